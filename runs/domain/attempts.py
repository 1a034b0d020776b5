"""Transitions made by a worker on behalf of one attempt of a run.

Every call names the attempt by ``(run_id, generation)``. A call from an attempt that is no
longer the run's live one (an older generation, a run that moved on) changes nothing: the
writes raise ``Fenced`` and the finish boundary answers False.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from runs.domain import outside, sql
from runs.domain.approvals import action_of
from runs.domain.bulk import bulk_jobs_resend
from runs.domain.core import (
    Ending,
    database_now,
    dispatch_after_commit,
    end_children,
    finish,
    locked_run,
    locked_runs_at,
    pending_intent,
    record,
    record_each,
    record_intent,
    release_claim,
)
from runs.domain.errors import Fenced, InvalidRequest
from runs.domain.schemas import check_schema
from runs.domain.text import short_id
from runs.models import (
    AppliedVia,
    Attempt,
    AttemptState,
    CloseReason,
    ControlAction,
    ControlIntent,
    EventKind,
    ResumeTicket,
    Run,
    RunState,
    Source,
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


def attempts_start(*, run_ids, owner: str, lease_seconds: float) -> list[Attempt]:
    """Claim each run of ``run_ids`` that is queued and due, in one transaction: the runs
    that arrived in one task message. The others are skipped; unknown ids are ignored."""
    with transaction.atomic():
        now = timezone.now()
        locked, clock = locked_runs_at(run_ids)
        runs = [run for run in locked if run.state == RunState.QUEUED
                and not (run.start_after and run.start_after > now)]
        if not runs:
            return []
        expires = (clock or database_now()) + timedelta(seconds=lease_seconds)
        attempts = []
        for run in runs:
            run.state = RunState.RUNNING
            run.generation += 1
            run.started_at = run.started_at or now
            run.owner, run.claimed_at = owner, now
            attempts.append(sql.new(Attempt, run=run, generation=run.generation, owner=owner,
                                    lease_expires_at=expires))
        record_each(runs, EventKind.STARTED,
                    fields=("state", "generation", "started_at", "owner", "claimed_at"),
                    actor=owner, source="worker", data={"owner": owner},
                    also=(sql.Insert(tuple(attempts)),))
    return attempts


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
                  prompt=None, schema=None, agent_state=None, actor: str | None = None,
                  source: str | None = "worker", action: dict | None = None,
                  ) -> ResumeTicket | None:
    """Move the run to ``awaiting`` with a new open ticket; the attempt closes.

    ``schema`` (a JSON Schema) is what the resume input must satisfy; an invalid one is
    refused (InvalidRequest) and nothing changes. ``action`` (``tool``, ``arguments``,
    ``rationale``) binds an approval ticket to that one tool call (``runs.domain.approvals``).
    A pending cancel or stop wins over the pause: the run ends instead and None is returned.
    """
    check_schema(schema)
    if action is not None:
        if reason != TicketReason.APPROVAL:
            raise InvalidRequest("Only an approval is bound to an action.", field="action")
        action = action_of(tool=action.get("tool"), arguments=action.get("arguments"),
                           rationale=action.get("rationale"))
    with transaction.atomic():
        run = _locked_current(run_id, generation)
        intent = pending_intent(run)
        if intent is not None:
            finish(run, Ending.from_intent(intent), generation=generation,
                   actor=intent.requested_by, source=intent.source)
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
                   **({"tool": action["tool"], "digest": action["digest"]} if action else {})})
    return ticket


def attempt_finish(*, run_id, generation: int, ending: Ending, actor: str | None = None,
                   source: str | None = "worker") -> bool:
    """Finish the run from its live attempt. False: the result is late and is dropped."""
    with transaction.atomic():
        run = locked_run(run_id)
        return finish(run, ending, generation=generation, actor=actor, source=source)


def attempt_interrupted(*, run_id, generation: int, actor: str | None = None,
                        source: str | None = None, accepted_at=None) -> bool:
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
        return finish(run, ending, generation=generation, actor=actor, source=source)


PARENT_GONE = {"command": "was asked to end", "fenced": "lost its attempt",
               "budget": "ran out of budget", "parent": "was ended with its own parent"}


def attempt_parent_gone(*, run_id, generation: int, parent_id, why: str,
                        actor: str | None = None, source: str | None = None) -> bool:
    """End a child run whose attempt's token was cancelled with its parent's (``why``: how
    the parent's token was cancelled). Nothing ends without a record of why: a pending
    request is applied; otherwise a cancel intent naming the parent is recorded first."""
    with transaction.atomic():
        run = locked_run(run_id)
        if run.state != RunState.RUNNING or run.generation != generation:
            return False
        intent = pending_intent(run) or record_intent(
            run, action=ControlAction.CANCEL, stop_code=None,
            reason=f"Parent run {short_id(parent_id)} {PARENT_GONE.get(why, 'ended')}.",
            actor=actor or "worker", source=source or Source.WORKER, caused_by_id=parent_id)
        return finish(run, Ending.from_intent(intent), generation=generation,
                      actor=intent.requested_by, source=intent.source)


def attempt_stop_by_policy(*, run_id, generation: int, code: str, reason: str) -> bool:
    """A budget or other host policy ends the run ``stopped`` with ``code``.

    The policy's request is recorded like an operator's (source ``policy``); a cancel or
    stop already pending is applied instead, since it was asked for first.
    """
    with transaction.atomic():
        run = locked_run(run_id)
        if run.state != RunState.RUNNING or run.generation != generation:
            return False
        intent = pending_intent(run) or record_intent(
            run, action=ControlAction.STOP, reason=reason, stop_code=code, actor="policy",
            source=Source.POLICY)
        return finish(run, Ending.from_intent(intent), generation=generation,
                      actor=intent.requested_by, source=intent.source)


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
    live.update(lease_expires_at=Now() + timedelta(seconds=lease_seconds))
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
    Returns what it did, or None if the attempt was renewed or closed meanwhile.
    """
    with transaction.atomic():
        run = locked_run(run_id)
        if run.state != RunState.RUNNING or run.generation != generation:
            return None
        now = timezone.now()
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
                   source=intent.source, via=AppliedVia.SWEEPER)
            return "applied"
        if run.crash_retries >= max_crash_retries:
            finish(run, Ending.failed("worker lost"), source="worker", via=AppliedVia.SWEEPER)
            return "failed"
        released = release_claim(run, CloseReason.LOST, now=now)
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


def worker_report(*, owner: str, live_attempts: int, abandoned_tools: int) -> None:
    """A worker process's figures, written with each of its lease renewals."""
    WorkerProcess.objects.update_or_create(
        owner=owner, defaults={"reported_at": timezone.now(), "live_attempts": live_attempts,
                               "abandoned_tools": abandoned_tools})


WORKER_REPORTS_KEPT = timedelta(hours=1)


def sweep(*, limit: int = 200) -> dict:
    """One pass of the sweeper (SPEC §6): expired leases, then queued runs whose message
    may be lost, then bulk jobs that nobody moves on. Each row is its own compare-and-set
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
    return counts
