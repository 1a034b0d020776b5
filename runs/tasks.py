"""Celery tasks: ids in, one call into the executor or the services, nothing else."""

from celery import shared_task

from runs import control  # noqa: F401  (registers the remote-control command in workers)
from runs.services import RunNotFound


@shared_task(bind=True, name="runs.execute", acks_late=True, ignore_result=True,
             max_retries=None)
def execute(self, run_id: str) -> None:
    """Claim the run and start its attempt on this worker's executor.

    A redelivered or duplicated message finds the run claimed (or ended) and does nothing.
    """
    from runs.runtime.executor import get_executor

    executor = get_executor(node=control.node_name or self.request.hostname)
    if executor.full:
        raise self.retry(countdown=1)
    try:
        executor.start(run_id)
    except RunNotFound:
        return


@shared_task(name="runs.sweep", ignore_result=True)
def sweep() -> dict:
    from runs import sweeper

    return sweeper.sweep()
