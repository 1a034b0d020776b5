"""Put runs into a given state through the domain, as production does."""

from runs import domain
from runs.models import Run

OWNER = "test-worker:1"


def queued_run(agent: str = "demo.steps", **kwargs) -> Run:
    """A queued run that no worker is asked to take: the test plays the attempts."""
    run, _ = domain.run_create(agent=agent, dispatch=False, **kwargs)
    return run


def running_run(**kwargs) -> tuple[Run, int]:
    run = queued_run(**kwargs)
    attempt = domain.attempt_start(run_id=run.id, owner=OWNER, lease_seconds=30)
    return Run.objects.get(pk=run.id), attempt.generation


def awaiting_run(**kwargs) -> tuple[Run, str]:
    run, generation = running_run(**kwargs)
    ticket = domain.attempt_pause(run_id=run.id, generation=generation)
    return Run.objects.get(pk=run.id), str(ticket.pk)
