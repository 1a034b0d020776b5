"""SIGTERM to the web, with a ``?wait=`` request, an event stream and a socket held: each
client gets its end (the wait its answer with committed state, the stream the end of its
response, the socket close code 4012) and the process exits within 2 s
(runs/sockets/shutdown.py). On daphne as the Procfile starts it, and on the embedded site."""

import threading
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from harness.processes import EmbeddedSite, Web, wait_until
from runs.changes.waiting import Watches
from runs.domain.keys import api_key_issue
from runs.models import ControlIntent
from runs.sockets.shutdown import GOING_AWAY
from tests.conftest import make_user
from tests.factories import running_run

EXIT_SECONDS = 2.0


def test_ending_the_watches_wakes_each_wait_and_every_later_one_starts_ended():
    watches = Watches()
    woke = []
    with watches.watch("r1", live=True) as watch:
        waiter = threading.Thread(target=lambda: woke.append(watch.next(30)))
        waiter.start()
        assert watches.end_all() == 1
        waiter.join(5)
        assert woke == [None] and not waiter.is_alive()
        watch.offer({"version": 2})
        assert watch.next(30) is None  # ended: a push no longer counts
    with watches.watch("r2", live=True) as later:
        assert later.ended and later.next(30) is None


class Held:
    """What a client holds open on ``site``: a request waiting on its own thread, a stream
    and a socket; each notes how it ended."""

    def __init__(self, site, method: str, path: str):
        self.site = site
        self.answer = None
        self.request = threading.Thread(target=self._call, args=(method, path), daemon=True)
        self.request.start()
        self.client = httpx.Client(base_url=site.base, timeout=httpx.Timeout(20))
        self.stream = self.client.stream(
            "GET", "/api/runs/stream/", headers={"Authorization": f"Token {site.token}"})
        self.response = self.stream.__enter__()
        self.lines = self.response.iter_lines()
        wait_until(lambda: next(self.lines).startswith("event: snapshot"), 10, "the snapshot")
        self.socket = ws_connect(f"ws://127.0.0.1:{site.port}/ws/runs/",
                                 additional_headers={"Authorization": f"Token {site.token}"})
        self.socket.recv(timeout=10)  # the snapshot

    def _call(self, method: str, path: str) -> None:
        self.answer = self.site.call(method, path, {}, timeout=40)

    def stream_rest(self) -> list[str]:
        """The rest of the stream, to its end: raises if the response was cut instead."""
        return list(self.lines)

    def socket_close_code(self) -> int | None:
        try:
            while True:
                self.socket.recv(timeout=10)
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd is not None else None

    def close(self) -> None:
        self.stream.__exit__(None, None, None)
        self.client.close()
        self.socket.close()


def terminate_and_time(site) -> float:
    started = time.monotonic()
    site.terminate()
    site.wait_exit(15)
    return time.monotonic() - started


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_sigterm_to_daphne_answers_the_held_wait_ends_the_stream_and_socket_and_exits():
    token = api_key_issue(user=make_user("terminator", "operator"))
    run, _ = running_run()  # its owner is a test's, which never applies the cancel
    with Web() as web:
        web.wait_ready(30)
        web.token = token
        held = Held(web, "POST", f"/api/runs/{run.id}/cancel/?wait=30")
        try:
            wait_until(lambda: ControlIntent.objects.filter(run=run).exists(), 10,
                       "the cancel to be committed")
            took = terminate_and_time(web)
            held.request.join(5)
            rest = held.stream_rest()
            code = held.socket_close_code()
        finally:
            held.close()
    assert took < EXIT_SECONDS, f"daphne took {took:.2f} s to exit"
    status, body = held.answer
    # A wait that ends early answers as one that ran out: 202, the run as committed.
    assert status == 202, body
    assert body["id"] == str(run.id) and body["state"] == "running"
    assert body["control"]["action"] == "cancel", body
    # The stream ends cleanly (the read above raises if it is cut), with no error event:
    # at most the push of the cancel, when it committed after the stream's snapshot.
    assert {line for line in rest if line.startswith("event: ")} <= {"event: run.changed"}, rest
    assert code == GOING_AWAY


@pytest.mark.ignores_database_url
def test_sigterm_to_the_embedded_site_answers_the_held_wait_and_exits(tmp_path):
    site = EmbeddedSite(tmp_path / "var").wait_ready()
    try:
        status, run = site.call("POST", "/api/runs/", {
            "agent": "demo.steps", "input": {"steps": 2, "step_seconds": 60}})
        assert status == 201, run
        wait_until(lambda: site.call("GET", f"/api/runs/{run['id']}/")[1]["state"] == "running",
                   20, "the run to start")
        held = Held(site, "POST", f"/api/runs/{run['id']}/pause/?wait=30")
        try:
            wait_until(lambda: any(  # the attempt took the pause: the wait is held
                entry["kind"] == "control" for entry in site.call(
                    "GET", f"/api/runs/{run['id']}/activity/")[1]["results"]),
                10, "the pause to be taken")
            took = terminate_and_time(site)
            held.request.join(5)
            held.stream_rest()
            code = held.socket_close_code()
        finally:
            held.close()
    finally:
        site.stop()
    assert took < EXIT_SECONDS, f"the embedded site took {took:.2f} s to exit"
    status, body = held.answer
    assert status == 202 and body["state"] == "running", (status, body)
    assert code == GOING_AWAY


def test_a_cancelled_instance_finishes_its_answer_once_the_drain_has_begun():
    import asyncio

    from runs.sockets.shutdown import Drain, Draining

    async def scenario():
        release = asyncio.Event()
        sent = []

        async def app(scope, receive, send):
            await release.wait()
            await send({"type": "http.response.start", "status": 202})

        async def send(message):
            sent.append(message["status"])

        state = Drain()
        instance = asyncio.ensure_future(Draining(app, state)({"type": "http"}, None, send))
        await asyncio.sleep(0)
        state.begun = True  # what the shutdown trigger does, in the same turn as the cancel
        instance.cancel()
        asyncio.get_running_loop().call_later(0.05, release.set)
        await asyncio.wait_for(instance, 5)
        assert sent == [202] and not instance.cancelled()
        # Before the drain, a cancel is a cancel.
        release.clear()
        other = asyncio.ensure_future(Draining(app, Drain())({"type": "http"}, None, send))
        await asyncio.sleep(0)
        other.cancel()
        await asyncio.wait({other}, timeout=5)
        assert other.cancelled() and sent == [202]

    asyncio.run(scenario())


def test_the_drain_settles_once_an_instance_begun_during_it_has_answered(monkeypatch):
    """Daphne takes connections until the reactor stops: a request that came in after the
    drain began is answered before the drain settles, not cut when the reactor stops."""
    import asyncio

    from runs.sockets import shutdown
    from runs.sockets.shutdown import Drain, Draining

    monkeypatch.setattr(shutdown, "GRACE_SECONDS", 30)  # the wait below never runs out
    monkeypatch.setattr(shutdown.gc, "freeze", lambda: None)  # not this process's heap

    async def scenario():
        release = asyncio.Event()
        sent = []

        async def app(scope, receive, send):
            if scope["path"] == "/late":
                await release.wait()
            await send({"type": "http.response.start", "status": 200})

        async def send(message):
            sent.append(message["status"])

        state = Drain()
        state.begun = True
        early = asyncio.ensure_future(Draining(app, state)({"type": "http", "path": "/"},
                                                           None, send))
        settled = asyncio.ensure_future(state.settled())
        await asyncio.sleep(0)
        late = asyncio.ensure_future(Draining(app, state)({"type": "http", "path": "/late"},
                                                          None, send))
        await asyncio.wait_for(early, 5)
        # Longer than the linger after the first instance ended: the drain holds on.
        await asyncio.sleep(shutdown.LINGER_SECONDS * 3)
        assert not settled.done() and sent == [200]
        release.set()
        await asyncio.wait_for(settled, 5)
        assert late.done() and sent == [200, 200]

    asyncio.run(scenario())
