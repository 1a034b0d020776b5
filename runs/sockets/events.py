"""Server-sent events: ``GET /api/runs/stream/`` (every run) and ``/api/runs/{id}/stream/``.

The same messages as the sockets (``runs.sockets.consumers``), as ``text/event-stream``: each
message is one event named by its ``type`` (``snapshot``, ``run.changed``, ...), its ``data``
the message's JSON, and its ``id`` the message's ``seq`` when it has one. A stream starts with
the snapshot, or, given ``Last-Event-ID`` (or ``?after=SEQ``), with the replay of the
committed events after that seq; then it goes on live. Like a socket, a stream follows the
process's one change stream through an outbox, so a reader that does not read is bounded
and then disconnected (it resumes with ``Last-Event-ID``); its admission is rechecked as a
socket's is; and a comment is sent every ``AWAKEN_SSE_KEEPALIVE_SECONDS`` so that proxies
keep an idle stream open.

Served by Channels' ``AsyncHttpConsumer`` on daphne's event loop, not by Django's WSGI
handler, which would hold a thread for as long as each stream is open.
"""

import asyncio
import contextvars
import json
import re
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer
from django.conf import settings

from runs.changes.outbox import Outbox
from runs.changes.stream import stream
from runs.domain import selectors
from runs.domain.errors import RunNotFound
from runs.domain.roles import is_viewer
from runs.sockets.consumers import MAX_SEQ
from runs.sockets.daphne import SCOPE_KEY as TRANSPORT_PRODUCER
from runs.sockets.recheck import Admission, rechecks

KEEPALIVE = ": keep-alive\n\n"
RETRY_MS = 1000  # what a browser's EventSource waits before it reconnects
_HEAD = re.compile(r'\{"type": "([\w.]+)"(?:, "seq": (\d+))?')


def frame(text: str) -> str:
    """The event of one socket message (its JSON ``text``)."""
    head = _HEAD.match(text)
    if head is not None:
        kind, seq = head.group(1), head.group(2)
    else:
        message = json.loads(text)
        kind, seq = message.get("type", "message"), message.get("seq")
    lines = [f"event: {kind}"]
    if seq is not None:
        lines.append(f"id: {seq}")
    lines.extend(f"data: {line}" for line in text.splitlines() or [""])
    return "\n".join(lines) + "\n\n"


class OwnContext:
    """ASGI middleware: ``app`` runs in a fresh ``contextvars`` context.

    A request on a kept-alive connection starts in the context of whatever daphne did last on
    that connection. Had that set asgiref's thread-sensitive context (a response sent
    through ``async_to_sync`` from a request's thread), it would name that finished thread
    as the one for synchronous calls, and every ``database_sync_to_async`` of the stream
    would fail."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        task = asyncio.get_running_loop().create_task(
            self.app(scope, receive, send), context=contextvars.Context())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            raise


class BadRequest(ValueError):
    """A stream asked for with a resume cursor that is not a seq."""


def requested_after(scope) -> int | None:
    """The seq to replay after: ``Last-Event-ID`` (what a reconnecting EventSource sends),
    else ``?after=``; None for neither."""
    headers = dict(scope.get("headers", ()))
    value = headers.get(b"last-event-id", b"").decode("latin-1").strip()
    if not value:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        value = (query.get("after") or [""])[-1].strip()
    if not value:
        return None
    if not value.isdigit() or int(value) > MAX_SEQ:
        raise BadRequest("The resume cursor (Last-Event-ID or after) is the last seq "
                         "received: a whole number, 0 or more.")
    return int(value)


class RunStream(AsyncHttpConsumer):
    # As the sockets: no channel of its own, the process's one subscription feeds the outbox.
    channel_layer_alias = None
    outbox = None
    keepalive = None
    run_id = None

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:  # a crash or a cancel too: nothing keeps a dead stream in the fan-out
            self.forget()

    async def http_request(self, message):
        """The request is whole: answer it. Unlike ``AsyncHttpConsumer``'s own, this returns
        while the stream stays open, so that the consumer goes on receiving and learns of
        the client's disconnect (``http_disconnect``)."""
        if message.get("more_body"):
            return
        if not await self.handle(b""):
            raise StopConsumer()  # answered with an error: the consumer ends

    async def refuse(self, status: int, code: str, detail: str, headers=()) -> bool:
        body = json.dumps({"code": code, "detail": detail}).encode()
        await self.send_response(status, body, headers=[
            (b"content-type", b"application/json"), *headers])
        return False

    async def handle(self, body) -> bool:
        """Open the stream; False when the request was answered with an error instead."""
        if self.scope["method"] != "GET":
            return await self.refuse(405, "method_not_allowed",
                                     f'Method "{self.scope["method"]}" not allowed.',
                                     headers=[(b"allow", b"GET")])
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            refused = self.scope.get("awaken.token_refused")
            return await self.refuse(
                401, "authentication_failed" if refused else "not_authenticated",
                "Invalid token." if refused else "Authentication credentials were not provided.",
                headers=[(b"www-authenticate", b"Token")])
        if not await database_sync_to_async(is_viewer)(user):
            return await self.refuse(403, "permission_denied",
                                     "You do not have permission to perform this action.")
        run_id = self.scope["url_route"]["kwargs"].get("run_id")
        if run_id is not None:
            try:
                self.run_id = str(selectors.parse_run_id(run_id))
                await database_sync_to_async(selectors.run_get)(self.run_id)
            except RunNotFound:
                return await self.refuse(404, "not_found", "No such run.")
        try:
            after = requested_after(self.scope)
        except BadRequest as problem:
            return await self.refuse(400, "invalid", str(problem))

        await self.send_headers(headers=[
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # nginx: pass each event on at once
        ])
        producer = self.scope.get(TRANSPORT_PRODUCER)  # under daphne only
        self.outbox = Outbox(self.send_text, self.fell_behind, held=True,
                             max_bytes=settings.AWAKEN_SOCKET_BUFFER_BYTES,
                             writable=producer.writable if producer is not None else None)
        rechecks.add(self, self.admission(user))
        # Follow before the first messages are read: a commit in between comes after them
        # (it may be in them too; readers keep the newest version of each run).
        await stream.join(self.outbox, self.run_id)
        if after is None:
            first = [await database_sync_to_async(selectors.socket_snapshot)(
                run_id=self.run_id)]
        else:
            first = await database_sync_to_async(selectors.replay)(
                after=after, run_id=self.run_id)
        # The first messages go straight out, each once the connection takes more: a replay
        # may be larger than the outbox holds. What commits meanwhile waits in the outbox.
        await self.send_body(f"retry: {RETRY_MS}\n\n".encode(), more_body=True)
        for text in first:
            if self.outbox is None:  # revoked, fallen behind or disconnected meanwhile
                return True
            if producer is not None:
                await producer.writable()
                if self.outbox is None:
                    return True
            await self.send_body(frame(text).encode(), more_body=True)
        if self.outbox is None:
            return True
        self.outbox.release(": live\n\n")
        self.keepalive = asyncio.get_running_loop().create_task(self.keep_alive())
        return True

    def admission(self, user) -> Admission:
        session = self.scope.get("session")
        token_id = self.scope.get("awaken.token")
        return Admission(user.pk,
                         session_key=session.session_key if token_id is None else None,
                         token_id=token_id)

    async def keep_alive(self) -> None:
        while self.outbox is not None:
            await asyncio.sleep(settings.AWAKEN_SSE_KEEPALIVE_SECONDS)
            if self.outbox is not None:
                self.outbox.put(KEEPALIVE)

    async def send_text(self, text: str) -> None:
        # The outbox holds socket messages (JSON) and, first, framed events and comments.
        event = frame(text) if text.startswith("{") else text
        await self.send_body(event.encode(), more_body=True)

    async def disconnect(self):
        self.forget()

    def forget(self) -> None:
        """Leave the change stream and the rechecks; once, however the stream ends."""
        rechecks.discard(self)
        if self.keepalive is not None and self.keepalive is not asyncio.current_task():
            self.keepalive.cancel()
        self.keepalive = None
        if self.outbox is not None:
            stream.leave(self.outbox, self.run_id)
            self.outbox.close()
            self.outbox = None

    async def end(self) -> None:
        """End the response; the client reconnects with ``Last-Event-ID``."""
        self.forget()
        await self.send_body(b"", more_body=False)

    async def fell_behind(self) -> None:
        """The reader stopped reading: end the stream (it resumes when it reconnects)."""
        await self.end()

    async def revoke(self) -> None:
        """The stream's admission no longer holds (logout, deactivation, lost role or token)."""
        await self.end()

    async def going_away(self) -> None:
        """The server shuts down: end the response (the client resumes elsewhere)."""
        await self.end()
