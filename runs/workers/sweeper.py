"""The sweeper (SPEC §6), a thread of the process that schedules: beat, or the embedded site.

The sweep runs where it cannot wait on a worker: beat's own process sweeps every third of
a lease, on a thread of its own, instead of sending a task for a worker to run. A frozen,
dead or busy fleet of workers then holds up nothing: an expired lease's pending intent is
applied, lost dispatches are sent again and idle bulk jobs moved on within a sweep
interval. Sweeps may overlap (each row is its own compare-and-set transition), so two
schedulers sweeping at once only repeat each other's reads.
"""

import logging
import threading

from celery.signals import beat_init
from django.conf import settings
from django.db import close_old_connections, connection

from runs import domain

log = logging.getLogger(__name__)


def sweep_interval() -> float:
    """Seconds between two sweeps: a third of a lease, at least one."""
    return max(1.0, settings.AWAKEN_LEASE_SECONDS / 3)


class Sweeper:
    """A daemon thread that sweeps every ``interval`` seconds until ``stop()``."""

    def __init__(self, interval: float | None = None, *, name: str = "awaken-sweeper"):
        self.interval = sweep_interval() if interval is None else interval
        self.sweeps = 0  # passes made, failed ones included
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> "Sweeper":
        self._thread.start()
        return self

    def stop(self, timeout: float = 5) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sweep_once()

    def sweep_once(self) -> dict | None:
        close_old_connections()  # a connection the database ended is not used again
        try:
            counts = domain.sweep()
        except Exception:
            log.warning("sweep failed; the next one is due in %g s", self.interval,
                        exc_info=True)
            counts = None
        finally:
            self.sweeps += 1
            # Between sweeps the connection goes back to PostgreSQL's pool.
            if connection.vendor == "postgresql":
                connection.close()
        if counts and any(counts.values()):
            log.info("sweep: %s", counts)
        return counts


@beat_init.connect
def sweep_in_beat(sender=None, **kwargs) -> None:
    """Beat sweeps itself: its sweeper thread starts with it."""
    Sweeper().start()
    log.info("sweeping every %g s in beat's process", sweep_interval())
