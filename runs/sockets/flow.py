"""Back-pressure from the server's side of a websocket connection, under daphne.

ASGI's ``send`` never waits: daphne writes each message into Twisted's transport at once, and
a client that does not read leaves it all in the transport's buffer, without bound. Twisted's
own back-pressure is a streaming producer registered on the transport: it is paused while the
transport holds more than its buffer size (64 KiB) and resumed once that is written. Daphne
hands every application the connection's protocol as the first argument of its ``send``
(``partial(server.handle_reply, protocol)``), so a ``Flow`` is registered on that transport,
and the socket's outbox waits for it before each send (see ``runs.changes.Outbox``). What a
client does not read then waits in the outbox, which is bounded. Under another server there is
no flow: the outbox bounds only what the server has not yet taken.
"""

import asyncio
import functools
import logging

log = logging.getLogger(__name__)

SCOPE_KEY = "awaken.flow"


class Flow:
    """Whether a connection's transport takes more now: a Twisted push producer
    (``IPushProducer``), called on daphne's loop, which Twisted runs on asyncio. It passes
    each call on to the producer it replaced (daphne's HTTP channel, which the connection
    began with and which stops reading while the transport cannot write)."""

    def __init__(self, replaced=None):
        self._open = asyncio.Event()
        self._open.set()
        self._replaced = replaced

    def pauseProducing(self) -> None:  # noqa: N802 (Twisted's names)
        self._open.clear()
        if self._replaced is not None:
            self._replaced.pauseProducing()

    def resumeProducing(self) -> None:  # noqa: N802
        self._open.set()
        if self._replaced is not None:
            self._replaced.resumeProducing()

    def stopProducing(self) -> None:  # noqa: N802  the connection is gone: let writers through
        self._open.set()
        if self._replaced is not None:
            self._replaced.stopProducing()

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    async def writable(self) -> None:
        """Return once the transport takes more."""
        await self._open.wait()


def daphne_protocol(send):
    """The protocol of the connection whose ``send`` daphne gave, or None under another
    server."""
    if isinstance(send, functools.partial) and send.args:
        protocol = send.args[0]
        if getattr(protocol, "transport", None) is not None:
            return protocol
    return None


def attach(transport) -> Flow | None:
    """A ``Flow`` registered on ``transport`` in place of its producer, or None where it
    cannot be (a TLS transport of daphne's own: terminate TLS in front of it instead)."""
    replaced = getattr(transport, "producer", None)
    try:
        if replaced is not None:
            transport.unregisterProducer()
        flow = Flow(replaced)
        transport.registerProducer(flow, True)
    except (RuntimeError, ValueError):
        log.warning("no back-pressure from %r: sockets are bounded by their outbox alone",
                    transport)
        return None
    return flow


class WriteFlow:
    """ASGI middleware: under daphne, a ``Flow`` registered on the connection's transport,
    in the scope as ``awaken.flow``."""

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        protocol = daphne_protocol(send)
        flow = attach(protocol.transport) if protocol is not None else None
        if flow is not None:
            scope = {**scope, SCOPE_KEY: flow}
        return await self.inner(scope, receive, send)
