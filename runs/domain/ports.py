"""What the domain needs from the world outside it, and nothing more.

The transitions decide; adapters carry their consequences across a process boundary. The
domain names two such consequences and the project wiring (``runs.apps``) plugs an adapter
into each when Django starts, so no module here imports Celery, Channels or the API:

* ``workers``: hand queued runs (and bulk jobs) to the workers, and send a live command to
  the one worker that holds a run's claim, waiting a bounded time for its answer or not at
  all (``runs.wire.web_side``);
* ``changes``: announce committed changes (of runs, and of bulk jobs' progress) to whoever
  watches them (``runs.changes``).

Both are called after commit only (``runs.domain.core.after_commit``), except ``deliver``,
which is the live command itself and answers whether the attempt took it.
"""

from datetime import datetime
from typing import Protocol


class Workers(Protocol):
    def runs_queued(self, *, runs: list[tuple[object, datetime | None]]) -> None:
        """Runs became queued: hand each ``(run_id, start_after)`` to a worker."""

    def deliver(self, *, run_id, generation: int, owner: str | None, command: str,
                actor: str | None = None, source: str | None = None,
                message=None) -> None:
        """Deliver a live command to the attempt ``generation`` held by ``owner``, waiting
        a bounded time for the answer; raise ``NotActive`` when nothing there takes it."""

    def signal(self, *, run_id, generation: int, owner: str, command: str,
               actor: str | None = None, source: str | None = None) -> None:
        """Send a live command without waiting for its answer."""

    def bulk_queued(self, *, job_id) -> None:
        """A bulk job has runs left to handle: hand it to a worker."""


class Changes(Protocol):
    def announce(self, *, changes: list) -> None:
        """Committed ``(run, event)`` pairs, in commit order."""

    def bulk_changed(self, *, job) -> None:
        """A bulk job as committed, after a change of its state or progress."""

    def activity(self, *, run_id, entries: list[dict]) -> None:
        """New entries of a run's activity log (``runs.domain.activity``), as committed."""


class _Unplugged:
    """Until the wiring plugs an adapter in, a port refuses loudly rather than drop work."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr):
        raise RuntimeError(f"the {self.name} port is not connected (runs.apps wires it)")


workers: Workers = _Unplugged("workers")
changes: Changes = _Unplugged("changes")


def connect(*, workers: Workers | None = None, changes: Changes | None = None) -> None:
    """Plug adapters into the ports (called once, by the project wiring)."""
    module = globals()
    if workers is not None:
        module["workers"] = workers
    if changes is not None:
        module["changes"] = changes
