"""A model-based test of the run-control domain (SPEC §2-§7).

A hypothesis state machine drives the domain in random orders: create (children
of running runs included), claim, step, pause at a step boundary, finish, stop by policy,
interrupted and parent-gone ends, lease renewal, a lease running out, expiry and sweeps,
cancel, stop, ticket revocation, resume, and the live commands. Each call is made by a
current or a stale attempt (``back`` generations behind), with current or old tickets.

Beside the domain runs a small reference model of what SPEC §2-§6 say each call must do
(which calls are refused, the state, end cause, generation, open ticket, pending request,
claim and step count of every run). After every step the database is compared with the
model, and SPEC §7 is checked on what committed:

* at most one live attempt per run, and exactly one while it runs, holding its claim;
* the first committed terminal state wins: one ``ended`` event, the last one, and the
  ended run never changes again (late steps and results are refused and write nothing,
  resumes fail closed);
* a consumed or revoked ticket stays closed and wakes nothing; at most one open ticket;
* every cancel or stop is recorded (an intent, or a request joining one), and a live
  cancel signal goes out only once its intent is committed; every cancelled or stopped run
  names who asked;
* the children of an ended parent have ended or have a cancel pending;
* generations only increase; each run's events have versions 1..n in increasing ``seq``,
  and no event is ever changed or removed;
* a run is handed to a worker only once it committed queued, and the representation last
  published of each run is the one the database holds.

The ``workers`` interface is a fake (through ``runs.domain.outside.connect``): its registry holds
the attempts the machine claimed, takes a live command only for the attempt holding the
claim as committed, and a cancel cancels that attempt's token. The ``changes`` port keeps
what each publication would push. Each example runs in a savepoint rolled back at its end,
and the transaction's after-commit hooks run when each step's calls are done.

Small by default; ``MODEL_EXAMPLES`` and ``MODEL_STEPS`` make it larger, e.g.

    MODEL_EXAMPLES=2000 MODEL_STEPS=80 .venv/bin/pytest tests/test_model.py -p no:cacheprovider

and ``DATABASE_URL=postgres://...`` runs it on PostgreSQL.
"""

import os
import sys
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

import hypothesis
import pytest
from django.db import transaction
from django.test import TestCase
from django.utils import timezone
from hypothesis import HealthCheck
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from runs import domain
from runs.domain import outside
from runs.domain.representation import run_data
from runs.models import (
    Attempt,
    AttemptState,
    ControlIntent,
    EndCause,
    Event,
    EventKind,
    ResumeTicket,
    Run,
    RunState,
    StopCode,
    TicketState,
    WorkerProcess,
)

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.getenv("MODEL_EXAMPLES", "80"))
STEPS = int(os.getenv("MODEL_STEPS", "40"))
MAX_RUNS = 8
OWNERS = ("host-a:1", "host-b:2")
ACTORS = ("olga", "oscar")
MAX_CRASH_RETRIES = 2
APPROVAL = {"type": "object", "properties": {"approved": {"type": "boolean"}},
            "required": ["approved"]}
TRIED: Counter = Counter()  # domain calls made, by rule and answer (and "examples" run)
PICK = st.integers(0, 10**6)
BACK = st.sampled_from([0, 0, 0, 1, 2])  # how many generations behind the caller is

QUEUED, RUNNING, AWAITING, ENDED = (RunState.QUEUED, RunState.RUNNING, RunState.AWAITING,
                                    RunState.ENDED)


# --- the outside interfaces -----------------------------------------------------------------


@dataclass
class FakeAttempt:
    owner: str
    cancelled_by: str | None = None  # its token, cancelled by whom
    pause_requested: bool = False
    inbox: list = field(default_factory=list)


class FakeWorkers:
    """The ``workers`` interface: the attempts the test plays, by ``(run_id, generation)``."""

    def __init__(self):
        self.attempts: dict[tuple[str, int], FakeAttempt] = {}
        self.queued: list[str] = []
        self.signals: list[tuple] = []
        self.violations: list[str] = []
        # Set while a call of several transactions runs (a sweep): its hooks run here once
        # it returns, after its later transactions, as the test's savepoints commit nothing.
        self.several_transactions = False

    def runs_queued(self, *, runs) -> None:
        for run_id, _ in runs:
            if not (Run.objects.filter(pk=run_id, state=QUEUED).exists()
                    or self.several_transactions and self.ended_from_queued(run_id)):
                self.violations.append(f"run {run_id} handed to a worker but not queued")
            self.queued.append(str(run_id))

    @staticmethod
    def ended_from_queued(run_id) -> bool:
        """The run's last transition went from committed queued to ended: a sweep requeued
        it, then ended it in a later transaction of its own (its parent's attempt was lost
        too), and the hand-over ran between the two."""
        states = list(Event.objects.filter(run_id=run_id).order_by("-seq")
                      .values_list("state", flat=True)[:2])
        return states == [ENDED, QUEUED]

    def send_command_and_wait(self, *, run_id, generation, owner, command, actor=None,
                              source=None, message=None) -> None:
        attempt = self.attempts.get((str(run_id), generation))
        # As a durable host does: the claim is checked as committed before delivery.
        holds = owner is not None and Run.objects.filter(
            pk=run_id, state=RUNNING, generation=generation, owner=owner).exists()
        if attempt is None or attempt.owner != owner or not holds:
            raise domain.NotActive(f"Nothing here takes the {command} of run {run_id}.")
        if command == "cancel":
            attempt.cancelled_by = attempt.cancelled_by or actor
        elif command == "pause":
            attempt.pause_requested = True
        else:
            attempt.inbox.append(message)

    def send_command(self, *, run_id, generation, owner, command, actor=None,
                     source=None) -> None:
        if not ControlIntent.objects.filter(run_id=run_id, requested_by=actor,
                                            source=source).exists():
            self.violations.append(f"a {command} signal to run {run_id} before its intent")
        self.signals.append((str(run_id), generation, owner, command))
        attempt = self.attempts.get((str(run_id), generation))
        if attempt is not None and attempt.owner == owner and command == "cancel":
            attempt.cancelled_by = attempt.cancelled_by or actor

    def bulk_queued(self, *, job_id) -> None:
        pass


class PublishedChanges:
    """The ``changes`` interface: the newest representation published of each run."""

    def __init__(self, workers: FakeWorkers):
        self.latest: dict[str, dict] = {}
        self.violations = workers.violations

    def publish_changes(self, *, changes) -> None:
        for run, event in changes:
            data = run_data(run)
            if data["version"] < event.version:
                self.violations.append(f"run {run.id} published at version {data['version']} "
                                       f"with event version {event.version}")
            known = self.latest.get(str(run.id))
            if known is None or data["version"] >= known["version"]:
                self.latest[str(run.id)] = data

    def publish_bulk(self, *, job) -> None:
        pass

    def publish_activity(self, *, run_id, entries) -> None:
        pass  # a log, not state: no rule of SPEC §7 reads it


@pytest.fixture(scope="module", autouse=True)
def report_the_count(request):
    yield
    examples = TRIED.pop("examples", 0)
    if TRIED:
        answers: dict[str, list] = {}
        for (name, answer), count in sorted(TRIED.items(), key=str):
            answers.setdefault(name, []).append(f"{answer} {count}")
        lines = [f"{name}: {', '.join(counts)}" for name, counts in answers.items()]
        plugins = request.config.pluginmanager
        with plugins.get_plugin("capturemanager").global_and_fixture_disabled():
            plugins.get_plugin("terminalreporter").write_line(
                f"\nmodel: {examples} examples, {sum(TRIED.values())} domain calls\n  "
                + "\n  ".join(lines))


@pytest.fixture
def outside_restored():
    """The machine plugs fakes into the outside interfaces; the real adapters come back
    afterwards."""
    workers, changes = outside.workers, outside.changes
    yield
    outside.connect(workers=workers, changes=changes)


# --- the reference model --------------------------------------------------------------------


@dataclass
class Model:
    """What SPEC §2-§6 say one run's committed state is."""

    id: str
    parent: str | None
    state: str = QUEUED
    generation: int = 0
    owner: str | None = None
    end_cause: str | None = None
    stop_code: str | None = None
    ticket: str | None = None  # the open ticket
    schema: dict | None = None
    intent: tuple | None = None  # the pending request: (action, stop_code)
    requests: int = 0  # cancel and stop requests recorded (intents and joined ones)
    crash_retries: int = 0
    steps: int = 0
    lapsed: int | None = None  # the live attempt's lease ran out, in this order


def outcome(call):
    """What a domain call answered: ("ok", value) or the name of the error it raised."""
    try:
        return "ok", call()
    except domain.ServiceError as error:
        return type(error).__name__, None


class RunControl(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        TRIED["examples"] += 1
        self.workers = FakeWorkers()
        self.published = PublishedChanges(self.workers)
        outside.connect(workers=self.workers, changes=self.published)
        self.savepoint = transaction.atomic()
        self.savepoint.__enter__()
        self.runs: dict[str, Model] = {}
        self.order: list[str] = []
        self.tickets: list[str] = []  # every ticket issued
        self.closed_tickets: dict[str, str] = {}
        self.lapses = 0
        self.max_seq = 0
        self.history: dict[str, list] = {}  # each run's events as first seen
        self.ended: dict[str, tuple] = {}  # each run's terminal state as first seen
        self.generations: dict[str, int] = {}

    def teardown(self):
        transaction.set_rollback(True)
        self.savepoint.__exit__(None, None, None)

    # helpers

    def call(self, fn):
        """Call a domain function as a step: its after-commit hooks run once it returns. The answer
        is counted under the rule's name."""
        with TestCase.captureOnCommitCallbacks(execute=True):
            answer, value = outcome(fn)
        shown = value if isinstance(value, (bool, str)) or value is None else "ok"
        TRIED[sys._getframe(1).f_code.co_name, answer if answer != "ok" else shown] += 1
        return answer, value

    def pick(self, pick: int, *states: str) -> Model:
        """A run: seven times in eight one in ``states`` if there is one, else any run."""
        runs = [self.runs[run_id] for run_id in self.order]
        preferred = [run for run in runs if run.state in states]
        if preferred and pick % 8:
            runs = preferred
        return runs[pick // 8 % len(runs)]

    def in_state(self, state: str = RUNNING) -> list[Model]:
        return [run for run in self.runs.values() if run.state == state]

    def children(self, parent: Model) -> list[Model]:
        return [run for run in self.runs.values() if run.parent == parent.id]

    def live(self, run: Model, generation: int) -> bool:
        return run.state == RUNNING and run.generation == generation

    def end(self, run: Model, cause: str, stop_code: str | None = None) -> bool:
        """The finish boundary, in the model."""
        if run.state == ENDED:
            return False
        if run.ticket is not None:
            self.closed_tickets[run.ticket] = TicketState.REVOKED
        run.state, run.end_cause, run.stop_code = ENDED, cause, stop_code
        run.ticket = run.schema = run.intent = run.owner = run.lapsed = None
        self.end_children(run)
        return True

    def end_children(self, parent: Model) -> None:
        for child in self.children(parent):
            if child.state == ENDED or child.intent is not None:
                continue
            child.intent, child.requests = ("cancel", None), child.requests + 1
            if child.state != RUNNING:
                self.end(child, EndCause.CANCELLED)

    def end_as_asked(self, run: Model) -> bool:
        action, code = run.intent
        if action == "stop":
            return self.end(run, EndCause.STOPPED, code)
        return self.end(run, EndCause.CANCELLED)

    def release(self, run: Model) -> None:
        """The run's attempt is over: its worker forgets it."""
        self.workers.attempts.pop((run.id, run.generation), None)

    # the domain

    @initialize(count=st.integers(1, 4), claimed=st.integers(0, 4))
    def start(self, count, claimed):
        """A few runs to start with, some of them claimed."""
        for index in range(count):
            self.create(parent=None, dispatch=bool(index % 2))
        if claimed:
            self.claim(picks=list(range(0, 8 * claimed, 8)), owner=OWNERS[claimed % 2])

    @precondition(lambda self: len(self.runs) < MAX_RUNS)
    @rule(parent=st.none() | PICK, dispatch=st.booleans())
    def create(self, parent, dispatch):
        running = [run for run in self.runs.values() if run.state == RUNNING]
        parent_id = running[parent % len(running)].id if parent is not None and running else None
        answer, made = self.call(lambda: domain.run_create(
            agent="demo.steps", parent_id=parent_id, dispatch=dispatch)[0])
        assert answer == "ok"
        run = Model(str(made.id), parent_id)
        self.runs[run.id] = run
        self.order.append(run.id)
        assert (run.id in self.workers.queued) == dispatch

    @precondition(lambda self: any(run.state == QUEUED for run in self.runs.values()))
    @rule(picks=st.lists(PICK, min_size=1, max_size=3), owner=st.sampled_from(OWNERS))
    def claim(self, picks, owner):
        wanted = {self.pick(pick, QUEUED).id for pick in picks}
        answer, attempts = self.call(lambda: domain.attempts_start(
            run_ids=sorted(wanted), owner=owner, lease_seconds=30))
        expected = set()
        for run_id in wanted:
            run = self.runs[run_id]
            if run.state == QUEUED:
                run.state, run.owner = RUNNING, owner
                run.generation += 1
                expected.add((run.id, run.generation))
                self.workers.attempts[(run.id, run.generation)] = FakeAttempt(owner)
        assert {(str(a.run_id), a.generation) for a in attempts} == expected

    @precondition(lambda self: self.in_state())
    @rule(pick=PICK, back=BACK)
    def step(self, pick, back):
        run = self.pick(pick, RUNNING)
        generation = run.generation - back
        answer, _ = self.call(lambda: domain.attempt_step(
            run_id=run.id, generation=generation, tokens=3, agent_state={"at": run.steps}))
        if self.live(run, generation):
            assert answer == "ok"
            run.steps += 1
        else:
            assert answer == "Fenced"

    @precondition(lambda self: self.in_state())
    @rule(pick=PICK, back=BACK, ask=st.booleans())
    def pause_at_boundary(self, pick, back, ask):
        run = self.pick(pick, RUNNING)
        generation = run.generation - back
        schema = APPROVAL if ask else None
        answer, ticket = self.call(lambda: domain.attempt_pause(
            run_id=run.id, generation=generation, reason="approval" if ask else "manual_pause",
            schema=schema))
        if not self.live(run, generation):
            assert answer == "Fenced"
            return
        assert answer == "ok"
        self.release(run)
        if run.intent is not None:  # a pending cancel or stop wins over the pause
            assert ticket is None
            self.end_as_asked(run)
            return
        run.state, run.owner, run.lapsed = AWAITING, None, None
        run.ticket, run.schema = str(ticket.pk), schema
        self.tickets.append(run.ticket)

    @precondition(lambda self: self.in_state())
    @rule(pick=PICK, back=BACK, cause=st.sampled_from([EndCause.COMPLETED, EndCause.FAILED]))
    def finish(self, pick, back, cause):
        run = self.pick(pick, RUNNING)
        generation = run.generation - back
        ending = (domain.Ending.completed({"steps": run.steps}) if cause == EndCause.COMPLETED
                  else domain.Ending.failed("it broke"))
        answer, finished = self.call(lambda: domain.attempt_finish(
            run_id=run.id, generation=generation, ending=ending))
        expected = self.live(run, generation)
        if expected:
            self.release(run)
            self.end(run, cause)
        assert (answer, finished) == ("ok", expected)

    @precondition(lambda self: self.in_state())
    @rule(pick=PICK, back=BACK)
    def stop_by_policy(self, pick, back):
        run = self.pick(pick, RUNNING)
        generation = run.generation - back
        answer, stopped = self.call(lambda: domain.attempt_stop_by_policy(
            run_id=run.id, generation=generation, code=StopCode.MAX_STEPS,
            reason="Out of steps."))
        expected = self.live(run, generation)
        if expected:
            self.release(run)
            if run.intent is None:
                run.intent, run.requests = ("stop", StopCode.MAX_STEPS), run.requests + 1
            self.end_as_asked(run)
        assert (answer, stopped) == ("ok", expected)

    @precondition(lambda self: self.in_state())
    @rule(pick=PICK, back=BACK, actor=st.sampled_from(ACTORS))
    def interrupted(self, pick, back, actor):
        """The attempt's token was cancelled (by a live cancel, a signal or a renewal)."""
        run = self.pick(pick, RUNNING)
        generation = run.generation - back
        answer, ended = self.call(lambda: domain.attempt_interrupted(
            run_id=run.id, generation=generation, actor=actor, source="api",
            accepted_at=timezone.now()))
        expected = self.live(run, generation)
        if expected:
            self.release(run)
            if run.intent is not None:
                self.end_as_asked(run)
            else:
                self.end(run, EndCause.CANCELLED)
        assert (answer, ended) == ("ok", expected)

    @precondition(lambda self: any(run.parent for run in self.in_state()))
    @rule(pick=PICK, back=BACK)
    def parent_gone(self, pick, back):
        children = [run for run in self.runs.values() if run.parent]
        running = [run for run in children if run.state == RUNNING]
        run = running[pick % len(running)] if pick % 8 else children[pick % len(children)]
        generation = run.generation - back
        answer, ended = self.call(lambda: domain.attempt_parent_gone(
            run_id=run.id, generation=generation, parent_id=run.parent, why="command"))
        expected = self.live(run, generation)
        if expected:
            self.release(run)
            if run.intent is None:
                run.intent, run.requests = ("cancel", None), run.requests + 1
            self.end_as_asked(run)
        assert (answer, ended) == ("ok", expected)

    @precondition(lambda self: self.workers.attempts)
    @rule(owner=st.sampled_from(OWNERS))
    def renew(self, owner):
        held = [key for key, attempt in self.workers.attempts.items() if attempt.owner == owner]
        answer, renewal = self.call(lambda: domain.attempt_renew(
            owner=owner, attempts=held, lease_seconds=30))
        expected = {(run_id, generation) for run_id, generation in held
                    if self.live(self.runs[run_id], generation)
                    and self.runs[run_id].owner == owner}
        assert answer == "ok" and renewal.renewed == expected
        assert {run_id: intent.action for run_id, intent in renewal.intents.items()} == {
            run_id: self.runs[run_id].intent[0] for run_id, _ in expected
            if self.runs[run_id].intent is not None}
        for key in held:  # a fenced attempt cancels its token and forgets the run
            if key not in expected:
                self.workers.attempts.pop(key)
        # The worker reports its figures with each renewal.
        self.call(lambda: domain.worker_report(owner=owner, live_attempts=len(expected),
                                               abandoned_tools=0))
        assert WorkerProcess.objects.get(owner=owner).live_attempts == len(expected)
        for run_id, generation in expected:
            self.runs[run_id].lapsed = None
            intent = renewal.intents.get(run_id)
            if intent is not None:
                self.workers.attempts[(run_id, generation)].cancelled_by = intent.requested_by

    @precondition(lambda self: any(run.state == RUNNING for run in self.runs.values()))
    @rule(pick=PICK)
    def lease_runs_out(self, pick):
        """Time passes for one attempt: its worker froze, or died."""
        running = [run for run in self.runs.values() if run.state == RUNNING]
        run = running[pick % len(running)]
        self.lapses += 1
        Attempt.objects.filter(run_id=run.id, state=AttemptState.LIVE).update(
            lease_expires_at=timezone.now() - timedelta(hours=1) + timedelta(
                seconds=self.lapses))
        run.lapsed = self.lapses

    def expired(self, run: Model) -> str:
        """SPEC §6 for an attempt whose lease ran out, in the model."""
        self.release(run)
        self.end_children(run)
        if run.intent is not None:
            self.end_as_asked(run)
            return "applied"
        if run.crash_retries >= MAX_CRASH_RETRIES:
            self.end(run, EndCause.FAILED)
            return "failed"
        run.state, run.owner, run.lapsed = QUEUED, None, None
        run.crash_retries += 1
        return "requeued"

    @precondition(lambda self: self.in_state())
    @rule(pick=PICK, back=BACK)
    def expire(self, pick, back):
        """Mostly an attempt whose lease ran out; else one renewed in time."""
        lapsed = [run for run in self.in_state() if run.lapsed]
        run = lapsed[pick % len(lapsed)] if lapsed and pick % 3 else self.pick(pick, RUNNING)
        generation = run.generation - back
        answer, did = self.call(lambda: domain.attempt_expire(
            run_id=run.id, generation=generation, max_crash_retries=MAX_CRASH_RETRIES))
        expected = None
        if self.live(run, generation) and run.lapsed is not None:
            expected = self.expired(run)
        assert (answer, did) == ("ok", expected)

    @precondition(lambda self: any(run.lapsed for run in self.runs.values()))
    @rule()
    def sweep(self):
        self.workers.several_transactions = True
        try:
            answer, counts = self.call(domain.sweep)
        finally:
            self.workers.several_transactions = False
        lapsed = sorted((run for run in self.runs.values()
                         if run.state == RUNNING and run.lapsed is not None),
                        key=lambda run: run.lapsed)
        expected = {"applied": 0, "requeued": 0, "failed": 0}
        for run in lapsed:
            expected[self.expired(run)] += 1
        assert answer == "ok"
        assert {key: counts[key] for key in expected} == expected

    @precondition(lambda self: self.runs)
    @rule(pick=PICK, action=st.sampled_from(["cancel", "stop"]), actor=st.sampled_from(ACTORS))
    def request_end(self, pick, action, actor):
        run = self.pick(pick, RUNNING, QUEUED, AWAITING)
        if action == "cancel":
            answer, result = self.call(lambda: domain.run_cancel(
                run_id=run.id, actor=actor, source="api", reason="no longer needed"))
        else:
            answer, result = self.call(lambda: domain.run_stop(
                run_id=run.id, actor=actor, source="api", reason="halt"))
        assert answer == "ok"
        if run.state == ENDED:
            expected = "ended"
        elif run.intent is not None:
            run.requests += 1
            expected = "live"
        else:
            run.intent = (action, StopCode.OPERATOR if action == "stop" else None)
            run.requests += 1
            if run.state == RUNNING:
                expected = "live"
                signal = (run.id, run.generation, run.owner, "cancel")
                assert self.workers.signals[-1:] == [signal]
            else:
                expected = "durable"
                self.end_as_asked(run)
        assert result.path == expected

    @precondition(lambda self: self.tickets)
    @rule(pick=PICK, actor=st.sampled_from(ACTORS))
    def revoke(self, pick, actor):
        ticket = self.tickets[pick % len(self.tickets)]
        answer, result = self.call(lambda: domain.ticket_revoke(
            ticket_id=ticket, actor=actor, source="api"))
        owner = next(run for run in self.runs.values() if run.ticket == ticket) if any(
            run.ticket == ticket for run in self.runs.values()) else None
        if owner is None:
            assert answer == "NotAwaiting"
            return
        assert answer == "ok" and result.path == "durable"
        owner.intent, owner.requests = ("stop", StopCode.OPERATOR), owner.requests + 1
        self.end_as_asked(owner)

    @precondition(lambda self: self.in_state(AWAITING))
    @rule(pick=PICK, which=st.sampled_from(["open", "open", "issued", "unknown"]),
          ticket=PICK, approved=st.none() | st.booleans(), actor=st.sampled_from(ACTORS))
    def resume(self, pick, which, ticket, approved, actor):
        """With the run's open ticket, any ticket ever issued, or one never issued."""
        run = self.pick(pick, AWAITING)
        if which == "issued" and self.tickets:
            ticket = self.tickets[ticket % len(self.tickets)]
        elif which == "open" and run.ticket:
            ticket = run.ticket
        else:
            ticket = str(uuid.uuid4())
        given = {} if approved is None else {"approved": approved}
        answer, _ = self.call(lambda: domain.run_resume(
            run_id=run.id, ticket_id=ticket, input=given, actor=actor, source="api"))
        if run.state != AWAITING:
            assert answer == "NotAwaiting"
        elif ticket != run.ticket:
            assert answer == "TicketMismatch"
        elif run.schema is not None and approved is None:
            assert answer == "InvalidRequest"
        else:
            assert answer == "ok"
            assert run.id in self.workers.queued
            self.closed_tickets[run.ticket] = TicketState.CONSUMED
            run.state, run.ticket, run.schema = QUEUED, None, None
            self.workers.queued.remove(run.id)

    @precondition(lambda self: self.runs)
    @rule(pick=PICK, command=st.sampled_from(["cancel", "pause", "wake", "message"]),
          actor=st.sampled_from(ACTORS))
    def send_live_command(self, pick, command, actor):
        run = self.pick(pick, RUNNING)
        answer, _ = self.call(lambda: domain.run_live_command(
            run_id=run.id, command=command, actor=actor, source="api",
            message={"hello": actor} if command == "message" else None))
        # Nothing durable: a live command changes no committed state.
        assert answer == ("ok" if run.state == RUNNING else "NotActive")
        if answer == "ok" and command == "cancel":
            assert self.workers.attempts[(run.id, run.generation)].cancelled_by

    # what must hold after every step

    @invariant()
    def spec_7_holds(self):
        """Everything committed, read once (five queries), then each check on it."""
        assert not self.workers.violations, self.workers.violations
        ids = list(self.runs)
        runs = {str(run.id): run for run in Run.objects.filter(pk__in=ids)
                .select_related("ticket", "control")}
        live = {run_id: [] for run_id in ids}
        for attempt in Attempt.objects.filter(run_id__in=ids, state=AttemptState.LIVE):
            live[str(attempt.run_id)].append(attempt)
        events = {run_id: [] for run_id in ids}
        for event in Event.objects.filter(run_id__in=ids).order_by("seq"):
            events[str(event.run_id)].append(event)
        intents = {run_id: [] for run_id in ids}
        for intent in ControlIntent.objects.filter(run_id__in=ids).order_by("pk"):
            intents[str(intent.run_id)].append(intent)
        tickets = list(ResumeTicket.objects.filter(run_id__in=ids))
        self.the_database_is_the_model(runs, intents)
        self.at_most_one_live_attempt_holding_the_claim(runs, live)
        self.the_first_terminal_state_wins_and_events_only_grow(runs, events)
        self.tickets_open_once_and_stay_closed(tickets)
        self.every_request_is_recorded_and_every_end_names_who_asked(events, intents)
        self.children_of_an_ended_parent_end(runs, intents)
        self.the_published_representation_is_the_committed_one(runs)

    def the_database_is_the_model(self, runs, intents):
        for run_id, model in self.runs.items():
            run = runs[run_id]
            pending = [(i.action, i.stop_code) for i in intents[run_id] if i.applied_at is None]
            assert (run.state, run.end_cause, run.stop_code, run.generation, run.owner,
                    None if run.ticket_id is None else str(run.ticket_id), run.crash_retries,
                    run.steps, pending) == (
                model.state, model.end_cause, model.stop_code, model.generation, model.owner,
                model.ticket, model.crash_retries, model.steps,
                [model.intent] if model.intent else []), run_id

    def at_most_one_live_attempt_holding_the_claim(self, runs, live):
        for run_id, run in runs.items():
            assert len(live[run_id]) == (run.state == RUNNING), (run_id, run.state)
            for attempt in live[run_id]:
                assert (attempt.generation, attempt.owner) == (run.generation, run.owner)

    def the_first_terminal_state_wins_and_events_only_grow(self, runs, events):
        newest = self.max_seq
        for run_id, history in events.items():
            run = runs[run_id]
            seen = self.history.get(run_id, [])
            now = [(e.seq, e.version, e.kind, e.generation) for e in history]
            assert now[:len(seen)] == seen, f"{run_id}: an event changed or went away"
            assert all(seq > self.max_seq for seq, *_ in now[len(seen):]), run_id
            assert [version for _, version, *_ in now] == list(range(1, run.version + 1))
            generations = [generation for *_, generation in now]
            assert generations == sorted(generations), run_id
            assert run.generation >= self.generations.get(run_id, 0), run_id
            self.generations[run_id] = run.generation
            self.history[run_id] = now
            newest = max([newest, *(seq for seq, *_ in now)])
            ended = [e for e in history if e.kind == EventKind.ENDED]
            assert len(ended) == (run.state == ENDED), (run_id, [e.kind for e in history])
            if ended:
                assert history[-1] is ended[0] and ended[0].end_cause == run.end_cause
                terminal = (run.end_cause, run.stop_code, run.ended_at, ended[0].seq,
                            run.version, run.output, run.error)
                assert self.ended.setdefault(run_id, terminal) == terminal, run_id
        self.max_seq = newest

    def tickets_open_once_and_stay_closed(self, tickets):
        open_by_run: dict[str, list] = {}
        for ticket in tickets:
            if ticket.state == TicketState.OPEN:
                open_by_run.setdefault(str(ticket.run_id), []).append(str(ticket.id))
            expected = self.closed_tickets.get(str(ticket.id))
            assert expected is None or ticket.state == expected, (ticket.id, ticket.state)
        for run_id, model in self.runs.items():
            assert open_by_run.get(run_id, []) == ([model.ticket] if model.ticket else [])

    def every_request_is_recorded_and_every_end_names_who_asked(self, events, intents):
        for run_id, model in self.runs.items():
            requested = [e for e in events[run_id] if e.kind in (
                EventKind.CANCEL_REQUESTED, EventKind.STOP_REQUESTED)]
            assert len(requested) == model.requests, run_id
            if model.end_cause in (EndCause.CANCELLED, EndCause.STOPPED):
                end = events[run_id][-1]
                assert end.actor and end.source, (run_id, end.actor, end.source)
                if intents[run_id]:
                    intent = intents[run_id][-1]
                    assert intent.applied_at is not None
                    assert (end.actor, end.source) == (intent.requested_by, intent.source)

    def children_of_an_ended_parent_end(self, runs, intents):
        for run_id, model in self.runs.items():
            parent = self.runs.get(model.parent)
            if parent is not None and parent.state == ENDED:
                child = runs[run_id]
                pending = [i for i in intents[run_id] if i.applied_at is None]
                assert child.state == ENDED or (child.state == RUNNING and pending), (
                    run_id, child.state)

    def the_published_representation_is_the_committed_one(self, runs):
        for run_id, run in runs.items():
            published = dict(self.published.latest[run_id])
            committed = run_data(run)
            for data in (published, committed):
                data.pop("duration")  # running time so far: it grows by itself
            assert published == committed, run_id


SETTINGS = hypothesis.settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                    database=None, print_blob=True, report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.timeout(max(300, EXAMPLES * STEPS // 4))
def test_the_domain_keeps_the_model_and_spec_7(outside_restored, settings):
    settings.AWAKEN_MAX_CRASH_RETRIES = MAX_CRASH_RETRIES
    run_state_machine_as_test(RunControl, settings=SETTINGS)
