"""What happens after commit when a run is queued or a control intent is recorded.

The services name the moment; this module talks to the broker, so they never import Celery.
A failure here loses nothing: the sweeper re-sends lost dispatches, and a pending intent
reaches its attempt on the next lease renewal or is applied when the lease expires.
"""

import logging

from django.conf import settings
from django.utils import timezone

from runs.services.errors import NotActive

log = logging.getLogger(__name__)


def runs_queued(*, runs) -> None:
    """Runs became queued: hand each ``(run_id, start_after)`` to a worker, over one broker
    connection. Runs due now go in messages of up to ``AWAKEN_DISPATCH_CHUNK`` runs (the
    worker claims each on its own); a run that starts later goes alone, at its time."""
    from runs.tasks import execute

    now = timezone.now()
    due = [str(run_id) for run_id, start_after in runs if not start_after or start_after <= now]
    later = [(str(run_id), start_after) for run_id, start_after in runs
             if start_after and start_after > now]
    size = settings.AWAKEN_DISPATCH_CHUNK
    with execute.app.producer_or_acquire() as producer:
        for first in range(0, len(due), size):
            execute.apply_async(args=[due[first:first + size]], producer=producer)
        for run_id, start_after in later:
            execute.apply_async(args=[[run_id]], eta=start_after, producer=producer)


def intent_recorded(*, run_id, generation: int, owner: str, actor: str, source: str) -> None:
    """A cancel or stop of a running run was recorded: tell its attempt now."""
    from runs import live

    try:
        live.deliver(run_id=run_id, generation=generation, owner=owner, command="cancel",
                     actor=actor, source=source)
    except NotActive:
        log.info("run %s: cancel not taken live; it waits for renewal or lease expiry", run_id)
