"""Transitions made by a worker on behalf of one attempt of a run.

Every call names the attempt by ``(run_id, generation)``. A call from an attempt that is no
longer the run's live one (an older generation, a run that moved on) changes nothing: the
writes raise ``Fenced`` and the finish boundary answers False.
"""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from runs.models import (
    Attempt,
    AttemptState,
    ControlIntent,
    EventKind,
    ResumeTicket,
    RunState,
    TicketReason,
)
from runs.services.core import Ending, close_live_attempt, finish, locked_run, record
from runs.services.errors import Fenced


def attempt_start(*, run_id, owner: str, lease_seconds: float) -> Attempt | None:
    """Claim a queued run for a new attempt (generation + 1) owned by ``owner``.

    Returns None when the run is not queued any more (a redelivered task message, a run
    cancelled meanwhile) or not due yet (``start_after``): the caller just drops the task.
    """
    with transaction.atomic():
        run = locked_run(run_id)
        now = timezone.now()
        if run.state != RunState.QUEUED or (run.start_after and run.start_after > now):
            return None
        run.state = RunState.RUNNING
        run.generation += 1
        run.started_at = run.started_at or now
        attempt = Attempt.objects.create(
            run=run,
            generation=run.generation,
            owner=owner,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
        )
        record(run, EventKind.STARTED, fields=("state", "generation", "started_at"),
               actor=owner, source="worker", data={"owner": owner})
    return attempt


def _locked_current(run_id, generation: int):
    run = locked_run(run_id)
    if run.state != RunState.RUNNING or run.generation != generation:
        raise Fenced(f"Attempt {generation} of run {run_id} is not the live attempt.")
    return run


def attempt_step(*, run_id, generation: int, tokens: int = 0, agent_state=None,
                 data: dict | None = None):
    """Commit one step: the checkpoint a later attempt continues from."""
    with transaction.atomic():
        run = _locked_current(run_id, generation)
        run.steps += 1
        run.tokens += max(0, int(tokens))
        run.agent_state = agent_state
        record(run, EventKind.STEP, fields=("steps", "tokens", "agent_state"),
               source="worker", data={"step": run.steps, "tokens": tokens, **(data or {})})
    return run


def attempt_pause(*, run_id, generation: int, reason: str = TicketReason.MANUAL_PAUSE,
                  prompt=None, agent_state=None, actor: str | None = None,
                  source: str | None = "worker") -> ResumeTicket | None:
    """Move the run to ``awaiting`` with a new open ticket; the attempt closes.

    A pending cancel or stop wins over the pause: the run ends instead and None is returned.
    """
    with transaction.atomic():
        run = _locked_current(run_id, generation)
        if run.control is not None and run.control.applied_at is None:
            finish(run, Ending.from_intent(run.control), generation=generation,
                   actor=run.control.requested_by, source=run.control.source)
            return None
        now = timezone.now()
        run.seconds_used += close_live_attempt(run, "paused", now=now)
        ticket = ResumeTicket.objects.create(
            run=run, generation=generation, reason=reason, prompt=prompt
        )
        run.state = RunState.AWAITING
        run.ticket = ticket
        run.agent_state = agent_state if agent_state is not None else run.agent_state
        record(run, EventKind.PAUSED, fields=("state", "ticket", "seconds_used", "agent_state"),
               actor=actor, source=source, data={"ticket": str(ticket.pk), "reason": reason})
    return ticket


def attempt_finish(*, run_id, generation: int, ending: Ending, actor: str | None = None,
                   source: str | None = "worker") -> bool:
    """Finish the run from its live attempt. False: the result is late and is dropped."""
    with transaction.atomic():
        run = locked_run(run_id)
        return finish(run, ending, generation=generation, actor=actor, source=source)


def attempt_interrupted(*, run_id, generation: int, actor: str | None = None,
                        source: str | None = None) -> bool:
    """End the run after its attempt's token was cancelled.

    The pending intent says how (cancelled, or stopped with its reason and code); a live-only
    cancel with no intent ends it ``cancelled`` in the name of whoever delivered it.
    """
    with transaction.atomic():
        run = locked_run(run_id)
        intent = run.control if run.control and run.control.applied_at is None else None
        if intent is not None:
            ending, actor, source = Ending.from_intent(intent), intent.requested_by, intent.source
        else:
            ending = Ending.cancelled()
        return finish(run, ending, generation=generation, actor=actor, source=source)


def attempt_heartbeat(*, run_id, generation: int, owner: str,
                      lease_seconds: float) -> ControlIntent | None:
    """Renew the attempt's lease; returns the run's pending control intent, if any.

    Raises Fenced when the attempt no longer holds the claim: its owner must cancel its own
    token at once and commit nothing.
    """
    renewed = Attempt.objects.filter(
        run_id=run_id, generation=generation, owner=owner, state=AttemptState.LIVE
    ).update(lease_expires_at=timezone.now() + timedelta(seconds=lease_seconds))
    if not renewed:
        raise Fenced(f"Attempt {generation} of run {run_id} lost its claim.")
    return ControlIntent.objects.filter(run_id=run_id, applied_at__isnull=True).first()
