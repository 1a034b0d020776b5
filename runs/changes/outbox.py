"""The outbox of one websocket: what it has yet to be sent, and the task that sends it.

The stream forwards each change to the outboxes of the sockets that follow it (``forward``);
an outbox never makes the stream wait, so a slow socket holds up nobody. A socket that falls
too far behind is closed instead of buffered without end.
"""

import asyncio
import logging
from collections import deque

log = logging.getLogger(__name__)


class Outbox:
    """What one socket has yet to be sent, and the task of its own that sends it.

    ``put`` never waits. A socket more than ``limit`` messages or ``max_bytes`` behind is not
    worth keeping up: ``overflow`` is called once (the socket closes itself, and its client
    resumes after the last seq it saw when it reconnects). ``writable``, if given, is awaited
    before each send and returns once the connection takes more, so that what a client does
    not read waits here, counted, and not in the server's write buffer. A ``held`` outbox
    sends nothing until ``release``.

    ``write_now``, if given, writes a message at once, without waiting: it returns False when
    the connection does not take it now. ``put`` tries it first whenever nothing is waiting
    or being sent, so that a message to many idle sockets is written in one pass on the loop
    instead of by one task each; anything else goes through the queue, in order.
    """

    def __init__(self, send, overflow, *, limit: int = 1000, max_bytes: int | None = None,
                 writable=None, held: bool = False, write_now=None):
        self._send, self._overflow, self._writable = send, overflow, writable
        self._write_now = write_now
        self._sending = False  # the task holds a message taken off the queue
        self._limit, self._max_bytes = limit, max_bytes
        self._queue: deque[str] = deque()
        self._bytes = 0
        self._ready = asyncio.Event()
        self._released = asyncio.Event()
        if not held:
            self._released.set()
        self._task = asyncio.get_running_loop().create_task(self._write())
        self.loop = asyncio.get_running_loop()
        self.closed = False

    def put(self, text: str) -> None:  # on the socket's loop
        if (self._write_now is not None and not self._queue and not self._sending
                and self._released.is_set() and not self.closed):
            try:
                if self._write_now(text):
                    return
            except Exception:
                log.info("a socket could not be written", exc_info=True)
                return
        self._add(text, first=False)

    def release(self, first: str) -> None:
        """Start sending: ``first``, then whatever was put meanwhile."""
        self._add(first, first=True)
        self._released.set()

    def _add(self, text: str, *, first: bool) -> None:
        if self.closed:
            return
        if len(self._queue) >= self._limit or (
                self._max_bytes is not None and self._bytes + len(text) > self._max_bytes):
            self.close()
            self.loop.create_task(self._overflow())
            return
        if first:
            self._queue.appendleft(text)
        else:
            self._queue.append(text)
        self._bytes += len(text)
        self._ready.set()

    async def _write(self) -> None:
        await self._released.wait()
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                if self._writable is not None:
                    await self._writable()
                text = self._queue.popleft()
                self._bytes -= len(text)
                self._sending = True
                try:
                    await self._send(text)
                except Exception:
                    log.info("a socket could not be written", exc_info=True)
                finally:
                    self._sending = False

    def close(self) -> None:
        self.closed = True
        self._queue.clear()
        self._bytes = 0
        self._task.cancel()


def forward(outboxes: list[Outbox], text: str) -> None:
    """Put ``text`` in each outbox, from any thread: one call onto each loop the outboxes
    live on (daphne's), not one per socket."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Outbox]] = {}
    for outbox in outboxes:
        by_loop.setdefault(outbox.loop, []).append(outbox)
    for loop, group in by_loop.items():  # one hand-over per loop (daphne's), not per socket
        if not loop.is_closed():
            loop.call_soon_threadsafe(_put_each, group, text)


def _put_each(outboxes: list[Outbox], text: str) -> None:  # on the sockets' loop
    for outbox in outboxes:
        outbox.put(text)
