"""Websockets: ``/ws/runs/`` (the run list) and ``/ws/runs/{id}/`` (one run).

Thin consumers: authenticate and authorize before accepting, follow the change stream, send
a snapshot, then forward each committed change. They write nothing. A client may ask to
``resume`` after the last ``seq`` it saw; the server replays committed events from the
events table.
"""

import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from runs.changes import Outbox, stream
from runs.domain import selectors
from runs.domain.errors import RunNotFound
from runs.domain.roles import is_viewer


class RunsConsumer(AsyncWebsocketConsumer):
    # No channel of its own: the process's one subscription (runs.changes) receives each
    # change once and puts it in the outbox of every local socket that follows it.
    channel_layer_alias = None
    outbox = None

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
        # Follow before the snapshot is read: a commit in between arrives as a push
        # (possibly also in the snapshot; clients keep the newest version of each run).
        await self.accept()
        self.outbox = Outbox(self.send_text, self.fell_behind)
        await stream.join(self.outbox, self.run_id)
        await self.send_text(await database_sync_to_async(selectors.socket_snapshot)(
            run_id=self.run_id))

    async def disconnect(self, code):
        if self.outbox is not None:
            stream.leave(self.outbox, self.run_id)
            self.outbox.close()

    async def receive(self, text_data=None, bytes_data=None):
        try:
            message = json.loads(text_data or "")
            after = int(message["after"]) if message.get("type") == "resume" else None
        except (ValueError, TypeError, KeyError):
            after = None
        if after is None or after < 0:
            await self.send_text(json.dumps({
                "type": "error", "code": "invalid",
                "detail": 'Send {"type": "resume", "after": <seq>}.'}))
            return
        for text in await database_sync_to_async(selectors.replay)(after=after,
                                                                   run_id=self.run_id):
            await self.send_text(text)

    async def send_text(self, text: str) -> None:
        await self.send(text_data=text)

    async def fell_behind(self) -> None:
        """The socket's client stopped reading: close it (it resumes when it reconnects)."""
        await self.close(code=4008)
