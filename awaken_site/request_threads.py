"""Requests run their synchronous code on threads kept from one request to the next.

Django's ASGI handler runs each request's synchronous parts (signals, sync middleware, the
view, closing the response) on one thread, as its thread-sensitive mode wants, and enters a
fresh ``ThreadSensitiveContext`` per request: a thread is started for every request and
ended after it. Whatever Django keeps per thread then lasts one request: the database
connection's wrapper and everything cached on it, which the request path reads again and
again. Measured on a GET of one run, that tripled the web process's CPU per request.

So this ASGI middleware enters, around Django's handler, a ``ThreadSensitiveContext`` with
an executor of its own (asgiref's documented ``executor=``): Django's inner context, not
the outer-most one, then sets nothing, and the request's synchronous code runs on a thread
borrowed from ``RequestThreads``, given back once that thread has finished its work.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext


class KeptRequestThreads:
    """ASGI middleware for HTTP: ``app`` runs its thread-sensitive code on a kept thread."""

    def __init__(self, app, threads: "RequestThreads | None" = None):
        self.app = app
        self.threads = threads or RequestThreads()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        executor = self.threads.borrow()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.app(scope, receive, send)
        finally:
            self.threads.give_back(executor)


class RequestThreads:
    """Single-thread executors for requests, kept for the next request when idle.

    Each request runs its synchronous parts on one thread; at most ``idle`` threads wait
    for the next request, the others end."""

    def __init__(self, idle: int = 64):
        self.idle = idle
        self._free: list[ThreadPoolExecutor] = []
        self._lock = threading.Lock()

    def borrow(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._free:
                return self._free.pop()
        return ThreadPoolExecutor(1, thread_name_prefix="awaken-request")

    def give_back(self, executor: ThreadPoolExecutor) -> None:
        # Queued behind whatever the thread still has to do (a view whose client went away
        # finishes first): it is free once this runs.
        executor.submit(_nothing).add_done_callback(lambda _: self._keep(executor))

    @property
    def idle_count(self) -> int:
        """How many threads wait for the next request."""
        with self._lock:
            return len(self._free)

    def _keep(self, executor: ThreadPoolExecutor) -> None:
        with self._lock:
            if len(self._free) < self.idle:
                self._free.append(executor)
                return
        executor.shutdown(wait=False)


def _nothing() -> None:
    pass
