"""Celery tasks: ids in, one call into the executor or the domain, nothing else."""

from celery import shared_task

from runs import domain
from runs.domain.errors import WorkerDraining
from runs.runtime.executor import get_executor
from runs.workers import commands, dispatch, sweeper  # noqa: F401 (beat sweeps itself)


@shared_task(bind=True, name=dispatch.EXECUTE, ignore_result=True, max_retries=None)
def execute(self, run_ids: list[str] | str) -> None:
    """Claim each run of ``run_ids`` and start its attempt on this worker's executor.

    The runs are claimed in one transaction. A redelivered or duplicated message finds a
    run claimed (or ended) and skips it. What the executor has no room for comes back in a
    second, as does every run a drained worker is sent. If the claim fails on an error, the
    runs stay queued and the sweeper sends them again.
    """
    executor = get_executor(node=commands.node_name or self.request.hostname)
    run_ids = [run_ids] if isinstance(run_ids, str) else list(run_ids)
    room = executor.room
    if room:
        try:
            executor.start(run_ids[:room])
        except WorkerDraining:  # asked by the claim itself: the message goes back whole
            room = 0
    if run_ids[room:]:
        raise self.retry(args=[run_ids[room:]], countdown=1)


@shared_task(bind=True, name=dispatch.BULK, acks_late=True, ignore_result=True)
def bulk(self, job_id: str) -> None:
    """Handle the next runs of a bulk job; a job with runs left is sent on as a new message,
    so it holds a worker thread for one slice at a time. A redelivered or duplicated message
    finds the runs already handled and skips them."""
    if domain.bulk_job_run(job_id=job_id):
        dispatch.bulk_queued(job_id=job_id)


@shared_task(name="runs.webhooks", ignore_result=True, expires=10)
def webhooks() -> int:
    """Send the webhook deliveries that are due."""
    from runs.workers.webhooks import send_due

    return send_due()
