"""The two primitives every transition is built from, and the finish boundary.

* ``locked_run`` takes the run's row lock: transitions of one run are serialized by it,
  which is also what orders a run's events (``version``).
* ``record`` applies a change to the locked run, bumps ``version``, writes the event in
  the same transaction and schedules the broadcast for after commit.
* ``finish`` is the one function that commits a terminal state.
"""

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from runs.domain import activity as activity_log
from runs.domain import outside, sql, webhooks
from runs.domain.errors import RunNotFound
from runs.domain.limits import encoded_size
from runs.domain.receipts import Trace, receipt, receipt_totals
from runs.domain.text import clipped, quoted_id, short_id
from runs.models import (
    AppliedVia,
    Attempt,
    AttemptState,
    CloseReason,
    ControlAction,
    ControlIntent,
    EndCause,
    Event,
    EventKind,
    Run,
    RunState,
    Source,
    StopCode,
    TicketState,
)


def database_now():
    """The database's clock: leases are set and compared by it alone, so the clocks of the
    hosts that run workers and sweepers never matter. (SQLite lives on one host.)"""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def locked_run(run_id) -> Run:
    """The run, row-locked until the surrounding transaction ends.

    Call inside ``transaction.atomic()``. The newest control intent is read once the lock
    is held, in a statement of its own, and the open ticket when it is first used; neither
    is joined to the locking read: when a locking read waits for another transaction,
    PostgreSQL re-reads the locked row once that one commits but not the rows joined to
    it, so a joined intent could be stale (``tests/test_races.py`` holds an end that waited
    for a request's lock to the request's intent).
    """
    key = run_key(run_id)
    run = None if key is None else sql.lock(Run, key)
    if run is None:
        raise RunNotFound(f"No run with id {quoted_id(run_id)}.")
    return read_control(run)


def read_control(run: Run) -> Run:
    """``run``, locked, with its newest control intent read (``locked_run`` says why
    apart from the lock)."""
    if run.control_id is not None:  # pending, unless the run has ended
        run.control = sql.get(ControlIntent, run.control_id)
    return run


def locked_runs(run_ids) -> list[Run]:
    """The runs of ``run_ids`` that exist, row-locked in the order of their ids (so two
    transactions locking overlapping sets never wait for each other in a cycle)."""
    return locked_runs_at(run_ids)[0]


def locked_runs_at(run_ids) -> tuple[list[Run], object]:
    """``locked_runs``, and the database's clock read by the same statement (None when
    it could not be read so: no run locked, or not PostgreSQL; ask ``database_now``)."""
    return sql.lock_many_at(Run, run_keys(run_ids))


def run_keys(run_ids) -> list:
    """The primary keys of ``run_ids``, once each and in order; what is not a UUID (no
    such run) left out."""
    return sorted({key for key in map(run_key, run_ids) if key is not None})


def run_key(run_id):
    """The primary key of ``run_id``; None for what is not a UUID (no such run)."""
    try:
        return Run._meta.pk.to_python(run_id)
    except ValidationError:
        return None


def record(
    run: Run,
    kind: str,
    *,
    fields: tuple[str, ...] = (),
    actor: str | None = None,
    source: str | None = None,
    data: dict | None = None,
    activity: list[dict] = (),
    also: tuple = (),
) -> Event:
    """Save ``fields`` of the locked ``run``, bump its version and write one event, with
    the ``activity`` entries of its live attempt that the change follows and the writes
    ``also`` made first (in the same statement)."""
    return _transition([run], kind, fields=fields, actor=actor, source=source,
                       data=lambda _: dict(data or {}), activity=activity, also=also)[0]


def record_each(runs: list[Run], kind: str, *, fields: tuple[str, ...] = (),
                actor: str | None = None, source: str | None = None,
                data: dict | None = None, also: tuple = ()) -> list[Event]:
    """``record`` for several locked runs that take the same step (a claim of a task
    message's runs): the runs' updates and the insert of all their events in one statement
    (``sql.write``), with the writes ``also`` made in it first (the claim's attempts)."""
    return _transition(runs, kind, fields=fields, actor=actor, source=source,
                       data=lambda run: dict(data or {}), also=also)


def _transition(runs: list[Run], kind: str, *, fields: tuple[str, ...], actor, source, data,
                also: tuple = (), children=None, activity: list[dict] = ()) -> list[Event]:
    """Bump the version of each locked run of ``runs``, write its ``fields`` and one
    ``kind`` event for it, and the writes ``also``: one statement on PostgreSQL. With
    ``children``, a function, the same statement reads the ids of the one run's children
    that have not ended, and ``children`` is given them once it is made (at the end of a
    ``sql.gathered`` block, in one); for a transition webhooks tell of, whether an
    endpoint is active (the deliveries are then written after it, in the same
    transaction). ``activity``: entries of the one run's live attempt, written before the
    change (``runs.domain.activity``).
    Returns the events; each run is published with its event once the transaction
    commits."""
    if activity:
        (run,) = runs
        noted = activity_log.staged(run, run.generation, activity)
        if noted:
            fields = (*fields, *activity_log.COUNTERS)
            also = (*also, sql.Insert(tuple(noted)))
            activity_log.published(run.pk, noted)
    events = []
    for run in runs:
        run.version += 1
        events.append(sql.new(Event, run=run, version=run.version, kind=kind,
                              state=run.state, end_cause=run.end_cause,
                              generation=run.generation, actor=actor, source=source,
                              data=data(run)))
    parts = [*also, *(sql.Update(run, (*fields, "version", "updated_at")) for run in runs),
             sql.Insert(tuple(events))]
    if children is not None:
        (parent,) = runs
        parts.append(sql.Keys(Run, {"parent": parent.pk}, {"state": RunState.ENDED}))
    told = any(webhooks.told_of(run, kind) for run in runs)
    if told:  # whether any webhook endpoint is active, read by the same statement
        parts.append(webhooks.ANY_ACTIVE)

    def written(answers):
        if told and answers[-1]:
            for run in runs:
                webhooks.run_changed(run, kind)
        after_commit(outside.changes.publish_changes,
                     changes=list(zip(runs, events, strict=True)))
        if children is not None:
            children(answers[0])

    sql.write(*parts, then=written)
    return events


def record_created(runs: list[Run], *, actor: str | None, source: str) -> None:
    """Insert new ``runs`` (made by ``sql.new``) as version 1, each with its ``created``
    event: one statement for the runs and their events (``sql.write``), however many there
    are."""
    events = []
    for run in runs:
        run.version = 1
        events.append(sql.new(Event, run=run, version=1, kind=EventKind.CREATED,
                              state=run.state, end_cause=run.end_cause,
                              generation=run.generation, actor=actor, source=source,
                              data=_created_data(run)))
    sql.write(sql.Insert(tuple(runs)), sql.Insert(tuple(events)))
    after_commit(outside.changes.publish_changes, changes=list(zip(runs, events, strict=True)))


def _created_data(run: Run) -> dict:
    data = {"agent": run.agent}
    if run.rerun_of_id is not None:
        data["rerun_of"] = str(run.rerun_of_id)
    return data


def after_commit(fn, /, **kwargs) -> None:
    """Call ``fn(**kwargs)`` once the transaction commits, never before and never if it
    rolls back. A failure there is logged, not raised: what committed stands, and the
    sweeper and the lease renewals recover a lost dispatch or delivery."""

    def hook():
        fn(**kwargs)

    # Django names the hook in its log line (a functools.partial has no name, and a
    # failing robust hook without one turns into an error of its own).
    name = getattr(fn, "__qualname__", None) or repr(fn)
    hook.__qualname__ = hook.__name__ = f"{getattr(fn, '__module__', '')}.{name}"
    transaction.on_commit(hook, robust=True)


def dispatch_after_commit(*runs: Run) -> None:
    """Hand the queued ``runs`` to workers once the transaction commits."""
    after_commit(outside.workers.runs_queued, runs=[(run.id, run.start_after) for run in runs])


def pending_intent(run: Run) -> ControlIntent | None:
    """The run's cancel or stop request that has not been applied yet, if any (read with
    the run by ``locked_run``)."""
    if run.control_id is None:
        return None
    return run.control if run.control.applied_at is None else None


def record_intent(run: Run, *, action: str, reason: str | None, stop_code: str | None,
                  actor: str, source: str, caused_by_id=None,
                  tell_attempt: bool = False) -> ControlIntent:
    """Write a control intent and its ``*_requested`` event (the run must be locked). With
    ``tell_attempt``, a running run's attempt is told live once the intent commits, before
    the change is published: the signal is what shortens the wait."""
    intent = sql.new(ControlIntent, run=run, action=action, reason=reason,
                     stop_code=stop_code, requested_by=actor, source=source,
                     caused_by_id=caused_by_id)
    run.control = intent
    if tell_attempt and run.state == RunState.RUNNING:
        after_commit(_send_cancel, run_id=run.id, generation=run.generation, owner=run.owner,
                     actor=actor, source=source)
    # One statement: the intent inserted first, the run's update naming the key it made.
    record(run, _requested_kind(action), fields=("control",), actor=actor, source=source,
           data=_request_data(reason, stop_code, caused_by_id), also=(sql.Insert((intent,)),))
    return intent


def record_joined(run: Run, pending: ControlIntent, *, action: str, reason: str | None,
                  stop_code: str | None, actor: str, source: str) -> None:
    """A cancel or stop asked while another is pending joins it: it changes nothing else,
    but who asked, when, from where and why is recorded as an event of its own."""
    data = _request_data(reason, stop_code, None)
    data["joined"] = pending.pk
    record(run, _requested_kind(action), actor=actor, source=source, data=data)


def _requested_kind(action: str) -> str:
    return EventKind.STOP_REQUESTED if action == ControlAction.STOP else EventKind.CANCEL_REQUESTED


def _request_data(reason, stop_code, caused_by_id) -> dict:
    data = {"reason": reason} if reason else {}
    if stop_code:
        data["stop_code"] = stop_code
    if caused_by_id is not None:
        data["caused_by"] = str(caused_by_id)
    return data


ERROR_CHARS = 2000  # of a failed run's error


@dataclass(frozen=True)
class Ending:
    """What a terminal commit says: the cause and its details."""

    cause: str
    output: object = None
    error: str | None = None
    stop_code: str | None = None
    stop_reason: str | None = None

    @classmethod
    def completed(cls, output=None) -> "Ending":
        """Completed with ``output``; failed, saying so, when the output encodes to more
        than AWAKEN_MAX_OUTPUT_BYTES (no page, answer or push then carries it)."""
        cap = settings.AWAKEN_MAX_OUTPUT_BYTES
        try:
            size = encoded_size(output)
        except (TypeError, ValueError):  # not JSON: refused where it is stored
            size = 0
        if size > cap:
            return cls.failed(f"The run's output is {size} bytes encoded, more than "
                              f"AWAKEN_MAX_OUTPUT_BYTES ({cap}): it was not kept.")
        return cls(EndCause.COMPLETED, output=output)

    @classmethod
    def failed(cls, error: str) -> "Ending":
        """A failure with its error, cut to ``ERROR_CHARS`` (a traceback can be long; the
        activity log keeps more of it)."""
        return cls(EndCause.FAILED, error=clipped(error, ERROR_CHARS) if error else "failed")

    @classmethod
    def cancelled(cls) -> "Ending":
        return cls(EndCause.CANCELLED)

    @classmethod
    def stopped(cls, code: str, reason: str) -> "Ending":
        return cls(EndCause.STOPPED, stop_code=code, stop_reason=reason)

    @classmethod
    def from_intent(cls, intent) -> "Ending":
        if intent.action == "stop":
            return cls.stopped(intent.stop_code or StopCode.OPERATOR, intent.reason or "stopped")
        return cls.cancelled()


def finish(
    run: Run,
    ending: Ending,
    *,
    generation: int | None = None,
    actor: str | None = None,
    source: str | None = None,
    via: str = AppliedVia.LIVE,
    trace: Trace | None = None,
    ran_until=None,
    activity: list[dict] = (),
) -> bool:
    """The finish boundary: commit ``ending`` as the run's terminal state, or refuse.

    ``run`` must be locked by the caller's transaction (``locked_run``). It is a
    compare-and-set: it succeeds only if the run is not ended and, when ``generation`` is
    given (an attempt finishing its own work), only if that attempt is still the run's live
    one. The first terminal commit wins; a refused call writes nothing and the caller drops
    its result. On success, in the same transaction:

    1. the run moves to ``ended`` with the cause, its details and ``ended_at``;
    2. the live attempt (if any) is closed and its running time added to the run (up to
       ``ran_until`` if given: a lost attempt's last renewal);
    3. the open ticket (if any) is revoked;
    4. the pending control intent (if any) is marked applied, ``via`` which path, with
       the stop receipt of the attempt's ``trace`` (``runs.domain.receipts``), counted on
       /metrics;
    5. exactly one ``ended`` event is written;
    6. each of its children that has not ended is asked to end (``end_children``).

    ``activity``: the entries attempt ``generation`` wrote since its last transition (the
    call it was stopped in, say), written in the same statement; and written all the same
    when the boundary refuses: they are a record of what the attempt did.
    """
    if run.state == RunState.ENDED or (generation is not None and (
            run.state != RunState.RUNNING or run.generation != generation)):
        if activity:
            activity_log.append(run, generation or run.generation, activity)
        return False

    now = timezone.now()
    fields = ["state", "end_cause", "ended_at"]
    also = []  # the other rows the boundary writes, in the run's own statement
    if run.state == RunState.RUNNING:
        lost = via == AppliedVia.SWEEPER
        released, close = _release(run, CloseReason.LOST if lost else ending.cause, now=now,
                                   ran_until=ran_until)
        fields += released
        also.append(close)
    if run.ticket is not None:
        ticket = run.ticket
        ticket.state, ticket.closed_at, ticket.closed_by = TicketState.REVOKED, now, actor
        also.append(sql.Update(ticket, ("state", "closed_at", "closed_by")))
        run.ticket = None
        fields.append("ticket")
    intent = pending_intent(run)
    if intent is not None:
        intent.applied_at = now
        intent.applied_via = via
        written = ("applied_at", "applied_via", "delivered_at")
        if trace is not None:
            intent.receipt = receipt(trace, intent.requested_at or now)
            written += ("receipt",)
            if totals := receipt_totals(intent.receipt):
                also.append(sql.Insert(totals))
        also.append(sql.Update(intent, written))

    run.state = RunState.ENDED
    run.end_cause = ending.cause
    run.ended_at = now
    data = {"cause": ending.cause}
    if ending.cause == EndCause.COMPLETED:
        run.output = ending.output
        fields.append("output")
    elif ending.cause == EndCause.FAILED:
        run.error = data["error"] = ending.error
        fields.append("error")
    elif ending.cause == EndCause.STOPPED:
        run.stop_code = data["stop_code"] = ending.stop_code
        run.stop_reason = data["stop_reason"] = ending.stop_reason
        fields += ["stop_code", "stop_reason"]
    _transition([run], EventKind.ENDED, fields=tuple(fields), actor=actor, source=source,
                data=lambda _: data, also=tuple(also), activity=activity,
                children=lambda ids: end_children(run, actor=actor, source=source,
                                                  children=ids))
    return True


def end_children(parent: Run, *, actor: str | None, source: str | None,
                 children: list | None = None) -> None:
    """No child runs on under an ended or lost parent (SPEC §7.10): each child that has not
    ended gets a cancel intent of its own naming the parent as the cause, in the parent's
    transaction. A queued or awaiting child ends at once (and its own children with it); a
    running one is told live after commit, and its lease renewal or expiry applies the
    intent if the signal is lost. A child with a request already pending keeps it.
    ``children``: their ids, when the caller has read them already."""
    if children is None:
        children = list(Run.objects.filter(parent_id=parent.pk).exclude(state=RunState.ENDED)
                        .order_by("pk").values_list("pk", flat=True))
    for child_id in children:
        child = locked_run(child_id)
        if child.state == RunState.ENDED or pending_intent(child) is not None:
            continue
        cause = parent.end_cause or "lost its attempt"
        intent = record_intent(child, action=ControlAction.CANCEL,
                               reason=f"Parent run {short_id(parent.pk)} {cause}.",
                               stop_code=None, actor=actor or source or "worker",
                               source=source or Source.WORKER, caused_by_id=parent.pk,
                               tell_attempt=True)
        if child.state != RunState.RUNNING:
            finish(child, Ending.cancelled(), actor=intent.requested_by, source=intent.source,
                   via=AppliedVia.DURABLE)


def _send_cancel(*, run_id, generation: int, owner: str, actor: str, source: str) -> None:
    """The live signal only shortens the wait, and nobody waits for it: if it is not taken,
    the attempt learns of the intent at its next lease renewal, or the sweeper applies it
    when the lease expires."""
    outside.workers.send_command(run_id=run_id, generation=generation, owner=owner,
                                 command="cancel", actor=actor, source=source)


def release_claim(run: Run, reason: str, *, now, ran_until=None) -> list[str]:
    """Close the run's live attempt and clear its claim; returns the run fields changed.

    The attempt's running time, up to ``ran_until`` if given (else ``now``), is added to
    the run's ``seconds_used``.
    """
    fields, close = _release(run, reason, now=now, ran_until=ran_until)
    sql.write(close)
    return fields


def _release(run: Run, reason: str, *, now, ran_until=None
             ) -> tuple[list[str], "sql.UpdateWhere"]:
    """``release_claim`` with the closing of the attempt left to the caller to write: the
    run fields changed, and that write."""
    # The live attempt is the run's current generation, found by that unique key: a
    # prepared statement cannot use the partial index on the live attempt (its state a
    # parameter), so PostgreSQL would plan it afresh at every end instead.
    close = sql.UpdateWhere(Attempt, {"state": AttemptState.CLOSED,
                                      "close_reason": CloseReason(reason), "closed_at": now},
                            {"run": run.pk, "generation": run.generation,
                             "state": AttemptState.LIVE})
    until = now if ran_until is None else min(now, ran_until)
    run.seconds_used += max(0.0, (until - run.claimed_at).total_seconds())
    run.owner = run.claimed_at = None
    return ["seconds_used", "owner", "claimed_at"], close
