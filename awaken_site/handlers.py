"""The HTTP side of the ASGI application."""

import tempfile

from asgiref.sync import sync_to_async
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

    Django would spool any body to a temporary file, whatever its size, before a view could
    refuse it: a body announced (``Content-Length``) or found to be over the limit is
    answered 413 ``too_large`` at once, for every route.
    """

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


def declared_length(scope) -> int:
    """The request's Content-Length, or 0 when it has none (or a malformed one)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0
