"""The HTTP side of the ASGI application."""

import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler
from django.http import JsonResponse

from runs.api.errors import too_large_body


class BodyTooLarge(Exception):
    """The body grew past AWAKEN_MAX_BODY_BYTES while it was being read."""


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler, with the middleware and the view run as one synchronous call,
    and request bodies over ``AWAKEN_MAX_BODY_BYTES`` refused before they are read.

    Every view of the site is synchronous, and so is part of the middleware. Django's own
    ASGI handler builds an async chain and hops between the event loop and a worker thread
    at each middleware that has a sync part (about a dozen hops per request here). This
    handler builds the chain Django builds for WSGI and enters it once, in the request's
    own thread (``ThreadSensitiveContext``), so a request costs a single hop. Websockets
    are served by the consumers and do not pass through here.

    Django's handler gives each request a thread of its own, started for it and joined by
    yet another thread afterwards. Here a request borrows an idle thread from ``threads``
    and gives it back once the thread has finished its work (a view cancelled by a client
    that went away finishes first).

    Django would spool any body to a temporary file, whatever its size, before a view could
    refuse it: a body announced (``Content-Length``) or found to be over the limit is
    answered 413 ``too_large`` at once, for every route.
    """

    def __init__(self):
        super().__init__()
        self.threads = RequestThreads()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django serves HTTP here, not {scope['type']}.")
        executor = self.threads.borrow()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            self.threads.give_back(executor)

    def load_middleware(self, is_async=False):
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)

    async def handle(self, scope, receive, send):
        if declared_length(scope) > settings.AWAKEN_MAX_BODY_BYTES:
            return await self.refuse_too_large(send)
        try:
            await super().handle(scope, receive, send)
        except BodyTooLarge:  # raised by read_body, before the request was begun
            await self.refuse_too_large(send)

    async def read_body(self, receive):
        """The body, in a file that rolls over to disk, read up to the limit and no further."""
        limit = settings.AWAKEN_MAX_BODY_BYTES
        body = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE,
                                             mode="w+b")
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                body.close()
                raise RequestAborted()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                body.close()
                raise BodyTooLarge()
            body.write(chunk)
            if not message.get("more_body", False):
                body.seek(0)
                return body

    async def refuse_too_large(self, send):
        response = JsonResponse(too_large_body(), status=413)
        response["Content-Length"] = len(response.content)  # no middleware ran to add it
        await self.send_response(response, send)


class RequestThreads:
    """Single-thread executors for requests, kept for the next request when idle.

    Each request runs its synchronous parts (signals, middleware, view, closing the
    response) on one thread, as Django's thread-sensitive mode wants; at most ``idle``
    threads wait for the next request, the others end."""

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
        # Queued behind whatever the thread still has to do: it is free once this runs.
        executor.submit(_noop).add_done_callback(lambda _: self._keep(executor))

    def _keep(self, executor: ThreadPoolExecutor) -> None:
        with self._lock:
            if len(self._free) < self.idle:
                self._free.append(executor)
                return
        executor.shutdown(wait=False)


def _noop() -> None:
    pass


def declared_length(scope) -> int:
    """The request's Content-Length, or 0 when it has none (or a malformed one)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0
