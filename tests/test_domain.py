"""The transitions of SPEC §2 and the finish boundary of §3, one domain call at a time."""

import json
import threading
import time
import uuid
from datetime import timedelta
from functools import partial
from unittest import mock

import pytest
from django.db import connection, transaction
from django.utils import timezone

from harness.processes import wait_until
from runs import domain
from runs.domain import Ending, sql
from runs.models import (
    Activity,
    Attempt,
    AttemptState,
    CloseReason,
    ControlIntent,
    EndCause,
    Event,
    EventKind,
    ResumeTicket,
    Run,
    RunState,
    TicketState,
)
from tests.conftest import db_state
from tests.factories import OWNER, awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db


def kinds(run) -> list[str]:
    return list(Event.objects.filter(run_id=run.id).order_by("seq").values_list("kind", flat=True))


def assert_versions_contiguous(run):
    run.refresh_from_db()
    versions = list(Event.objects.filter(run=run).order_by("seq").values_list("version", flat=True))
    assert versions == list(range(1, run.version + 1))


# --- create ---------------------------------------------------------------------------


def test_create_queues_the_run_with_one_created_event():
    run = queued_run(input={"steps": 2}, budget={"max_steps": 3})
    assert run.state == RunState.QUEUED
    assert run.generation == 0 and run.version == 1
    assert run.thread_id == str(run.id)
    assert run.max_steps == 3
    assert kinds(run) == ["created"]


def test_child_runs_share_their_parents_thread():
    parent = queued_run(thread_id="t-1")
    child = queued_run(parent_id=parent.id)
    assert child.thread_id == "t-1" and child.parent_id == parent.id


@pytest.mark.parametrize("kwargs, field", [
    pytest.param({"agent": "nope"}, "agent", id="unknown-agent"),
    pytest.param({"agent": "demo.steps", "input": [1]}, "input", id="list-input"),
    pytest.param({"agent": "demo.steps", "budget": {"max_steps": 0}}, "budget",
                 id="zero-steps"),
    pytest.param({"agent": "demo.steps", "budget": {"max_steps": 1.5}}, "budget",
                 id="fractional-steps"),
    pytest.param({"agent": "demo.steps", "budget": {"max_seconds": True}}, "budget",
                 id="boolean-seconds"),
    pytest.param({"agent": "demo.steps", "budget": {"max_money": 3}}, "budget",
                 id="unknown-limit"),
    pytest.param({"agent": "demo.steps", "budget": {"max_tokens": 2**63}}, "budget",
                 id="tokens-beyond-64-bits"),
    pytest.param({"agent": "demo.steps", "input": {"a": ["b", {"c\x00": 1}]}}, "input.a.1",
                 id="nul-in-a-key"),
    pytest.param({"agent": "demo.steps", "input": {"a": "nul \x00 inside"}}, "input.a",
                 id="nul-in-a-value"),
    pytest.param({"agent": "demo.steps", "parent_id": "00000000-0000-0000-0000-000000000000"},
                 "parent_id", id="unknown-parent"),
])
def test_create_rejects_bad_requests_and_writes_nothing(kwargs, field):
    before = db_state()
    with pytest.raises(domain.InvalidRequest) as caught:
        domain.run_create(**kwargs)
    assert caught.value.field == field
    assert db_state() == before


def test_idempotency_key_replay_returns_the_first_run(operator):
    first, created = domain.run_create(agent="demo.steps", created_by=operator,
                                         idempotency_key="k1")
    again, created_again = domain.run_create(agent="demo.steps", created_by=operator,
                                               idempotency_key="k1")
    assert created and not created_again
    assert again.id == first.id
    assert Run.objects.count() == 1


def test_idempotency_key_reused_with_another_request_conflicts(operator):
    domain.run_create(agent="demo.steps", created_by=operator, idempotency_key="k1")
    with pytest.raises(domain.IdempotencyConflict):
        domain.run_create(agent="demo.fail", created_by=operator, idempotency_key="k1")
    assert Run.objects.count() == 1


def test_idempotency_keys_are_per_user(operator, viewer):
    a, _ = domain.run_create(agent="demo.steps", created_by=operator, idempotency_key="k")
    b, _ = domain.run_create(agent="demo.steps", created_by=viewer, idempotency_key="k")
    assert a.id != b.id


# --- the durable path ------------------------------------------------------------------


def test_cancel_of_a_queued_run_commits_cancelled_at_once():
    run = queued_run()
    result = domain.run_cancel(run_id=run.id, actor="olga", source="api", reason="not needed")
    assert result.path == "durable"
    run.refresh_from_db()
    assert (run.state, run.end_cause) == (RunState.ENDED, "cancelled")
    assert kinds(run) == ["created", "cancel_requested", "ended"]
    intent = ControlIntent.objects.get(run=run)
    assert intent.applied_at is not None and intent.requested_by == "olga"
    assert run.control_id == intent.pk
    assert_versions_contiguous(run)


def test_stop_of_an_awaiting_run_revokes_its_ticket():
    run, ticket_id = awaiting_run()
    result = domain.run_stop(run_id=run.id, actor="olga", source="ui", reason="budget spent")
    assert result.path == "durable"
    run.refresh_from_db()
    assert (run.state, run.end_cause, run.stop_code, run.stop_reason) == (
        RunState.ENDED, "stopped", "operator", "budget spent")
    assert run.ticket_id is None
    assert ResumeTicket.objects.get(pk=ticket_id).state == TicketState.REVOKED
    ended = Event.objects.get(run=run, kind=EventKind.ENDED)
    assert ended.data["stop_reason"] == "budget spent" and ended.source == "ui"


def test_cancel_and_stop_of_an_ended_run_return_it_unchanged():
    run = queued_run()
    domain.run_cancel(run_id=run.id, actor="olga", source="api")
    before = db_state()
    assert domain.run_cancel(run_id=run.id, actor="x", source="api").path == "ended"
    assert domain.run_stop(run_id=run.id, actor="x", source="api", reason="r").path == "ended"
    assert db_state() == before


@pytest.mark.parametrize("reason", ["", "   ", None, "x" * 501],
                         ids=["empty", "blank", "none", "501-characters"])
def test_stop_needs_a_reason_of_at_most_500_characters(reason):
    run = queued_run()
    before = db_state()
    with pytest.raises(domain.InvalidRequest):
        domain.run_stop(run_id=run.id, actor="olga", source="api", reason=reason)
    assert db_state() == before


def test_cancel_of_an_unknown_run_is_not_found():
    with pytest.raises(domain.RunNotFound):
        domain.run_cancel(run_id="00000000-0000-0000-0000-000000000000", actor="o", source="api")


# --- the live path: intent first ----------------------------------------------------------


def test_cancel_of_a_running_run_records_the_intent_and_leaves_it_running():
    run, generation = running_run()
    result = domain.run_cancel(run_id=run.id, actor="olga", source="api")
    assert result.path == "live"
    run.refresh_from_db()
    assert run.state == RunState.RUNNING
    assert run.control.applied_at is None
    assert kinds(run)[-1] == "cancel_requested"


def test_a_second_request_joins_the_pending_one():
    run, generation = running_run()
    first = domain.run_cancel(run_id=run.id, actor="olga", source="api")
    second = domain.run_stop(run_id=run.id, actor="olga", source="api", reason="again")
    assert second.intent.pk == first.intent.pk
    assert ControlIntent.objects.filter(run=run).count() == 1


def test_the_interrupted_attempt_ends_the_run_as_the_intent_says():
    run, generation = running_run()
    domain.run_stop(run_id=run.id, actor="olga", source="api", reason="enough")
    assert domain.attempt_interrupted(run_id=run.id, generation=generation)
    run.refresh_from_db()
    assert (run.end_cause, run.stop_code, run.stop_reason) == ("stopped", "operator", "enough")
    assert run.control.applied_at is not None
    attempt = Attempt.objects.get(run=run)
    assert (attempt.state, attempt.close_reason) == (AttemptState.CLOSED, CloseReason.STOPPED)
    assert Event.objects.get(run=run, kind="ended").actor == "olga"


# --- the finish boundary -------------------------------------------------------------------


def test_first_terminal_commit_wins_and_late_results_are_dropped():
    run, generation = running_run()
    domain.run_cancel(run_id=run.id, actor="olga", source="api")
    assert domain.attempt_interrupted(run_id=run.id, generation=generation)
    assert not domain.attempt_finish(run_id=run.id, generation=generation,
                                       ending=Ending.completed({"late": True}))
    run.refresh_from_db()
    assert run.end_cause == "cancelled" and run.output is None
    assert Event.objects.filter(run=run, kind="ended").count() == 1


def test_a_stale_generation_can_neither_finish_nor_step():
    run, generation = running_run()
    before = db_state()
    assert not domain.attempt_finish(run_id=run.id, generation=generation + 1,
                                       ending=Ending.completed())
    with pytest.raises(domain.Fenced):
        domain.attempt_step(run_id=run.id, generation=generation - 1)
    with pytest.raises(domain.Fenced):
        domain.attempt_pause(run_id=run.id, generation=generation - 1)
    stale = domain.attempt_renew(owner=OWNER, attempts=[(run.id, generation - 1)],
                                   lease_seconds=5)
    other_owner = domain.attempt_renew(owner="other:9", attempts=[(run.id, generation)],
                                         lease_seconds=5)
    assert stale.renewed == set() and other_owner.renewed == set()
    assert db_state() == before


def test_completion_closes_the_attempt_and_keeps_the_output():
    run, generation = running_run()
    domain.attempt_step(run_id=run.id, generation=generation, tokens=7, agent_state={"i": 1})
    assert domain.attempt_finish(run_id=run.id, generation=generation,
                                   ending=Ending.completed({"answer": 42}))
    run.refresh_from_db()
    assert (run.state, run.end_cause, run.output) == ("ended", "completed", {"answer": 42})
    assert (run.steps, run.tokens) == (1, 7)
    assert Attempt.objects.get(run=run).close_reason == CloseReason.COMPLETED
    assert kinds(run) == ["created", "started", "step", "ended"]
    assert_versions_contiguous(run)


def test_failure_keeps_the_error():
    run, generation = running_run()
    domain.attempt_finish(run_id=run.id, generation=generation, ending=Ending.failed("boom"))
    run.refresh_from_db()
    assert (run.end_cause, run.error) == ("failed", "boom")


# --- pause and resume ----------------------------------------------------------------------


def test_pause_issues_a_ticket_and_resume_consumes_it():
    run, ticket_id = awaiting_run()
    assert run.state == RunState.AWAITING and str(run.ticket_id) == ticket_id
    assert Attempt.objects.get(run=run).close_reason == CloseReason.PAUSED
    resumed = domain.run_resume(run_id=run.id, ticket_id=ticket_id, input={"approved": True},
                                  actor="olga", source="api")
    assert resumed.state == RunState.QUEUED and resumed.ticket_id is None
    ticket = ResumeTicket.objects.get(pk=ticket_id)
    assert (ticket.state, ticket.resume_input) == (TicketState.CONSUMED, {"approved": True})
    attempt = domain.attempt_start(run_id=run.id, owner=OWNER, lease_seconds=5)
    assert attempt.generation == 2


def test_resume_with_another_ticket_is_a_mismatch():
    run, _ = awaiting_run()
    before = db_state()
    with pytest.raises(domain.TicketMismatch):
        domain.run_resume(run_id=run.id, ticket_id="00000000-0000-0000-0000-000000000000",
                            actor="olga", source="api")
    assert db_state() == before


def test_resume_after_ended_fails_closed():
    run, ticket_id = awaiting_run()
    domain.run_cancel(run_id=run.id, actor="olga", source="api")
    before = db_state()
    with pytest.raises(domain.NotAwaiting):
        domain.run_resume(run_id=run.id, ticket_id=ticket_id, actor="olga", source="api")
    assert db_state() == before


def test_a_pending_cancel_wins_over_a_pause():
    run, generation = running_run()
    domain.run_cancel(run_id=run.id, actor="olga", source="api")
    assert domain.attempt_pause(run_id=run.id, generation=generation) is None
    run.refresh_from_db()
    assert (run.state, run.end_cause) == ("ended", "cancelled")
    assert ResumeTicket.objects.count() == 0


def test_start_claims_only_a_queued_run_once():
    run = queued_run()
    first = domain.attempt_start(run_id=run.id, owner=OWNER, lease_seconds=5)
    second = domain.attempt_start(run_id=run.id, owner="other:2", lease_seconds=5)
    assert first.generation == 1 and second is None


def test_start_waits_for_start_after():
    run = queued_run(start_after=timezone.now() + timedelta(hours=1))
    assert domain.attempt_start(run_id=run.id, owner=OWNER, lease_seconds=5) is None


# --- changes are published after commit only ------------------------------------------------


def test_every_transition_is_broadcast_after_commit(django_capture_on_commit_callbacks):
    with mock.patch("runs.changes.stream.stream.publish") as send:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            run = queued_run()
        assert send.call_count == 0  # nothing before the commit
        for callback in callbacks:
            callback()
    (messages,), _ = send.call_args
    [message] = messages
    assert message["run_id"] == str(run.id)
    assert message["type"] == "run.changed"
    pushed = json.loads(message["text"])
    assert pushed["type"] == "run.changed"
    assert pushed["event"]["kind"] == "created" and pushed["run"]["id"] == str(run.id)
    assert pushed["seq"] == pushed["event"]["seq"]


@pytest.mark.django_db(transaction=True)
def test_a_failure_after_commit_never_undoes_or_fails_the_request(monkeypatch):
    def broker_down(**kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr("runs.workers.dispatch.runs_queued", broker_down)
    monkeypatch.setattr("runs.changes.stream.stream.publish", lambda *a, **k: broker_down())
    run, created = domain.run_create(agent="demo.steps")  # dispatch and broadcast both fail
    assert created and Run.objects.get(pk=run.id).state == RunState.QUEUED


def test_a_bulk_import_writes_whole_histories():
    assert domain.runs_import(agent="demo.steps", count=5, batch=2) == 5
    for run in Run.objects.all():
        assert (run.state, run.end_cause, run.version) == ("ended", "completed", 2)
        assert kinds(run) == ["created", "ended"]
    with pytest.raises(domain.InvalidRequest):
        domain.runs_import(agent="nope", count=1)


def test_due_runs_go_to_workers_in_chunks_and_later_ones_alone(settings, monkeypatch):
    from runs.workers import dispatch

    sent = []
    monkeypatch.setattr("runs.workers.dispatch.current_app.send_task",
                        lambda name, args, eta=None, **kwargs: sent.append((args[0], eta)))
    settings.AWAKEN_DISPATCH_CHUNK = 8
    later = timezone.now() + timedelta(hours=1)
    dispatch.send_runs(runs=[(n, None) for n in range(19)] + [(99, later)])
    assert sent == [([str(n) for n in range(8)], None),
                    ([str(n) for n in range(8, 16)], None),
                    (["16", "17", "18"], None),
                    (["99"], later)]


def test_runs_queued_while_a_send_is_under_way_go_together_in_the_next(monkeypatch, settings):
    """The first run goes at once; those queued while its message is being sent share the
    next message, in order, but for a full message's worth, which goes at once; and after
    that a lone run goes at once again."""
    from runs.workers import dispatch

    sent, sending, release = [], threading.Event(), threading.Event()

    def send_task(name, args, eta=None, **kwargs):
        sent.append(args[0])
        sending.set()
        assert release.wait(10)

    monkeypatch.setattr("runs.workers.dispatch.current_app.send_task", send_task)
    settings.AWAKEN_DISPATCH_CHUNK = 3
    dispatches = dispatch.Dispatches()
    dispatches.add([("a", None)])
    assert sending.wait(10)
    dispatches.add([("b", None)])
    dispatches.add([("c", None), ("d", None)])
    dispatches.add([("x", None), ("y", None), ("z", None)])  # a message on its own
    wait_until(lambda: sent == [["a"], ["x", "y", "z"]])  # b, c and d wait for a's send
    release.set()
    wait_until(lambda: sent == [["a"], ["x", "y", "z"], ["b", "c", "d"]])
    dispatches.add([("e", None)])
    wait_until(lambda: sent == [["a"], ["x", "y", "z"], ["b", "c", "d"], ["e"]])


def test_runs_queued_within_the_linger_of_a_send_go_together_when_it_is_over(monkeypatch,
                                                                              settings):
    """A process sends its queued runs at most once per ``AWAKEN_DISPATCH_LINGER``: the
    first run goes at once, the runs queued within the linger of that send wait for its end
    and then go together, in one message (so one claim)."""
    from runs.workers import dispatch

    sent = []

    def send_runs(*, runs):
        sent.append(([run_id for run_id, _ in runs], time.monotonic()))

    monkeypatch.setattr(dispatch, "send_runs", send_runs)
    threads = dispatch.broker_threads()
    calls, post = [], threads.post

    def counted_post(fn, **kwargs):  # each task a broker thread is given, kept to look at
        calls.append(post(fn, **kwargs))
        return calls[-1]

    monkeypatch.setattr(threads, "post", counted_post)
    settings.AWAKEN_DISPATCH_LINGER = 1.0
    dispatches = dispatch.Dispatches()
    dispatches.add([("a", None)])
    wait_until(lambda: len(sent) == 1)
    # Nothing waits: the broker thread is given back at once, not held through the linger.
    wait_until(lambda: calls[0].done(), 0.5, "the broker thread to be free")
    dispatches.add([("b", None)])
    dispatches.add([("c", None)])
    wait_until(lambda: len(sent) == 2)
    (first, first_at), (second, second_at) = sent
    assert (first, second) == (["a"], ["b", "c"])
    assert second_at - first_at >= 1.0


def test_a_send_that_fails_leaves_the_runs_queued_next_free_to_go(monkeypatch):
    from runs.workers import dispatch

    sent = []

    def send_runs(*, runs):
        sent.append(runs)
        if len(sent) == 1:
            raise RuntimeError("a fault the send did not expect")

    monkeypatch.setattr(dispatch, "send_runs", send_runs)
    dispatches = dispatch.Dispatches()
    dispatches.add([("a", None)])
    wait_until(lambda: len(sent) == 1)
    dispatches.add([("b", None)])
    wait_until(lambda: sent == [[("a", None)], [("b", None)]])


def test_one_claim_takes_every_queued_due_run_of_a_message_and_skips_the_rest():
    due, other = queued_run(), queued_run()
    later = queued_run(start_after=timezone.now() + timedelta(hours=1))
    ended = queued_run()
    domain.run_cancel(run_id=ended.id, actor="olga", source="api")
    running, _ = running_run()
    ids = [str(due.id), "not-a-uuid", str(later.id), str(ended.id), str(running.id),
           str(uuid.uuid4()), str(other.id)]
    attempts = domain.attempts_start(run_ids=ids, owner=OWNER, lease_seconds=30)
    assert sorted(str(a.run_id) for a in attempts) == sorted([str(due.id), str(other.id)])
    for run_id in (due.id, other.id):
        run = Run.objects.get(pk=run_id)
        assert (run.state, run.generation, run.owner, run.version) == ("running", 1, OWNER, 2)
        assert kinds(run) == ["created", "started"]
    assert Run.objects.get(pk=later.id).state == "queued"
    assert Run.objects.get(pk=running.id).generation == 1


def fields(run: Run) -> dict:
    return {f.attname: getattr(run, f.attname) for f in Run._meta.concrete_fields}


@pytest.fixture
def rows_of_every_shape() -> dict:
    """Ids of runs whose rows fill every kind of column: a parent; its child with nested
    input, a big budget and a start time; an awaiting run with an agent state and a prompt."""
    parent = queued_run()
    child = queued_run(parent_id=parent.id, input={"deep": [1, {"x": "ü"}], "n": None},
                       budget={"max_seconds": 2.5, "max_tokens": 2**40},
                       start_after=timezone.now() - timedelta(seconds=1))
    run, generation = running_run()
    domain.attempt_step(run_id=run.id, generation=generation, tokens=3,
                          agent_state={"cursor": [1, 2]})
    domain.attempt_pause(run_id=run.id, generation=generation, prompt={"ask": "ok?"})
    return {"parent": parent.id, "child": child.id, "awaiting": run.id}


@pytest.mark.parametrize("shape", ["parent", "child", "awaiting"])
def test_the_hot_statements_lock_a_row_as_the_orm_reads_it(rows_of_every_shape, shape):
    pk = rows_of_every_shape[shape]
    with transaction.atomic():
        assert fields(sql.lock(Run, pk)) == fields(Run.objects.get(pk=pk))


def test_the_hot_statements_lock_many_rows_as_the_orm_reads_them(rows_of_every_shape):
    parent, child = rows_of_every_shape["parent"], rows_of_every_shape["child"]
    with transaction.atomic():
        locked, _ = sql.lock_many_at(Run, sorted([child, parent, uuid.uuid4()]))
    assert [r.id for r in locked] == sorted([child, parent])
    assert [fields(r) for r in locked] == [fields(Run.objects.get(pk=r.id)) for r in locked]


def test_an_output_past_the_cap_ends_the_run_failed_saying_so(settings):
    settings.AWAKEN_MAX_OUTPUT_BYTES = 1024
    run, generation = running_run()
    assert domain.attempt_finish(run_id=run.id, generation=generation,
                                 ending=Ending.completed({"text": "x" * 2000}))
    run = Run.objects.get(pk=run.id)
    assert (run.end_cause, run.output) == ("failed", None)
    assert "AWAKEN_MAX_OUTPUT_BYTES (1024)" in run.error


# --- an attempt's last step written with its end ------------------------------------------------

LAST_STEP = {"tokens": 9, "agent_state": {"i": 2}, "actor": None, "source": "worker",
             "data": {"replies": [{"model": "mine", "usage": {"prompt": 10, "completion": 20}}],
                      "tools": [{"name": "look", "digest": "d1"}]}}


def stop_asked(**budget) -> tuple[Run, int]:
    """A running run whose stop is asked, not taken yet by its attempt."""
    run, generation = running_run(budget=budget or None)
    domain.run_stop(run_id=run.id, reason="enough", actor="olga", source="api")
    return run, generation


def ended_by_two_writes(**budget) -> Run:
    run, generation = stop_asked(**budget)
    domain.attempt_step(run_id=run.id, generation=generation, **LAST_STEP)
    assert domain.attempt_finish(run_id=run.id, generation=generation,
                                 ending=Ending.completed({"a": 1}))
    return Run.objects.get(pk=run.id)


def ended_with_its_step(**budget) -> Run:
    run, generation = stop_asked(**budget)
    assert domain.attempt_finish(run_id=run.id, generation=generation,
                                 ending=Ending.completed({"a": 1}), step=LAST_STEP)
    return Run.objects.get(pk=run.id)


def what_was_pushed(monkeypatch, django_capture_on_commit_callbacks, end) -> list:
    """The runs' changes pushed to the sockets once the transitions commit, in order: the
    event's kind and version, and the run's state, steps and request as pushed."""
    from runs.domain import outside
    from runs.domain.representation import run_data

    pushed = []

    class Changes:
        def publish_changes(self, *, changes):
            for run, event in changes:
                data = run_data(run)
                control = data["control"] and (data["control"]["action"],
                                               data["control"]["applied_at"] is not None)
                pushed.append((event.kind, event.version, data["state"],
                               data["usage"]["steps"], control))

    monkeypatch.setattr(outside, "changes", Changes())
    with django_capture_on_commit_callbacks(execute=True):
        run = end()
    return run, pushed


def test_a_last_step_written_with_the_end_is_what_its_own_write_was(
        settings, monkeypatch, django_capture_on_commit_callbacks):
    """The same run, the same events in the same order, the same pushes after commit."""
    settings.AWAKEN_MODEL_PRICES = '{"mine": {"input": 1, "output": 3}}'
    alone, pushed_alone = what_was_pushed(monkeypatch, django_capture_on_commit_callbacks,
                                          lambda: ended_by_two_writes(max_repeats=3))
    together, pushed_together = what_was_pushed(
        monkeypatch, django_capture_on_commit_callbacks,
        lambda: ended_with_its_step(max_repeats=3))
    assert pushed_together == pushed_alone
    assert pushed_together[-3:] == [("stop_requested", 3, "running", 0, ("stop", False)),
                                    ("step", 4, "running", 1, ("stop", False)),
                                    ("ended", 5, "ended", 1, ("stop", True))]
    columns = ("state", "end_cause", "output", "steps", "tokens", "cost_usd", "repeats",
               "agent_state", "version")
    assert ([getattr(together, name) for name in columns]
            == [getattr(alone, name) for name in columns])
    assert together.cost_usd == pytest.approx((10 * 1 + 20 * 3) / 1e6)
    assert together.repeats == {"d1": 1}

    def events(run):
        return [(event.kind, event.version, event.state, event.data) for event
                in Event.objects.filter(run=run).order_by("seq")]

    assert events(together) == events(alone)
    assert_versions_contiguous(together)


def test_the_step_rule_reckons_what_the_write_gives(settings):
    """``step_totals``, the rule a worker reckons a step not written yet by, is the one the
    write applies: priced, unpriced (the cost unknown from then on), loop guard counts."""
    from runs.domain.attempts import step_totals

    settings.AWAKEN_MODEL_PRICES = '{"mine": {"input": 1, "output": 3}}'
    run, generation = running_run(budget={"max_repeats": 5})
    reckoned = {"steps": 0, "tokens": 0, "cost_usd": 0.0, "repeats": {}}
    for model in ("mine", "mine", "nobody's", "mine"):
        data = {"replies": [{"model": model, "usage": {"prompt": 7, "completion": 11}}],
                "tools": [{"name": "look", "digest": "d1"}, {"name": "x", "digest": "d2"}]}
        totals = step_totals(**reckoned, max_repeats=5, step_tokens=18, data=data)
        reckoned = {"steps": totals.steps, "tokens": totals.tokens,
                    "cost_usd": totals.cost_usd, "repeats": totals.repeats}
        written = domain.attempt_step(run_id=run.id, generation=generation, tokens=18,
                                      data=data)
        assert reckoned == {"steps": written.steps, "tokens": written.tokens,
                            "cost_usd": written.cost_usd, "repeats": written.repeats}
    assert reckoned["cost_usd"] is None and reckoned["repeats"] == {"d1": 4, "d2": 4}


@pytest.mark.parametrize("moved_on", ["ended", "newer attempt"])
def test_a_last_step_of_an_attempt_no_longer_live_is_refused_with_its_end(moved_on):
    run, generation = running_run()
    if moved_on == "ended":
        domain.run_cancel(run_id=run.id, actor="olga", source="api")
        domain.attempt_interrupted(run_id=run.id, generation=generation)
    else:
        Attempt.objects.filter(run=run).update(lease_expires_at=timezone.now()
                                               - timedelta(minutes=5))
        assert domain.attempt_expire(run_id=run.id, generation=generation,
                                     max_crash_retries=3) == "requeued"
        domain.attempt_start(run_id=run.id, owner=OWNER, lease_seconds=30)
    before = db_state()
    assert not domain.attempt_finish(run_id=run.id, generation=generation,
                                     ending=Ending.completed({"late": True}), step=LAST_STEP)
    assert db_state() == before
    with pytest.raises(domain.Fenced):  # as the step's own write is
        domain.attempt_step(run_id=run.id, generation=generation, **LAST_STEP)


def commits_of(end, tries: int = 3) -> int:
    """The transactions PostgreSQL commits on this connection while ``end(i)`` runs, less
    those of the measure itself: its statistics, flushed at once. They count the whole
    database, and another connection's may come in late, so only ever more: the fewest of
    ``tries`` is the count."""
    from django.db import connection

    def committed():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute("SELECT xact_commit FROM pg_stat_database "
                           "WHERE datname = current_database()")
            return cursor.fetchone()[0]

    def measured(work) -> int:
        first = committed()
        work()
        return committed() - first

    empty = min(measured(lambda: None) for _ in range(tries))
    return min(measured(partial(end, i)) for i in range(tries)) - empty


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_last_step_and_the_end_commit_in_one_transaction_not_two():
    """Counted by PostgreSQL itself: the step's own write is one transaction more."""
    alone = [running_run()[0] for _ in range(3)]
    folded = [running_run()[0] for _ in range(3)]

    def two_writes(i):
        domain.attempt_step(run_id=alone[i].id, generation=1, **LAST_STEP)
        domain.attempt_finish(run_id=alone[i].id, generation=1, ending=Ending.completed())

    def together(i):
        domain.attempt_finish(run_id=folded[i].id, generation=1, ending=Ending.completed(),
                              step=LAST_STEP)

    assert (commits_of(two_writes), commits_of(together)) == (2, 1)
    for run in alone + folded:
        assert kinds(run)[-2:] == ["step", "ended"]


# --- the ends of a worker's attempts in one transaction ------------------------------------


def end_of(run, generation=1, **end) -> dict:
    return {"run_id": run.id, "generation": generation,
            "ending": end.pop("ending", Ending.completed({"n": 1})), **end}


def test_ends_together_write_what_each_would_write_alone():
    alone, together = running_run()[0], [running_run()[0] for _ in range(3)]
    noted = [{"kind": "progress", "text": "1 of 2"}, {"kind": "model", "text": "m", "ms": 3}]
    domain.attempt_finish(**end_of(alone, step=LAST_STEP, activity=noted))
    assert domain.attempts_finish(ends=[end_of(run, step=LAST_STEP, activity=noted)
                                        for run in together]) == [True] * 3

    def written(run):
        run = Run.objects.get(pk=run.id)
        events = Event.objects.filter(run_id=run.id).order_by("seq")
        return (run.state, run.end_cause, run.output, run.version, run.steps, run.tokens,
                [(e.kind, e.version, e.state, e.end_cause, e.actor) for e in events],
                list(Activity.objects.filter(run=run).order_by("seq")
                     .values_list("kind", "text", "generation")))

    assert all(written(run) == written(alone) for run in together)
    assert written(alone)[1] == EndCause.COMPLETED


def test_an_end_of_an_attempt_no_longer_live_is_refused_and_the_others_commit():
    first, moved_on, last = (running_run()[0] for _ in range(3))
    domain.run_cancel(run_id=moved_on.id, actor="olga", source="api")
    domain.attempt_interrupted(run_id=moved_on.id, generation=1)
    ended = Run.objects.get(pk=moved_on.id)
    assert domain.attempts_finish(ends=[end_of(first), end_of(moved_on, step=LAST_STEP),
                                        end_of(last)]) == [True, False, True]
    assert Run.objects.get(pk=moved_on.id).version == ended.version
    assert Run.objects.get(pk=moved_on.id).end_cause == EndCause.CANCELLED
    assert {Run.objects.get(pk=run.id).end_cause for run in (first, last)} == {
        EndCause.COMPLETED}


def test_the_answers_follow_the_ends_not_the_order_their_runs_are_locked_in():
    runs = sorted((running_run()[0] for _ in range(6)), key=lambda run: str(run.id),
                  reverse=True)
    stale = {runs[0].id, runs[2].id}  # not where the lock order would put them
    answers = domain.attempts_finish(ends=[end_of(run, generation=2 if run.id in stale else 1)
                                           for run in runs])
    assert answers == [run.id not in stale for run in runs]
    assert [Run.objects.get(pk=run.id).state for run in runs] == [
        RunState.RUNNING if run.id in stale else RunState.ENDED for run in runs]


@pytest.mark.parametrize("wrong", ["the same run twice", "no such run", "not an id"])
def test_a_wrong_batch_of_ends_commits_none_of_them(wrong):
    runs = [running_run()[0] for _ in range(2)]
    ends = [end_of(run) for run in runs]
    extra = {"the same run twice": end_of(runs[0]),
             "no such run": {**end_of(runs[0]), "run_id": uuid.uuid4()},
             "not an id": {**end_of(runs[0]), "run_id": "../x"}}[wrong]
    before = db_state()
    error = ValueError if wrong == "the same run twice" else domain.RunNotFound
    with pytest.raises(error):
        domain.attempts_finish(ends=[*ends, extra])
    assert db_state() == before


def test_ends_together_end_the_children_of_each_run_in_its_name():
    parents = [running_run()[0] for _ in range(3)]
    queued = [queued_run(parent_id=parents[0].id) for _ in range(2)]
    running = running_run(parent_id=parents[2].id)[0]
    assert domain.attempts_finish(ends=[end_of(run) for run in parents]) == [True] * 3
    for child, parent in [(queued[0], parents[0]), (queued[1], parents[0]),
                          (running, parents[2])]:
        assert ControlIntent.objects.get(run_id=child.id).caused_by_id == parent.id
    assert [Run.objects.get(pk=run.id).state for run in queued] == [RunState.ENDED] * 2
    assert Run.objects.get(pk=running.id).state == RunState.RUNNING  # told, pending
    assert not ControlIntent.objects.filter(caused_by_id=parents[1].id).exists()


@pytest.mark.postgres
def test_ends_together_of_every_kind_are_written_by_one_statement():
    runs = [running_run()[0] for _ in range(6)]
    ends = [end_of(runs[0]), end_of(runs[1]), end_of(runs[2], step=LAST_STEP),
            end_of(runs[3], step=LAST_STEP, activity=[{"kind": "log", "text": "last"}]),
            end_of(runs[4], ending=Ending.failed("boom")), end_of(runs[5], generation=2)]
    sent = []

    def kept(execute, text, params, many, context):
        sent.append(text)
        return execute(text, params, many, context)

    with connection.execute_wrapper(kept):
        assert domain.attempts_finish(ends=ends) == [True] * 5 + [False]
    assert len([text for text in sent if text.startswith("WITH")]) == 1
    assert [Run.objects.get(pk=run.id).end_cause for run in runs] == [
        EndCause.COMPLETED] * 4 + [EndCause.FAILED, None]
    assert [kinds(run)[-2:] for run in runs[2:4]] == [["step", "ended"]] * 2
    assert Activity.objects.filter(run_id=runs[3].id, text="last").exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_ends_together_commit_in_one_transaction():
    """Counted by PostgreSQL itself, as the step's is above."""
    batches = [[running_run()[0] for _ in range(4)] for _ in range(3)]
    assert commits_of(lambda i: domain.attempts_finish(
        ends=[end_of(run) for run in batches[i]])) == 1
    assert {run.end_cause for run in Run.objects.all()} == {EndCause.COMPLETED}
