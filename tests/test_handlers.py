"""The HTTP side of the ASGI application: Django's middleware and view entered once per
request (awaken_site/handlers.py), with the same answers as Django's own handler, and
bodies over the limit refused before they are read."""

import asyncio
import json
import threading

import pytest
from asgiref.sync import SyncToAsync, async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.core.handlers.asgi import ASGIHandler

from awaken_site.handlers import RequestThreads, SyncChainASGIHandler
from harness.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def get(handler, path: str) -> tuple[dict, int]:
    """One GET through ``handler``: the response start message, and how many times the
    request hopped from the event loop to a thread (``sync_to_async`` calls)."""
    hops = 0
    original = SyncToAsync.__call__

    async def counted(self, *args, **kwargs):
        nonlocal hops
        hops += 1
        return await original(self, *args, **kwargs)

    async def request():
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "root_path": "", "headers": [(b"host", b"127.0.0.1")],
                 "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80)}
        communicator = ApplicationCommunicator(handler, scope)
        await communicator.send_input({"type": "http.request", "body": b""})
        start = await communicator.receive_output(timeout=10)
        while (await communicator.receive_output(timeout=10)).get("more_body"):
            pass
        await asyncio.sleep(0)
        return start

    SyncToAsync.__call__ = counted
    try:
        start = async_to_sync(request)()
    finally:
        SyncToAsync.__call__ = original
    return start, hops


def test_a_request_enters_the_middleware_and_view_in_one_hop():
    start, hops = get(SyncChainASGIHandler(), "/accounts/login/")
    _, django_hops = get(ASGIHandler(), "/accounts/login/")
    assert start["status"] == 200
    # The chain and the view are one call; Django's own handler hops at each sync
    # middleware. (The remaining hops are Django's per-request signals.)
    assert hops < django_hops
    assert hops <= 3, hops


def test_requests_one_after_another_run_on_one_kept_thread():
    seen = []
    original = SyncChainASGIHandler._get_response

    def view_call(self, request):
        seen.append(threading.get_ident())
        return original(self, request)

    SyncChainASGIHandler._get_response = view_call
    try:
        handler = SyncChainASGIHandler()  # its chain holds the view call patched above
        for _ in range(3):
            start, _ = get(handler, "/accounts/login/")
            assert start["status"] == 200
            wait_until(lambda: len(handler.threads._free) == 1, 5, "the thread to be free")
    finally:
        SyncChainASGIHandler._get_response = original
    assert len(seen) == 3 and len(set(seen)) == 1  # Django's handler starts one per request


def test_a_thread_still_busy_is_not_lent_to_the_next_request():
    threads = RequestThreads(idle=4)
    executor = threads.borrow()
    release = threading.Event()
    executor.submit(release.wait, 5)
    threads.give_back(executor)
    assert threads.borrow() is not executor  # still running the first request's work
    release.set()
    wait_until(lambda: threads._free == [executor], 5, "the thread to be given back")
    assert threads.borrow() is executor


def test_it_answers_as_djangos_own_handler_does():
    mine, _ = get(SyncChainASGIHandler(), "/accounts/login/")
    theirs, _ = get(ASGIHandler(), "/accounts/login/")
    header_names = {name.lower() for name, _ in mine["headers"]}
    assert mine["status"] == theirs["status"] == 200
    assert header_names == {name.lower() for name, _ in theirs["headers"]}
    assert {b"x-frame-options", b"set-cookie", b"content-type"} <= header_names


def post(chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, dict, int]:
    """One POST to /api/runs/ through the site's handler, its body sent in ``chunks``.
    Returns the status, the JSON body, and how many chunks the handler asked for."""

    async def request():
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/api/runs/",
                 "raw_path": b"/api/runs/", "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                             *headers],
                 "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80)}
        communicator = ApplicationCommunicator(SyncChainASGIHandler(), scope)
        for index, chunk in enumerate(chunks):
            await communicator.send_input({"type": "http.request", "body": chunk,
                                           "more_body": index < len(chunks) - 1})
        start = await communicator.receive_output(timeout=10)
        body = b""
        while True:
            message = await communicator.receive_output(timeout=10)
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await communicator.wait(timeout=10)
        if start["status"] == 413:  # answered by the handler itself, whole
            sent = {name.lower(): value for name, value in start["headers"]}
            assert int(sent[b"content-length"]) == len(body)
        unread = communicator.input_queue.qsize()
        return start["status"], json.loads(body), len(chunks) - unread

    return async_to_sync(request)()


def test_a_body_announced_over_the_limit_is_refused_unread(settings):
    settings.AWAKEN_MAX_BODY_BYTES = 2048
    chunks = [b"x" * 1024] * 3
    status, body, read = post(chunks, [(b"content-length", b"3072")])
    assert (status, body["code"]) == (413, "too_large")
    assert "2048" in body["detail"]
    assert read == 0


def test_a_body_found_over_the_limit_is_refused_where_it_crosses_it(settings):
    # No Content-Length (a chunked upload): counted as it comes.
    settings.AWAKEN_MAX_BODY_BYTES = 2048
    status, body, read = post([b"x" * 1024] * 5, [])
    assert (status, body["code"]) == (413, "too_large")
    assert read == 3


def test_a_body_within_the_limit_reaches_the_view(settings):
    settings.AWAKEN_MAX_BODY_BYTES = 2048
    status, body, _ = post([b'{"agent": ', b'"demo.steps"}'], [(b"content-length", b"23")])
    assert (status, body["code"]) == (401, "not_authenticated")
