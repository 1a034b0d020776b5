"""The seed's guarantees at the edges (SPEC §7.9-13): stale attempts, children of ended or
lost parents, resume input across a crash, joined requests, the database clock, and the
worker's side of live delivery. Each test failed before its fix."""

import asyncio
import gc
import os
import threading
import uuid
import weakref
from datetime import timedelta
from functools import partial

import pytest
from django.db import connection
from django.utils import timezone

from runs import domain
from runs.domain import selectors
from runs.domain.actions import action_digest
from runs.models import Attempt, ControlIntent, Event, Run, RunState
from runs.runtime.agent import Agent, Context, register
from runs.runtime.registry import Entry, Registry
from runs.runtime.token import CancellationToken, Why
from runs.workers import commands
from tests.conftest import client_for, db_state, make_user
from tests.factories import OWNER, awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db


def expire(run: Run) -> None:
    """Make the run's live attempt's lease run out (as if its worker froze)."""
    Attempt.objects.filter(run=run, state="live").update(
        lease_expires_at=timezone.now() - timedelta(minutes=5))


def child_of(parent: Run, *, running: bool) -> Run:
    run = queued_run(parent_id=parent.id)
    if running:
        domain.attempt_start(run_id=run.id, owner=OWNER, lease_seconds=30)
    return Run.objects.get(pk=run.id)


# --- live commands reach only the attempt that holds the claim (SPEC §4, §7.6) -----------------


class FakeExecutor:
    def __init__(self):
        self.owner = OWNER
        self.registry = Registry()


@pytest.fixture
def executor(monkeypatch):
    fake = FakeExecutor()
    monkeypatch.setattr(commands, "current_executor", lambda: fake)
    return fake


def test_a_live_command_to_a_re_queued_attempt_is_not_active(executor):
    run, generation = running_run()
    entry = Entry(str(run.id), generation, CancellationToken())
    executor.registry.register(entry)
    expire(run)
    assert domain.sweep()["requeued"] == 1  # the claim is gone; the registry still has it
    assert not commands.apply_command(str(run.id), generation, "pause", actor="olga")
    assert not entry.pause_requested.is_set()
    assert not commands.apply_command(str(run.id), generation, "cancel")
    assert not entry.token.cancelled


def test_a_live_command_to_the_claim_holder_is_applied(executor):
    run, generation = running_run()
    entry = Entry(str(run.id), generation, CancellationToken())
    executor.registry.register(entry)
    assert commands.apply_command(str(run.id), generation, "cancel", actor="olga")
    assert entry.token.why.actor == "olga"


def test_a_command_that_arrives_before_its_attempt_registers_waits_for_it(executor):
    run, generation = running_run()  # claimed: the claim commits before registration
    entry = Entry(str(run.id), generation, CancellationToken())
    threading.Timer(0.05, executor.registry.register, args=(entry,)).start()
    assert commands.apply_command(str(run.id), generation, "cancel")
    assert entry.token.cancelled


def test_a_command_past_its_deadline_is_dropped(executor):
    """Its sender has answered NotActive by then: applying it would make that answer false."""
    import time

    run, generation = running_run()
    entry = Entry(str(run.id), generation, CancellationToken())
    executor.registry.register(entry)
    past = time.time() - 0.01
    assert not commands.apply_command(str(run.id), generation, "pause", deadline=past)
    assert not commands.apply_command(str(run.id), generation, "message", deadline=past,
                                      message={"hello": 1})
    assert not entry.pause_requested.is_set() and not entry.inbox
    assert commands.apply_command(str(run.id), generation, "pause",
                                  deadline=time.time() + 5)
    assert entry.pause_requested.is_set()


def test_a_command_whose_attempt_registers_after_its_deadline_is_dropped(executor):
    import time

    run, generation = running_run()
    entry = Entry(str(run.id), generation, CancellationToken())
    threading.Timer(0.1, executor.registry.register, args=(entry,)).start()
    assert not commands.apply_command(str(run.id), generation, "cancel",
                                      deadline=time.time() + 0.05)
    assert not entry.token.cancelled


def test_a_full_delivery_path_answers_busy_not_not_active(monkeypatch):
    """No broker thread can send it: 503 ``busy`` with Retry-After, never a false
    ``not_active`` (the run is running)."""
    from runs.workers import broker

    run, generation = running_run()
    full = broker.BrokerThreads(threads=1, backlog=0)
    release = threading.Event()
    full.post(release.wait, timeout=10)  # the only thread, and no backlog place
    monkeypatch.setattr(broker, "_threads", full)
    try:
        client = client_for(make_user("busy-olga", "operator"))
        for path, body in ((f"/api/runs/{run.id}/pause/?wait=0", None),
                           (f"/api/runs/{run.id}/deliver/", {"command": "wake"})):
            answer = client.post(path, body, format="json")
            assert answer.status_code == 503, answer.content
            assert answer.json()["code"] == "busy"
            assert answer["Retry-After"] == "1"
    finally:
        release.set()
    assert Run.objects.get(pk=run.id).state == RunState.RUNNING


def test_queued_runs_no_broker_thread_can_send_are_counted_for_the_sweeper(
        monkeypatch, caplog):
    from runs.workers import broker
    from runs.workers.dispatch import Dispatches

    full = broker.BrokerThreads(threads=1, backlog=0)
    release = threading.Event()
    full.post(release.wait, timeout=10)  # the only thread, and no backlog place
    monkeypatch.setattr(broker, "_threads", full)
    try:
        with caplog.at_level("WARNING", logger="runs.workers.dispatch"):
            Dispatches().add([(f"run-{n}", None) for n in range(3)])
    finally:
        release.set()
    assert "broker threads full: 3 queued run(s) left for the sweeper" in caplog.text


def test_a_newer_generation_fences_the_one_it_replaces():
    registry = Registry()
    old, new = (Entry("r", n, CancellationToken()) for n in (1, 2))
    child = old.token.child()
    registry.register(old)
    assert registry.register(new)
    assert old.token.why.kind == "fenced" and child.cancelled
    assert not new.token.cancelled
    assert not registry.register(Entry("r", 1, CancellationToken()))  # stale: refused


# --- sweeper and renewal, on the database's clock (SPEC §6) --------------------------------


def test_a_renewal_after_the_sweep_reports_the_attempt_fenced():
    run, generation = running_run()
    expire(run)
    assert domain.attempt_expire(run_id=run.id, generation=generation,
                                 max_crash_retries=3) == "requeued"
    renewal = domain.attempt_renew(owner=OWNER, attempts=[(run.id, generation)],
                                   lease_seconds=30)
    assert renewal.renewed == set()


@pytest.mark.parametrize("ending", ["requeued", "applied", "failed"])
def test_a_lost_attempt_is_charged_up_to_its_last_renewal_not_the_outage(ending):
    """Its worker renewed 40 s after the claim and was not heard of again for half an hour:
    the run has run 40 s, on its page and for its time budget alike."""
    run, generation = running_run(budget={"max_seconds": 60})
    claimed = timezone.now() - timedelta(minutes=30)
    renewed = claimed + timedelta(seconds=40)
    Run.objects.filter(pk=run.id).update(claimed_at=claimed)
    Attempt.objects.filter(run=run, state="live").update(
        started_at=claimed, renewed_at=renewed, lease_expires_at=renewed + timedelta(seconds=30))
    if ending == "applied":
        domain.run_cancel(run_id=run.id, actor="olga", source="api")
    assert domain.attempt_expire(run_id=run.id, generation=generation,
                                 max_crash_retries=0 if ending == "failed" else 3) == ending
    run.refresh_from_db()
    assert run.seconds_used == pytest.approx(40, abs=0.01)
    lost = Attempt.objects.get(run=run, generation=generation)
    assert lost.close_reason == "lost" and lost.closed_at > renewed + timedelta(minutes=20)
    assert (lost.ran_until - lost.started_at).total_seconds() == pytest.approx(40, abs=0.01)
    if ending == "requeued":  # the next attempt has the 20 s the budget leaves
        again = domain.attempt_start(run_id=run.id, owner=OWNER, lease_seconds=30)
        view = selectors.attempt_view(run=Run.objects.get(pk=run.id),
                                      generation=again.generation)
        assert view.max_seconds - view.seconds_used == pytest.approx(20, abs=0.01)


def test_a_renewal_records_when_it_renewed():
    run, generation = running_run()
    first = Attempt.objects.get(run=run).renewed_at
    assert first is not None
    Attempt.objects.filter(run=run).update(renewed_at=first - timedelta(minutes=1))
    domain.attempt_renew(owner=OWNER, attempts=[(run.id, generation)], lease_seconds=30)
    assert Attempt.objects.get(run=run).renewed_at >= first


@pytest.mark.postgres
def test_a_renewal_changes_no_indexed_column_so_each_lease_is_updated_in_place():
    """A renewal is every live attempt's update each interval. It writes no indexed column,
    so PostgreSQL makes each a heap-only update, on the row's own page (which has room in a
    new table): no new entry in any index of the attempts, no dead row for a vacuum."""
    held = [running_run() for _ in range(3)]

    def updated():  # this transaction's updates of attempts so far: all, heap-only
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_get_xact_tuples_updated(%s::regclass), "
                           "pg_stat_get_xact_tuples_hot_updated(%s::regclass)",
                           [Attempt._meta.db_table] * 2)
            return cursor.fetchone()

    before = updated()
    renewal = domain.attempt_renew(owner=OWNER, lease_seconds=30, attempts=[
        (run.id, generation) for run, generation in held])
    assert renewal.renewed == {(str(run.id), generation) for run, generation in held}
    after = updated()
    assert (after[0] - before[0], after[1] - before[1]) == (3, 3)


def test_a_renewed_lease_is_not_expired_by_a_sweep():
    run, generation = running_run()
    expire(run)
    domain.attempt_renew(owner=OWNER, attempts=[(run.id, generation)], lease_seconds=30)
    assert domain.attempt_expire(run_id=run.id, generation=generation,
                                 max_crash_retries=3) is None
    assert Run.objects.get(pk=run.id).state == RunState.RUNNING


@pytest.mark.postgres  # an executor's threads and this one: SQLite's shared cache locks tables
@pytest.mark.django_db(transaction=True)
def test_a_worker_renews_chunk_by_chunk_and_judges_every_attempt(monkeypatch):
    """Seven attempts in chunks of two: each is renewed, fenced or told of its request by
    the chunk that holds it, whatever the order they were registered in."""
    from runs.domain import attempts
    from runs.runtime.executor import Executor

    monkeypatch.setattr(attempts, "RENEWAL_CHUNK", 2)
    executor = Executor(node="edges-renew", lease_seconds=3600, db_threads=1)
    try:
        runs = [queued_run() for _ in range(7)]
        held = [domain.attempt_start(run_id=run.id, owner=executor.owner, lease_seconds=30)
                for run in runs]
        entries = [Entry(str(a.run_id), a.generation, CancellationToken()) for a in held]
        for entry in reversed(entries):
            executor.registry.register(entry)
        lost, asked = entries[2], entries[5]
        expire(Run.objects.get(pk=lost.run_id))
        assert domain.sweep()["requeued"] == 1
        domain.run_cancel(run_id=asked.run_id, actor="olga", source="api")

        asyncio.run_coroutine_threadsafe(executor.leases.renew(), executor.loop).result(10)
    finally:
        executor.close()
    assert lost.token.why.kind == "fenced"
    assert (asked.token.why.kind, asked.token.why.actor) == ("command", "olga")
    others = [entry for entry in entries if entry not in (lost, asked)]
    assert not any(entry.token.cancelled for entry in others)
    leases = Attempt.objects.filter(run_id__in=[entry.run_id for entry in others + [asked]],
                                    state="live").values_list("lease_expires_at", flat=True)
    assert len(leases) == 6 and min(leases) > timezone.now() + timedelta(minutes=30)


def test_renewal_chunks_are_ranges_of_run_ids(monkeypatch):
    from runs.domain import attempts

    monkeypatch.setattr(attempts, "RENEWAL_CHUNK", 3)
    ids = [str(uuid.uuid4()) for _ in range(8)]
    chunks = attempts.renewal_chunks([(run_id, 1) for run_id in ids], run_id=lambda p: p[0])
    assert [len(chunk) for chunk in chunks] == [3, 3, 2]
    assert [run_id for chunk in chunks for run_id, _ in chunk] == sorted(ids)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_sweeper_and_renewal_racing_never_both_win(gang):
    """8 threads: half expire the attempt, half renew it, from an expired lease."""
    threads = gang(8)
    for _ in range(40):
        run, generation = running_run()
        expire(run)
        sweep = partial(domain.attempt_expire, run_id=run.id, generation=generation,
                        max_crash_retries=3)
        renew = partial(domain.attempt_renew, owner=OWNER, attempts=[(run.id, generation)],
                        lease_seconds=30)
        results = threads.run([sweep] * 4 + [renew] * 4)
        renewed = any((str(run.id), generation) in r.renewed for r in results[4:])
        expired = [r for r in results[:4] if r is not None]
        assert len(expired) <= 1, expired
        attempt = Attempt.objects.get(run=run, generation=generation)
        assert not (renewed and expired), (renewed, expired)
        assert (attempt.state == "live") == (not expired)


def test_leases_are_compared_on_the_database_clock(monkeypatch):
    run, generation = running_run()
    domain.attempt_renew(owner=OWNER, attempts=[(run.id, generation)], lease_seconds=30)
    skewed = timezone.now() + timedelta(hours=1)  # this host's clock runs an hour fast
    monkeypatch.setattr("django.utils.timezone.now", lambda: skewed)
    assert domain.sweep()["requeued"] == 0
    assert Run.objects.get(pk=run.id).state == RunState.RUNNING


def test_a_claim_sets_its_lease_by_the_database_clock(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite lives on one host: its clock is the host's")
    skewed = timezone.now() - timedelta(hours=1)  # this host's clock runs an hour slow
    run = queued_run()
    monkeypatch.setattr("django.utils.timezone.now", lambda: skewed)
    domain.attempt_start(run_id=run.id, owner=OWNER, lease_seconds=30)
    monkeypatch.undo()
    assert domain.sweep()["requeued"] == 0


# --- children never run on under an ended or lost parent (SPEC §7.10) ------------------------


def test_cancelling_an_awaiting_parent_cancels_its_children_each_with_an_intent():
    parent, generation = running_run()
    running_child = child_of(parent, running=True)
    queued_child = child_of(parent, running=False)
    grandchild = child_of(queued_child, running=False)
    finished = child_of(parent, running=False)
    domain.run_cancel(run_id=finished.id, actor="olga", source="api")
    domain.attempt_pause(run_id=parent.id, generation=generation)

    domain.run_cancel(run_id=parent.id, actor="olga", source="ui")

    for child in (queued_child, grandchild):
        child = Run.objects.select_related("control").get(pk=child.id)
        assert (child.state, child.end_cause) == ("ended", "cancelled")
        assert child.control.requested_by == "olga" and child.control.source == "ui"
    assert Run.objects.get(pk=queued_child.id).control.caused_by_id == parent.id
    assert Run.objects.get(pk=grandchild.id).control.caused_by_id == queued_child.id
    live = Run.objects.select_related("control").get(pk=running_child.id)
    assert live.state == "running" and live.control.applied_at is None  # told live
    assert live.control.caused_by_id == parent.id
    assert str(parent.id)[:8] in live.control.reason
    assert ControlIntent.objects.filter(run=finished).count() == 1  # ended: left alone


def test_a_parent_that_completes_cancels_the_children_it_left_running():
    parent, generation = running_run()
    child = child_of(parent, running=False)
    domain.attempt_finish(run_id=parent.id, generation=generation,
                          ending=domain.Ending.completed({"ok": True}))
    child = Run.objects.select_related("control").get(pk=child.id)
    assert child.end_cause == "cancelled" and child.control.caused_by_id == parent.id
    assert child.control.requested_by == "worker"


def test_a_lost_parent_attempt_cancels_its_children_with_a_record():
    parent, generation = running_run()
    child = child_of(parent, running=False)
    expire(parent)
    assert domain.sweep()["requeued"] == 1
    child = Run.objects.select_related("control").get(pk=child.id)
    assert child.end_cause == "cancelled"
    assert "lost its attempt" in child.control.reason
    assert child.control.caused_by_id == parent.id


def test_a_child_cancelled_with_its_fenced_parent_ends_with_a_record_of_why():
    parent, _ = running_run()
    child = child_of(parent, running=True)
    assert domain.attempt_parent_gone(run_id=child.id, generation=1, parent_id=parent.id,
                                      why="fenced")
    child = Run.objects.select_related("control").get(pk=child.id)
    assert child.end_cause == "cancelled"
    assert child.control.caused_by_id == parent.id
    assert (child.control.requested_by, child.control.source) == ("worker", "worker")
    ended = Event.objects.get(run=child, kind="ended")
    assert (ended.actor, ended.source) == ("worker", "worker")


# --- resume input survives a crash until the next step (SPEC §7.11) ---------------------------


def test_resume_input_reaches_the_attempt_after_a_crash():
    run, ticket = awaiting_run()
    domain.run_resume(run_id=run.id, ticket_id=ticket, input={"approved": True},
                      actor="olga", source="api")
    attempt = domain.attempt_start(run_id=run.id, owner=OWNER, lease_seconds=30)
    expire(run)
    assert domain.sweep()["requeued"] == 1  # the worker died before the next step
    again = domain.attempt_start(run_id=run.id, owner=OWNER, lease_seconds=30)
    assert again.generation == attempt.generation + 1
    view = selectors.attempt_view(run=again.run, generation=again.generation)
    assert (view.resume.reason, view.resume.input) == ("manual_pause", {"approved": True})

    domain.attempt_step(run_id=run.id, generation=again.generation)
    expire(run)
    domain.sweep()
    third = domain.attempt_start(run_id=run.id, owner=OWNER, lease_seconds=30)
    assert selectors.attempt_view(run=third.run, generation=third.generation).resume is None


# --- every control request is recorded, joined ones too (SPEC §7.12) --------------------------


def test_a_request_that_joins_a_pending_one_is_recorded():
    run, _ = running_run()
    first = domain.run_cancel(run_id=run.id, actor="olga", source="ui")
    second = domain.run_stop(run_id=run.id, actor="bob", source="api", reason="too slow")
    assert second.intent == first.intent and second.path == "live"
    joined = Event.objects.filter(run=run).order_by("-seq").first()
    assert (joined.kind, joined.actor, joined.source) == ("stop_requested", "bob", "api")
    assert joined.data == {"reason": "too slow", "stop_code": "operator",
                           "joined": first.intent.pk}
    assert ControlIntent.objects.filter(run=run).count() == 1


# --- an attempt's memory does not grow with its awaits (SPEC §7.13) ----------------------------


def test_a_token_holds_only_the_waits_in_progress():
    token = CancellationToken()

    class Host:
        pass

    ctx = Context(run_id="r", generation=1, input={}, state={}, resume=None, token=token,
                  host=Host())

    async def many():
        for _ in range(10_000):
            await ctx.race(asyncio.sleep(0))

    asyncio.run(many())
    assert token.waiting == 0


# --- pause answers, live delivery input ---------------------------------------------------------


@pytest.fixture
def api(db):
    return client_for(make_user("olga", "operator"))


def test_pause_of_a_run_that_ends_before_its_boundary_is_not_active(api, monkeypatch):
    run, generation = running_run()

    def attempt_ends_instead(**kwargs):
        domain.attempt_finish(run_id=run.id, generation=generation,
                              ending=domain.Ending.completed())

    monkeypatch.setattr("runs.workers.dispatch.send_command_and_wait", attempt_ends_instead)
    response = api.post(f"/api/runs/{run.id}/pause/?wait=0")
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "not_active"
    assert body["run"]["state"] == "ended" and body["run"]["id"] == str(run.id)


def test_pause_of_a_run_that_is_not_running_is_not_active_with_the_run(api):
    run = queued_run()
    response = api.post(f"/api/runs/{run.id}/pause/?wait=0")
    assert response.status_code == 409
    assert response.json()["code"] == "not_active"
    assert response.json()["run"]["state"] == "queued"


@pytest.mark.parametrize("body, field", [
    ({"command": "message", "message": {"text": "x" * (64 * 1024)}}, "message"),
    ({"command": "wake", "message": {"text": "hi"}}, "message"),
    ({"command": "message", "message": "nul \u0000"}, "message"),
    ({"command": "shout"}, "command"),
])
def test_bad_live_deliveries_are_refused_and_change_nothing(api, body, field):
    run, _ = running_run()
    before = db_state()
    response = api.post(f"/api/runs/{run.id}/deliver/", body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "invalid"
    assert field in response.json()["detail"]
    assert db_state() == before


def test_inbox_items_arrive_in_order_and_a_wake_is_an_empty_item():
    registry = Registry()
    loop = asyncio.new_event_loop()
    entry = Entry(str(uuid.uuid4()), 1, CancellationToken(), loop=loop)
    registry.register(entry)
    assert registry.apply(entry.run_id, 1, "message", message={"n": 1}) is entry
    assert registry.apply(entry.run_id, 1, "wake") is entry
    assert registry.apply(entry.run_id, 2, "message", message={"n": 2}) is None
    assert [item.message for item in entry.inbox] == [{"n": 1}, None]
    entry.token.cancel(Why("command"))
    assert registry.apply(entry.run_id, 1, "message", message={"n": 3}) is None
    loop.close()


# --- abandoned blocking tools are counted, replaced and capped -----------------------------------


def test_abandoned_blocking_tools_are_replaced_and_past_the_cap_fail_at_once():
    from harness.processes import wait_until
    from runs.runtime.agent import Interrupted
    from runs.runtime.executor import Executor, ToolsExhausted

    executor = Executor(node="edges", lease_seconds=3600, tool_threads=2, db_threads=1)
    executor.tool_threads.abandoned_limit = 4
    release = threading.Event()

    class ToolHost:  # the part of the host interface a tool call uses
        run_sync_tool = executor.tool_threads.run

        async def fence(self, ctx):
            pass

        def before_tool(self, ctx, tool, arguments, pending):
            return action_digest(tool, arguments)  # no loop guard here

        def activity(self, ctx, entry):
            pass

    def blocking_tool(started: threading.Event) -> bool:
        started.set()
        return release.wait(30)

    async def call_tool(cancel: bool):
        token, started = CancellationToken(), threading.Event()
        ctx = Context(run_id="r", generation=1, input={}, state={}, resume=None, token=token,
                      host=ToolHost())
        call = asyncio.ensure_future(ctx.tool(blocking_tool, started))
        if cancel:
            await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
            token.cancel(Why("command"))
        return await call

    def on_loop(cancel: bool):
        return asyncio.run_coroutine_threadsafe(call_tool(cancel), executor.loop).result(10)

    for _ in range(3):  # more than the slots: each abandoned thread is replaced
        with pytest.raises(Interrupted):
            on_loop(cancel=True)
    assert executor.tool_threads.abandoned == 3
    with pytest.raises(Interrupted):
        on_loop(cancel=True)
    with pytest.raises(ToolsExhausted):  # the memory cap: 4 out at once
        on_loop(cancel=False)
    release.set()  # the abandoned threads return
    wait_until(lambda: executor.tool_threads.abandoned == 0, 10, "the abandoned tools to return")
    assert on_loop(cancel=False) is True
    executor.close()


def test_worker_reports_reach_the_metrics():
    from django.test import Client

    domain.worker_report(owner="w1@host:7", live_attempts=3, abandoned_tools=1)
    text = Client().get("/metrics").content.decode()
    assert 'awaken_worker_live_attempts{owner="w1@host:7"} 3.0' in text
    assert 'awaken_worker_abandoned_tools{owner="w1@host:7"} 1.0' in text


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_live_cancel_taken_while_a_pause_commits_is_not_lost():
    """The attempt saw no cancel at its boundary, then a live-only cancel (no intent) cancels
    its token while the pause commits: the run is awaiting, so the cancel goes durable."""
    from runs.runtime.executor import Executor

    executor = Executor(node="edges-pause", lease_seconds=3600, db_threads=2)
    run, generation = running_run()
    token = CancellationToken()
    view = selectors.attempt_view(run=run, generation=generation)
    host = executor.host_for(Entry(str(run.id), generation, token, loop=executor.loop), view)
    ctx = Context(run_id=str(run.id), generation=generation, input={}, state={}, resume=None,
                  token=token, host=host)
    token.cancel(Why("command", actor="olga", source="api", at=timezone.now()))

    try:
        asyncio.run_coroutine_threadsafe(
            host.pause(ctx, reason="manual_pause", prompt=None), executor.loop).result(10)
    finally:
        executor.close()
    run = Run.objects.select_related("control").get(pk=run.id)
    assert (run.state, run.end_cause) == ("ended", "cancelled")
    assert run.control.requested_by == "olga" and run.control.applied_via == "durable"


# --- in-process children take the worker's capacity; a run's children are capped ----------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_children_started_in_process_count_against_the_workers_capacity():
    from harness.processes import wait_until
    from runs.runtime.executor import Executor

    executor = Executor(node="edges-children", lease_seconds=3600, capacity=3, db_threads=2)
    parent, _ = domain.run_create(agent="demo.parent", dispatch=False, input={
        "children": 5, "child_agent": "demo.hang"})
    try:
        assert executor.start([parent.id]) == 1
        wait_until(lambda: Run.objects.get(pk=parent.id).state == RunState.ENDED, 20,
                   "the parent to end")
        parent.refresh_from_db()
        assert parent.end_cause == "failed" and "AWAKEN_WORKER_CAPACITY" in parent.error
        assert Run.objects.filter(parent=parent).count() == 2  # the parent holds the third
        for entry in executor.registry.snapshot():
            entry.token.cancel(Why("command"))
        wait_until(lambda: len(executor.registry) == 0, 20, "the children to end")
    finally:
        executor.close()
    assert not Run.objects.exclude(state=RunState.ENDED).exists()


def test_a_runs_children_are_capped_by_a_setting(settings, op_client):
    settings.AWAKEN_MAX_CHILDREN = 2
    parent = queued_run()
    for expected in (201, 201, 400):
        response = op_client.post("/api/runs/", {"agent": "demo.steps", "parent_id":
                                                 str(parent.id)}, format="json")
        assert response.status_code == expected
    assert response.json()["code"] == "invalid"
    assert "AWAKEN_MAX_CHILDREN" in response.json()["detail"]
    assert Run.objects.filter(parent=parent).count() == 2


# --- log records cannot forge lines or act on a terminal ----------------------------------------


def test_log_records_escape_control_characters_and_redact_review_tokens():
    import logging
    import sys

    from awaken_site.logs import SafeFormatter

    (handler,) = [h for h in logging.getLogger().handlers
                  if isinstance(h.formatter, SafeFormatter)]  # the settings' console handler
    forged = "boom\n2026-01-01 00:00:00 INFO runs all is well\x1b[2J\u202e"
    record = logging.LogRecord("runs", logging.ERROR, __file__, 1, "run failed: %s",
                               (forged,), None)
    line = handler.format(record)
    assert "\n" not in line and "\x1b" not in line and "\u202e" not in line
    assert line.endswith("run failed: boom\\n2026-01-01 00:00:00 INFO runs all is well"
                         "\\x1b[2J\\u202e")
    try:
        raise RuntimeError(forged)
    except RuntimeError:
        record = logging.LogRecord("django.request", logging.WARNING, __file__, 1,
                                   "Gone: %s", ("/review/s3cret-t0ken/",), sys.exc_info())
    text = handler.format(record)
    assert "s3cret-t0ken" not in text and "Gone: /review/…/" in text
    assert all(line.startswith("  ") for line in text.splitlines()[1:])  # never a record's
    assert "\x1b" not in text


def test_the_old_names_of_the_broker_thread_settings_are_read_with_a_warning(monkeypatch):
    from awaken_site.settings import envrenamed

    monkeypatch.setenv("AWAKEN_COURIER_THREADS", "7")
    monkeypatch.delenv("AWAKEN_BROKER_THREADS", raising=False)
    with pytest.warns(DeprecationWarning, match="AWAKEN_COURIER_THREADS is deprecated"):
        envrenamed("AWAKEN_BROKER_THREADS", "AWAKEN_COURIER_THREADS")
    assert os.environ["AWAKEN_BROKER_THREADS"] == "7"
    monkeypatch.setenv("AWAKEN_BROKER_THREADS", "3")  # the new name wins when both are set
    with pytest.warns(DeprecationWarning):
        envrenamed("AWAKEN_BROKER_THREADS", "AWAKEN_COURIER_THREADS")
    assert os.environ["AWAKEN_BROKER_THREADS"] == "3"


# --- an agent's last step goes with its end; other steps are durable before anything acts -------

LAST_STEP = {}  # what the agents below saw, by run id


def steps_committed(run_id) -> int:
    """A tool: how many of the run's steps are committed, as another connection sees it."""
    try:
        return Run.objects.get(pk=run_id).steps
    finally:
        connection.close()  # the tool's thread keeps no connection


def _go(run_id) -> threading.Event:
    return LAST_STEP.setdefault(f"{run_id}:go", threading.Event())


async def _wait_to_go(ctx) -> None:
    """Wait (not through the host) until the test lets the agent go on."""
    LAST_STEP[f"{ctx.run_id}:waiting"] = True
    assert await asyncio.get_running_loop().run_in_executor(None, _go(ctx.run_id).wait, 20)


@register
class OneStep(Agent):
    """One step, then the answer: its step commits with its end."""

    name = "test.edges.one_step"

    async def run(self, ctx):
        async with ctx.step():
            ctx.state["done"] = 1
        ctx.state["after"] = "not kept"  # changed after the step: not in its checkpoint
        LAST_STEP[ctx.run_id] = dict(ctx.usage)
        if ctx.input.get("crash"):
            raise RuntimeError("crashed after its step")
        if ctx.input.get("wait"):
            await _wait_to_go(ctx)
        return {"steps": ctx.usage["steps"]}


@register
class StepThenTool(Agent):
    """A step, then a tool that reads how many steps are committed."""

    name = "test.edges.step_then_tool"

    async def run(self, ctx):
        async with ctx.step():
            ctx.state["done"] = 1
        if ctx.input.get("wait"):
            await _wait_to_go(ctx)
        seen = await ctx.tool(steps_committed, ctx.run_id)
        LAST_STEP[ctx.run_id] = seen
        return {"seen": seen}


class Calls:
    """The domain calls an executor makes (each its own transaction), by name."""

    def __init__(self, executor):
        self.names, self.steps = [], []
        db = executor.worker_loop.db

        async def recorded(fn, /, **kwargs):
            if fn.__name__.startswith("attempt_"):
                self.names.append(fn.__name__)
            if fn.__name__ == "attempt_finish":
                self.steps.append(kwargs.get("step"))
            return await db(fn, **kwargs)

        executor.worker_loop.db = recorded


def run_agent(agent: str, *, input=None, delay: float = 60.0, during=None, **budget):
    """Run ``agent`` on an executor of its own until the run ends (``during(run)`` while it
    runs); the run, its events and the domain calls of the attempt. ``delay``: how long a
    committed step may wait to be written (long: only the boundaries write it)."""
    from harness.processes import wait_until
    from runs.runtime.attempt_host import AttemptHost
    from runs.runtime.executor import Executor

    run, _ = domain.run_create(agent=agent, input=input or {}, dispatch=False,
                               budget=budget or None)
    executor = Executor(node="edges-last-step", lease_seconds=3600, db_threads=2)
    calls = Calls(executor)
    before, AttemptHost.STEP_DELAY = AttemptHost.STEP_DELAY, delay
    try:
        assert executor.start([run.id]) == 1
        if during is not None:
            during(run)
        wait_until(lambda: Run.objects.get(pk=run.id).state == RunState.ENDED, 20,
                   "the run to end")
        wait_until(lambda: len(executor.registry) == 0, 20, "the attempt to end")
    finally:
        AttemptHost.STEP_DELAY = before
        executor.close()
    events = list(Event.objects.filter(run_id=run.id).order_by("seq"))
    return Run.objects.get(pk=run.id), events, calls


def versions_of(events) -> list[tuple]:
    return [(event.kind, event.version) for event in events]


@pytest.mark.postgres  # an executor's threads and this one: SQLite's shared cache locks tables
@pytest.mark.django_db(transaction=True)
def test_the_last_step_commits_with_the_end_in_one_domain_call():
    """No write of its own for the last step: the end's transaction writes it, its event
    first; the checkpoint is the state at the step, the usage the agent saw what committed."""
    run, events, calls = run_agent(OneStep.name)
    assert "attempt_step" not in calls.names and calls.names.count("attempt_finish") == 1
    assert calls.steps[0]["agent_state"] == {"done": 1}
    assert versions_of(events) == [("created", 1), ("started", 2), ("step", 3), ("ended", 4)]
    assert (run.end_cause, run.output, run.steps, run.agent_state) == (
        "completed", {"steps": 1}, 1, {"done": 1})
    assert LAST_STEP[str(run.id)] == {"steps": 1, "tokens": 0, "cost_usd": 0.0}
    assert run.cost_usd == 0.0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_step_not_followed_by_a_boundary_is_written_after_the_short_delay():
    """An agent that computes on after its step (no call of the host) has its step
    committed alone, within the delay, while it still runs."""
    def once_written(run):
        from harness.processes import wait_until
        wait_until(lambda: Event.objects.filter(run_id=run.id, kind="step").exists(), 10,
                   "the step to be written on its delay")
        assert Run.objects.get(pk=run.id).state == RunState.RUNNING
        _go(run.id).set()

    run, events, calls = run_agent(OneStep.name, input={"wait": True}, delay=0.1,
                                   during=once_written)
    assert calls.names.count("attempt_step") == 1 and calls.steps == [None]
    assert versions_of(events)[2:] == [("step", 3), ("ended", 4)]
    assert run.end_cause == "completed"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_step_followed_by_a_tool_is_durable_before_the_tool_runs():
    run, events, calls = run_agent(StepThenTool.name)
    assert LAST_STEP[str(run.id)] == 1 and run.output == {"seen": 1}
    assert calls.names.index("attempt_step") < calls.names.index("attempt_finish")
    assert [event.kind for event in events][2:] == ["step", "ended"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_attempt_fenced_after_its_step_stops_at_the_tool_and_never_runs_it():
    """The run moved on while the step waited to be written: the write is refused at the
    tool's boundary, the tool never runs, and the attempt commits nothing more."""
    def fence(run):
        from harness.processes import wait_until
        wait_until(lambda: LAST_STEP.get(f"{run.id}:waiting"), 10, "the step to be taken")
        expire(run)
        assert domain.attempt_expire(run_id=run.id, generation=1, max_crash_retries=0)
        _go(run.id).set()

    run, events, calls = run_agent(StepThenTool.name, input={"wait": True}, during=fence)
    assert str(run.id) not in LAST_STEP  # the tool never ran
    assert "attempt_finish" not in calls.names and calls.names.count("attempt_step") == 1
    assert (run.end_cause, run.error, run.steps) == ("failed", "worker lost", 0)
    assert [event.kind for event in events] == ["created", "started", "ended"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_crash_after_a_step_commits_the_step_then_the_failure():
    run, events, calls = run_agent(OneStep.name, input={"crash": True})
    assert calls.names == ["attempt_step", "attempt_finish"] and calls.steps == [None]
    assert versions_of(events)[2:] == [("step", 3), ("ended", 4)]
    assert (run.end_cause, run.steps, run.agent_state) == ("failed", 1, {"done": 1})
    assert "crashed after its step" in run.error


CONTEXTS = {}  # run id -> a weak reference to the context of test.edges.remembered


@register
class Remembered(Agent):
    """``steps`` steps of a large state (a model's answer, say), then a sleep of ``sleep``
    seconds; its context is remembered by a weak reference."""

    name = "test.edges.remembered"

    async def run(self, ctx):
        CONTEXTS[ctx.run_id] = weakref.ref(ctx)
        for step in range(ctx.input["steps"]):
            async with ctx.step():
                ctx.state[f"answer {step}"] = "x" * 100_000
        await ctx.sleep(ctx.input.get("sleep", 0))
        return {"steps": ctx.usage["steps"]}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("input,budget,ending", [
    ({"steps": 1}, {}, ("completed", None, 1)),  # the last step goes with the end
    ({"steps": 2}, {}, ("completed", None, 2)),  # the first is written alone, at a boundary
    ({"steps": 1, "sleep": 60}, {"max_seconds": 0.5}, ("stopped", "max_seconds", 1)),
])
def test_an_ended_attempt_leaves_no_cycle_to_keep_its_context_and_state(input, budget,
                                                                         ending):
    """An attempt's context, and with it the agent's state, goes once the attempt ends:
    no reference cycle of the attempt's holds it, which only a full pass of the cyclic
    collector would free (rare in a worker with many objects: until then, each ended run
    would keep its last answer)."""
    from harness.processes import wait_until

    gc.collect()
    gc.disable()
    try:
        run, _, _ = run_agent(Remembered.name, input=input, **budget)
        wait_until(lambda: CONTEXTS[str(run.id)]() is None, 10, "the context to go")
    finally:
        gc.enable()
    assert (run.end_cause, run.stop_code, run.steps) == ending


@register
class StepThenSleep(Agent):
    """Waits to be let go, takes a step, then sleeps (a wait of the context's own, not a
    call of the host)."""

    name = "test.edges.step_then_sleep"

    async def run(self, ctx):
        await _wait_to_go(ctx)
        async with ctx.step():
            ctx.state["done"] = 1
        await ctx.sleep(60)
        LAST_STEP[ctx.run_id] = "slept"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_step_refused_on_its_delay_stops_the_attempt_in_its_wait():
    """Fenced before its step: the write on the delay is refused, the token cancelled, and
    the attempt stops in the middle of its sleep, committing nothing."""
    def fence(run):
        from harness.processes import wait_until
        wait_until(lambda: LAST_STEP.get(f"{run.id}:waiting"), 10, "the agent to wait")
        expire(run)
        assert domain.attempt_expire(run_id=run.id, generation=1, max_crash_retries=0)
        _go(run.id).set()

    run, events, calls = run_agent(StepThenSleep.name, delay=0.1, during=fence)
    from harness.processes import wait_until
    wait_until(lambda: "attempt_step" in calls.names, 10, "the step's write on its delay")
    assert str(run.id) not in LAST_STEP and "attempt_finish" not in calls.names
    assert (run.error, run.steps) == ("worker lost", 0)
    assert [event.kind for event in events] == ["created", "started", "ended"]


# --- the ends of attempts that end together ------------------------------------------------


TOGETHER: dict = {}  # the executor loop's gate, and how many attempts wait at it


@register
class EndsWithOthers(Agent):
    """Waits at a gate shared with the other attempts, then answers: all end at once."""

    name = "test.edges.ends_with_others"

    async def run(self, ctx):
        gate = TOGETHER.setdefault("gate", asyncio.Event())
        TOGETHER["waiting"] = TOGETHER.get("waiting", 0) + 1
        await gate.wait()
        return {"n": {ctx.input["n"]} if ctx.input.get("bad") else ctx.input["n"]}


def end_together(bad: int | None = None) -> tuple[list[Run], list[list[str]]]:
    """Eight runs of ``EndsWithOthers`` on an executor of their own, let go at once (run
    ``bad``'s output not JSON): the runs as they ended, and the run ids of each end's
    domain call, in order."""
    from harness.processes import wait_until
    from runs.runtime.executor import Executor

    TOGETHER.clear()
    runs = [domain.run_create(agent=EndsWithOthers.name, input={"n": n, "bad": n == bad},
                              dispatch=False)[0] for n in range(8)]
    executor = Executor(node="edges-ends", lease_seconds=3600, db_threads=2)
    ends, db = [], executor.worker_loop.db

    async def recorded(fn, /, **kwargs):
        if fn in (domain.attempt_finish, domain.attempts_finish):
            ends.append([str(end["run_id"]) for end in kwargs.get("ends", [kwargs])])
        return await db(fn, **kwargs)

    executor.worker_loop.db = recorded
    try:
        assert executor.start([run.id for run in runs]) == 8
        wait_until(lambda: TOGETHER.get("waiting") == 8, 20, "the attempts to wait")
        executor.loop.call_soon_threadsafe(TOGETHER["gate"].set)
        wait_until(lambda: len(executor.registry) == 0, 20, "the attempts to end")
    finally:
        executor.close()
    for run in runs:
        assert Event.objects.filter(run=run, kind="ended").count() == 1
    return [Run.objects.get(pk=run.id) for run in runs], ends


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_attempts_that_end_together_commit_their_ends_together_each_as_its_own():
    """Ends that come together go in one transaction (those that come while it is written
    in the next); each run ends once, with its own answer."""
    runs, ends = end_together()
    assert sorted(sum(ends, [])) == sorted(str(run.id) for run in runs)
    assert max(map(len, ends)) > 1, ends
    assert [(run.state, run.end_cause, run.output) for run in runs] == [
        (RunState.ENDED, "completed", {"n": n}) for n in range(8)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_end_that_cannot_be_written_fails_its_run_alone_and_the_others_complete(caplog):
    """The shared transaction fails on the one output that is not JSON: nothing of it is
    committed, each end is written again alone, and that run fails as it would alone."""
    runs, ends = end_together(bad=3)
    assert [(run.end_cause, run.output) for n, run in enumerate(runs) if n != 3] == [
        ("completed", {"n": n}) for n in range(8) if n != 3]
    assert runs[3].end_cause == "failed" and "TypeError" in runs[3].error, runs[3].error
    gathered = next(i for i, call in enumerate(ends) if str(runs[3].id) in call)
    assert len(ends[gathered]) > 1 and [str(runs[3].id)] in ends[gathered + 1:]
    assert "ends not committed together" in caplog.text


# --- a worker's connection pool ------------------------------------------------------------


def test_a_pool_smaller_than_a_workers_threads_is_named_with_what_to_set():
    short = commands.pool_shortfall(pool={"max_size": 12}, concurrency=8, db_threads=8)
    assert "DB_POOL_MAX is 12" in short and "16 connections" in short
    assert commands.pool_shortfall(pool={"max_size": 12}, concurrency=4, db_threads=8) is None
    assert commands.pool_shortfall(pool=None, concurrency=100, db_threads=8) is None  # SQLite


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_pool_is_too_small_does_not_start_and_says_why(tmp_path):
    from harness.processes import Worker

    worker = Worker(concurrency=8, extra_env={"DB_POOL_MAX": "4", "AWAKEN_DB_THREADS": "8"},
                    log_dir=tmp_path)
    worker.wait_exit(60)
    assert worker.popen.returncode not in (None, 0, -9)
    assert "set DB_POOL_MAX to 16 or more" in worker.log()
