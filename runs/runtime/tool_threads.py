"""Threads for blocking tools, and the count of those abandoned by a cancel.

A thread cannot be killed: when an attempt stops waiting for a blocking tool, its thread is
abandoned and keeps its slot until it returns; being a daemon, it never holds up the
worker's shutdown. Abandoned threads are counted (the worker reports them on /metrics).
Once every slot is held by one, a blocking tool fails at once with ``ToolsExhausted`` (its
run ends ``failed``, saying so) instead of waiting for a slot that may never come back; the
worker needs a restart to get its slots back.
"""

import asyncio
import threading

TOOL_THREADS = 64


class ToolsExhausted(RuntimeError):
    """No thread is left for a blocking tool: abandoned calls hold every one."""


class ToolThreads:
    def __init__(self, size: int = TOOL_THREADS):
        self.size = size
        self._slots = asyncio.Semaphore(size)  # bound to the loop of its first wait
        self._abandoned: set[asyncio.Future] = set()

    @property
    def abandoned(self) -> int:
        """Blocking tool calls given up on whose threads have not returned."""
        return len(self._abandoned)

    async def run(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` in a daemon thread, at most ``size`` at once."""
        if len(self._abandoned) >= self.size:
            raise ToolsExhausted(f"every one of the {self.size} threads for blocking tools "
                                 "is held by an abandoned call")
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def call():
            result, error = None, None
            try:
                result = fn(*args, **kwargs)
            except BaseException as raised:  # handed to the awaiting attempt
                error = raised
            loop.call_soon_threadsafe(self._returned, future, result, error)

        threading.Thread(target=call, name="awaken-tool", daemon=True).start()
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if not future.done():
                self._abandoned.add(future)
            raise

    def _returned(self, future, result, error) -> None:  # on the loop
        self._slots.release()
        self._abandoned.discard(future)
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
