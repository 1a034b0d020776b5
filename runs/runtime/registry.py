"""The active-attempt registry: per worker process, run id -> the live attempt's handles.

It is the only in-process lookup for the live commands (cancel, pause, wake, message).
Entries carry their generation: a command for another generation is NotActive, and a stale
attempt's cleanup can never remove its replacement.
"""

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field

from django.utils import timezone

from runs import telemetry
from runs.runtime.token import CancellationToken, Why


@dataclass
class Entry:
    run_id: str
    generation: int
    token: CancellationToken
    loop: asyncio.AbstractEventLoop | None = None  # the loop the attempt runs on
    pause_requested: threading.Event = field(default_factory=threading.Event)
    pause_actor: str | None = None
    pause_source: str | None = None
    inbox: deque = field(default_factory=deque)  # InboxItem, oldest first
    trace: telemetry.NoAttempt = telemetry.NO_ATTEMPT  # the attempt's trace, once it starts
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    INBOX_LIMIT = 1000  # items waiting at most; a full inbox takes no more

    def post(self, item: "InboxItem | None") -> bool:
        """From any thread: add ``item`` to the inbox (None only wakes a waiting receive).
        False if the inbox is full."""
        if item is not None:
            if len(self.inbox) >= self.INBOX_LIMIT:
                return False
            self.inbox.append(item)
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._arrived.set)
        return True

    def take(self) -> "InboxItem | None":
        """On the loop: the oldest item, or None if the inbox is empty."""
        return self.inbox.popleft() if self.inbox else None

    async def arrival(self) -> None:
        """On the loop: wait until something is posted (returns at once if the inbox
        is not empty)."""
        self._arrived.clear()
        if not self.inbox:
            await self._arrived.wait()


@dataclass(frozen=True)
class InboxItem:
    message: object  # the JSON sent with the command; None for a wake
    actor: str | None = None  # who sent it, named on the step it causes
    source: str | None = None


class Registry:
    def __init__(self):
        self._lock = threading.Lock()
        self._registered = threading.Condition(self._lock)
        self._entries: dict[str, Entry] = {}

    def register(self, entry: Entry) -> bool:
        """Register ``entry``; an older generation of its run here is fenced at once (its
        token cancelled, its children's with it). False, and nothing changes, if a newer
        generation is already registered: ``entry`` is stale and must not run."""
        with self._lock:
            current = self._entries.get(entry.run_id)
            if current is not None and current.generation > entry.generation:
                return False
            self._entries[entry.run_id] = entry
            self._registered.notify_all()
        if current is not None and current.generation < entry.generation:
            current.token.cancel(Why("fenced", detail=f"replaced by {entry.generation}"))
        return True

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

    def wait_for(self, run_id: str, generation: int, timeout: float) -> bool:
        """Wait up to ``timeout`` for attempt ``generation`` of the run to be registered."""
        def registered():
            entry = self._entries.get(str(run_id))
            return entry is not None and entry.generation >= generation

        with self._registered:
            return self._registered.wait_for(registered, timeout)

    def apply(self, run_id: str, generation: int | None, command: str, *,
              actor: str | None = None, source: str | None = None,
              message=None) -> Entry | None:
        """Apply a live command to the registered attempt: cancel its token, ask it to
        pause, wake it or post a message to its inbox. None means NotActive (nothing
        changed)."""
        entry = self.get(run_id, generation)
        if entry is None or entry.token.cancelled:
            return None
        if command == "cancel":
            entry.token.cancel(Why("command", actor=actor, source=source, at=timezone.now()))
        elif command == "pause":
            entry.pause_actor = actor
            entry.pause_source = source
            entry.pause_requested.set()
            entry.post(None)  # an attempt waiting on its inbox takes the pause at once
        elif command == "wake":
            entry.post(InboxItem(None, actor, source))
        elif command == "message":
            if not entry.post(InboxItem(message, actor, source)):
                return None
        else:
            raise ValueError(f"unknown command {command!r}")
        if command != "cancel":  # a cancel's trace names its request (Executor._interrupted)
            entry.trace.control("deliver" if command == "message" else command, actor=actor,
                                source=source)
        return entry

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def snapshot(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())
