"""Transitions made by a worker on behalf of one attempt of a run.

Every call names the attempt by ``(run_id, generation)``. A call from an attempt that is no
longer the run's live one (an older generation, a run that moved on) changes nothing: the
writes raise ``Fenced`` and the finish boundary answers False.
"""

import copy
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from runs.domain import activity as activity_log
from runs.domain import limits, outside, overview, prices, sql
from runs.domain.approvals import action_of
from runs.domain.bulk import bulk_jobs_resend
from runs.domain.core import (
    Ending,
    database_now,
    dispatch_after_commit,
    end_children,
    finish,
    locked_run,
    locked_runs,
    locked_runs_at,
    pending_intent,
    read_control,
    record,
    record_each,
    record_intent,
    release_claim,
    run_key,
    run_keys,
)
from runs.domain.errors import (
    Fenced,
    InvalidRequest,
    RunNotFound,
    WorkerDraining,
    WorkerNotFound,
)
from runs.domain.receipts import Trace
from runs.domain.schemas import check_schema
from runs.domain.text import quoted_id, short_id
from runs.models import (
    ActivityKind,
    AppliedVia,
    Attempt,
    AttemptState,
    CloseReason,
    ControlAction,
    ControlIntent,
    EventKind,
    OnExhausted,
    ResumeTicket,
    Run,
    RunState,
    Source,
    StopCode,
    TicketReason,
    WorkerProcess,
)


def attempt_start(*, run_id, owner: str, lease_seconds: float) -> Attempt | None:
    """Claim a queued run for a new attempt (generation + 1) owned by ``owner``.

    Returns None when the run is not queued any more (a redelivered task message, a run
    cancelled meanwhile) or not due yet (``start_after``): the caller just drops the task.
    """
    claimed = attempts_start(run_ids=[run_id], owner=owner, lease_seconds=lease_seconds)
    return claimed[0] if claimed else None


def attempts_start(*, run_ids, owner: str, lease_seconds: float,
                   unless_draining: bool = False) -> list[Attempt]:
    """Claim each run of ``run_ids`` that is queued and due, in one transaction: the runs
    that arrived in one task message. The others are skipped; unknown ids are ignored.

    With ``unless_draining`` (a task message's claim), a worker process ``owner`` that an
    operator drained claims none: WorkerDraining, asked by the statement that locks the
    runs. (No run to lock, no claim: nothing to ask.) A child run claimed by its parent's
    process is claimed even so."""
    with transaction.atomic():
        now = timezone.now()
        if unless_draining:
            locked, clock, draining = sql.lock_many_asking(
                Run, run_keys(run_ids), sql.Exists(WorkerProcess, {"owner": owner,
                                                                   "draining": True}))
            if draining:
                raise WorkerDraining(f"Worker {owner} is draining: it claims no new run.")
        else:
            locked, clock = locked_runs_at(run_ids)
        runs = [run for run in locked if run.state == RunState.QUEUED
                and not (run.start_after and run.start_after > now)]
        if not runs:
            return []
        granted = clock or database_now()
        expires = granted + timedelta(seconds=lease_seconds)
        attempts = []
        for run in runs:
            run.state = RunState.RUNNING
            run.generation += 1
            run.started_at = run.started_at or now
            run.owner, run.claimed_at = owner, now
            attempts.append(sql.new(Attempt, run=run, generation=run.generation, owner=owner,
                                    lease_expires_at=expires, renewed_at=granted))
        record_each(runs, EventKind.STARTED,
                    fields=("state", "generation", "started_at", "owner", "claimed_at"),
                    actor=owner, source="worker", data={"owner": owner},
                    also=(sql.Insert(tuple(attempts)),))
    return attempts


def _locked_current(run_id, generation: int, activity: list[dict] = ()) -> Run | None:
    """The run, locked, if attempt ``generation`` is its live one. Else None, with the
    attempt's ``activity`` written all the same (a record of what it did): the caller
    commits that, and then raises ``fenced``."""
    run = locked_run(run_id)
    if run.state == RunState.RUNNING and run.generation == generation:
        return run
    if activity:
        activity_log.append(run, generation, activity)
    return None


def _fenced(run_id, generation: int) -> Fenced:
    return Fenced(f"Attempt {generation} of run {run_id} is not the live attempt.")


def attempt_step(*, run_id, generation: int, tokens: int = 0, agent_state=None,
                 data: dict | None = None, actor: str | None = None,
                 source: str = "worker", activity: list[dict] = ()):
    """Commit one step: the checkpoint a later attempt continues from.

    Its model calls (``data["replies"]``, each with its model and usage) are priced
    (``runs.domain.prices``) and added to the run's ``cost_usd``; a model with no price
    makes the run's cost unknown (null) from then on, says so in the step's event, and
    writes a warning to the run's activity the first time. With ``max_repeats`` set, the
    step's tool calls (``data["tools"]``, by ``digest``) are added to the run's counts.
    ``actor`` and ``source``: who caused the step, when a live delivery (a message or a
    wake) led to it. ``activity``: the attempt's entries since its last transition, written
    in the step's statement (and all the same if the attempt is fenced). (``step_totals``
    is the arithmetic.)"""
    activity = list(activity)
    with transaction.atomic():
        run = _locked_current(run_id, generation, activity)
        if run is not None:
            _record_step(run, tokens=tokens, agent_state=agent_state, data=data, actor=actor,
                         source=source, activity=activity)
    if run is None:
        raise _fenced(run_id, generation)
    return run


@dataclass(frozen=True)
class StepTotals:
    """What a step makes of a run's usage (``step_totals``)."""

    steps: int
    tokens: int
    cost_usd: float | None
    repeats: dict | None  # the loop guard's counts; None: not counted (no max_repeats)
    step_cost: float | None  # the step's own model calls; None if it made none
    unpriced: list  # the models among them that have no price


def step_totals(*, steps: int, tokens: int, cost_usd: float | None, repeats: dict | None,
                max_repeats: int | None, step_tokens: int = 0,
                data: dict | None = None) -> StepTotals:
    """The run's usage once one more step with ``step_tokens`` and its event's ``data``
    is added to ``steps``, ``tokens``, ``cost_usd`` and ``repeats`` (the rule of
    ``attempt_step``). Pure: a worker's host reckons a step it has not written yet with
    it, and gets what the write will give."""
    data = data or {}
    step_cost, unpriced = None, []
    replies = data.get("replies") or []
    if replies:
        step_cost, unpriced = prices.replies_cost(replies)
        if unpriced:
            cost_usd = None
        elif cost_usd is not None:
            cost_usd += step_cost
    digests = [call["digest"] for call in data.get("tools") or () if call.get("digest")]
    counted = None
    if digests and max_repeats is not None:
        counted = dict(repeats or {})
        for digest in digests:
            counted[digest] = counted.get(digest, 0) + 1
    return StepTotals(steps=steps + 1, tokens=tokens + max(0, int(step_tokens)),
                      cost_usd=cost_usd, repeats=counted, step_cost=step_cost,
                      unpriced=unpriced)


def _record_step(run: Run, *, tokens: int = 0, agent_state=None, data: dict | None = None,
                 actor: str | None = None, source: str = "worker",
                 activity: list[dict]) -> None:
    """Write one step of the locked ``run``'s live attempt: its changes, its ``step``
    event and the attempt's ``activity`` before it, in one statement (``attempt_step``;
    ``attempt_finish`` writes an attempt's last step so)."""
    data = dict(data or {})
    totals = step_totals(steps=run.steps, tokens=run.tokens, cost_usd=run.cost_usd,
                         repeats=run.repeats, max_repeats=run.max_repeats,
                         step_tokens=tokens, data=data)
    run.steps, run.tokens = totals.steps, totals.tokens
    run.agent_state = agent_state
    fields = ["steps", "tokens", "agent_state"]
    if totals.step_cost is not None:
        data["cost_usd"] = None if totals.unpriced else totals.step_cost
        if totals.unpriced:
            data["unpriced_models"] = totals.unpriced
            if run.cost_usd is not None:
                activity.append({
                    "kind": ActivityKind.WARNING,
                    "text": f"Cost unknown: no price for model {', '.join(totals.unpriced)} "
                            "(set AWAKEN_MODEL_PRICES).",
                    "data": {"unpriced_models": totals.unpriced}})
        run.cost_usd = totals.cost_usd
        fields.append("cost_usd")
    if totals.repeats is not None:
        run.repeats = totals.repeats
        fields.append("repeats")
    record(run, EventKind.STEP, fields=tuple(fields), actor=actor, source=source,
           data={"step": run.steps, "tokens": tokens, **data}, activity=activity)


def usage_of(run: Run) -> dict:
    """A run's usage as a budget ticket's prompt says it."""
    return {"steps": run.steps, "tokens": run.tokens, "seconds": round(run.duration, 3),
            "cost_usd": run.cost_usd}


def budget_of(run: Run) -> dict:
    return {key: getattr(run, key) for key in limits.BUDGET_KEYS}


def attempt_budget_reached(*, run_id, generation: int, code: str, reason: str,
                           digest: str | None = None, trace: Trace | None = None,
                           activity: list[dict] = ()) -> ResumeTicket | bool:
    """A budget of the run is reached (``code``: a stop code, ``reason``: what to read).

    As the run asked (``on_exhausted``): it ends ``stopped`` with ``code``
    (``attempt_stop_by_policy``), or it moves to ``awaiting`` with a ticket of reason
    ``budget`` (``loop`` for the loop guard, ``code`` ``max_repeats``) whose prompt says
    which limit and the usage so far, keeping the state of its last committed step. The
    loop guard always pauses: a repeated call is a question for the operator, not an end.
    Returns the ticket, or whether the stop was applied.
    """
    loop = code == StopCode.MAX_REPEATS
    with transaction.atomic():
        run = _locked_current(run_id, generation, activity)
        if run is None:
            return False
        if not loop and run.on_exhausted != OnExhausted.PAUSE:
            return attempt_stop_by_policy(run_id=run_id, generation=generation, code=code,
                                          reason=reason, trace=trace, activity=activity)
        limit = next(key for key, stop in limits.STOP_CODES.items() if stop == code)
        prompt = {"limit": limit, "stop_code": code, "message": reason,
                  "budget": budget_of(run), "usage": usage_of(run)}
        if loop:
            prompt["digest"] = digest
            prompt["message"] += (" Resume to let it go on (its count starts again), or "
                                  "raise budget.max_repeats.")
        else:
            prompt["message"] += f" Resume with {{\"budget\": {{\"{limit}\": …}}}} to raise it."
        return attempt_pause(run_id=run_id, generation=generation,
                             reason=TicketReason.LOOP if loop else TicketReason.BUDGET,
                             prompt=prompt, schema=None if loop else RAISE_SCHEMA,
                             source=Source.POLICY, actor="policy", activity=activity)


# What a resume of a ``budget`` ticket gives: the budgets to raise.
RAISE_SCHEMA = {"type": "object", "required": ["budget"], "additionalProperties": False,
                "properties": {"budget": {"type": "object"}}}


def attempt_provider_failed(*, run_id, generation: int, error: str, status: int | None,
                            activity: list[dict] = ()) -> ResumeTicket | bool:
    """The provider kept failing past the client's retries. With
    ``AWAKEN_ON_PROVIDER_ERROR=pause`` the run moves to ``awaiting`` with a ticket of reason
    ``provider`` (the state of its last committed step kept), to be resumed once the
    provider is back; otherwise it fails with ``error``."""
    if settings.AWAKEN_ON_PROVIDER_ERROR != "pause":
        return attempt_finish(run_id=run_id, generation=generation,
                              ending=Ending.failed(error), activity=activity)
    return attempt_pause(run_id=run_id, generation=generation, reason=TicketReason.PROVIDER,
                         prompt={"message": f"{error} Resume once the provider is back.",
                                 "error": error, "status": status},
                         source=Source.POLICY, actor="policy", activity=activity)


def attempt_pause(*, run_id, generation: int, reason: str = TicketReason.MANUAL_PAUSE,
                  prompt=None, schema=None, agent_state=None, actor: str | None = None,
                  source: str | None = "worker", action: dict | None = None,
                  activity: list[dict] = ()) -> ResumeTicket | None:
    """Move the run to ``awaiting`` with a new open ticket; the attempt closes.

    ``schema`` (a JSON Schema) is what the resume input must satisfy; an invalid one is
    refused (InvalidRequest) and nothing changes. ``action`` (``tool``, ``arguments``,
    ``rationale``) binds an approval ticket to that one tool call (``runs.domain.approvals``).
    A pending cancel or stop wins over the pause: the run ends instead and None is returned.
    ``activity``: the attempt's entries since its last transition, written with it.
    """
    check_schema(schema)
    if action is not None:
        if reason != TicketReason.APPROVAL:
            raise InvalidRequest("Only an approval is bound to an action.", field="action")
        action = action_of(tool=action.get("tool"), arguments=action.get("arguments"),
                           rationale=action.get("rationale"))
    with transaction.atomic():
        run = _locked_current(run_id, generation, activity)
        if run is None:
            paused = None
        else:
            paused = _pause(run, reason=reason, prompt=prompt, schema=schema,
                            agent_state=agent_state, actor=actor, source=source,
                            action=action, activity=activity)
    if run is None:
        raise _fenced(run_id, generation)
    return paused


def _pause(run: Run, *, reason, prompt, schema, agent_state, actor, source, action,
           activity) -> ResumeTicket | None:
    generation = run.generation
    intent = pending_intent(run)
    if intent is not None:
        finish(run, Ending.from_intent(intent), generation=generation,
               actor=intent.requested_by, source=intent.source, activity=activity)
        return None
    released = release_claim(run, CloseReason.PAUSED, now=timezone.now())
    ticket = ResumeTicket.objects.create(
        run=run, generation=generation, reason=reason, prompt=prompt, schema=schema,
        action=action)
    run.state = RunState.AWAITING
    run.ticket = ticket
    run.agent_state = agent_state if agent_state is not None else run.agent_state
    record(run, EventKind.PAUSED, fields=("state", "ticket", "agent_state", *released),
           actor=actor, source=source, data={
               "ticket": str(ticket.pk), "reason": reason,
               **({"tool": action["tool"], "digest": action["digest"]} if action else {})},
           activity=activity)
    return ticket


def attempt_finish(*, run_id, generation: int, ending: Ending, actor: str | None = None,
                   source: str | None = "worker", trace: Trace | None = None,
                   step: dict | None = None, activity: list[dict] = ()) -> bool:
    """Finish the run from its live attempt. False: the result is late and is dropped.
    ``trace`` (``runs.domain.receipts``): the attempt's, for the receipt of a request that
    is pending; ``activity``: its entries since its last transition, written in the
    boundary's statement; the same for the transitions below.

    ``step``: the attempt's last step, not written yet (``attempt_step``'s arguments but
    the run's and the generation): written first in the same transaction, its ``step``
    event (with the activity) before the ``ended`` one, and in the same statement
    (``sql.gathered``). It is refused with the end when the attempt is not the live one
    any more, as ``attempt_step`` would refuse it alone."""
    with transaction.atomic():
        return _finish_locked(locked_run(run_id), generation=generation, ending=ending,
                              actor=actor, source=source, trace=trace, step=step,
                              activity=activity)


def attempts_finish(*, ends: list[dict]) -> list[bool]:
    """``attempt_finish`` for several runs whose attempts end together on one worker,
    each ``ends`` item its arguments: one transaction, the runs locked by one statement,
    then each end as it would be alone, in the order of the runs' ids (the order every
    statement that locks several runs or their attempts takes them in), all written by one
    statement (``sql.gathered``), then the children of each ended. Whether each was
    committed, in the order of ``ends``.

    One end a run, and no run an ancestor of another: an end locks the children it ends
    after every run of the statement, and a transaction that ends an ancestor (a cancel)
    locks them the other way round. A worker gathers the ends of runs with no parent. An
    error ends them all: nothing is committed, and the caller may make each alone."""
    keys = [run_key(end["run_id"]) for end in ends]
    if len(set(keys)) < len(keys):
        raise ValueError("One end a run in a transaction.")
    committed = [False] * len(ends)
    with transaction.atomic(), sql.gathered():
        runs = {run.pk: run for run in locked_runs(keys)}
        for index in sorted(range(len(ends)), key=lambda index: str(keys[index])):
            end = dict(ends[index])
            run_id = end.pop("run_id")
            if keys[index] not in runs:
                raise RunNotFound(f"No run with id {quoted_id(run_id)}.")
            committed[index] = _finish_locked(read_control(runs[keys[index]]), **end)
    return committed


def _finish_locked(run: Run, *, generation: int, ending: Ending, actor: str | None = None,
                   source: str | None = "worker", trace: Trace | None = None,
                   step: dict | None = None, activity: list[dict] = ()) -> bool:
    """``attempt_finish`` of ``run``, locked by the caller's transaction."""
    with sql.gathered():
        if step is not None and run.state == RunState.RUNNING and run.generation == generation:
            _record_step(run, **step, activity=list(activity))
            run, activity = _apart(run), ()  # the step's statement wrote the activity
        # Refused (with its step, if any): the activity is written all the same.
        return finish(run, ending, generation=generation, actor=actor, source=source,
                      trace=trace, activity=activity)


def _apart(run: Run) -> Run:
    """The locked ``run`` for the next transition of the same transaction: a copy (with
    its control intent's), so the change pushed after commit for the one before shows the
    run as that one left it, as when each was a transaction of its own."""
    later = copy.copy(run)
    if run.control_id is not None:
        later.control = copy.copy(run.control)
    return later


def attempt_interrupted(*, run_id, generation: int, actor: str | None = None,
                        source: str | None = None, accepted_at=None,
                        trace: Trace | None = None, activity: list[dict] = ()) -> bool:
    """End the run after its attempt's token was cancelled (at ``accepted_at``).

    The pending intent says how (cancelled, or stopped with its reason and code) and records
    when the attempt accepted the signal; a live-only cancel with no intent ends the run
    ``cancelled`` in the name of whoever delivered it.
    """
    with transaction.atomic():
        run = locked_run(run_id)
        intent = pending_intent(run)
        if intent is not None and intent.delivered_at is None:
            intent.delivered_at = accepted_at  # saved with the intent by the finish boundary
        if intent is not None:
            ending, actor, source = Ending.from_intent(intent), intent.requested_by, intent.source
        else:
            ending = Ending.cancelled()
        return finish(run, ending, generation=generation, actor=actor, source=source,
                      trace=trace, activity=activity)


PARENT_GONE = {"command": "was asked to end", "fenced": "lost its attempt",
               "budget": "ran out of budget", "parent": "was ended with its own parent"}


def attempt_parent_gone(*, run_id, generation: int, parent_id, why: str,
                        actor: str | None = None, source: str | None = None,
                        trace: Trace | None = None, activity: list[dict] = ()) -> bool:
    """End a child run whose attempt's token was cancelled with its parent's (``why``: how
    the parent's token was cancelled). Nothing ends without a record of why: a pending
    request is applied; otherwise a cancel intent naming the parent is recorded first."""
    with transaction.atomic():
        run = _locked_current(run_id, generation, activity)
        if run is None:
            return False
        intent = pending_intent(run) or record_intent(
            run, action=ControlAction.CANCEL, stop_code=None,
            reason=f"Parent run {short_id(parent_id)} {PARENT_GONE.get(why, 'ended')}.",
            actor=actor or "worker", source=source or Source.WORKER, caused_by_id=parent_id)
        return finish(run, Ending.from_intent(intent), generation=generation,
                      actor=intent.requested_by, source=intent.source, trace=trace,
                      activity=activity)


def attempt_stop_by_policy(*, run_id, generation: int, code: str, reason: str,
                           trace: Trace | None = None, activity: list[dict] = ()) -> bool:
    """A budget or other host policy ends the run ``stopped`` with ``code``.

    The policy's request is recorded like an operator's (source ``policy``); a cancel or
    stop already pending is applied instead, since it was asked for first.
    """
    with transaction.atomic():
        run = _locked_current(run_id, generation, activity)
        if run is None:
            return False
        intent = pending_intent(run) or record_intent(
            run, action=ControlAction.STOP, reason=reason, stop_code=code, actor="policy",
            source=Source.POLICY)
        return finish(run, Ending.from_intent(intent), generation=generation,
                      actor=intent.requested_by, source=intent.source, trace=trace,
                      activity=activity)


# A worker renews its attempts this many per statement. Each statement holds its attempts'
# row locks until it commits, so a finish boundary on one of them waits for one chunk's
# update at most, not for every attempt the worker holds.
RENEWAL_CHUNK = 500


def renewal_chunks(items: list, run_id) -> list[list]:
    """``items`` in the chunks a worker renews them in: in order of ``run_id(item)``, up to
    ``RENEWAL_CHUNK`` each, so that each chunk is one narrow range of run ids."""
    ordered = sorted(items, key=lambda item: str(run_id(item)))
    return [ordered[first:first + RENEWAL_CHUNK]
            for first in range(0, len(ordered), RENEWAL_CHUNK)]


@dataclass(frozen=True)
class Renewal:
    renewed: set  # (run_id, generation) of the attempts that still hold their claim
    intents: dict  # run_id -> its pending ControlIntent


def attempt_renew(*, owner: str, attempts: list[tuple], lease_seconds: float) -> Renewal:
    """Renew the leases of ``attempts`` (pairs of run id and generation) held by ``owner``.

    One UPDATE and two reads, for up to ``RENEWAL_CHUNK`` of a worker's attempts at a
    time (its executor renews them chunk by chunk). An attempt missing from
    ``renewed`` was fenced (reclaimed, expired or closed): its owner must cancel its token at
    once and commit nothing. ``intents`` carries the pending cancel or stop requests, so a
    lost live signal costs at most one renewal interval.
    """
    wanted = {(str(run_id), generation) for run_id, generation in attempts}
    run_ids = sorted({run_id for run_id, _ in wanted})
    if not run_ids:
        return Renewal(set(), {})
    # The range bounds the scan of the (owner, run) index to this chunk's part of the
    # owner's attempts; the planner applies the list of ids only as a filter.
    live = Attempt.objects.filter(owner=owner, state=AttemptState.LIVE, run_id__gte=run_ids[0],
                                  run_id__lte=run_ids[-1], run_id__in=run_ids)
    live.update(lease_expires_at=Now() + timedelta(seconds=lease_seconds), renewed_at=Now())
    # Read after the update: an attempt closed before it was not renewed and is absent here;
    # one closed after it cannot be, its lease being fresh. Unordered: the default order
    # would join every attempt's run.
    renewed = {(str(run_id), generation) for run_id, generation
               in live.order_by().values_list("run_id", "generation")} & wanted
    # Every pending request, read through the partial index that holds only those: they
    # are few, whatever the history. Asked by the ids of thousands of attempts instead, the
    # planner may read every request ever made, or every attempt and run, as its
    # statistics lead it.
    renewed_runs = {run_id for run_id, _ in renewed}
    intents = {str(intent.run_id): intent
               for intent in ControlIntent.objects.filter(applied_at__isnull=True).order_by()
               if str(intent.run_id) in renewed_runs}
    return Renewal(renewed, intents)


def attempt_expire(*, run_id, generation: int, max_crash_retries: int) -> str | None:
    """The sweeper's transition for an attempt whose lease ran out (SPEC §6).

    1. a pending cancel or stop is applied as the terminal state;
    2. otherwise the run is queued again for a new attempt, within ``max_crash_retries``;
    3. past that budget it ends ``failed`` ("worker lost").
    The attempt is charged running time up to its last renewal, not the outage after it:
    nothing is known to have run since. Returns what it did, or None if the attempt was
    renewed or closed meanwhile.
    """
    with transaction.atomic():
        run = locked_run(run_id)
        if run.state != RunState.RUNNING or run.generation != generation:
            return None
        now = timezone.now()
        renewed = (Attempt.objects.filter(run=run, generation=generation)
                   .values_list("renewed_at", flat=True).first())
        # Closing the attempt is the check, in one statement on its row: a renewal that
        # commits first leaves nothing expired to close; one that comes after finds the
        # attempt closed and reports it fenced. Expiry is read on the database's clock.
        closed = Attempt.objects.filter(
            run=run, generation=generation, state=AttemptState.LIVE,
            lease_expires_at__lt=Now()).update(state=AttemptState.CLOSED,
                                               close_reason=CloseReason.LOST, closed_at=now)
        if not closed:
            return None
        end_children(run, actor=None, source=Source.WORKER)  # its attempt's children are lost
        intent = pending_intent(run)
        if intent is not None:
            finish(run, Ending.from_intent(intent), actor=intent.requested_by,
                   source=intent.source, via=AppliedVia.SWEEPER, ran_until=renewed)
            return "applied"
        if run.crash_retries >= max_crash_retries:
            finish(run, Ending.failed("worker lost"), source="worker", via=AppliedVia.SWEEPER,
                   ran_until=renewed)
            return "failed"
        released = release_claim(run, CloseReason.LOST, now=now, ran_until=renewed)
        run.crash_retries += 1
        run.state = RunState.QUEUED
        run.dispatched_at = now
        record(run, EventKind.REQUEUED, fields=("crash_retries", "state", "dispatched_at",
                                                 *released),
               source="worker", data={"lost_generation": generation,
                                      "crash_retries": run.crash_retries})
        dispatch_after_commit(run)
        return "requeued"


def runs_redispatch(*, older_than: float, limit: int = 100) -> list:
    """Queued runs that are due and were last handed to a worker ``older_than`` seconds ago:
    their broker message may be lost, so send another (a duplicate claim is refused)."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=older_than)
    due = (Q(start_after__isnull=True) | Q(start_after__lte=now))
    candidates = list(Run.objects.filter(due, state=RunState.QUEUED, dispatched_at__lt=cutoff)
                      .values_list("id", "dispatched_at")[:limit])
    sent = []
    for run_id, dispatched_at in candidates:
        # Compare-and-set on dispatched_at: two sweepers never both send.
        if Run.objects.filter(pk=run_id, state=RunState.QUEUED, dispatched_at=dispatched_at
                              ).update(dispatched_at=now):
            sent.append(run_id)
    if sent:
        outside.workers.runs_queued(runs=[(run_id, None) for run_id in sent])
    return sent


def worker_report(*, owner: str, live_attempts: int, abandoned_tools: int,
                  capacity: int = 0) -> None:
    """A worker process's figures, written with each of its lease renewals (whether it is
    draining is the operators' and is kept)."""
    WorkerProcess.objects.update_or_create(
        owner=owner, defaults={"reported_at": timezone.now(), "live_attempts": live_attempts,
                               "abandoned_tools": abandoned_tools, "capacity": capacity})


def worker_drain(*, name: str, draining: bool, actor: str) -> WorkerProcess:
    """Drain a worker process (it claims no new run; its live attempts go on) or undrain
    it, recording who and when. WorkerNotFound if no such worker reported."""
    changed = WorkerProcess.objects.filter(owner=name).update(
        draining=draining, drained_by=actor, drained_at=timezone.now())
    if not changed:
        raise WorkerNotFound(f"No worker named {name!r} has reported.")
    return WorkerProcess.objects.get(owner=name)


WORKER_REPORTS_KEPT = timedelta(hours=1)


def sweep(*, limit: int = 200) -> dict:
    """One pass of the sweeper (SPEC §6): expired leases, then queued runs whose message
    may be lost, then bulk jobs that nobody moves on; and the minute's sample of live runs
    by state for the overview, if not taken yet. Each row is its own compare-and-set
    transition, so sweeps may overlap."""
    counts = {"applied": 0, "requeued": 0, "failed": 0, "redispatched": 0}
    expired = (Attempt.objects.filter(state=AttemptState.LIVE, lease_expires_at__lt=Now())
               .order_by("lease_expires_at").values_list("run_id", "generation")[:limit])
    for run_id, generation in list(expired):
        outcome = attempt_expire(run_id=run_id, generation=generation,
                                 max_crash_retries=settings.AWAKEN_MAX_CRASH_RETRIES)
        if outcome:
            counts[outcome] += 1
    counts["redispatched"] = len(runs_redispatch(older_than=settings.AWAKEN_LEASE_SECONDS,
                                                 limit=limit))
    counts["bulk_resent"] = len(bulk_jobs_resend(older_than=2 * settings.AWAKEN_LEASE_SECONDS,
                                                 limit=limit))
    WorkerProcess.objects.filter(reported_at__lt=timezone.now() - WORKER_REPORTS_KEPT).delete()
    overview.record_live_sample()
    return counts
