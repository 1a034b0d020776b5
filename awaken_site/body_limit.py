"""Request bodies over ``AWAKEN_MAX_BODY_BYTES`` are refused before Django reads them.

Django's ASGI handler reads the whole body into a temporary file (spooled to disk past
``FILE_UPLOAD_MAX_MEMORY_SIZE``) before any middleware or view runs, so nothing inside Django
can refuse a large body before it has been taken in. This ASGI middleware sits in front of
Django's handler and answers 413 ``too_large`` (the body of ``runs.api.errors.too_large_body``)
for every route:

1. a request whose ``Content-Length`` announces more than the limit is answered at once, and
   Django never sees it;
2. otherwise the body's chunks are counted as Django receives them; at the chunk that takes it
   over the limit Django is told the client went away (``http.disconnect``, upon which Django
   ends the request without answering), and the 413 is sent instead;
3. once the whole body is in, ``receive`` is the server's own again: Django waits on it for
   the client's disconnect while the view runs.

A client that disconnects mid-body reaches Django as it is, and Django ends the request
quietly. Only the ASGI specification is relied on, not Django's handler's insides.
"""

from django.conf import settings
from django.http import JsonResponse

from runs.api.errors import too_large_body


class BodySizeLimit:
    """ASGI middleware for HTTP: bodies over ``AWAKEN_MAX_BODY_BYTES`` are answered 413
    before ``app`` reads them. Other scopes go to ``app`` unchanged."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = settings.AWAKEN_MAX_BODY_BYTES
        if declared_length(scope) > limit:
            return await send_too_large(send)
        body = CountedBody(receive, limit)
        await self.app(scope, body.receive, send)
        if body.over_limit:
            await send_too_large(send)


class CountedBody:
    """A ``receive`` that counts the body's bytes, and ends the body, as a disconnect, at
    the chunk that takes it over ``limit``."""

    def __init__(self, receive, limit: int):
        self.server_receive = receive
        self.limit = limit
        self.size = 0
        self.complete = False
        self.over_limit = False

    async def receive(self) -> dict:
        if self.complete:  # after the body: the disconnect Django listens for
            return await self.server_receive()
        if self.over_limit:  # Django was told already; it does not ask again
            return {"type": "http.disconnect"}
        message = await self.server_receive()
        if message["type"] != "http.request":
            return message
        self.size += len(message.get("body", b""))
        if self.size > self.limit:
            self.over_limit = True
            return {"type": "http.disconnect"}
        if not message.get("more_body", False):
            self.complete = True
        return message


async def send_too_large(send) -> None:
    """The 413 ``too_large`` answer, whole, as ASGI messages."""
    response = JsonResponse(too_large_body(), status=413)
    headers = [(name.lower().encode("latin-1"), value.encode("latin-1"))
               for name, value in response.items()]
    headers.append((b"content-length", str(len(response.content)).encode()))
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})


def declared_length(scope) -> int:
    """The request's Content-Length, or 0 when it has none (or a malformed one)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0
