"""What /healthz reports, found out in the background and kept for a moment.

A burst of health checks must not wedge the process (SPEC §8): the database is probed on a
thread of its own and the broker on a broker thread, each at most one probe at a time per
process, and a check answers from the newest results within ``ANSWER_WITHIN`` seconds
whatever the probes are doing. No request thread holds a pooled database connection or
waits on the broker for it. ``db`` reports the database alone: a broker outage makes the
broker ``down`` or ``unknown``, never the database.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.db import connection

from runs.workers.broker import broker_and_workers, broker_threads, release_database

FRESH_FOR = 2.0  # seconds a result is reused before a new probe is started
ANSWER_WITHIN = 0.8  # seconds a check waits for a probe in flight
STALE_AFTER = 10.0  # a result this old is no answer: the probe itself is stuck


@dataclass(frozen=True)
class Health:
    db: str  # "ok" | "down"
    broker: str  # "ok" | "down" | "unknown"
    workers: int

    def as_json(self) -> dict:
        return {"db": self.db, "broker": self.broker, "workers": self.workers}


class Probe:
    """One measurement, made again in the background when the last is older than
    ``FRESH_FOR``, at most one at a time. ``post(fn, done=event)`` runs ``fn(done=event)``
    on a thread of the probe's own, or returns None when it cannot."""

    def __init__(self, measure, post):
        self._measure, self._post = measure, post
        self._lock = threading.Lock()
        self._latest: tuple[object, float] | None = None  # (value, monotonic time)
        self._probing: threading.Event | None = None

    def refresh(self) -> threading.Event | None:
        """Start a measurement if none is fresh or in flight; the event of the one in
        flight (None when the last is fresh, or no thread is free)."""
        with self._lock:
            if self._latest is not None and time.monotonic() - self._latest[1] < FRESH_FOR:
                return None
            if self._probing is None:
                self._probing = threading.Event()
                if self._post(self._run, done=self._probing) is None:
                    self._probing = None
            return self._probing

    def latest(self):
        """The newest value, or None when there is none or it is older than
        ``STALE_AFTER`` (the measurement itself is stuck)."""
        with self._lock:
            latest = self._latest
        if latest is None or time.monotonic() - latest[1] > STALE_AFTER:
            return None
        return latest[0]

    def _run(self, *, done: threading.Event) -> None:
        try:
            value = self._measure()
            with self._lock:
                self._latest = (value, time.monotonic())
        finally:
            with self._lock:
                self._probing = None
            done.set()


class Prober:
    """The database and the broker, each probed on its own: a broker that hangs (or broker
    threads all busy with it) never makes the database look down."""

    def __init__(self):
        # One thread of its own for the database (one connection, kept), never a broker
        # thread: those are the ones a broker outage ties up.
        database_thread = ThreadPoolExecutor(1, thread_name_prefix="awaken-health")
        self.database = Probe(database_answers, database_thread.submit)
        self.broker = Probe(broker_and_workers, lambda fn, **kwargs: broker_threads().post(
            fn, **kwargs))

    def current(self) -> Health:
        """The newest health, probed again where older than ``FRESH_FOR``; answered within
        ``ANSWER_WITHIN`` whatever the probes are doing."""
        deadline = time.monotonic() + ANSWER_WITHIN
        for probing in [self.database.refresh(), self.broker.refresh()]:
            if probing is not None:
                probing.wait(max(0.0, deadline - time.monotonic()))
        broker, workers = self.broker.latest() or ("unknown", 0)
        return Health(self.database.latest() or "down", broker, workers)


def database_answers() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception:
        return "down"
    finally:
        release_database()


prober = Prober()
