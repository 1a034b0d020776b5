"""What the domain needs from outside it: the two interfaces the wiring plugs in.

(Such interfaces are often called "ports"; here they are just the two objects below.) The
transitions decide; adapters carry their consequences across a process boundary. The
domain names two such consequences and the project wiring (``runs.apps``) plugs an adapter
into each when Django starts, so no module here imports Celery, Channels or the API:

* ``workers``: hand queued runs (and bulk jobs) to the workers, and send a live command to
  the one worker that holds a run's claim, waiting a bounded time for its answer or not at
  all (``runs.workers.dispatch``);
* ``changes``: publish committed changes (of runs, of bulk jobs' progress, of a run's
  activity) to whoever follows them (``runs.changes.publishing``).

Both are called after commit only (``runs.domain.core.after_commit``), except
``send_command_and_wait``, which is the live command itself and answers whether the
attempt took it.
"""

from datetime import datetime
from typing import Protocol


class Workers(Protocol):
    def runs_queued(self, *, runs: list[tuple[object, datetime | None]]) -> None:
        """Runs became queued: hand each ``(run_id, start_after)`` to a worker."""

    def send_command_and_wait(self, *, run_id, generation: int, owner: str | None,
                              command: str, actor: str | None = None,
                              source: str | None = None, message=None) -> None:
        """Send a live command to the attempt ``generation`` held by ``owner``, waiting
        a bounded time for the answer; raise ``NotActive`` when nothing there takes it
        (final: a command not taken in time is dropped by its worker), ``Busy`` when it
        could not be sent at all."""

    def send_command(self, *, run_id, generation: int, owner: str, command: str,
                     actor: str | None = None, source: str | None = None) -> None:
        """Send a live command without waiting for its answer."""

    def bulk_queued(self, *, job_id) -> None:
        """A bulk job has runs left to handle: hand it to a worker."""


class Changes(Protocol):
    def publish_changes(self, *, changes: list) -> None:
        """Committed ``(run, event)`` pairs, in commit order."""

    def publish_bulk(self, *, job) -> None:
        """A bulk job as committed, after a change of its state or progress."""

    def publish_activity(self, *, run_id, entries: list[dict]) -> None:
        """New entries of a run's activity log (``runs.domain.activity``), as committed."""


class _Unplugged:
    """Until the wiring plugs an adapter in, an interface refuses loudly rather than drop
    work."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr):
        raise RuntimeError(f"the domain's {self.name} interface is not connected "
                           "(runs.apps connects it)")


workers: Workers = _Unplugged("workers")
changes: Changes = _Unplugged("changes")


def connect(*, workers: Workers | None = None, changes: Changes | None = None) -> None:
    """Plug adapters into the two interfaces (called once, by the project wiring)."""
    module = globals()
    if workers is not None:
        module["workers"] = workers
    if changes is not None:
        module["changes"] = changes
