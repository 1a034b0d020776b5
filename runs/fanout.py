"""One channel-layer subscription per group per process, fanned out to local sockets.

With every socket a member of the layer's group, each message wakes every consumer task
through the layer's dispatch machinery; with a thousand sockets that costs more than the
writes. Here each process receives a group's message once and writes the already-encoded
text to its local sockets in one pass, in the order the messages came.
"""

import asyncio
import logging
import weakref

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


class Hub:
    """The sockets of one event loop, by group."""

    def __init__(self):
        self.members: dict[str, set] = {}
        self.readers: dict[str, asyncio.Task] = {}

    async def join(self, group: str, consumer) -> None:
        """Add ``consumer`` (it has ``send_text``) to ``group``; subscribed on return."""
        members = self.members.setdefault(group, set())
        members.add(consumer)
        if group not in self.readers:
            layer = get_channel_layer()
            channel = await layer.new_channel()
            await layer.group_add(group, channel)
            self.readers[group] = asyncio.get_running_loop().create_task(
                self._read(group, channel))

    async def leave(self, group: str, consumer) -> None:
        members = self.members.get(group)
        if members is None:
            return
        members.discard(consumer)
        if not members:
            del self.members[group]
            reader = self.readers.pop(group, None)
            if reader is not None:
                reader.cancel()

    async def _read(self, group: str, channel: str) -> None:
        layer = get_channel_layer()
        try:
            while True:
                try:
                    message = await layer.receive(channel)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the layer is down: clients heal with a resume
                    log.warning("reading group %s failed", group, exc_info=True)
                    await asyncio.sleep(1)
                    continue
                text = message.get("text")
                for consumer in list(self.members.get(group, ())):
                    try:
                        await consumer.send_text(text)
                    except Exception:
                        log.info("a socket of %s could not be written", group, exc_info=True)
        finally:
            try:
                await layer.group_discard(group, channel)
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
