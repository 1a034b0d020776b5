"""Request bodies over ``AWAKEN_MAX_BODY_BYTES`` are refused before Django reads them.

Django reads the whole body before any middleware or view runs, so nothing inside Django can
refuse a large body before it has been taken in. This ASGI middleware sits in front of it and
answers 413 ``too_large`` (the body of ``runs.api.errors.too_large_body``) for every route:

1. a request whose ``Content-Length`` announces more than the limit is answered at once;
2. otherwise the body is read here, chunk by chunk, and answered 413 at the chunk that takes
   it over the limit, without reading further; the application is never called;
3. a body within the limit is handed to the application as one ``http.request`` message, and
   after it ``receive`` is the server's own again (a disconnect reaches the application).

A client that disconnects mid-body ends the request here, quietly. Only the ASGI
specification is relied on.
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
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away mid-body
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await send_too_large(send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return await self.app(scope, ReadBody(b"".join(chunks), receive).receive, send)


class ReadBody:
    """A ``receive`` that gives the body already read, then passes on to the server's."""

    def __init__(self, body: bytes, receive):
        self.body = body
        self.server_receive = receive
        self.given = False

    async def receive(self) -> dict:
        if self.given:
            return await self.server_receive()
        self.given = True
        return {"type": "http.request", "body": self.body, "more_body": False}


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
