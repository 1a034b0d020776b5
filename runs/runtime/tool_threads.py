"""Threads for blocking tools, and the count of those abandoned by a cancel.

A thread cannot be killed: when an attempt stops waiting for a blocking tool, its thread is
abandoned and runs on until it returns; being a daemon, it never holds up the worker's
shutdown. An abandoned thread gives its slot back at once, so a new thread replaces it and
the worker goes on running blocking tools without a restart. Abandoned threads are counted
(the worker reports them on /metrics); only if ``abandoned_limit`` of them are still out at
once (memory is finite) does a blocking tool fail at once with ``ToolsExhausted`` (its run
ends ``failed``, saying so), until some return.
"""

import asyncio
import threading
from concurrent.futures import Future
from functools import partial

TOOL_THREADS = 64
# Abandoned threads that may be out at once, per slot.
ABANDONED_PER_SLOT = 16


class ToolsExhausted(RuntimeError):
    """No thread is left for a blocking tool: too many abandoned calls are still out."""


class ToolThreads:
    def __init__(self, size: int = TOOL_THREADS, abandoned_limit: int | None = None):
        self.size = size
        self.abandoned_limit = abandoned_limit or size * ABANDONED_PER_SLOT
        self._slots = asyncio.Semaphore(size)  # bound to the loop of its first wait
        self._abandoned: set[asyncio.Future] = set()

    @property
    def abandoned(self) -> int:
        """Blocking tool calls given up on whose threads have not returned."""
        return len(self._abandoned)

    async def run(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` in a daemon thread, at most ``size`` awaited at once."""
        if len(self._abandoned) >= self.abandoned_limit:
            raise ToolsExhausted(f"{len(self._abandoned)} abandoned calls of blocking tools "
                                 "have not returned yet: no thread is started for another")
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        on_a_thread(partial(fn, *args, **kwargs), name="awaken-tool").add_done_callback(
            lambda done: loop.call_soon_threadsafe(self._returned, future, done))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if not future.done():
                self._abandoned.add(future)
                self._slots.release()  # replaced: the next call starts a thread of its own
            raise

    def _returned(self, future, done: Future) -> None:  # on the loop
        if future in self._abandoned:
            self._abandoned.discard(future)  # its slot was given back when it was abandoned
        else:
            self._slots.release()
        if future.done():
            return
        if done.exception() is not None:
            future.set_exception(done.exception())
        else:
            future.set_result(done.result())


def on_a_thread(call, *, name: str) -> Future:
    """``call()`` on a daemon thread of its own, its outcome (whatever it raises too) in
    the future returned: a call that never returns keeps its thread, and the process still
    exits. Blocking tools run so, and agents' preparations (``runs.runtime.executor``)."""
    outcome = Future()
    outcome.set_running_or_notify_cancel()

    def run():
        try:
            result = call()
        except BaseException as error:  # handed to whoever waits for the outcome
            outcome.set_exception(error)
        else:
            outcome.set_result(result)

    threading.Thread(target=run, name=name, daemon=True).start()
    return outcome
