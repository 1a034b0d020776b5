"""What /healthz reports, found out in the background and kept for a moment.

A burst of health checks must not wedge the process (SPEC §8): the database and the broker
are probed on a broker thread, at most one probe at a time per process, and a check answers
from the newest result within ``ANSWER_WITHIN`` seconds whatever the probe is doing. No
request thread holds a pooled database connection or waits on the broker for it.
"""

import threading
import time
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
    at: float  # monotonic time of the probe

    def as_json(self) -> dict:
        return {"db": self.db, "broker": self.broker, "workers": self.workers}


class Prober:
    def __init__(self):
        self._lock = threading.Lock()
        self._latest: Health | None = None
        self._probing: threading.Event | None = None

    def current(self) -> Health:
        """The newest health, probed again if it is older than ``FRESH_FOR``."""
        with self._lock:
            latest, probing = self._latest, self._probing
            fresh = latest is not None and time.monotonic() - latest.at < FRESH_FOR
            if not fresh and probing is None:
                probing = self._probing = threading.Event()
                if broker_threads().post(self._probe, done=probing) is None:
                    self._probing = None  # no broker thread is free: answer with what is known
        if not fresh and probing is not None:
            probing.wait(ANSWER_WITHIN)
        with self._lock:
            latest = self._latest
        if latest is None or time.monotonic() - latest.at > STALE_AFTER:
            return Health("down", "unknown", 0, time.monotonic())
        return latest

    def _probe(self, *, done: threading.Event) -> None:  # on a broker thread
        try:
            db = database_answers()
            broker, workers = broker_and_workers() if db == "ok" else ("unknown", 0)
            with self._lock:
                self._latest = Health(db, broker, workers, time.monotonic())
        finally:
            with self._lock:
                self._probing = None
            done.set()


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
