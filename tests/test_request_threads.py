"""Requests run their synchronous code on threads kept between requests
(awaken_site/request_threads.py), around Django's own ASGI handler (awaken_site/asgi.py)."""

import threading

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.db import connection
from django.http import HttpResponse
from django.test import override_settings
from django.urls import path

from awaken_site.request_threads import KeptRequestThreads, RequestThreads
from harness.processes import wait_until
from tests.test_body_limit import http_scope

pytestmark = pytest.mark.django_db(transaction=True)

seen: list[tuple[int, int]] = []


def where_am_i(request):
    seen.append((threading.get_ident(), id(connection)))
    return HttpResponse("ok")


urlpatterns = [path("where/", where_am_i)]


def get(application, path_: str) -> int:
    async def request():
        communicator = ApplicationCommunicator(application, http_scope("GET", path_))
        await communicator.send_input({"type": "http.request", "body": b""})
        start = await communicator.receive_output(timeout=10)
        while (await communicator.receive_output(timeout=10)).get("more_body"):
            pass
        await communicator.wait(timeout=10)
        return start["status"]

    return async_to_sync(request)()


@override_settings(ROOT_URLCONF=__name__)
def test_requests_one_after_another_run_on_one_kept_thread_and_database_wrapper():
    # Django's own handler starts a thread per request, and with it a new database
    # connection wrapper (and whatever is cached on it).
    seen.clear()
    threads = RequestThreads()
    application = KeptRequestThreads(get_asgi_application(), threads)
    for _ in range(3):
        assert get(application, "/where/") == 200
        wait_until(lambda: threads.idle_count == 1, 5, "the thread to be given back")
    assert len(seen) == 3
    assert len({thread for thread, _ in seen}) == 1
    assert len({wrapper for _, wrapper in seen}) == 1


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
