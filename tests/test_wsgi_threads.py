"""Django's WSGI application served on kept threads (awaken_site/wsgi_threads.py), as the site
serves HTTP (awaken_site/asgi.py)."""

import asyncio
import contextlib
import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.core.signals import request_finished
from django.core.wsgi import get_wsgi_application
from django.db import connection
from django.http import HttpResponse, StreamingHttpResponse
from django.test import override_settings
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from awaken_site.wsgi_threads import DUPLICATE_HEADERS, RequestThreads, WsgiOnThreads
from harness.processes import wait_until
from tests.test_body_limit import http_scope

pytestmark = pytest.mark.django_db(transaction=True)

seen: list[tuple[int, int]] = []
flowing = threading.Event()  # the streaming view's client has had its first chunk
request_id = contextvars.ContextVar("request_id", default=None)


def where_am_i(request):
    seen.append((threading.get_ident(), id(connection)))
    return HttpResponse("ok")


@csrf_exempt
def echo(request):
    return HttpResponse(
        f"{request.method} {request.path} {request.META['QUERY_STRING']} "
        f"{request.headers.get('X-Twice')} {request.COOKIES} {request.body.decode()} "
        f"{request_id.get()}")


def chunks(request):
    def body():
        yield b"one,"
        flowing.wait(5)
        yield b"two"
    return StreamingHttpResponse(body())


def endless(request):
    def body():
        while True:
            yield b"more,"
    return StreamingHttpResponse(body())


def broken(request):
    raise RuntimeError("a view that fails")


urlpatterns = [path("where/", where_am_i), path("echo/", echo), path("chunks/", chunks),
               path("endless/", endless), path("broken/", broken)]


def exchange(application, scope: dict, body: bytes = b"", *, on_first=None):
    """One request through ``application``: the status, the body, and the messages sent.
    ``on_first`` is called once the first body message is out."""
    return async_to_sync(exchanged)(application, scope, body, on_first=on_first)


async def exchanged(application, scope: dict, body: bytes = b"", *, on_first=None):
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": body})
    messages = [await communicator.receive_output(timeout=10)]
    while True:
        message = await communicator.receive_output(timeout=10)
        messages.append(message)
        if len(messages) == 2 and on_first is not None:
            on_first()
        if not message.get("more_body"):
            break
    await communicator.wait(timeout=10)
    body = b"".join(m.get("body", b"") for m in messages[1:])
    return messages[0]["status"], body, messages


def served(threads=None) -> WsgiOnThreads:
    return WsgiOnThreads(get_wsgi_application(), threads)


@override_settings(ROOT_URLCONF=__name__)
def test_requests_one_after_another_run_on_one_kept_thread_and_database_wrapper():
    # Without kept threads, each request would get a thread of its own, and with it a new
    # database connection wrapper.
    seen.clear()
    threads = RequestThreads()
    application = served(threads)
    for _ in range(3):
        assert exchange(application, http_scope("GET", "/where/"))[0] == 200
        wait_until(lambda: threads.idle_count == 1, 5, "the thread to be given back")
    assert len(seen) == 3
    assert len({thread for thread, _ in seen}) == 1
    assert len({wrapper for _, wrapper in seen}) == 1


@override_settings(ROOT_URLCONF=__name__)
def test_a_served_request_wakes_its_thread_once_and_leaves_it_free_at_once():
    """The thread whose call has returned is kept for the next request then and there: no
    second call is queued on it to learn that it is free."""
    calls = []

    class Counted(ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            calls.append(fn)
            return super().submit(fn, *args, **kwargs)

    threads = RequestThreads()
    threads.borrow = lambda: Counted(1)
    assert exchange(served(threads), http_scope("GET", "/where/"))[0] == 200
    assert len(calls) == 1
    assert threads.idle_count == 1


def test_a_thread_still_busy_is_not_lent_to_the_next_request():
    threads = RequestThreads(idle=4)
    executor = threads.borrow()
    release = threading.Event()
    executor.submit(release.wait, 5)
    threads.give_back(executor)
    assert threads.borrow() is not executor  # still running the first request's work
    release.set()
    wait_until(lambda: threads.idle_count == 1, 5, "the thread to be given back")
    assert threads.borrow() is executor


@override_settings(ROOT_URLCONF=__name__)
def test_the_request_reaches_the_view_as_sent_and_a_whole_answer_goes_in_two_messages():
    scope = http_scope("POST", "/echo/", [(b"x-twice", b"a"), (b"x-twice", b"b"),
                                           (b"cookie", b"c=1"), (b"cookie", b"d=2"),
                                           (b"content-type", b"text/plain"),
                                           (b"content-length", b"8")])
    scope["query_string"] = b"q=%C3%A9"
    inner = served()

    async def naming(scope, receive, send):  # an ASGI middleware: the view's thread sees it
        request_id.set("r-1")
        await inner(scope, receive, send)

    status, body, messages = exchange(naming, scope, b"the body")
    assert status == 200
    assert body == b"POST /echo/ q=%C3%A9 a,b {'c': '1', 'd': '2'} the body r-1"
    assert [m["type"] for m in messages] == ["http.response.start", "http.response.body"]
    assert (b"content-length", str(len(body)).encode()) in messages[0]["headers"]


@override_settings(ROOT_URLCONF=__name__)
def test_a_streaming_answer_goes_chunk_by_chunk_and_the_request_is_finished_after_it():
    finished = []

    def note(sender, **kwargs):
        finished.append(flowing.is_set())

    flowing.clear()
    request_finished.connect(note)
    try:
        # The view's second chunk waits for the client to have the first.
        status, body, messages = exchange(served(), http_scope("GET", "/chunks/"),
                                          on_first=flowing.set)
    finally:
        request_finished.disconnect(note)
    assert (status, body) == (200, b"one,two")
    assert [m.get("body") for m in messages[1:]] == [b"one,", b"two", None]
    assert finished == [True]  # closed once, after its last chunk


@override_settings(ROOT_URLCONF=__name__)
def test_a_streaming_answer_whose_request_is_cancelled_stops_and_is_finished():
    # The server cancels the request of a client that has gone: the thread stops at its
    # next chunk, closes the response (Django's end of the request), and is given back.
    finished = threading.Event()
    threads = RequestThreads()

    def note(sender, **kwargs):
        finished.set()

    async def leave():
        communicator = ApplicationCommunicator(served(threads), http_scope("GET", "/endless/"))
        await communicator.send_input({"type": "http.request", "body": b""})
        assert (await communicator.receive_output(timeout=10))["status"] == 200
        assert (await communicator.receive_output(timeout=10))["body"] == b"more,"
        communicator.future.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await communicator.future

    request_finished.connect(note)
    try:
        async_to_sync(leave)()
        assert finished.wait(10)
    finally:
        request_finished.disconnect(note)
    wait_until(lambda: threads.idle_count == 1, 5, "the thread to be given back")


@override_settings(ROOT_URLCONF=__name__, DEBUG_PROPAGATE_EXCEPTIONS=False)
def test_a_failing_view_is_answered_500_and_the_thread_serves_the_next_request():
    threads = RequestThreads()
    application = served(threads)
    assert exchange(application, http_scope("GET", "/broken/"))[0] == 500
    wait_until(lambda: threads.idle_count == 1, 5, "the thread to be given back")
    assert exchange(application, http_scope("GET", "/where/"))[0] == 200


def test_a_header_repeated_too_often_is_a_bad_request_that_reaches_no_view():
    called = []

    def app(environ, start_response):
        called.append(environ)
        start_response("200 OK", [])
        return [b""]

    scope = http_scope("GET", "/", [(b"x-many", b"1")] * (DUPLICATE_HEADERS + 1))
    status, body, _ = exchange(WsgiOnThreads(app), scope)
    assert status == 400 and b"x-many" in body
    assert called == []


def test_a_client_that_leaves_before_its_body_is_in_reaches_no_view():
    called = []

    def app(environ, start_response):
        called.append(environ)

    async def leave():
        communicator = ApplicationCommunicator(WsgiOnThreads(app), http_scope("POST", "/"))
        await communicator.send_input({"type": "http.request", "body": b"a", "more_body": True})
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=10)
        assert await communicator.receive_nothing()

    async_to_sync(leave)()
    assert called == []
