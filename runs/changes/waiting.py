"""The REST side of the stream: a request thread's watch of one run's next committed change.

A thread that waits for a run's change registers its watch before it reads the run, so no
commit slips between its read and its wake-up. The stream offers each committed run it
receives to the watches of that run (``Watches.offer``); a watch keeps the newest version.
When the process shuts down, ``Watches.end_all`` ends every watch, and every watch begun
after it starts ended: each waiting thread answers at once, as a wait that ran out does.
"""

import threading
from contextlib import contextmanager

from runs.domain import selectors
from runs.domain.representation import run_data


class Watch:
    """The newest committed snapshot of one run pushed since the watch began. ``live`` is
    False while the stream has no subscription: no push will come."""

    def __init__(self, live: bool, ended: bool = False):
        self._changed = threading.Event()
        self._lock = threading.Lock()
        self.run: dict | None = None
        self.live = live
        self.ended = ended
        if ended:
            self._changed.set()

    def offer(self, run: dict) -> None:
        with self._lock:
            # Pushes can arrive out of order; never step back to an older version.
            if self.run is None or run["version"] > self.run["version"]:
                self.run = run
        self._changed.set()

    def next(self, timeout: float) -> dict | None:
        """Wait up to ``timeout`` for a push; the newest snapshot, or None on time-out. A run
        pushed truncated is read whole: the caller answers with the run as the API shows it.
        None at once once the watch is ended (the process shuts down)."""
        if not self._changed.wait(timeout) or self.ended:
            return None
        self._changed.clear()
        with self._lock:
            run = self.run
        if run is not None and run.get("truncated"):
            run = run_data(selectors.run_get(run["id"]))
        return run

    def end(self) -> None:
        """No push is waited for any more: ``next`` returns None, now and from now on."""
        self.ended = True
        self._changed.set()


class Watches:
    """The watches of this process, by run id; registered and offered from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_run: dict[str, set[Watch]] = {}
        self.ended = False

    @contextmanager
    def watch(self, run_id, *, live: bool):
        key = str(run_id)
        with self._lock:
            watch = Watch(live, ended=self.ended)
            self._by_run.setdefault(key, set()).add(watch)
        try:
            yield watch
        finally:
            with self._lock:
                discard_member(self._by_run, key, watch)

    def end_all(self) -> int:
        """End every watch, and every watch begun from now on (the process shuts down);
        how many were waiting."""
        with self._lock:
            self.ended = True
            watches = [watch for members in self._by_run.values() for watch in members]
        for watch in watches:
            watch.end()
        return len(watches)

    def of(self, run_id) -> list[Watch]:
        """The watches of one run now."""
        with self._lock:
            return list(self._by_run.get(run_id, ()))


def discard_member(groups: dict, key, member) -> None:
    """Take ``member`` out of the set ``groups[key]``, and the key out of ``groups`` once its
    set is empty (so followers and watches of ended runs are not kept)."""
    members = groups.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del groups[key]
