"""One channel-layer subscription per process, fanned out to local sockets.

Every committed change is published once, to the runs group, with its run's id beside the
encoded text. Each process with sockets receives it once and writes the text to the
sockets that follow every run and to those that follow that one run, in one pass, in the
order the messages came. With every socket a member of the layer's group instead, each
message would wake every consumer task through the layer's dispatch machinery, which with
a thousand sockets costs more than the writes.
"""

import asyncio
import logging
import weakref

from channels.layers import get_channel_layer

from runs.broadcast import RUNS_GROUP

log = logging.getLogger(__name__)

EVERY_RUN = None  # the topic of the sockets that follow the whole list


class Hub:
    """The sockets of one event loop, by the run they follow (``EVERY_RUN``: all)."""

    def __init__(self):
        self.members: dict[str | None, set] = {}
        self._subscription: asyncio.Task | None = None
        self._reader: asyncio.Task | None = None

    async def join(self, consumer, run_id: str | None = EVERY_RUN) -> None:
        """Add ``consumer`` (it has ``send_text``); subscribed when this returns."""
        self.members.setdefault(run_id, set()).add(consumer)
        if self._subscription is None:
            self._subscription = asyncio.get_running_loop().create_task(self._subscribe())
        try:
            await asyncio.shield(self._subscription)
        except Exception:
            self._subscription = None  # the next join tries again
            self.members[run_id].discard(consumer)
            raise

    async def leave(self, consumer, run_id: str | None = EVERY_RUN) -> None:
        members = self.members.get(run_id)
        if members is None:
            return
        members.discard(consumer)
        if not members:
            del self.members[run_id]
        if not self.members and self._reader is not None:
            self._reader.cancel()
            self._reader = self._subscription = None

    async def _subscribe(self) -> None:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(RUNS_GROUP, channel)
        self._reader = asyncio.get_running_loop().create_task(self._read(channel))

    async def _read(self, channel: str) -> None:
        layer = get_channel_layer()
        try:
            while True:
                try:
                    message = await layer.receive(channel)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the layer is down: clients heal with a resume
                    log.warning("reading the run changes failed", exc_info=True)
                    await asyncio.sleep(1)
                    continue
                text = message.get("text")
                sockets = [*self.members.get(EVERY_RUN, ()),
                           *self.members.get(message.get("run_id"), ())]
                for consumer in sockets:
                    try:
                        await consumer.send_text(text)
                    except Exception:
                        log.info("a socket could not be written", exc_info=True)
        finally:
            try:
                await layer.group_discard(RUNS_GROUP, channel)
            except Exception:
                pass


_hubs: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub]" = (
    weakref.WeakKeyDictionary())


def hub() -> Hub:
    """The hub of the running event loop (daphne's, in a web process)."""
    loop = asyncio.get_running_loop()
    if loop not in _hubs:
        _hubs[loop] = Hub()
    return _hubs[loop]
