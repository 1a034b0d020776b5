"""The periodic sweep (SPEC §6): expired leases and queued runs whose message was lost."""

from django.conf import settings
from django.utils import timezone

from runs import services
from runs.models import Attempt, AttemptState


def sweep(*, limit: int = 200) -> dict:
    """One pass; each row is its own compare-and-set transition, so sweeps may overlap."""
    counts = {"applied": 0, "requeued": 0, "failed": 0, "redispatched": 0}
    expired = (Attempt.objects.filter(state=AttemptState.LIVE,
                                      lease_expires_at__lt=timezone.now())
               .order_by("lease_expires_at").values_list("run_id", "generation")[:limit])
    for run_id, generation in list(expired):
        outcome = services.attempt_expire(run_id=run_id, generation=generation,
                                          max_crash_retries=settings.AWAKEN_MAX_CRASH_RETRIES)
        if outcome:
            counts[outcome] += 1
    counts["redispatched"] = len(services.runs_redispatch(
        older_than=settings.AWAKEN_LEASE_SECONDS, limit=limit))
    return counts
