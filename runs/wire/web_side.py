"""The web side of the wire: hand queued runs to workers, send live commands to them.

This is the domain's ``workers`` port (``runs.domain.ports``). A failure here loses
nothing: the sweeper re-sends lost dispatches, and a pending intent reaches its attempt on
the next lease renewal or is applied when the lease expires.
"""

from celery import current_app
from django.conf import settings
from django.utils import timezone
from prometheus_client import Counter

from runs.domain.errors import NotActive

EXECUTE = "runs.execute"  # the worker side's task (runs.tasks.execute), sent by name
DELIVER = "awaken_deliver"  # the worker side's remote-control command (runs.wire.worker_side)

NOT_ACTIVE = Counter("awaken_not_active", "Live commands this process sent that were answered "
                     "NotActive (no live attempt, or its owner did not take it).", ["command"])


def runs_queued(*, runs) -> None:
    """Runs became queued: hand each ``(run_id, start_after)`` to a worker, over one broker
    connection. Runs due now go in messages of up to ``AWAKEN_DISPATCH_CHUNK`` runs (the
    worker claims each on its own); a run that starts later goes alone, at its time."""
    now = timezone.now()
    due = [str(run_id) for run_id, start_after in runs if not start_after or start_after <= now]
    later = [(str(run_id), start_after) for run_id, start_after in runs
             if start_after and start_after > now]
    size = settings.AWAKEN_DISPATCH_CHUNK
    app = current_app
    with app.producer_or_acquire() as producer:
        for first in range(0, len(due), size):
            app.send_task(EXECUTE, args=[due[first:first + size]], producer=producer)
        for run_id, start_after in later:
            app.send_task(EXECUTE, args=[[run_id]], eta=start_after, producer=producer)


def owner_node(owner: str) -> str:
    """The Celery node name in an attempt owner ("node:pid")."""
    return owner.rsplit(":", 1)[0]


def deliver(*, run_id, generation: int, owner: str | None, command: str,
            actor: str | None = None, source: str | None = None, message=None) -> None:
    """Deliver a live command to attempt ``generation`` held by ``owner`` (the run's claim as
    committed).

    Raises NotActive when nothing holds the claim or its owner does not take the command
    (another generation, a finished attempt, a worker that is gone). Nothing is retried.
    """
    if owner is None:
        NOT_ACTIVE.labels(command).inc()
        raise NotActive(f"Run {run_id} has no live attempt.")
    replies = current_app.control.broadcast(
        DELIVER,
        arguments={"run_id": str(run_id), "generation": generation, "command": command,
                   "actor": actor, "source": source, "message": message},
        destination=[owner_node(owner)], reply=True, limit=1,
        timeout=settings.AWAKEN_DELIVERY_TIMEOUT,
    ) or []
    if not any(answer.get("delivered") for reply in replies for answer in reply.values()):
        NOT_ACTIVE.labels(command).inc()
        raise NotActive(f"The attempt of run {run_id} did not take the {command}.")
