"""Requests run their synchronous code on threads kept between requests
(awaken_site/request_threads.py), around Django's own ASGI handler (awaken_site/asgi.py)."""

import threading

import pytest
from asgiref.wsgi import WsgiToAsgi
from django.core.wsgi import get_wsgi_application
from django.db import connection
from django.http import HttpResponse
from django.test import override_settings
from django.urls import path

from awaken_site.request_threads import KeptRequestThreads, RequestThreads
from awaken_site.wsgi_close import closing
from harness.processes import wait_until
from tests.test_body_limit import get as get_start

pytestmark = pytest.mark.django_db(transaction=True)

seen: list[tuple[int, int]] = []


def where_am_i(request):
    seen.append((threading.get_ident(), id(connection)))
    return HttpResponse("ok")


urlpatterns = [path("where/", where_am_i)]


def get(application, path_: str) -> int:
    return get_start(application, path_)["status"]


@override_settings(ROOT_URLCONF=__name__)
def test_requests_one_after_another_run_on_one_kept_thread_and_database_wrapper():
    # As the site serves HTTP (awaken_site/asgi.py). Without kept threads, each request
    # would get a thread of its own, and with it a new database connection wrapper.
    seen.clear()
    threads = RequestThreads()
    application = KeptRequestThreads(WsgiToAsgi(closing(get_wsgi_application())), threads)
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
