"""Push committed transitions to the channel layer: one group per run and one for the list.

The services call ``run_changed`` from ``transaction.on_commit`` only, so nothing that was
rolled back is ever announced. Messages are handed to one long-lived event loop per process
and sent in commit order; the sender never builds a loop per call.
"""

import asyncio
import logging
import threading
from collections import deque

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

RUNS_GROUP = "runs"


def run_group(run_id) -> str:
    return f"run-{run_id}"


def run_changed(*, run, event) -> None:
    from runs.api.serializers import change_message

    publisher.send((run_group(run.id), RUNS_GROUP), change_message(run=run, event=event))


class Publisher:
    """Sends group messages from any thread on one event loop, in the order given."""

    def __init__(self):
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._pending: deque = deque()
        self._drainer: asyncio.Task | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send on ``loop`` (the ASGI server's, say) instead of on a thread of our own."""
        self._loop = loop

    def send(self, groups, message: dict) -> None:
        if get_channel_layer() is None:
            return
        self._event_loop().call_soon_threadsafe(self._enqueue, groups, message)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="broadcast",
                                 daemon=True).start()
            return self._loop

    def _enqueue(self, groups, message) -> None:  # on the loop
        self._pending.append((groups, message))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        layer = get_channel_layer()
        while self._pending:
            groups, message = self._pending.popleft()
            for group in groups:
                try:
                    await layer.group_send(group, message)
                except Exception:  # the layer is down: clients heal with "resume after seq"
                    log.warning("broadcast to %s failed", group, exc_info=True)


publisher = Publisher()
