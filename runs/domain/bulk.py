"""Bulk jobs: one cancel, stop or resume asked of many runs, carried out on a worker.

The job and its selection are rows written in one transaction (``bulk_create``); a worker
then handles the selected runs one by one (``bulk_job_run``), each through ``run_cancel``,
``run_stop`` or ``run_resume`` in the name of whoever started the job. A resume wakes
awaiting runs whose ticket needs no input of its own (``BULK_RESUMABLE``: runs paused for
their provider, by the loop guard or by an operator), e.g. every run paused for
``provider`` once the provider is back. Each run is handled in a transaction
of its own that also marks its item handled and counts it, under the job's row lock, so:

* a run is handled and counted once, whatever runs the job again (a redelivered task
  message, the sweeper sending a job whose worker died, two workers at once);
* an abort (``bulk_job_abort``) takes the same lock: once it commits, no further run is
  touched, and the counts say exactly which runs were.
"""

import base64
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from runs.domain import outside, webhooks
from runs.domain.core import after_commit
from runs.domain.errors import BulkJobNotFound, InvalidRequest, ServiceError
from runs.domain.representation import bulk_data
from runs.domain.runs import clean_reason, run_cancel, run_resume, run_stop
from runs.domain.selectors import matching
from runs.domain.text import quoted_id
from runs.models import (
    BULK_RESUMABLE,
    LIVE_BULK_STATES,
    BulkAction,
    BulkItem,
    BulkJob,
    BulkState,
    ItemOutcome,
    Run,
    RunState,
    WebhookEvent,
)

CHUNK = 50  # runs read at once; progress is published after each chunk


def bulk_selection(*, ids: list | None = None, criteria: dict | None = None) -> list:
    """The ids of the runs a job would handle: the runs of ``ids`` (each must exist), or
    those matching the run-list filters ``criteria`` that have not ended, newest first.
    At most ``AWAKEN_BULK_MAX_RUNS``."""
    limit = settings.AWAKEN_BULK_MAX_RUNS
    if (ids is None) == (criteria is None):
        raise InvalidRequest("Choose the runs by ids or by a filter.", field="ids")
    if ids is not None:
        wanted = list(dict.fromkeys(_run_pk(run_id) for run_id in ids))
        if not 1 <= len(wanted) <= limit:
            raise InvalidRequest(f"Give 1 to {limit} run ids.", field="ids")
        found = set(Run.objects.filter(pk__in=wanted).values_list("pk", flat=True))
        missing = [run_id for run_id in wanted if run_id not in found]
        if missing:
            raise InvalidRequest(f"No run with id {quoted_id(missing[0])}.", field="ids")
        return wanted
    chosen = (Run.objects.filter(matching(**criteria)).exclude(state=RunState.ENDED)
              .order_by("-created_at", "-id").values_list("pk", flat=True))
    selected = list(chosen[:limit + 1])
    if len(selected) > limit:
        raise InvalidRequest(f"The filter matches more than {limit} runs that have not "
                             "ended; narrow it.", field="filter")
    return selected


def bulk_preview(*, ids: list | None = None, criteria: dict | None = None) -> dict:
    """How many runs a job would select (``total``) and how many of them have not ended
    (``live``: the ones a cancel or stop changes), without making it."""
    selected = bulk_selection(ids=ids, criteria=criteria)
    if criteria is not None:
        return {"total": len(selected), "live": len(selected)}
    ended = Run.objects.filter(pk__in=selected, state=RunState.ENDED).count()
    return {"total": len(selected), "live": len(selected) - ended}


def bulk_create(*, action: str, reason: str | None = None, ids: list | None = None,
                criteria: dict | None = None, requested_by: str, created_by=None,
                source: str) -> BulkJob:
    """Make a bulk job over the selection (see ``bulk_selection``) and hand it to a worker
    once it commits. A stop needs a reason; an empty selection is refused."""
    if action not in BulkAction.values:
        raise InvalidRequest(f"Unknown action {action!r}.", field="action")
    reason = clean_reason(reason)
    if action == BulkAction.STOP and not reason:
        raise InvalidRequest("A stop needs a reason.", field="reason")
    selected = bulk_selection(ids=ids, criteria=criteria)
    if not selected:
        raise InvalidRequest("No run that has not ended matches the filter.", field="filter")
    with transaction.atomic():
        job = BulkJob.objects.create(
            action=action, reason=reason, total=len(selected), requested_by=requested_by,
            created_by=created_by, source=source, heartbeat_at=timezone.now(),
            filter=None if criteria is None else plain(criteria))
        BulkItem.objects.bulk_create([BulkItem(job=job, run_id=run_id) for run_id in selected],
                                     batch_size=1000)
        after_commit(outside.workers.bulk_queued, job_id=job.id)
        after_commit(outside.changes.publish_bulk, job=job)
    return job


def plain(criteria: dict) -> dict:
    """Filters as plain JSON, as the job keeps them."""
    return {key: value.isoformat() if isinstance(value, datetime)
            else str(value) if isinstance(value, uuid.UUID) else value
            for key, value in criteria.items()}


def bulk_job_run(*, job_id, budget: int = 500) -> bool:
    """Handle up to ``budget`` of the job's runs not handled yet, in order. Returns True if
    some are left (the caller hands the job on, so no worker thread is held for long).

    1. a queued job starts; a finished or aborted one is left alone;
    2. each run is handled in its own transaction (``_handle``), which stops at once if
       the job is no longer running;
    3. with nothing left, the job is done.
    """
    if not _begin(job_id):
        return False
    handled = 0
    while handled < budget:
        chunk = list(BulkItem.objects.filter(job_id=job_id, outcome=ItemOutcome.PENDING)
                     .order_by("id").values_list("id", "run_id")[:min(CHUNK, budget - handled)])
        if not chunk:
            _complete(job_id)
            return False
        for item_id, run_id in chunk:
            if not _handle(job_id, item_id, run_id):
                return False
        handled += len(chunk)
        outside.changes.publish_bulk(job=BulkJob.objects.get(pk=job_id))
    return True


def _begin(job_id) -> bool:
    with transaction.atomic():
        job = BulkJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.state not in LIVE_BULK_STATES:
            return False
        if job.state == BulkState.QUEUED:
            job.state = BulkState.RUNNING
            job.started_at = job.heartbeat_at = timezone.now()
            job.version += 1
            job.save(update_fields=["state", "started_at", "heartbeat_at", "version"])
            after_commit(outside.changes.publish_bulk, job=job)
    return True


def _handle(job_id, item_id, run_id) -> bool:
    """Handle one run of a running job, in one transaction: the request, the item's
    outcome and the job's count commit together or not at all. False once the job is not
    running (aborted, or done by another worker)."""
    with transaction.atomic():
        # The job's lock first, as an abort takes it: nothing is handled after an abort.
        job = BulkJob.objects.select_for_update().get(pk=job_id)
        if job.state != BulkState.RUNNING:
            return False
        item = (BulkItem.objects.select_for_update()
                .filter(pk=item_id, outcome=ItemOutcome.PENDING).first())
        if item is None:  # handled already, by a run of the job that came first
            return True
        who = {"actor": job.requested_by, "source": job.source}
        try:
            if job.action == BulkAction.RESUME:
                item.outcome, item.detail = _resume(run_id, who)
            else:
                if job.action == BulkAction.STOP:
                    result = run_stop(run_id=run_id, reason=job.reason, **who)
                else:
                    result = run_cancel(run_id=run_id, reason=job.reason, **who)
                ended = result.path == "ended"
                item.outcome = ItemOutcome.UNCHANGED if ended else ItemOutcome.APPLIED
                item.detail = result.path
        except ServiceError as error:
            item.outcome, item.detail = ItemOutcome.REFUSED, error.message
        item.done_at = timezone.now()
        item.save(update_fields=["outcome", "detail", "done_at"])
        counter = {ItemOutcome.APPLIED: "applied", ItemOutcome.UNCHANGED: "unchanged",
                   ItemOutcome.REFUSED: "refused"}[item.outcome]
        setattr(job, counter, getattr(job, counter) + 1)
        job.done += 1
        job.heartbeat_at = item.done_at
        job.version += 1
        job.save(update_fields=[counter, "done", "heartbeat_at", "version"])
    return True


def _resume(run_id, who: dict) -> tuple[str, str]:
    """Resume one run of a resume job with its open ticket: unchanged if it is not
    awaiting any more, refused if its ticket asks for input of its own (an approval, a
    budget to raise)."""
    run = Run.objects.select_related("ticket").get(pk=run_id)
    if run.state != RunState.AWAITING:
        return ItemOutcome.UNCHANGED, f"not awaiting ({run.status_label})"
    if run.ticket.reason not in BULK_RESUMABLE:
        return ItemOutcome.REFUSED, (f"its ticket ({run.ticket.reason}) needs input of its "
                                     "own: resume it on its page")
    run_resume(run_id=run.pk, ticket_id=run.ticket_id, input=None, **who)
    return ItemOutcome.APPLIED, "resumed"


def _complete(job_id) -> None:
    with transaction.atomic():
        job = BulkJob.objects.select_for_update().get(pk=job_id)
        if job.state != BulkState.RUNNING or BulkItem.objects.filter(
                job_id=job_id, outcome=ItemOutcome.PENDING).exists():
            return
        job.state = BulkState.DONE
        job.finished_at = timezone.now()
        job.version += 1
        job.save(update_fields=["state", "finished_at", "version"])
        webhooks.enqueue(WebhookEvent.BULK_DONE, lambda: bulk_data(job))
        after_commit(outside.changes.publish_bulk, job=job)


def bulk_job_abort(*, job_id, actor: str) -> BulkJob:
    """Stop a queued or running job: no run is handled after this commits, and the runs it
    had not reached are left as they are. A job that is over is returned as it is."""
    with transaction.atomic():
        job = BulkJob.objects.select_for_update().filter(pk=_job_pk(job_id)).first()
        if job is None:
            raise BulkJobNotFound(f"No bulk job with id {quoted_id(job_id)}.")
        if job.state in LIVE_BULK_STATES:
            job.state = BulkState.ABORTED
            job.finished_at = timezone.now()
            job.aborted_by = actor
            job.version += 1
            job.save(update_fields=["state", "finished_at", "aborted_by", "version"])
            after_commit(outside.changes.publish_bulk, job=job)
    return job


def bulk_jobs_resend(*, older_than: float, limit: int = 100) -> list:
    """Jobs not over that nobody has moved on for ``older_than`` seconds (their message or
    their worker was lost): hand each to a worker again. A compare-and-set on the
    heartbeat, so two sweepers never both send one."""
    now = timezone.now()
    stale = list(BulkJob.objects.filter(state__in=LIVE_BULK_STATES,
                                        heartbeat_at__lt=now - timedelta(seconds=older_than))
                 .values_list("id", "heartbeat_at")[:limit])
    sent = []
    for job_id, heartbeat_at in stale:
        if BulkJob.objects.filter(pk=job_id, state__in=LIVE_BULK_STATES,
                                  heartbeat_at=heartbeat_at).update(heartbeat_at=now):
            outside.workers.bulk_queued(job_id=job_id)
            sent.append(job_id)
    return sent


def bulk_job_get(job_id) -> BulkJob:
    job = BulkJob.objects.filter(pk=_job_pk(job_id)).first()
    if job is None:
        raise BulkJobNotFound(f"No bulk job with id {quoted_id(job_id)}.")
    return job


ITEMS_PAGE = 100  # runs of a job shown on one page of its detail


def bulk_job_items(*, job_id, after: int = 0, limit: int | None = None):
    """The runs a job selected, in the order it handles them, each with what the job did
    (its outcome, detail and when), from the item after ``after``. Returns ``(items, the
    ``after`` of the next page or None)``; each item's ``run`` holds only the few columns a
    row shows (id, agent, state, end cause). ``limit``: ``ITEMS_PAGE`` unless given."""
    limit = limit or ITEMS_PAGE
    items = list(BulkItem.objects.filter(job_id=_job_pk(job_id), id__gt=after)
                 .select_related("run").only("id", "outcome", "detail", "done_at", "job_id",
                                             "run__id", "run__agent", "run__state",
                                             "run__end_cause")
                 .order_by("id")[:limit + 1])
    more = len(items) > limit
    items = items[:limit]
    return items, (items[-1].id if more else None)


def bulk_jobs_among(ids) -> list[BulkJob]:
    """Those of the jobs named by ``ids`` that exist, newest first (a bad id names none)."""
    keys = []
    for job_id in ids:
        try:
            keys.append(_job_pk(job_id))
        except BulkJobNotFound:
            continue
    return list(BulkJob.objects.filter(pk__in=keys).order_by("-created_at", "-id"))


def bulk_jobs(*, cursor: str | None = None, limit: int = 50):
    """Past and current jobs, newest first. Returns ``(jobs, next_cursor or None)``."""
    jobs = BulkJob.objects.order_by("-created_at", "-id")
    if cursor:
        created_at, job_id = _decode(cursor)
        jobs = jobs.filter(created_at__lte=created_at).filter(
            Q(created_at__lt=created_at) | Q(id__lt=job_id))
    page = list(jobs[:limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return page, (_encode(page[-1]) if more else None)


def _run_pk(run_id) -> uuid.UUID:
    try:
        return run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    except ValueError:
        raise InvalidRequest(f"{run_id!r} is not a run id.", field="ids") from None


def _job_pk(job_id):
    try:
        return uuid.UUID(str(job_id))
    except ValueError:
        raise BulkJobNotFound(f"No bulk job with id {quoted_id(job_id)}.") from None


def _encode(job: BulkJob) -> str:
    raw = f"{job.created_at.isoformat()}|{job.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str):
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, job_id = raw.split("|")
        value = datetime.fromisoformat(created_at)
        if value.tzinfo is None:
            raise ValueError(created_at)
        return value, uuid.UUID(job_id)
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("The cursor is not one this API gave out.", field="cursor") from None
