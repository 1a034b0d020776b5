"""Transitions requested from outside a worker: create, cancel, stop, resume."""

import hashlib
import json
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Count
from django.utils import timezone

from runs import telemetry
from runs.domain import activity, limits, outside, sql
from runs.domain.approvals import decision_of
from runs.domain.catalogue import CATALOGUE
from runs.domain.core import (
    Ending,
    after_commit,
    dispatch_after_commit,
    finish,
    locked_run,
    pending_intent,
    record,
    record_created,
    record_intent,
    record_joined,
)
from runs.domain.errors import (
    IdempotencyConflict,
    InvalidRequest,
    NotAwaiting,
    TicketMismatch,
)
from runs.domain.schemas import check_input
from runs.domain.selectors import run_get, ticket_get
from runs.domain.text import quoted_id, short_id
from runs.models import (
    AppliedVia,
    ControlAction,
    ControlIntent,
    EndCause,
    Event,
    EventKind,
    Run,
    RunState,
    StopCode,
    TicketReason,
    TicketState,
)

MAX_REASON_LENGTH = 500


def run_create(
    *,
    agent: str,
    input: dict | None = None,
    thread_id: str | None = None,
    parent_id=None,
    budget: dict | None = None,
    start_after: datetime | None = None,
    created_by=None,
    idempotency_key: str | None = None,
    source: str = "api",
    dispatch: bool = True,
    rerun_of: Run | None = None,
) -> tuple[Run, bool]:
    """Create a queued run. Returns ``(run, created)``.

    With an ``idempotency_key`` the same user replaying the same request gets the run the
    first call created (``created`` is False); a different request under the same key is an
    ``IdempotencyConflict``. The insert itself is the check (runs_run_idempotency_key_unique).
    ``dispatch=False`` leaves the run to the caller to claim (a child run started
    in-process); if no claim follows, the sweeper hands it to a worker like a lost message.
    """
    run = _new_run(agent=agent, input=input, thread_id=thread_id, parent_id=parent_id,
                   budget=budget, start_after=start_after, created_by=created_by,
                   parents=_parents([parent_id]))
    run.idempotency_key = idempotency_key
    if rerun_of is not None:
        run.rerun_of = rerun_of
        run.request_fingerprint = _fingerprint(run.request_fingerprint, str(rerun_of.pk))
    try:
        with _creating():
            record_created([run], actor=_name(created_by), source=source)
            if dispatch:
                dispatch_after_commit(run)
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = Run.objects.filter(created_by=created_by,
                                      idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        fingerprint, run = run.request_fingerprint, existing
    else:
        return run, True
    if run.request_fingerprint != fingerprint:
        raise IdempotencyConflict(
            "This Idempotency-Key was already used with a different request."
        )
    return run, False


def run_rerun(*, run_id, created_by=None, idempotency_key: str | None = None,
              source: str = "api") -> tuple[Run, bool]:
    """Run again: a new queued run with the agent, input, budget and thread of ``run_id``,
    linked to it by ``rerun_of``. Returns ``(run, created)`` as ``run_create`` does.

    Any run may be started again, whatever its state. The new run has no parent: a parent
    takes children only from its own attempt.
    """
    old = run_get(run_id)
    budget = {key: getattr(old, key) for key in limits.BUDGET_KEYS if getattr(old, key) is not None}
    budget[limits.ON_EXHAUSTED] = old.on_exhausted
    return run_create(agent=old.agent, input=old.input, thread_id=old.thread_id,
                      budget=budget, created_by=created_by, idempotency_key=idempotency_key,
                      source=source, rerun_of=old)


MAX_BATCH = 500


def runs_create(*, runs: list[dict], created_by=None, source: str = "api") -> list[Run]:
    """Create many queued runs at once, all or none: each item of ``runs`` holds the
    arguments of one ``run_create`` (``agent``, ``input``, ``thread_id``, ``parent_id``,
    ``budget``, ``start_after``). One transaction, one insert for the runs and one for their
    events; every run is handed to a worker after the commit. A bad item is an
    ``InvalidRequest`` naming its index, and nothing is created."""
    if not 1 <= len(runs) <= MAX_BATCH:
        raise InvalidRequest(f"Give between 1 and {MAX_BATCH} runs.", field="runs")
    parents = _parents([spec.get("parent_id") for spec in runs])
    made = []
    for index, spec in enumerate(runs):
        try:
            made.append(_new_run(**spec, created_by=created_by, parents=parents))
        except InvalidRequest as error:
            where = f"runs.{index}" + (f".{error.field}" if error.field else "")
            raise InvalidRequest(f"{where}: {error.message}", field=where) from None
    with _creating():
        record_created(made, actor=_name(created_by), source=source)
        dispatch_after_commit(*made)
    return made


def _creating():
    """The transaction a create's writes go in.

    On PostgreSQL the runs and their events are one statement (``record_created``), and
    nothing else of a create writes: in autocommit that statement is a transaction of its
    own, with no BEGIN or COMMIT sent. The hooks for after the commit (the broadcast, the
    dispatch) then run as soon as it succeeds, and not at all if it fails. Inside a
    caller's transaction the create takes a savepoint, so a refused insert (a replayed
    Idempotency-Key) leaves that transaction usable. Elsewhere the writes are several
    statements, in one atomic block."""
    if connection.vendor == "postgresql" and transaction.get_autocommit():
        return nullcontext()
    return transaction.atomic()


def _parents(ids) -> dict[str, Run]:
    """The runs named as parents in ``ids`` (None allowed), by id as text, each with
    ``child_count``, the children it has."""
    wanted = {str(pk) for pk in ids if pk is not None}
    if not wanted:
        return {}
    try:
        return {str(run.id): run for run in Run.objects.filter(pk__in=wanted)
                .only("id", "thread_id").annotate(child_count=Count("children"))}
    except ValidationError:  # a parent id that is not a UUID: no such parent
        return {}


def _new_run(*, agent: str, input: dict | None = None, thread_id: str | None = None,
             parent_id=None, budget: dict | None = None, start_after: datetime | None = None,
             created_by=None, parents: dict[str, Run]) -> Run:
    """A checked, unsaved queued run; ``parents`` holds its parent, if it names one."""
    input = {} if input is None else input
    budget = limits.check_budget(budget)
    if agent not in CATALOGUE:
        raise InvalidRequest(f"Unknown agent {agent!r}.", field="agent")
    if not isinstance(input, dict):
        raise InvalidRequest("input must be a JSON object.", field="input")
    _check_input(input)
    parent = None
    if parent_id is not None:
        parent = parents.get(str(parent_id))
        if parent is None:
            raise InvalidRequest(f"No parent run with id {quoted_id(parent_id)}.",
                                 field="parent_id")
        if parent.child_count >= settings.AWAKEN_MAX_CHILDREN:
            raise InvalidRequest(
                f"Run {parent_id} has {parent.child_count} child runs already, the most "
                f"AWAKEN_MAX_CHILDREN allows.", field="parent_id")
        parent.child_count += 1  # a batch's next child of the same parent counts this one
    run = sql.new(
        Run,
        dispatched_at=timezone.now(),
        agent=agent,
        input=input,
        parent=parent,
        start_after=start_after,
        created_by=created_by,
        request_fingerprint=_fingerprint(agent, input, thread_id, parent_id, budget,
                                         start_after),
        traceparent=telemetry.traceparent(),
        **budget,
    )
    run.thread_id = thread_id or (parent.thread_id if parent else str(run.id))
    return run


def runs_import(*, agent: str, count: int, ended: bool = True, source: str = "cli",
                batch: int = 2000) -> int:
    """Create ``count`` runs of ``agent`` in bulk, each with its ``created`` event (and, with
    ``ended``, already ended ``completed`` with its ``ended`` event): history brought in from
    elsewhere, or data for a benchmark. No worker is asked to take them. Returns how many."""
    if agent not in CATALOGUE:
        raise InvalidRequest(f"Unknown agent {agent!r}.", field="agent")
    made = 0
    while made < count:
        size = min(batch, count - made)
        now = timezone.now()
        runs = [Run(agent=agent, input={}, state=RunState.ENDED if ended else RunState.QUEUED,
                    end_cause=EndCause.COMPLETED if ended else None,
                    ended_at=now if ended else None, version=2 if ended else 1,
                    dispatched_at=now) for _ in range(size)]
        for run in runs:
            run.thread_id = str(run.id)
        with transaction.atomic():
            Run.objects.bulk_create(runs)
            events = [Event(run=run, version=1, kind=EventKind.CREATED, state=RunState.QUEUED,
                            generation=0, source=source) for run in runs]
            if ended:
                events += [Event(run=run, version=2, kind=EventKind.ENDED, state=RunState.ENDED,
                                 end_cause=EndCause.COMPLETED, generation=0, source=source,
                                 data={"cause": EndCause.COMPLETED}) for run in runs]
            Event.objects.bulk_create(events)
        made += size
    if connection.vendor == "postgresql":
        # Fresh statistics, or the planner chooses its plans for the table as it was.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE runs_run, runs_event")
    return made


def _check_input(value) -> None:
    """A run's input (or a resume's) is storable JSON of at most AWAKEN_MAX_INPUT_BYTES."""
    limits.check_json(value, "input")
    limits.check_size(value, "input", settings.AWAKEN_MAX_INPUT_BYTES)


def _fingerprint(*parts) -> str:
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _name(user) -> str | None:
    return user.get_username() if user is not None else None


@dataclass(frozen=True)
class ControlResult:
    """The answer to a cancel or stop request."""

    run: Run
    path: str  # "ended": nothing to do; "durable": committed now; "live": intent pending
    intent: ControlIntent | None = None


def run_cancel(*, run_id, actor: str, source: str, reason: str | None = None) -> ControlResult:
    """Cancel a run: an external request to end its work."""
    return _request_end(run_id=run_id, action=ControlAction.CANCEL, reason=clean_reason(reason),
                        stop_code=None, actor=actor, source=source)


def run_stop(
    *, run_id, actor: str, source: str, reason: str, code: str = StopCode.OPERATOR
) -> ControlResult:
    """Stop a run: a host decision (an operator's halt or a policy), with a reason."""
    reason = clean_reason(reason)
    if not reason:
        raise InvalidRequest("A stop needs a reason.", field="reason")
    if code not in StopCode.values:
        raise InvalidRequest(f"Unknown stop code {code!r}.", field="code")
    return _request_end(run_id=run_id, action=ControlAction.STOP, reason=reason,
                        stop_code=code, actor=actor, source=source)


def clean_reason(reason: str | None) -> str | None:
    """A control's reason as it is recorded: stripped, None when empty, refused when long."""
    reason = (reason or "").strip() or None
    if reason is not None and len(reason) > MAX_REASON_LENGTH:
        raise InvalidRequest(f"The reason is longer than {MAX_REASON_LENGTH} characters.",
                             field="reason")
    return reason


def _request_end(*, run_id, action, reason, stop_code, actor, source) -> ControlResult:
    """Cancel and stop share one routing (SPEC §2):

    1. ended: nothing to do, the committed terminal state is the answer;
    2. queued or awaiting: the durable path, the intent and the terminal state in one
       transaction (the ticket is revoked by the finish boundary);
    3. running: the intent is written first; live delivery only shortens the wait. A
       second request while one is pending joins it rather than adding another.
    """
    with transaction.atomic():
        run = locked_run(run_id)
        if run.state == RunState.ENDED:
            return ControlResult(run, "ended")
        pending = pending_intent(run)
        if pending is not None:
            record_joined(run, pending, action=action, reason=reason, stop_code=stop_code,
                          actor=actor, source=source)
            return ControlResult(run, "live", pending)
        intent = record_intent(run, action=action, reason=reason, stop_code=stop_code,
                               actor=actor, source=source, tell_attempt=True)
        if run.state == RunState.RUNNING:
            return ControlResult(run, "live", intent)
        finish(run, Ending.from_intent(intent), actor=actor, source=source,
               via=AppliedVia.DURABLE)
        _traced_control(run, action, actor=actor, source=source, reason=reason)
        return ControlResult(run, "durable", intent)


def _traced_control(run: Run, action: str, **details) -> None:
    """A control action that no live attempt takes, traced once it commits (when traces
    are on): a span of its own in the run's trace."""
    if telemetry.enabled():
        after_commit(telemetry.control, run_id=run.id, traceparent=run.traceparent,
                     action=action, **details)


LIVE_COMMANDS = ("cancel", "pause", "wake", "message")
MAX_MESSAGE_BYTES = 64 * 1024


def run_live_command(*, run_id, command: str, actor: str, source: str, message=None) -> Run:
    """Send a live command to the run's live attempt, as committed now; nothing durable.

    No intent is written and nothing happens later if it is not taken: NotActive when the
    run has no live attempt or its owner does not take the command. ``message`` (any JSON
    up to 64 KiB encoded) goes with ``message`` to the attempt's live inbox. A command
    taken is noted in the run's activity log (a record, not state), with who sent it.
    Returns the run as read (its ``generation`` is the attempt that took the command).
    """
    if command not in LIVE_COMMANDS:
        raise InvalidRequest(f"Unknown live command {command!r}.", field="command")
    if command == "message":
        limits.check_json(message, "message")
        limits.check_size(message, "message", MAX_MESSAGE_BYTES)
    elif message is not None:
        raise InvalidRequest(f"A {command} carries no message.", field="message")
    run = run_get(run_id)  # the claim as committed: no owner unless it is running
    outside.workers.send_command_and_wait(run_id=run.id, generation=run.generation, owner=run.owner,
                          command=command, actor=actor, source=source, message=message)
    # Taken: the run's activity (and trace) says who sent what, when. A pause is not done
    # yet: the page says so until it commits.
    activity.control_taken(run_id=run.id, generation=run.generation, command=command,
                           actor=actor, source=source)
    return run


def run_pause(*, run_id, actor: str, source: str) -> Run:
    """Ask a running run to pause at its next step boundary (a live signal; the run moves
    to ``awaiting`` with a ticket when its attempt reaches the boundary). NotActive when it
    is not running."""
    return run_live_command(run_id=run_id, command="pause", actor=actor, source=source)


def ticket_revoke(*, ticket_id, actor: str, source: str,
                  reason: str | None = None) -> ControlResult:
    """Withdraw an open resume ticket. The ticket is the only thing that can wake its run,
    so its run ends: stopped (code ``operator``) with ``reason``, through the same request
    and finish boundary as a stop, which revokes the ticket.

    NotAwaiting when the ticket is no longer open (consumed, revoked, or its run ended).
    """
    ticket = ticket_get(ticket_id)
    reason = clean_reason(reason) or f"Resume ticket {short_id(ticket.pk)} revoked."
    with transaction.atomic():
        run = locked_run(ticket.run_id)
        if run.state != RunState.AWAITING or str(run.ticket_id) != str(ticket.pk):
            raise NotAwaiting(f"Ticket {ticket.pk} is not open.")
        return _request_end(run_id=run.id, action=ControlAction.STOP, reason=reason,
                            stop_code=StopCode.OPERATOR, actor=actor, source=source)


def run_resume(*, run_id, ticket_id, input=None, actor: str, source: str) -> Run:
    """Wake an awaiting run with its open ticket: consume it and queue a new attempt.

    Fails closed: a run that is not awaiting (an ended one included) raises NotAwaiting,
    another ticket raises TicketMismatch, and an input that does not satisfy the ticket's
    schema raises InvalidRequest; none of them changes anything. A ticket bound to an
    action takes a decision on it (``runs.domain.approvals.decision_of``), kept as checked
    and recorded on the ``resumed`` event: what was decided and which arguments run.
    """
    _check_input(input)
    with transaction.atomic():
        run = locked_run(run_id)
        if run.state != RunState.AWAITING:
            raise NotAwaiting(f"Run {run.id} is {run.status_label}, not awaiting.")
        ticket = run.ticket
        if str(ticket.pk) != str(ticket_id):
            raise TicketMismatch(f"Ticket {ticket_id} is not the open ticket of run {run.id}.")
        check_input(ticket.schema, input)
        decided = {}
        if ticket.action is not None:
            decision = decision_of(ticket.action, input)
            input, decided = decision.stored(), decision.event_data(ticket.action)
        changed = _resume_budget(run, ticket, input)
        ticket.state = TicketState.CONSUMED
        ticket.resume_input = input
        ticket.closed_at = timezone.now()
        ticket.closed_by = actor
        ticket.save(update_fields=["state", "resume_input", "closed_at", "closed_by"])
        run.ticket = None
        run.state = RunState.QUEUED
        run.dispatched_at = ticket.closed_at
        record(run, EventKind.RESUMED, fields=("ticket", "state", "dispatched_at", *changed),
               actor=actor, source=source,
               data={"ticket": str(ticket.pk), **decided, **({"budget": {
                   key: getattr(run, key) for key in changed if key in limits.BUDGET_KEYS}}
                   if set(changed) & set(limits.BUDGET_KEYS) else {})})
        dispatch_after_commit(run)
        _traced_control(run, "resume", actor=actor, source=source, reason=ticket.reason)
    return run


def _resume_budget(run: Run, ticket, input) -> list[str]:
    """What a resume changes of the run's budget, set on ``run`` (unsaved); the fields.

    A ``budget`` ticket needs ``{"budget": {…}}`` raising the limit that was reached (and
    any other, checked by ``limits.check_raised``). A ``loop`` ticket may raise
    ``max_repeats`` the same way; without it the run's counts of repeated calls start
    again, so the run goes on. Other tickets change nothing here. Refused: InvalidRequest,
    before anything is written."""
    if ticket.reason not in (TicketReason.BUDGET, TicketReason.LOOP):
        return []
    given = input.get("budget") if isinstance(input, dict) else None
    if ticket.reason == TicketReason.LOOP and given is None:
        run.repeats = {}
        return ["repeats"]
    current = {key: getattr(run, key) for key in limits.BUDGET_KEYS}
    raised = limits.check_raised(current, given)
    reached = (ticket.prompt or {}).get("limit") if isinstance(ticket.prompt, dict) else None
    if reached in limits.BUDGET_KEYS and reached not in raised:
        raise InvalidRequest(f"The run reached budget.{reached}: raise it to go on.",
                             field="budget")
    for key, value in raised.items():
        setattr(run, key, value)
    return list(raised)
