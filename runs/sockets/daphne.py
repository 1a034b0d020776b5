"""Back-pressure for websockets served by daphne: the one place that knows daphne, Twisted
and autobahn.

ASGI's ``send`` never waits: daphne writes each message into Twisted's transport at once, and
a client that does not read leaves it all in the transport's buffer, without bound. Twisted's
own back-pressure is a streaming producer (``IPushProducer``) registered on the transport: it
is paused while the transport holds more than its buffer size (64 KiB) and resumed once that
is written. So a ``TransportProducer`` is registered on each socket's transport, and the
socket's outbox waits for it before each send (``runs.changes.outbox.Outbox``): what a client does
not read waits in the outbox, which is bounded. Under another server nothing is registered,
and the outbox bounds only what the server has not yet taken.

What this relies on that daphne does not document, and ``tests/test_daphne_contract.py``
checks on every upgrade:

* daphne gives each application ``partial(server.handle_reply, protocol)`` as its ``send``:
  the connection's protocol (autobahn's ``WebSocketServerProtocol``) is its first argument.
  ASGI has no way to reach the transport, and without it a stalled client costs daphne
  memory without bound.
* Twisted's TCP ``Connection`` writes at once with ``writeSomeData`` and keeps what it has not
  written yet in ``dataBuffer`` and ``_tempDataLen``: when both are empty, a frame goes
  straight to the socket (``write_to``) and only what the socket does not take is left to
  ``transport.write``. Twisted's ``write`` alone registers the socket with the reactor and
  writes on the loop's next turn, so in a fan-out to 1,000 sockets the first client waited
  until every socket had been handed its copy: commit → first of 1,000 clients 61–67 ms at
  p50 that way, 7.6–7.8 ms with the write at once; commit → the last 112–128 against 53–58
  (``manage.py bench push``, interleaved, the same quiet machine).

* For HTTP, that protocol is daphne's ``WebRequest``, a Twisted ``http.Request``: a streamed
  response (server-sent events) registers its producer there with the public
  ``IRequest.registerProducer``, and Twisted's HTTP channel pauses it while the transport
  holds more than its buffer.
* daphne's HTTP factory builds each connection's requests with the class its module names
  ``WebRequest``: ``serve_bodies_unparsed`` names there a subclass that asks Twisted, with
  ``http.Request``'s public ``parsePOSTFormSubmission=False``, not to parse a POST body as
  a form. Twisted would otherwise parse a form or multipart body into ``request.args``,
  which daphne never reads (it hands the body to the application, where Django parses it,
  and ``BodySizeLimit`` refuses one too large): a multipart body is read into memory whole
  and parsed on the event loop, before the application sees the request. A 20 MB one
  cost 0.31 s of the loop's CPU and 230 MB more at the peak that way, 0.05 s and nothing
  more without. Every other POST had its Content-Type parsed by the e-mail package, some
  30 us each.
* daphne's server builds its HTTP factory with the class ``daphne.server`` names
  ``HTTPFactory``: ``serve_without_twisteds_access_log`` names there a subclass whose
  ``log`` (Twisted's public ``HTTPFactory.log``, which ``http.Request.finish`` calls for
  every request) writes nothing. Twisted would otherwise format a combined-log line for
  every request and write it to its own log, which daphne sends nowhere at a verbosity of
  0 or 1 (the Procfile's is 0) and to its ``daphne.server`` logger above that; the site
  writes its own access line (``awaken_site.logs.AccessLog``), with the status, time and
  key prefix an operator reads. Twisted's line cost 12-20 us of the loop's CPU a request
  (a loop of 20,000 ``log`` calls on a create's request).
* ``daphne.server.Server`` and ``daphne.endpoints.build_endpoint_description_strings``,
  what daphne's own command line and ``runserver`` start a server with: ``serve`` starts one
  in this process for ``manage.py serve``, the embedded mode.

The rest is public API: Twisted's ``ITransport.write``, ``IConsumer.registerProducer`` /
``unregisterProducer`` and ``FileDescriptor.producer``, and autobahn's ``state`` constants,
``autoFragmentSize`` option and prepared messages (``prepareMessage`` on the factory,
``sendPreparedMessage`` on the protocol, documented for sending one payload to many
connections).

A ``TransportProducer`` also writes a text message straight to its connection
(``write_now``), without the ASGI ``send`` chain, when the connection is open and its
transport takes more: the frame is built once and the same bytes go to every socket that
gets the same text, which is what a fan-out to many sockets does.
"""

import asyncio
import functools
import logging

from twisted.internet import tcp

log = logging.getLogger(__name__)

SCOPE_KEY = "awaken.transport_producer"


class TransportProducer:
    """Whether a connection's transport takes more now: a Twisted push producer, called on
    daphne's loop, which Twisted runs on asyncio. It passes each call on to the producer it
    replaced (daphne's HTTP channel, which the connection began with and which stops reading
    while the transport cannot write)."""

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
            write_to(protocol.transport, message.payloadHybi)
        return True


def write_to(transport, data: bytes) -> None:
    """``transport.write(data)``, but straight to the socket when the transport is a plain
    TCP connection with nothing buffered before ``data``; what the socket does not take
    now is buffered by the transport, which then writes as usual."""
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
    server (or a daphne that no longer hands it over this way)."""
    if isinstance(send, functools.partial) and send.args:
        protocol = send.args[0]
        if getattr(protocol, "transport", None) is not None:
            return protocol
    return None


def attach(transport, protocol=None) -> TransportProducer | None:
    """A ``TransportProducer`` registered on ``transport`` in place of its producer, or None
    where it cannot be (a TLS transport of daphne's own: terminate TLS in front of it
    instead). With the connection's ``protocol`` it can also ``write_now``."""
    replaced = getattr(transport, "producer", None)
    try:
        if replaced is not None:
            transport.unregisterProducer()
        producer = TransportProducer(replaced, protocol)
        transport.registerProducer(producer, True)
    except (RuntimeError, ValueError):
        log.warning("no back-pressure from %r: sockets are bounded by their outbox alone",
                    transport)
        return None
    return producer


def attach_request(request) -> TransportProducer | None:
    """A ``TransportProducer`` registered on a streamed HTTP response's request (Twisted's
    ``IRequest.registerProducer``, which its channel pauses while the transport cannot
    write), or None where it cannot be. It does not ``write_now``: HTTP goes through ASGI."""
    producer = TransportProducer()
    try:
        request.registerProducer(producer, True)
    except (AttributeError, RuntimeError, ValueError):
        log.warning("no back-pressure from %r: streams are bounded by their outbox alone",
                    request)
        return None
    return producer


class DaphneBackPressure:
    """ASGI middleware for websockets and streamed HTTP responses: under daphne, a
    ``TransportProducer`` registered on the connection's transport (a socket) or on its
    request (HTTP), in the scope as ``SCOPE_KEY``."""

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        protocol = daphne_protocol(send)
        if protocol is None:
            producer = None
        elif scope["type"] == "http":
            producer = attach_request(protocol)
        else:
            producer = attach(protocol.transport, protocol)
        if producer is not None:
            scope = {**scope, SCOPE_KEY: producer}
        return await self.inner(scope, receive, send)


def serve_bodies_unparsed() -> None:
    """Make daphne's HTTP requests leave a POST body to the application (see above). Called
    as the application is built, before daphne serves a connection."""
    from daphne import http_protocol

    def unparsed(daphnes):
        class WebRequest(daphnes):
            def __init__(self, channel, *args, **kwargs):
                super().__init__(channel, *args, parsePOSTFormSubmission=False, **kwargs)

        return WebRequest

    _subclass_once(http_protocol, "WebRequest", "leaves_bodies_unparsed", unparsed)


def serve_without_twisteds_access_log() -> None:
    """Make daphne's HTTP factory write no access line of Twisted's (see above): the site
    writes its own. Called as the application is built, before daphne's server starts."""
    from daphne import server

    def unlogged(daphnes):
        class HTTPFactory(daphnes):
            def log(self, request) -> None:
                pass

        return HTTPFactory

    _subclass_once(server, "HTTPFactory", "writes_no_access_log", unlogged)


def _subclass_once(module, name: str, marker: str, make) -> None:
    """Name at ``module.name`` the subclass ``make(base)`` of the class ``base`` named there,
    marked ``marker``; once only: a class so marked is left as it is."""
    base = getattr(module, name)
    if getattr(base, marker, False):
        return
    made = make(base)
    setattr(made, marker, True)
    setattr(module, name, made)


def on_shutdown(callback) -> None:
    """Call ``callback()`` when daphne's reactor begins to shut down (SIGTERM, SIGINT), before
    it stops: Twisted's public ``addSystemEventTrigger``, in the phase where daphne cancels
    its application instances and waits for them; the reactor also waits for the coroutine
    ``callback`` returns (``Deferred.fromFuture``). Called from a running daphne only."""
    from twisted.internet import defer, reactor

    def trigger():
        waited = callback()
        if waited is not None:
            return defer.Deferred.fromFuture(asyncio.ensure_future(waited))
        return None

    reactor.addSystemEventTrigger("before", "shutdown", trigger)


def serve(application, *, host: str, port: int) -> None:
    """Serve ``application`` over HTTP and websockets on ``host``:``port`` with daphne, in
    this thread, until the process ends."""
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server

    Server(application=application,
           endpoints=build_endpoint_description_strings(host=host, port=port),
           verbosity=0, **TIMEOUTS).run()


# Daphne's public timeouts, as the Procfile's web line sets them: a response may take 60 s
# (a ?wait= is at most 30), a socket's application must accept within 5 s, and a socket
# that answers no ping for 30 s is closed. Idle and slow-header connections are the
# reverse proxy's to bound (README, Production): daphne has no option for them.
TIMEOUTS = {"http_timeout": 60, "websocket_connect_timeout": 5, "ping_interval": 20,
            "ping_timeout": 30}
