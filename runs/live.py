"""The sending side of live delivery: find the run's owner on its claim, ask it directly."""

from django.conf import settings

from runs.metrics import NOT_ACTIVE
from runs.services import NotActive


def owner_node(owner: str) -> str:
    """The Celery node name in an attempt owner ("node:pid")."""
    return owner.rsplit(":", 1)[0]


def deliver(*, run_id, generation: int, owner: str | None, command: str,
            actor: str | None = None, source: str | None = None) -> int:
    """Deliver a live command to attempt ``generation`` held by ``owner`` (the run's claim as
    committed); returns the generation.

    Raises NotActive when nothing holds the claim or its owner does not take the command
    (another generation, a finished attempt, a worker that is gone). Nothing is retried.
    """
    from awaken_site.celery import app

    if owner is None:
        NOT_ACTIVE.labels(command).inc()
        raise NotActive(f"Run {run_id} has no live attempt.")
    node = owner_node(owner)
    replies = app.control.broadcast(
        "awaken_deliver",
        arguments={"run_id": str(run_id), "generation": generation,
                   "command": command, "actor": actor, "source": source},
        destination=[node], reply=True, limit=1, timeout=settings.AWAKEN_DELIVERY_TIMEOUT,
    ) or []
    if not any(answer.get("delivered") for reply in replies for answer in reply.values()):
        NOT_ACTIVE.labels(command).inc()
        raise NotActive(f"The attempt of run {run_id} did not take the {command}.")
    return generation
