"""A reader cannot exhaust the database pool or starve another client's controls
(awaken_site/request_share.py, awaken_site/busy.py; API.md: 503 ``busy``)."""

import asyncio
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.urls import path

from awaken_site.request_share import RequestShare
from harness.processes import Web
from runs.domain.keys import api_key_issue
from runs.models import Run, RunState
from tests.conftest import make_user
from tests.factories import queued_run


class Gate:
    """An ASGI application that answers 200 once the test opens its gate."""

    def __init__(self):
        self.inside = 0
        self.open = asyncio.Event()

    async def __call__(self, scope, receive, send):
        self.inside += 1
        await self.open.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def scope(method: str, key: str, path: str = "/api/runs/") -> dict:
    return {"type": "http", "method": method, "path": path, "query_string": b"",
            "headers": [(b"authorization", f"Token {key}".encode())],
            "client": ("10.0.0.1", 1234)}


async def until(condition, timeout: float = 5) -> None:
    """Let the loop run until ``condition()`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.001)


async def call(app, scope_) -> tuple[int, dict]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    await app(scope_, receive, send)
    return sent[0]["status"], dict(sent[0]["headers"])


def test_one_clients_reads_wait_then_shed_and_leave_room_for_anothers_controls():
    async def scenario():
        gate = Gate()
        share = RequestShare(gate, slots=4, read_slots=3, client_slots=2, wait=0.2)
        started = time.monotonic()
        flood = [asyncio.create_task(call(share, scope("GET", "viewer"))) for _ in range(5)]
        other = asyncio.create_task(call(share, scope("GET", "reader")))
        await until(lambda: len(share.waiting) == 3)  # 3 in, the rest waiting
        # The viewer's share is 2; one more reader fits before reads are full (3).
        shed = [await task for task in flood[2:]]
        assert all(status == 503 and headers[b"retry-after"] == b"1"
                   for status, headers in shed), shed
        assert time.monotonic() - started >= 0.2  # they waited briefly first
        assert gate.inside == 3
        # Reads are full, yet an operator's control goes in at once.
        control = asyncio.create_task(call(share, scope("POST", "operator",
                                                        "/api/runs/x/cancel/")))
        await until(lambda: gate.inside == 4)
        # Health checks are never counted, even with every place taken.
        health = asyncio.create_task(call(share, scope("GET", "lb", "/healthz")))
        await until(lambda: gate.inside == 5)
        # A reader that finds reads full waits, and is let in when a place comes free.
        late = asyncio.create_task(call(share, scope("GET", "late-reader")))
        await until(lambda: len(share.waiting) == 1)
        gate.open.set()
        assert [status for status, _ in [await task for task in flood[:2]]] == [200, 200]
        assert (await control)[0] == 200 and (await health)[0] == 200
        assert (await other)[0] == 200 and (await late)[0] == 200
        assert gate.inside == 6
        assert share.running == 0 and share.by_client == {} and not share.waiting

    asyncio.run(scenario())


def test_one_clients_controls_are_not_held_to_its_read_share():
    """A script that stops many runs at once is served as places free up, not shed."""
    async def scenario():
        gate = Gate()
        share = RequestShare(gate, slots=4, read_slots=3, client_slots=1, wait=5)
        stops = [asyncio.create_task(call(share, scope("POST", "script", "/api/runs/x/stop/")))
                 for _ in range(6)]
        await until(lambda: gate.inside == 4 and len(share.waiting) == 2)
        gate.open.set()
        assert [status for status, _ in [await task for task in stops]] == [200] * 6

    asyncio.run(scenario())


def test_a_waiter_whose_client_goes_away_gives_its_place_back():
    async def scenario():
        gate = Gate()
        share = RequestShare(gate, slots=1, read_slots=1, client_slots=1, wait=5)
        first = asyncio.create_task(call(share, scope("GET", "a")))
        second = asyncio.create_task(call(share, scope("GET", "b")))
        await until(lambda: len(share.waiting) == 1)
        second.cancel()
        await until(lambda: not share.waiting)
        gate.open.set()
        assert (await first)[0] == 200
        assert share.running == 0 and share.by_client == {}

    asyncio.run(scenario())


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_read_flood_gets_no_500_and_an_operators_cancels_go_through():
    """The read flood, small: 40 parallel lists of 300 runs from one viewer key against a
    pool of 4 connections, while an operator cancels 8 runs, one after another. The flood
    is served or shed (503 busy), never a 500; every cancel is answered 200 in time."""
    for _ in range(300):
        queued_run()
    targets = [str(queued_run().id) for _ in range(8)]
    viewer = api_key_issue(user=make_user("flooder", "viewer"))
    operator = api_key_issue(user=make_user("canceller", "operator"))
    env = {"DB_POOL_MAX": "4", "DB_POOL_MIN": "1", "DB_POOL_TIMEOUT": "0.5",
           "AWAKEN_REQUEST_SLOTS": "3", "AWAKEN_READ_SLOTS": "2", "AWAKEN_CLIENT_SLOTS": "2",
           "AWAKEN_BUSY_WAIT": "0.5", "ALLOWED_HOSTS": "127.0.0.1,localhost"}
    with Web(extra_env=env) as web:
        web.wait_ready(30)

        def read(_):
            return web.call("GET", "/api/runs/?limit=500", token=viewer, timeout=30)

        def cancel(run_id):
            started = time.monotonic()
            answer = web.call("POST", f"/api/runs/{run_id}/cancel/?wait=0", {},
                              token=operator, timeout=30)
            return answer, time.monotonic() - started

        with ThreadPoolExecutor(48) as pool:
            flood = [pool.submit(read, i) for i in range(40)]
            # Amid the flood, the operator cancels one run after another.
            cancels = pool.submit(lambda: [cancel(run_id) for run_id in targets])
            flood = [future.result() for future in flood]
            cancels = cancels.result()
    statuses = Counter(status for status, _ in flood)
    assert set(statuses) <= {200, 503}, statuses
    assert all(body["code"] == "busy" for status, body in flood if status == 503)
    assert statuses[200] >= 2, statuses
    assert [status for (status, _), _ in cancels] == [200] * 8, cancels
    assert max(took for _, took in cancels) < 3, cancels
    assert set(Run.objects.filter(pk__in=targets).values_list("state", flat=True)) == {
        RunState.ENDED}


def no_connection_free(request):
    from django.db import OperationalError
    from psycopg_pool import PoolTimeout

    try:
        raise PoolTimeout("couldn't get a connection after 5.00 sec")
    except PoolTimeout as error:  # as Django's wrapper raises it from the pool's
        raise OperationalError(str(error)) from error


urlpatterns = [path("api/exhausted/", no_connection_free)]


@pytest.mark.django_db
def test_an_exhausted_pool_is_503_busy_not_500(client, settings):
    settings.ROOT_URLCONF = __name__
    answer = client.get("/api/exhausted/")
    assert answer.status_code == 503
    assert answer.json()["code"] == "busy" and answer["Retry-After"] == "1"
