"""Races on one run from many threads, each with its own PostgreSQL connection.

Real concurrency needs real transactions, so these use ``transactional_db`` and run only on
PostgreSQL (row locks are what serialize a run's transitions).
"""

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, connections, transaction

from harness.processes import wait_until
from runs import domain
from runs.domain import Ending
from runs.models import ControlIntent, Event, EventKind, ResumeTicket, Run, RunState, TicketState
from tests.factories import OWNER, awaiting_run, queued_run, running_run

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ROUNDS = 200


@pytest.fixture(autouse=True)
def threads_are_the_only_actors(settings, monkeypatch):
    # The threads below play every part, the attempts included: no queued run may reach a
    # worker process another test started, and a live delivery finds nobody to answer
    # (the recorded intent is what these tests are about), so do not wait a second for it.
    monkeypatch.setattr("runs.workers.dispatch.runs_queued", lambda **kwargs: None)
    settings.AWAKEN_DELIVERY_TIMEOUT = 0.01


def check_run_history(run_id) -> Run:
    """SPEC §7.1: one terminal event, nothing after it, versions contiguous."""
    run = Run.objects.get(pk=run_id)
    events = list(Event.objects.filter(run_id=run_id).order_by("seq"))
    assert [e.version for e in events] == list(range(1, run.version + 1))
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    ended = [e for e in events if e.kind == EventKind.ENDED]
    if run.state == RunState.ENDED:
        assert len(ended) == 1 and events[-1] is ended[0]
        assert ended[0].end_cause == run.end_cause
        assert not ControlIntent.objects.filter(run_id=run_id, applied_at__isnull=True).exists()
    else:
        assert ended == []
    return run


def finisher(run_id, generation, ending):
    def op():
        return ("finish", ending.cause,
                domain.attempt_finish(run_id=run_id, generation=generation, ending=ending))
    return op


def starter_finisher(run_id, ending):
    def op():
        attempt = domain.attempt_start(run_id=run_id, owner=OWNER, lease_seconds=30)
        if attempt is None:
            return ("finish", ending.cause, False)
        return ("finish", ending.cause, domain.attempt_finish(
            run_id=run_id, generation=attempt.generation, ending=ending))
    return op


def canceller(run_id):
    def op():
        return ("request", "cancelled",
                domain.run_cancel(run_id=run_id, actor="c", source="api").path)
    return op


def stopper(run_id):
    def op():
        return ("request", "stopped",
                domain.run_stop(run_id=run_id, actor="s", source="api", reason="halt").path)
    return op


def test_cancel_stop_completion_and_failure_race_to_one_terminal_state(gang):
    """Eight threads at once on one run, 200 times: exactly one terminal commit wins."""
    threads = gang(8)
    rng = random.Random(7)
    for round_no in range(ROUNDS):
        from_queued = round_no % 2 == 1
        if from_queued:
            run = queued_run()
            attempt_ops = [starter_finisher(run.id, Ending.completed({"n": 1})),
                           starter_finisher(run.id, Ending.completed({"n": 2})),
                           starter_finisher(run.id, Ending.failed("boom")),
                           starter_finisher(run.id, Ending.failed("bang"))]
        else:
            run, generation = running_run()
            attempt_ops = [finisher(run.id, generation, Ending.completed({"n": 1})),
                           finisher(run.id, generation, Ending.completed({"n": 2})),
                           finisher(run.id, generation, Ending.failed("boom")),
                           finisher(run.id, generation, Ending.failed("bang"))]
        ops = attempt_ops + [canceller(run.id), canceller(run.id), stopper(run.id),
                             stopper(run.id)]
        rng.shuffle(ops)
        results = threads.run(ops)
        errors = [r for r in results if isinstance(r, Exception)]
        assert not errors, errors

        run = check_run_history(run.id)
        assert run.state == RunState.ENDED
        won = [cause for kind, cause, outcome in results
               if (kind == "finish" and outcome is True)
               or (kind == "request" and outcome == "durable")]
        assert won == [run.end_cause], (round_no, results, run.end_cause)
        if not from_queued:
            # Cancel and stop of a running run only record the intent: an attempt decides.
            assert run.end_cause in ("completed", "failed")
        if run.end_cause == "completed":
            assert run.output in ({"n": 1}, {"n": 2}) and run.error is None
        # A second request joins the first: never more than one intent.
        assert ControlIntent.objects.filter(run=run).count() <= 1


def test_resume_racing_cancel_consumes_the_ticket_at_most_once(gang):
    threads = gang(8)
    rng = random.Random(11)
    outcomes = {"resumed_then_ended": 0, "ended_before_resume": 0}
    for _ in range(ROUNDS):
        run, ticket_id = awaiting_run()

        def resumer():
            try:
                domain.run_resume(run_id=run.id, ticket_id=ticket_id, input={"r": 1},
                                    actor="r", source="api")
                return ("resume", True)
            except (domain.NotAwaiting, domain.TicketMismatch) as error:
                return ("resume", type(error).__name__)

        ops = [resumer, resumer, resumer, canceller(run.id), canceller(run.id), stopper(run.id),
               stopper(run.id), canceller(run.id)]
        rng.shuffle(ops)
        results = threads.run(ops)
        assert not [r for r in results if isinstance(r, Exception)], results

        run = check_run_history(run.id)
        accepted = [r for r in results if r == ("resume", True)]
        assert len(accepted) <= 1
        ticket = ResumeTicket.objects.get(pk=ticket_id)
        kinds = list(Event.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))
        # Every request either ended the run on the durable path or joined a pending one;
        # here nothing is running, so the run always ends.
        assert run.state == RunState.ENDED
        if accepted:
            assert ticket.state == TicketState.CONSUMED
            assert kinds.count("resumed") == 1
            assert kinds.index("resumed") < kinds.index("ended")
            outcomes["resumed_then_ended"] += 1
        else:
            assert ticket.state == TicketState.REVOKED
            assert "resumed" not in kinds
            assert all(r[1] == "NotAwaiting" for r in results if r[0] == "resume")
            outcomes["ended_before_resume"] += 1
    assert sum(outcomes.values()) == ROUNDS


def test_a_stale_generation_changes_nothing_while_its_replacement_runs(gang):
    """Generation 1 paused and was resumed; generation 2 is live. Generation 1's late calls
    race generation 2's steps and must all be refused."""
    threads = gang(8)
    for _ in range(50):
        run, ticket_id = awaiting_run()
        domain.run_resume(run_id=run.id, ticket_id=ticket_id, actor="r", source="api")
        current = domain.attempt_start(run_id=run.id, owner="w2:2", lease_seconds=30)
        assert current.generation == 2

        def stale(call):
            def op():
                try:
                    return ("stale", call())
                except domain.Fenced:
                    return ("stale", "fenced")
            return op

        ops = [
            stale(lambda: domain.attempt_finish(run_id=run.id, generation=1,
                                                  ending=Ending.completed("late"))),
            stale(lambda: domain.attempt_step(run_id=run.id, generation=1)),
            stale(lambda: domain.attempt_pause(run_id=run.id, generation=1)),
            stale(lambda: domain.attempt_renew(owner=OWNER, attempts=[(run.id, 1)],
                                                 lease_seconds=30).renewed or "fenced"),
            stale(lambda: domain.attempt_interrupted(run_id=run.id, generation=1)),
            lambda: ("current", domain.attempt_step(run_id=run.id, generation=2).steps),
            lambda: ("current", domain.attempt_step(run_id=run.id, generation=2).steps),
            lambda: ("current", domain.attempt_renew(owner="w2:2", attempts=[(run.id, 2)],
                                                       lease_seconds=30).renewed),
        ]
        results = threads.run(ops)
        assert not [r for r in results if isinstance(r, Exception)], results
        for kind, outcome in results:
            if kind == "stale":
                assert outcome in ("fenced", False), results
        run = check_run_history(run.id)
        assert (run.state, run.generation, run.steps) == (RunState.RUNNING, 2, 2)
        assert run.output is None


def test_overlapping_claims_take_each_run_once_and_never_deadlock(gang):
    """Duplicated task messages: eight claimers take overlapping sets of the same runs, each
    in its own order, while a cancel races them for one of the runs."""
    threads = gang(8)
    for _ in range(50):
        runs = [str(queued_run().id) for _ in range(6)]

        def claimer(index):
            def op():
                mine = random.sample(runs, 4)
                return ("claim", [(str(a.run_id), a.owner) for a in domain.attempts_start(
                    run_ids=mine, owner=f"w{index}:1", lease_seconds=30)])
            return op

        def cancel():
            return ("cancel", domain.run_cancel(run_id=runs[0], actor="c", source="api"))

        results = threads.run([claimer(i) for i in range(7)] + [cancel])
        assert not [r for r in results if isinstance(r, Exception)], results
        claims = [claim for kind, outcome in results if kind == "claim" for claim in outcome]
        claimed = [run_id for run_id, _ in claims]
        assert len(claimed) == len(set(claimed)), claims  # no run claimed twice
        for run_id in runs:
            run = check_run_history(run_id)
            if run_id in claimed:
                owner = dict(claims)[run_id]
                assert run.generation == 1
                assert run.attempts.get().owner == owner
                if run.state == RunState.RUNNING:
                    assert run.owner == owner
            else:
                assert run.generation == 0
                assert run.state in (RunState.QUEUED, RunState.ENDED)


def test_ends_written_together_by_several_workers_end_each_run_once(gang):
    """Six threads each end four of six running runs in one transaction, in an order of
    their own, while a cancel and a stop race them (duplicated ends, as after a lost
    message): no deadlock, each run ends once, and the one answered True wrote it."""
    threads = gang(8)
    rng = random.Random(5)
    for _ in range(50):
        runs = [running_run()[0].id for _ in range(6)]
        taken = [rng.sample(runs, 4) for _ in range(6)]

        def ender(index):
            def op():
                return ("ends", index, domain.attempts_finish(ends=[
                    {"run_id": run_id, "generation": 1,
                     "ending": Ending.completed({"by": index})} for run_id in taken[index]]))
            return op

        results = threads.run([ender(i) for i in range(6)]
                              + [canceller(runs[0]), stopper(runs[1])])
        assert not [r for r in results if isinstance(r, Exception)], results
        won = {}
        for kind, index, answers in results:
            if kind == "ends":
                for run_id, answer in zip(taken[index], answers, strict=True):
                    if answer:
                        assert run_id not in won, (run_id, results)
                        won[run_id] = index
        for run_id in runs:
            run = check_run_history(run_id)
            if any(run_id in mine for mine in taken):
                assert (run.end_cause, run.output) == ("completed", {"by": won[run_id]})
            else:
                assert run.state == RunState.RUNNING and run_id not in won


@pytest.mark.parametrize("parent_state", ["running", "awaiting"])
def test_a_parent_ending_and_a_child_naming_it_never_deadlock(parent_state):
    """A child's transaction holds the child's lock and has written an intent naming its
    parent; meanwhile the parent's end locks the parent and, to end its children, waits
    for the child's lock. When the child's transaction commits, its foreign key check must
    not wait for the parent's lock: both transitions commit."""
    parent, generation = running_run(agent="demo.parent")
    child, _ = domain.run_create(agent="demo.hang", parent_id=parent.id, dispatch=False)
    child_generation = domain.attempt_start(run_id=child.id, owner=OWNER,
                                              lease_seconds=30).generation
    if parent_state == "awaiting":
        domain.attempt_pause(run_id=parent.id, generation=generation, reason="input")

        def end_parent():
            return domain.run_cancel(run_id=parent.id, actor="op", source="api").path
    else:
        def end_parent():
            return domain.attempt_finish(run_id=parent.id, generation=generation,
                                           ending=Ending.completed())

    def child_names_parent():
        return domain.attempt_parent_gone(
            run_id=child.id, generation=child_generation, parent_id=parent.id,
            why="command", actor="op", source="api")

    child_ended, parent_ended = locked_while_another_waits(
        child_names_parent, end_parent, "the parent's end to wait for the child")
    assert child_ended is True and parent_ended
    assert check_run_history(parent.id).state == RunState.ENDED
    child = check_run_history(child.id)
    assert child.end_cause == "cancelled" and child.control.caused_by_id == parent.id


@pytest.mark.parametrize("end", ["interrupted", "completed"])
def test_an_end_that_waited_for_the_runs_lock_sees_the_request_committed_meanwhile(end):
    """A stop's request holds the run's lock with its intent written; the attempt's end
    waits for that lock. Once the request commits, the end must read the intent as
    committed: a read joined to the locking statement would get the run as the request
    left it but its intents as they were when the end's statement began (none pending).
    An interrupted attempt then ends the run stopped, as asked; a completion applies the
    pending request (SPEC §7: no ended run keeps one)."""
    run, generation = running_run()

    def request_stop():
        return domain.run_stop(run_id=run.id, actor="op", source="api", reason="halt")

    def end_attempt() -> bool:
        if end == "interrupted":
            return domain.attempt_interrupted(run_id=run.id, generation=generation,
                                              actor="worker", source="worker")
        return domain.attempt_finish(run_id=run.id, generation=generation,
                                     ending=Ending.completed("done"))

    _, answered = locked_while_another_waits(request_stop, end_attempt,
                                             "the end to wait for the run's lock")
    assert answered is True
    ended = check_run_history(run.id)
    intent = ControlIntent.objects.get(run_id=run.id)
    assert intent.applied_at is not None
    if end == "interrupted":
        assert (ended.end_cause, ended.stop_reason, ended.stop_code) == (
            "stopped", "halt", intent.stop_code)
        assert Event.objects.get(run_id=run.id, kind=EventKind.ENDED).actor == "op"
    else:
        assert (ended.end_cause, ended.output) == ("completed", "done")


def locked_while_another_waits(holder, waiter, what: str) -> tuple:
    """``holder()`` in a transaction on a thread of its own, kept open until ``waiter()``,
    started on another thread once ``holder`` has returned, waits for a row lock (``what``
    names that wait); then committed. The results of both, in that order."""
    written, commit = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            result = holder()
            written.set()
            assert commit.wait(15)
        return result

    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(with_own_connection, hold)
        assert written.wait(15)
        waited = pool.submit(with_own_connection, waiter)
        wait_until(a_transaction_waits_for_a_lock, 15, what)
        commit.set()
        return held.result(30), waited.result(30)


def a_transaction_waits_for_a_lock() -> bool:
    """Whether a transaction on the test database waits for a row lock now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                       "current_database() AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0] > 0


def with_own_connection(fn):
    """``fn()`` in a pool's thread, closing the thread's database connection after it."""
    try:
        return fn()
    finally:
        connections.close_all()
