"""The broker threads: the few threads of each process that talk to the broker for the rest.

Nothing talks to the broker on the thread that needs it sent: a request thread hands the
call to one of these threads, with their own broker connections, and waits for an answer
no longer than its deadline (SPEC §8), holding no database connection meanwhile. At most
``AWAKEN_BROKER_THREADS`` calls are made at once and ``AWAKEN_BROKER_BACKLOG`` wait; past
that a call is refused at once (counted by ``awaken_broker_dropped``) rather than queued
without end.
"""

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from celery import current_app
from django.conf import settings
from django.db import connection
from prometheus_client import Counter

log = logging.getLogger(__name__)

DROPPED = Counter("awaken_broker_dropped", "Broker calls this process did not make because "
                  "its broker threads were full (a dispatch or a live command; both are "
                  "recovered).")


class BrokerFull(Exception):
    """Every broker thread and backlog place is taken: the call was not made."""


class BrokerThreads:
    """The threads of this process that talk to the broker for everyone else.

    At most ``threads`` calls are made at once and ``backlog`` wait; past that a call is
    refused at once rather than queued without end. Each thread keeps a broker connection
    of its own for live commands, so no caller waits on a shared pool either.
    """

    def __init__(self, *, threads: int, backlog: int):
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="awaken-broker")
        self._slots = threading.BoundedSemaphore(threads + backlog)
        self._local = threading.local()

    def post(self, fn, /, **kwargs) -> Future | None:
        """Run ``fn(**kwargs)`` on a broker thread; None if every thread and backlog place is
        taken."""
        if not self._slots.acquire(blocking=False):
            DROPPED.inc()
            return None
        future = self._pool.submit(fn, **kwargs)
        future.add_done_callback(lambda _: self._slots.release())
        return future

    def call(self, fn, /, *, timeout: float, **kwargs):
        """``fn(**kwargs)`` on a broker thread, waited for at most ``timeout`` seconds by a
        caller that holds no database connection meanwhile. Raises TimeoutError when it
        takes longer, the call itself going on with a deadline of its own; BrokerFull when
        no broker thread or backlog place is free (nothing was sent)."""
        future = self.post(fn, **kwargs)
        if future is None:
            raise BrokerFull("every broker thread is taken")
        release_database()
        try:
            return future.result(timeout)
        except FutureTimeout:
            raise TimeoutError(f"no answer from the broker within {timeout:g} s") from None

    def broker(self):
        """This broker thread's own broker connection, made (and re-made) on demand."""
        conn = getattr(self._local, "connection", None)
        if conn is None:
            conn = current_app.connection_for_write()
            conn.ensure_connection(max_retries=1, timeout=settings.AWAKEN_BROKER_TIMEOUT)
            self._local.connection = conn
        return conn

    def forget_broker(self) -> None:
        conn = getattr(self._local, "connection", None)
        self._local.connection = None
        if conn is not None:
            try:
                conn.release()
            except Exception:
                pass


_threads: BrokerThreads | None = None
_threads_lock = threading.Lock()


def broker_threads() -> BrokerThreads:
    """This process's broker threads, made on first use."""
    global _threads
    with _threads_lock:
        if _threads is None:
            _threads = BrokerThreads(threads=settings.AWAKEN_BROKER_THREADS,
                                     backlog=settings.AWAKEN_BROKER_BACKLOG)
        return _threads


def release_database() -> None:
    """Give this thread's database connection back to the pool before a wait on the
    network (PostgreSQL's pool; the next query takes one again). Not inside a transaction,
    and not on SQLite, whose connections are per thread and cheap to keep."""
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        connection.close()


# --- health -----------------------------------------------------------------------------------


def broker_and_workers() -> tuple[str, int]:
    """On a broker thread: whether the broker answers, and how many workers answer a
    ping, each within ``AWAKEN_BROKER_TIMEOUT``."""
    threads = broker_threads()
    try:
        threads.broker().ensure_connection(max_retries=1,
                                           timeout=settings.AWAKEN_BROKER_TIMEOUT)
    except Exception:
        threads.forget_broker()
        return "down", 0
    try:
        replies = current_app.control.ping(timeout=settings.AWAKEN_BROKER_TIMEOUT,
                                           connection=threads.broker()) or []
    except Exception:
        threads.forget_broker()
        return "down", 0
    return "ok", len(replies)
