"""Websockets: ``/ws/runs/`` (the run list) and ``/ws/runs/{id}/`` (one run).

Thin consumers: authenticate and authorize before accepting, follow the change stream, send
a snapshot, then forward each committed change. They write nothing. A client may ask to
``resume`` after the last ``seq`` it saw; the server replays committed events from the
events table. One replay is in flight per socket (a consumer handles its messages one at a
time), and resumes are coalesced: one from no earlier than the socket's last replay, and
less than ``RESUME_COALESCE_SECONDS`` after it, sends nothing again (the socket has been
live since, and has had it all). A flood of resumes costs a replay or two per second, not
one each; a page healing a hole in seq a second later is answered. Anything else a client sends is
answered with an error, and the socket stays open. Everything a socket sends goes through
its outbox, which bounds what a client that does not read can hold; however a socket ends,
it leaves the change stream and the socket rechecks.
"""

import json
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from runs.changes.outbox import Outbox
from runs.changes.stream import stream
from runs.domain import selectors
from runs.domain.errors import RunNotFound
from runs.domain.roles import is_viewer
from runs.sockets.daphne import SCOPE_KEY as TRANSPORT_PRODUCER
from runs.sockets.recheck import REVOKED, Admission, rechecks
from runs.sockets.shutdown import GOING_AWAY

MAX_COMMAND_CHARS = 1024  # a resume is some 40
MAX_SEQ = 2**63 - 1  # seq is a bigint
RESUME_COALESCE_SECONDS = 0.5  # a resume covered by a replay this recent sends nothing
FELL_BEHIND = 4008  # the close code of a socket whose client stopped reading


class InvalidCommand(ValueError):
    """A client message that is not a known, well-formed command; its text says why."""


def resume_after(text_data: str | None) -> int:
    """The ``after`` of a well-formed ``{"type": "resume", "after": SEQ}``."""
    if text_data is None:
        raise InvalidCommand("Commands are JSON text frames, not binary ones.")
    if len(text_data) > MAX_COMMAND_CHARS:
        raise InvalidCommand(f"A command is at most {MAX_COMMAND_CHARS} characters.")
    try:
        message = json.loads(text_data)
    except (ValueError, RecursionError):
        raise InvalidCommand("A command is a JSON object.") from None
    if not isinstance(message, dict) or message.get("type") != "resume":
        raise InvalidCommand('The one command is {"type": "resume", "after": <seq>}.')
    if message.keys() != {"type", "after"}:
        raise InvalidCommand('A resume has exactly the fields "type" and "after".')
    after = message["after"]
    if type(after) is not int or not 0 <= after <= MAX_SEQ:
        raise InvalidCommand('"after" is the last seq received: a whole number, 0 or more.')
    return after


def error_text(detail: str) -> str:
    return json.dumps({"type": "error", "code": "invalid", "detail": detail})


class RunsConsumer(AsyncWebsocketConsumer):
    # No channel of its own: the process's one subscription (runs.changes.stream) receives each
    # change once and puts it in the outbox of every local socket that follows it.
    channel_layer_alias = None
    outbox = None
    replayed: tuple[int, float] | None = None  # the last replay: its after, when it ended

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:  # a crash or a cancel too: nothing keeps a dead socket in the fan-out
            self.forget()

    async def connect(self):
        user = self.scope.get("user")
        self.run_id = self.scope["url_route"]["kwargs"].get("run_id")
        if not await database_sync_to_async(is_viewer)(user):
            await self.close()  # before accept: the handshake is refused (HTTP 403)
            return
        if self.run_id is not None:
            try:
                self.run_id = str(selectors.parse_run_id(self.run_id))
                await database_sync_to_async(selectors.run_get)(self.run_id)
            except RunNotFound:
                await self.close()
                return
        await self.accept()
        producer = self.scope.get(TRANSPORT_PRODUCER)  # under daphne only
        self.outbox = Outbox(self.send_text, self.fell_behind, held=True,
                             max_bytes=settings.AWAKEN_SOCKET_BUFFER_BYTES,
                             writable=producer.writable if producer is not None else None,
                             write_now=producer.write_now if producer is not None else None)
        rechecks.add(self, self.admission(user))
        # Follow before the snapshot is read: a commit in between is sent after it (it may
        # be in the snapshot too; clients keep the newest version of each run).
        await stream.join(self.outbox, self.run_id)
        self.outbox.release(await database_sync_to_async(selectors.socket_snapshot)(
            run_id=self.run_id))

    def admission(self, user) -> Admission:
        session = self.scope.get("session")
        token_id = self.scope.get("awaken.token")
        return Admission(user.pk,
                         session_key=session.session_key if token_id is None else None,
                         token_id=token_id)

    async def disconnect(self, code):
        self.forget()

    def forget(self) -> None:
        """Leave the change stream and the rechecks; once, however the socket ends."""
        rechecks.discard(self)
        if self.outbox is not None:
            stream.leave(self.outbox, self.run_id)
            self.outbox.close()
            self.outbox = None

    async def receive(self, text_data=None, bytes_data=None):
        if self.outbox is None:
            return
        try:
            after = resume_after(text_data)
        except InvalidCommand as problem:
            self.outbox.put(error_text(str(problem)))
            return
        if (self.replayed is not None and after >= self.replayed[0]
                and time.monotonic() - self.replayed[1] < RESUME_COALESCE_SECONDS):
            return  # covered by the replay just made
        replay = await database_sync_to_async(selectors.replay)(after=after, run_id=self.run_id)
        self.replayed = (after, time.monotonic())
        for text in replay:
            if self.outbox is None:
                break
            self.outbox.put(text)

    async def send_text(self, text: str) -> None:
        await self.send(text_data=text)

    async def fell_behind(self) -> None:
        """The socket's client stopped reading: close it (it resumes when it reconnects)."""
        self.forget()
        await self.close(code=FELL_BEHIND)

    async def revoke(self) -> None:
        """The socket's admission no longer holds (logout, deactivation, lost role or token)."""
        self.forget()
        await self.close(code=REVOKED)

    async def going_away(self) -> None:
        """The server shuts down: close with 4012 (the page reconnects)."""
        self.forget()
        await self.close(code=GOING_AWAY)


class Refused(AsyncWebsocketConsumer):
    """Any other socket path: the handshake is refused (HTTP 403)."""

    async def connect(self):
        await self.close()
