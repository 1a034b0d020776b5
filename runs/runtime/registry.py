"""The active-attempt registry: per worker process, run id -> the live attempt's handles.

It is the only in-process lookup for cancel, pause, wake and inbox delivery. Entries carry
their generation: a command for another generation is NotActive, and a stale attempt's
cleanup can never remove its replacement.
"""

import threading
from dataclasses import dataclass, field

from django.utils import timezone

from runs.runtime.token import CancellationToken, Why


@dataclass
class Entry:
    run_id: str
    generation: int
    token: CancellationToken
    pause_requested: threading.Event = field(default_factory=threading.Event)
    pause_actor: str | None = None


class Registry:
    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}

    def register(self, entry: Entry) -> None:
        with self._lock:
            current = self._entries.get(entry.run_id)
            if current is not None and current.generation > entry.generation:
                raise ValueError(f"run {entry.run_id}: generation {current.generation} is newer")
            self._entries[entry.run_id] = entry

    def unregister(self, run_id: str, generation: int) -> bool:
        """Remove the entry only if it is still this generation's."""
        with self._lock:
            current = self._entries.get(run_id)
            if current is None or current.generation != generation:
                return False
            del self._entries[run_id]
            return True

    def get(self, run_id: str, generation: int | None = None) -> Entry | None:
        with self._lock:
            entry = self._entries.get(str(run_id))
        if entry is None or (generation is not None and entry.generation != generation):
            return None
        return entry

    def deliver(self, run_id: str, generation: int | None, command: str, *,
                actor: str | None = None, source: str | None = None) -> Entry | None:
        """Deliver a live command; None means NotActive (nothing changed)."""
        entry = self.get(run_id, generation)
        if entry is None or entry.token.cancelled:
            return None
        if command == "cancel":
            entry.token.cancel(Why("command", actor=actor, source=source, at=timezone.now()))
        elif command == "pause":
            entry.pause_actor = actor
            entry.pause_requested.set()
        elif command == "wake":
            pass  # a live attempt takes it; the inbox it would wake is not built yet
        else:
            raise ValueError(f"unknown command {command!r}")
        return entry

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def snapshot(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())
