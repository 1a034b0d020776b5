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

A ``Flow`` also writes a text message straight to its connection (``write_now``), without
the ASGI ``send`` chain, when the connection is open and its transport takes more: the frame
is built once with autobahn's prepared messages (``prepareMessage``, documented for sending
one payload on many connections) and the same bytes go to every socket that gets the same
text. When the transport holds nothing yet to be written, the frame goes to the socket at
once (``writeSomeData``, the transport's own immediate write), and only what the socket does
not take is left to the transport's buffer; Twisted's ``write`` would instead register the
socket with the event loop and write it on the loop's next turn, which for a change pushed to
a thousand sockets costs more than the writes themselves and delays the first client until
the last socket has been handed its copy.
"""

import asyncio
import functools
import logging

from twisted.internet import tcp

log = logging.getLogger(__name__)

SCOPE_KEY = "awaken.flow"


class Flow:
    """Whether a connection's transport takes more now: a Twisted push producer
    (``IPushProducer``), called on daphne's loop, which Twisted runs on asyncio. It passes
    each call on to the producer it replaced (daphne's HTTP channel, which the connection
    began with and which stops reading while the transport cannot write)."""

    def __init__(self, replaced=None, protocol=None):
        self._open = asyncio.Event()
        self._open.set()
        self._replaced = replaced
        self._protocol = protocol

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

    def write_now(self, text: str) -> bool:
        """Write ``text`` as one text message now, if the connection is open and its transport
        takes more; False (nothing written) otherwise, and the caller sends it the ASGI way.

        What daphne would check before a ``websocket.send`` is checked here: the handshake is
        done and no close has begun (autobahn's state is OPEN once the socket is accepted and
        until a close starts). The frame is never compressed (an uncompressed message is
        valid on every connection); a connection set to fragment messages is left to
        autobahn's own framing."""
        protocol = self._protocol
        if (protocol is None or not self._open.is_set()
                or protocol.state != protocol.STATE_OPEN or protocol.autoFragmentSize):
            return False
        message = _prepared(protocol.factory, text)
        if protocol.send_queue:  # autobahn has writes of its own waiting: after them
            protocol.sendPreparedMessage(message)
        else:
            _write(protocol.transport, message.payloadHybi)
        return True


def _write(transport, data: bytes) -> None:
    """``transport.write(data)``, but straight to the socket when it is a plain TCP
    connection with nothing buffered before ``data``; what the socket does not take now is
    buffered by the transport, after which it writes as usual."""
    if (isinstance(transport, tcp.Connection) and not transport.TLS and transport.connected
            and not transport.disconnecting and not transport.dataBuffer
            and not transport._tempDataLen):
        sent = transport.writeSomeData(data)
        if isinstance(sent, int):  # else the connection is lost: the transport finds out
            if sent == len(data):
                return
            data = data[sent:]
    transport.write(data)


_last: tuple = (None, None, None)  # (factory, text, prepared message) last built


def _prepared(factory, text: str):
    """The frame of ``text`` for the connections of ``factory``, built once for every socket
    the same text goes to (a fan-out hands the same string to each)."""
    global _last
    built_for, built_text, message = _last
    if built_text is not text or built_for is not factory:
        message = factory.prepareMessage(text.encode(), isBinary=False, doNotCompress=True)
        _last = (factory, text, message)
    return message


def daphne_protocol(send):
    """The protocol of the connection whose ``send`` daphne gave, or None under another
    server."""
    if isinstance(send, functools.partial) and send.args:
        protocol = send.args[0]
        if getattr(protocol, "transport", None) is not None:
            return protocol
    return None


def attach(transport, protocol=None) -> Flow | None:
    """A ``Flow`` registered on ``transport`` in place of its producer, or None where it
    cannot be (a TLS transport of daphne's own: terminate TLS in front of it instead).
    With the connection's ``protocol`` it can also ``write_now``."""
    replaced = getattr(transport, "producer", None)
    try:
        if replaced is not None:
            transport.unregisterProducer()
        flow = Flow(replaced, protocol)
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
        flow = attach(protocol.transport, protocol) if protocol is not None else None
        if flow is not None:
            scope = {**scope, SCOPE_KEY: flow}
        return await self.inner(scope, receive, send)
