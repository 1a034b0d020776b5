"""The HTTP side of the ASGI application (awaken_site/asgi.py): Django behind
awaken_site/body_limit.py, which refuses bodies over the limit before Django reads them,
lets a client that leaves mid-body end its request quietly, and leaves the server's
``receive`` to Django once the body is in."""

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.core.handlers.asgi import ASGIHandler

from awaken_site.asgi import application
from awaken_site.body_limit import BodySizeLimit

pytestmark = pytest.mark.django_db(transaction=True)


def http_scope(method: str, path: str, headers: list[tuple[bytes, bytes]] = ()) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "",
            "headers": [(b"host", b"127.0.0.1"), *headers],
            "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80)}


def get(app, path: str) -> dict:
    """One GET through ``app``: the response start message."""

    async def request():
        communicator = ApplicationCommunicator(app, http_scope("GET", path))
        await communicator.send_input({"type": "http.request", "body": b""})
        start = await communicator.receive_output(timeout=10)
        while (await communicator.receive_output(timeout=10)).get("more_body"):
            pass
        await communicator.wait(timeout=10)
        return start

    return async_to_sync(request)()


def test_it_answers_as_djangos_own_handler_does():
    mine = get(application, "/accounts/login/")
    theirs = get(ASGIHandler(), "/accounts/login/")
    header_names = {name.lower() for name, _ in mine["headers"]}
    assert mine["status"] == theirs["status"] == 200
    assert header_names == {name.lower() for name, _ in theirs["headers"]}
    assert {b"x-frame-options", b"set-cookie", b"content-type"} <= header_names


def post(chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, dict, int]:
    """One POST to /api/runs/ through the site's application, its body sent in ``chunks``.
    Returns the status, the JSON body, and how many chunks the application asked for."""

    async def request():
        scope = http_scope("POST", "/api/runs/",
                           [(b"content-type", b"application/json"), *headers])
        communicator = ApplicationCommunicator(application, scope)
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
        if start["status"] == 413:  # answered by the limit itself, whole
            sent = {name.lower(): value for name, value in start["headers"]}
            assert int(sent[b"content-length"]) == len(body)
            assert sent[b"content-type"] == b"application/json"
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


def test_a_body_over_the_limit_is_refused_on_every_route(settings):
    # It should answer 413 before any view or middleware runs, on a page as on the API.
    settings.AWAKEN_MAX_BODY_BYTES = 2048

    async def request(path):
        communicator = ApplicationCommunicator(application, http_scope(
            "POST", path, [(b"content-length", b"4096")]))
        start = await communicator.receive_output(timeout=10)
        await communicator.wait(timeout=10)
        return start["status"]

    for path in ("/accounts/login/", "/no/such/page/", "/api/runs/"):
        assert async_to_sync(request)(path) == 413, path


def test_a_body_within_the_limit_reaches_the_view(settings):
    settings.AWAKEN_MAX_BODY_BYTES = 2048
    status, body, _ = post([b'{"agent": ', b'"demo.steps"}'], [(b"content-length", b"23")])
    assert (status, body["code"]) == (401, "not_authenticated")


def test_a_client_that_leaves_mid_body_ends_the_request_quietly():
    sent = []

    async def request():
        communicator = ApplicationCommunicator(application, http_scope(
            "POST", "/api/runs/", [(b"content-length", b"100")]))
        await communicator.send_input({"type": "http.request", "body": b"x" * 10,
                                       "more_body": True})
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=10)  # the application returns, raising nothing
        while not communicator.output_queue.empty():
            sent.append(communicator.output_queue.get_nowait())

    async_to_sync(request)()
    assert sent == []  # nobody to answer


def test_after_the_body_receive_is_the_servers_own():
    # The application gets the body whole, then the server's later messages (the client's
    # disconnect, say).
    server = asyncio.Queue()
    for message in ({"type": "http.request", "body": b"ab", "more_body": True},
                    {"type": "http.request", "body": b"c"},
                    {"type": "http.disconnect"}):
        server.put_nowait(message)
    received = []

    async def inner(scope, receive, send):
        received.append(await receive())
        received.append(await receive())

    async_to_sync(BodySizeLimit(inner))(http_scope("POST", "/api/runs/"), server.get, None)
    assert received == [{"type": "http.request", "body": b"abc", "more_body": False},
                        {"type": "http.disconnect"}]
    assert server.empty()


def test_other_scopes_pass_through_unchanged():
    seen = []

    async def inner(scope, receive, send):
        seen.append(scope["type"])

    async_to_sync(BodySizeLimit(inner))({"type": "lifespan"}, None, None)
    assert seen == ["lifespan"]


def test_every_request_is_finished_and_gives_its_connection_back():
    # Django ends a request (request_finished: its database connection back to the pool)
    # when the server closes the response (awaken_site/wsgi_threads.py).
    from django.core.signals import request_finished

    finished = []

    def note(sender, **kwargs):
        finished.append(sender)

    request_finished.connect(note)
    try:
        for _ in range(3):
            assert get(application, "/accounts/login/")["status"] == 200
    finally:
        request_finished.disconnect(note)
    assert len(finished) == 3
