"""Fault injection: the broker and channel layer go away, or the web process dies, while
runs are live. Every run must end up ended or legitimately live, and no accepted cancel or
stop may be lost. Each test runs its own Redis, web and worker processes."""

import json
import shutil
import signal
import time

import pytest
from django.db import connection, transaction

from harness.processes import PrivateRedis, Processes, Web, Worker, wait_until
from runs import domain
from runs.domain.keys import api_key_issue
from runs.models import ControlIntent, Run, RunState
from tests.conftest import make_user

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")]


@pytest.fixture
def system(settings):
    """Private Redis, a web process and a worker, all on the test database; the web
    process calls with an operator's token."""
    settings.AWAKEN_LEASE_SECONDS = 1.5
    redis = PrivateRedis().wait_ready(10)
    private = {"REDIS_URL": redis.url, "CELERY_BROKER_URL": None}
    try:
        with Processes() as processes:
            web = processes.add(Web(extra_env={**private, "AWAKEN_LEASE_SECONDS": "1.5",
                                               "ALLOWED_HOSTS": "127.0.0.1,localhost"}))
            worker = processes.add(Worker(lease_seconds=1.5, extra_env=private,
                                          broker=redis.url))
            processes.wait_ready(30)
            web.token = api_key_issue(user=make_user("faulty", "operator"))
            yield redis, web, worker
    finally:
        redis.stop()


def run_of(run_id) -> Run:
    return Run.objects.select_related("control").get(pk=run_id)


def settle(timeout=20):
    """Sweep until nothing runs without a live, renewed lease and no intent is pending."""
    def settled():
        domain.sweep()
        pending = ControlIntent.objects.filter(applied_at__isnull=True).exists()
        return not pending
    wait_until(settled, timeout, "every accepted request to be applied")


def test_a_cancel_during_a_broker_outage_is_not_lost(system):
    redis, web, worker = system
    _, run = web.call("POST", "/api/runs/", {"agent": "demo.hang"})
    wait_until(lambda: run_of(run["id"]).state == RunState.RUNNING, 15, "the run to start")
    _, other = web.call("POST", "/api/runs/",
                        {"agent": "demo.steps", "input": {"steps": 200, "step_seconds": 0.05}})
    wait_until(lambda: run_of(other["id"]).state == RunState.RUNNING, 15, "the second run")

    redis.stop()
    started = time.monotonic()
    status, body = web.call("POST", f"/api/runs/{run['id']}/cancel/?wait=1")
    answered = time.monotonic() - started
    assert status in (200, 202), body
    assert body["control"]["action"] == "cancel"
    assert answered < 15, f"the cancel call took {answered:.1f} s with the broker down"
    # The intent is durable and the lease renewal goes through the database: it lands
    # while the broker is still down.
    wait_until(lambda: run_of(run["id"]).state == RunState.ENDED, 15, "the cancel to land")
    assert run_of(run["id"]).end_cause == "cancelled"

    redis.start().wait_ready(10)
    assert web.call("POST", f"/api/runs/{other['id']}/stop/?wait=10",
                    {"reason": "after the outage"})[1]["end_cause"] == "stopped"
    _, fresh = web.call("POST", "/api/runs/",
                        {"agent": "demo.steps", "input": {"steps": 1, "step_seconds": 0.01}})
    settle()
    wait_until(lambda: run_of(fresh["id"]).state == RunState.ENDED, 30, "a run after the outage")
    assert run_of(fresh["id"]).end_cause == "completed"


def test_a_web_process_killed_after_recording_an_intent_loses_nothing(system, settings):
    redis, web, worker = system
    _, run = web.call("POST", "/api/runs/", {"agent": "demo.hang"})
    wait_until(lambda: run_of(run["id"]).state == RunState.RUNNING, 15, "the run to start")
    # The moment between the commit of the intent and its live delivery: freeze the worker
    # so the delivery cannot land, record the cancel, and kill the web process at once.
    worker.signal(signal.SIGSTOP)
    try:
        try:
            web.call("POST", f"/api/runs/{run['id']}/cancel/?wait=0", timeout=0.5)
        except OSError:
            pass  # the web process may be gone before it answers
        wait_until(lambda: run_of(run["id"]).control is not None, 10, "the intent to commit")
        recorded = run_of(run["id"]).control
        web.kill()
        # The live signal, if it was sent at all, expires unread (its time to live is the
        # delivery timeout; test_edges drops a command past its deadline): only the durable
        # intent is left to end the run, found by the worker's lease renewal or the sweeper,
        # whichever comes first once the worker runs again.
        expired = time.monotonic() + settings.AWAKEN_DELIVERY_TIMEOUT + 0.5
        wait_until(lambda: time.monotonic() > expired, 10, "the live signal to expire")
    finally:
        worker.signal(signal.SIGCONT)
    settle()
    run = run_of(run["id"])
    assert run.state == RunState.ENDED and run.end_cause == "cancelled"
    assert run.control.pk == recorded.pk and run.control.applied_at is not None
    assert run.control.requested_by == "faulty"


def test_sockets_heal_across_a_redis_restart(system):
    """Pub/sub keeps nothing while the subscriber reconnects: pushes in that window can be
    lost. The socket stays open, pushes flow again, and a resume replays what was missed."""
    import asyncio
    import threading

    import websockets

    redis, web, worker = system
    seen, last_seq, connected = [], [0], threading.Event()
    outbox: asyncio.Queue | None = None
    loop_box = []

    async def listen():
        nonlocal outbox
        outbox = asyncio.Queue()
        loop_box.append(asyncio.get_running_loop())
        async with websockets.connect(
                f"ws://127.0.0.1:{web.port}/ws/runs/",
                additional_headers={"Authorization": f"Token {web.token}"}) as socket_:
            last_seq[0] = json.loads(await socket_.recv())["seq"]  # the snapshot
            connected.set()

            async def send_from_outbox():
                while True:
                    await socket_.send(await outbox.get())

            sender = asyncio.create_task(send_from_outbox())
            try:
                async for text in socket_:
                    message = json.loads(text)
                    if message.get("type") == "run.changed":
                        seen.append((message["run"]["id"], message["event"]["kind"]))
            except websockets.ConnectionClosed:
                pass  # the web process stops at the end of the test
            finally:
                sender.cancel()

    threading.Thread(target=lambda: asyncio.run(listen()), daemon=True).start()
    assert connected.wait(10)
    before_restart = last_seq[0]
    redis.restart().wait_ready(10)

    def create():
        return web.call("POST", "/api/runs/", {
            "agent": "demo.steps", "input": {"steps": 1, "step_seconds": 0.01}})[1]["id"]

    created = [create()]
    # Pushes flow again once the subscription is re-made.
    wait_until(lambda: created.append(create()) or (created[-2], "created") in seen, 20,
               "pushes to flow again")
    # Whatever was lost in the window comes back with a resume from the last seq seen.
    loop_box[0].call_soon_threadsafe(
        outbox.put_nowait, json.dumps({"type": "resume", "after": before_restart}))
    wait_until(lambda: {(run_id, "created") for run_id in created} <= set(seen), 15,
               "the resume to replay every missed event")


# --- the control plane stays available (SPEC §8) ------------------------------------------------


def answers_in_time(web, calls, *, within: float) -> list:
    """Make ``calls`` (method, path, body) at once from as many threads; each must answer
    within ``within`` seconds. Returns the statuses."""
    from concurrent.futures import ThreadPoolExecutor

    def timed(call):
        started = time.monotonic()
        status, _ = web.call(*call, timeout=within + 5)
        took = time.monotonic() - started
        assert took < within, f"{call[0]} {call[1]} took {took:.1f} s"
        return status

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(timed, calls))


# A frozen peer would hold a request for its whole deadline (5 s and more); an answer within
# 4 s is one that waited on nothing, even with the other test streams on the same 2 cores
# (the bounds of the tests below are chosen so too).
def every_endpoint_answers(web, run_id, within: float = 4.0) -> None:
    statuses = answers_in_time(web, [
        ("GET", "/healthz", None), ("GET", "/api/runs/", None), ("GET", f"/api/runs/{run_id}/",
                                                                 None),
        ("POST", "/api/runs/", {"agent": "demo.steps", "input": {"steps": 1}}),
        ("POST", f"/api/runs/{run_id}/cancel/?wait=0", {}),
    ], within=within)
    assert statuses[:3] == [200, 200, 200] and statuses[3] == 201, statuses


def test_a_burst_of_health_checks_wedges_nothing(system):
    redis, web, worker = system
    _, run = web.call("POST", "/api/runs/", {"agent": "demo.hang"})
    ends = time.monotonic() + 5
    checks = 0
    while time.monotonic() < ends:  # 20 at a time, for five seconds
        statuses = answers_in_time(web, [("GET", "/healthz", None)] * 20, within=3.0)
        assert set(statuses) == {200}, statuses
        checks += len(statuses)
    assert checks >= 40
    every_endpoint_answers(web, run["id"])
    assert web.call("GET", "/healthz")[1]["workers"] >= 1
    web.stop(timeout=10)  # and it still stops on SIGTERM
    assert web.popen.returncode is not None and web.popen.returncode != -signal.SIGKILL


def test_cancels_to_a_frozen_worker_wedge_nothing(system):
    redis, web, worker = system
    runs = [web.call("POST", "/api/runs/", {"agent": "demo.hang"})[1]["id"] for _ in range(40)]
    wait_until(lambda: Run.objects.filter(pk__in=runs, state=RunState.RUNNING).count() == 40,
               30, "40 runs to start")
    worker.signal(signal.SIGSTOP)
    try:
        statuses = answers_in_time(
            web, [("POST", f"/api/runs/{run_id}/cancel/?wait=0", {}) for run_id in runs],
            within=4.0)
        assert set(statuses) == {202}, statuses
        every_endpoint_answers(web, runs[0])
    finally:
        worker.signal(signal.SIGCONT)
    every_endpoint_answers(web, runs[0])
    settle(30)
    assert set(Run.objects.filter(pk__in=runs).values_list("end_cause", flat=True)) == {
        "cancelled"}



def test_a_worker_outlives_a_redis_restart_during_a_claim(system):
    """A worker handling a task message when the broker goes away carries on afterwards (with
    kombu's acknowledgement emulation it exited, restoring the message through the closed
    connection); the run is claimed and completed all the same."""
    redis, web, worker = system
    with transaction.atomic(), connection.cursor() as cursor:
        # The claim's insert of the attempt waits for this lock: its task message is being
        # handled, not yet acknowledged, when the broker goes away.
        cursor.execute("LOCK TABLE runs_attempt IN SHARE ROW EXCLUSIVE MODE")

        def claim_waits() -> bool:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # a fresh view each time
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND wait_event_type = 'Lock'")
            return cursor.fetchone()[0] > 0

        _, run = web.call("POST", "/api/runs/", {
            "agent": "demo.steps", "input": {"steps": 1, "step_seconds": 0.01}})
        wait_until(claim_waits, 15, "the claim to wait for the lock")
        redis.restart().wait_ready(10)
    wait_until(lambda: not worker.running() or worker.ready(), 15, "the worker to answer")
    assert worker.running(), "the worker exited"
    wait_until(lambda: run_of(run["id"]).state == RunState.ENDED, 15, "the run to end")
    assert run_of(run["id"]).end_cause == "completed"


# --- the sweep runs while every worker is frozen (SPEC §6) -------------------------------------


def test_beat_applies_a_cancel_while_every_worker_is_frozen(system):
    """The Procfile's shape, one worker: frozen, it can run no task, yet beat's sweep applies
    the pending cancel once the lease expires. Only beat sweeps here: the test never does."""
    from harness.processes import Beat

    redis, web, worker = system
    _, run = web.call("POST", "/api/runs/", {"agent": "demo.hang"})
    wait_until(lambda: run_of(run["id"]).state == RunState.RUNNING, 15, "the run to start")
    with Beat(lease_seconds=1.5, extra_env={"REDIS_URL": redis.url,
                                            "CELERY_BROKER_URL": None}) as beat:
        worker.freeze()
        try:
            status, body = web.call("POST", f"/api/runs/{run['id']}/cancel/?wait=0")
            assert status == 202, body
            wait_until(lambda: run_of(run["id"]).state == RunState.ENDED, 20,
                       f"beat to apply the cancel\n{beat.output()}")
        finally:
            worker.thaw()
    run = run_of(run["id"])
    assert run.end_cause == "cancelled"
    assert run.control.applied_via == "sweeper"


# --- a live command answered not_active is final (SPEC §4) -------------------------------------


def test_live_commands_answered_not_active_by_a_frozen_worker_are_never_carried_out(system):
    redis, web, worker = system
    _, run = web.call("POST", "/api/runs/", {"agent": "demo.inbox"})
    wait_until(lambda: run_of(run["id"]).state == RunState.RUNNING, 15, "the run to start")
    worker.freeze()
    try:
        status, body = web.call("POST", f"/api/runs/{run['id']}/pause/?wait=0")
        assert (status, body["code"]) == (409, "not_active"), body
        status, body = web.call("POST", f"/api/runs/{run['id']}/deliver/",
                                {"command": "message", "message": {"text": "once"}})
        assert (status, body["code"]) == (409, "not_active"), body
    finally:
        worker.thaw()
    # Commands reach the worker in order: once a later one is taken, the two above have been
    # received, and dropped. Had the pause been applied, the run would now await a resume.
    wait_until(lambda: web.call("POST", f"/api/runs/{run['id']}/deliver/",
                                {"command": "message", "message": {"done": True}})[0] == 200,
               15, "the thawed worker to take a message")
    wait_until(lambda: run_of(run["id"]).state != RunState.RUNNING, 15, "the run to end")
    ended = run_of(run["id"])
    assert (ended.state, ended.end_cause) == (RunState.ENDED, "completed")
    assert ended.output == {"messages": [{"done": True}]}  # the first message never came
    assert "dropped" in worker.log()
