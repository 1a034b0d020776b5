"""The cancellation token of one attempt: cancelled from any thread, awaited on its loop."""

import asyncio
import threading
import time
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Why:
    """Why a token was cancelled.

    ``kind`` is ``command`` (a cancel applied live or found on lease renewal), ``budget``
    (``code`` names it), ``fenced`` (the attempt lost its claim) or ``parent``.
    """

    kind: str
    code: str | None = None
    detail: str | None = None
    actor: str | None = None
    source: str | None = None
    at: datetime | None = None  # when the attempt accepted a command


class CancellationToken:
    """Once cancelled, stays cancelled. Thread-safe; waiters on any event loop wake at once.

    A child token is cancelled with its parent; cancelling a child leaves the parent alone.
    """

    def __init__(self, parent: "CancellationToken | None" = None):
        self._lock = threading.Lock()
        self._why: Why | None = None
        self.cancelled_at: float | None = None  # unix seconds, for the stop receipt
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._children: list[CancellationToken] = []
        if parent is not None:
            parent._adopt(self)

    @property
    def cancelled(self) -> bool:
        return self._why is not None

    @property
    def why(self) -> Why | None:
        return self._why

    def cancel(self, why: Why) -> bool:
        """Cancel; returns False if it already was (the first reason stands)."""
        with self._lock:
            if self._why is not None:
                return False
            self._why = why
            self.cancelled_at = time.time()
            waiters, self._waiters = self._waiters, []
            children, self._children = self._children, []
        for loop, future in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, future)
        for child in children:
            child.cancel(Why("parent", detail=why.kind, actor=why.actor, source=why.source))
        return True

    def child(self) -> "CancellationToken":
        return CancellationToken(parent=self)

    def _adopt(self, child: "CancellationToken") -> None:
        with self._lock:
            if self._why is None:
                self._children.append(child)
                return
            why = self._why
        child.cancel(Why("parent", detail=why.kind, actor=why.actor, source=why.source))

    def wait(self) -> asyncio.Future:
        """A future of the running loop that resolves when the token is cancelled.

        Cancel the future when no longer waiting: it then leaves the token, so a token
        holds only the waits in progress, however many awaits its attempt makes.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if self._why is None:
                self._waiters.append((loop, future))
                future.add_done_callback(self._forget)
                return future
        future.set_result(None)
        return future

    def _forget(self, future: asyncio.Future) -> None:
        with self._lock:
            self._waiters = [(loop, f) for loop, f in self._waiters if f is not future]

    @property
    def waiting(self) -> int:
        """How many waits are in progress."""
        with self._lock:
            return len(self._waiters)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
