"""What runs/sockets/daphne.py relies on in daphne, Twisted and autobahn. When an upgrade
changes one of these, this file fails, naming it, before a stalled client can cost the web
process memory without bound (tests/test_socket_server.py holds the behaviour itself)."""

import asyncio
import functools

import daphne.server  # installs Twisted's asyncio reactor, as daphne does when it starts
import pytest
from autobahn.websocket.protocol import PreparedMessage, WebSocketProtocol
from daphne.ws_protocol import WebSocketFactory
from daphne.ws_protocol import WebSocketProtocol as DaphneWebSocketProtocol
from twisted.internet import abstract

from runs.sockets.daphne import (
    SCOPE_KEY,
    DaphneBackPressure,
    TransportProducer,
    attach,
    daphne_protocol,
    write_to,
)


class Connection:
    """Stands for daphne's protocol object: the test needs only its identity and transport."""

    def __init__(self, transport=None):
        self.transport = transport or object()


def test_daphne_hands_the_application_a_send_that_holds_the_protocol():
    # The one undocumented piece: ``Server.create_application`` gives each application
    # ``partial(server.handle_reply, protocol)``. If this fails, daphne hands the
    # connection over differently: find the protocol anew in daphne_protocol().
    seen = {}

    async def application(scope, receive, send):
        seen["send"] = send

    async def create():
        server = daphne.server.Server(application, endpoints=["tcp:port=0"])
        connection = Connection()
        server.connections = {connection: {}}  # as Server.run() keeps them
        server.create_application(connection, {"type": "websocket", "path": "/"})
        await asyncio.sleep(0)  # the application instance starts
        return connection

    connection = asyncio.run(create())
    send = seen["send"]
    assert isinstance(send, functools.partial), type(send)
    assert send.args[:1] == (connection,)
    assert daphne_protocol(send) is connection


def test_a_send_of_another_server_finds_no_protocol():
    async def send(message):
        pass

    assert daphne_protocol(send) is None
    assert daphne_protocol(functools.partial(send)) is None


def test_daphnes_websocket_protocol_is_autobahns_with_what_write_now_reads():
    assert issubclass(DaphneWebSocketProtocol, WebSocketProtocol)
    assert DaphneWebSocketProtocol.STATE_OPEN == WebSocketProtocol.STATE_OPEN
    # autoFragmentSize is copied from the factory's options onto each connection.
    assert "autoFragmentSize" in DaphneWebSocketProtocol.CONFIG_ATTRS
    assert callable(DaphneWebSocketProtocol.sendPreparedMessage)
    factory = WebSocketFactory(server_class=None)
    message = factory.prepareMessage(b'{"a": 1}', isBinary=False, doNotCompress=True)
    assert isinstance(message, PreparedMessage)
    assert message.doNotCompress
    assert message.payloadHybi == b"\x81\x08" + b'{"a": 1}'  # one unmasked text frame


class Reactor:
    """No event loop: the transport below only asks it to watch its socket."""

    def addWriter(self, _):  # noqa: N802
        pass

    def removeWriter(self, _):  # noqa: N802
        pass


class Transport(abstract.FileDescriptor):
    """Twisted's own buffered transport (the base of its TCP connections), on no socket."""

    def __init__(self):
        super().__init__(reactor=Reactor())
        self.connected = True
        self.client_reads = False

    def writeSomeData(self, data):  # noqa: N802  what the socket takes
        return len(data) if self.client_reads else 0


class Producer:
    def __init__(self):
        self.calls = []

    def pauseProducing(self):  # noqa: N802
        self.calls.append("pause")

    def resumeProducing(self):  # noqa: N802
        self.calls.append("resume")

    def stopProducing(self):  # noqa: N802
        self.calls.append("stop")


def test_twisteds_transport_takes_the_producer_in_place_of_its_own():
    transport = Transport()
    replaced = Producer()
    transport.registerProducer(replaced, True)
    assert transport.producer is replaced  # FileDescriptor.producer, read by attach()

    producer = attach(transport)
    assert isinstance(producer, TransportProducer)
    assert transport.producer is producer
    assert not producer.paused


def test_twisteds_transport_pauses_the_producer_past_its_buffer_and_passes_it_on():
    transport = Transport()
    replaced = Producer()
    transport.registerProducer(replaced, True)
    producer = attach(transport)
    transport.write(b"x" * (transport.bufferSize + 1))  # a client that does not read
    assert producer.paused
    assert replaced.calls == ["pause"]
    transport.client_reads = True
    transport.doWrite()  # the reactor's call once the socket takes more: the buffer drains
    assert not producer.paused
    assert replaced.calls == ["pause", "resume"]


def test_the_middleware_puts_the_producer_in_the_scope_under_daphne_only():
    seen = []

    async def inner(scope, receive, send):
        seen.append(scope)

    async def reply(protocol, message):
        pass

    transport = Transport()
    connection = Connection(transport)
    middleware = DaphneBackPressure(inner)
    asyncio.run(middleware({"type": "websocket"}, None, functools.partial(reply, connection)))
    asyncio.run(middleware({"type": "websocket"}, None, functools.partial(reply)))
    assert seen[0][SCOPE_KEY] is transport.producer
    assert SCOPE_KEY not in seen[1]


class TcpReactor(Reactor):
    def callLater(self, *args, **kwargs):  # noqa: N802
        raise AssertionError("nothing here is scheduled")


def connected_pair():
    """A Twisted TCP connection on one end of a socket pair, and the other end."""
    import socket

    from twisted.internet import tcp

    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    connection = tcp.Connection(ours, None, reactor=TcpReactor())
    connection.connected = True
    return connection, theirs


def test_twisteds_tcp_connection_has_what_the_immediate_write_reads():
    from twisted.internet import tcp

    for name in ("TLS", "connected", "disconnecting", "dataBuffer", "_tempDataLen",
                 "writeSomeData"):
        assert hasattr(tcp.Connection, name) or hasattr(connected_pair()[0], name), name


def test_a_frame_goes_to_the_socket_at_once_when_nothing_waits_before_it():
    connection, client = connected_pair()
    write_to(connection, b"first")
    assert client.recv(100) == b"first"  # no turn of the reactor needed


def test_a_frame_waits_behind_what_the_transport_holds():
    connection, client = connected_pair()
    connection.write(b"held")  # Twisted's own write: buffered until the reactor's turn
    write_to(connection, b"next")
    try:
        received = client.recv(100)
    except BlockingIOError:
        received = b""
    assert received == b""  # nothing overtook the buffered bytes
    assert connection._tempDataLen == len(b"heldnext")


def test_daphnes_server_takes_what_serve_gives_it():
    import inspect

    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server

    assert build_endpoint_description_strings(host="127.0.0.1", port=8123) == [
        "tcp:port=8123:interface=127.0.0.1"]
    parameters = inspect.signature(Server).parameters
    assert {"application", "endpoints", "verbosity"} <= set(parameters)
    assert callable(Server.run)


def test_a_streamed_response_registers_its_producer_on_daphnes_request():
    # For HTTP, daphne's protocol is its WebRequest, a Twisted Request: the one whose public
    # registerProducer the event streams use (runs.sockets.events).
    from daphne.http_protocol import WebRequest
    from twisted.web import http

    from runs.sockets.daphne import attach_request

    assert issubclass(WebRequest, http.Request)

    class Request:
        def registerProducer(self, producer, streaming):  # noqa: N802
            self.registered = (producer, streaming)

    request = Request()
    producer = attach_request(request)
    assert request.registered == (producer, True)
    assert attach_request(object()) is None


@pytest.mark.parametrize("headers, answer", [
    ([b"X-Big: " + b"a" * 17_000], b""),  # one line over 16 KiB: dropped, no answer
    ([b"X-Part-%d: " % i + b"a" * 1000 for i in range(17)], b"HTTP/1.1 400 Bad Request"),
])
def test_twisteds_http_answers_oversized_headers_as_the_readme_says(headers, answer):
    """The README's production section leaves oversized headers to the reverse proxy: the
    HTTP channel daphne serves with (Twisted's) drops a connection whose header line is over
    16 KiB without an answer, and answers a bare 400 to 16 KiB of headers in all, before
    the application sees the request. Should it ever answer otherwise, the README changes."""
    from daphne.http_protocol import HTTPFactory
    from twisted.internet.testing import StringTransport

    class Server:  # what daphne's request tells its server of a connection
        def protocol_connected(self, protocol):
            pass

        def protocol_disconnected(self, protocol):
            pass

    protocol = HTTPFactory(Server()).buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: x\r\n" + b"\r\n".join(headers) + b"\r\n\r\n")
    assert transport.value().startswith(answer) and (answer or transport.value() == b"")
    assert transport.disconnecting


def test_daphnes_requests_leave_a_posted_form_to_the_application(monkeypatch):
    """``serve_bodies_unparsed`` names a request class of its own where daphne's HTTP
    factory looks it up, and Twisted takes ``parsePOSTFormSubmission``: a POST body then
    reaches the application as it came, unparsed by Twisted (Django parses it once)."""
    from daphne import http_protocol
    from twisted.internet.testing import StringTransport
    from twisted.web import http

    from runs.sockets.daphne import serve_bodies_unparsed

    daphnes = http_protocol.WebRequest
    while getattr(daphnes, "leaves_bodies_unparsed", False):  # installed by an import
        daphnes = daphnes.__bases__[0]
    monkeypatch.setattr(http_protocol, "WebRequest", daphnes)
    serve_bodies_unparsed()
    serve_bodies_unparsed()  # once only: the class is not wrapped again
    made = http_protocol.WebRequest
    assert made.__bases__ == (daphnes,) and daphnes.__bases__ == (http.Request,)

    parsed, processed = [], []
    monkeypatch.setattr(http, "_parseContentType",
                        lambda line: parsed.append(line) or b"application/x-www-form-urlencoded")
    monkeypatch.setattr(made, "process", lambda request: processed.append(request))

    class Server:  # what daphne's request tells its server of a connection
        def protocol_connected(self, protocol):
            pass

        def protocol_disconnected(self, protocol):
            pass

    protocol = http_protocol.HTTPFactory(Server()).buildProtocol(None)
    assert protocol.requestFactory is made
    protocol.makeConnection(StringTransport())
    body = b"a=1&b=2"
    protocol.dataReceived(b"POST /x HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/x-www-form-urlencoded\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body) + body)
    (request,) = processed
    assert parsed == [] and request.args == {}
    assert request.content.read() == body


def test_daphnes_server_builds_a_factory_that_writes_no_access_line_of_twisteds(monkeypatch):
    """``serve_without_twisteds_access_log`` names a factory class of its own where daphne's
    server looks it up, and Twisted's request calls the factory's ``log`` as it finishes:
    the line Twisted would format for each request is then never made."""
    from daphne import http_protocol
    from twisted.internet.testing import StringTransport
    from twisted.web import http

    from runs.sockets.daphne import serve_without_twisteds_access_log

    daphnes = daphne.server.HTTPFactory
    while getattr(daphnes, "writes_no_access_log", False):  # installed by an import
        daphnes = daphnes.__bases__[0]
    assert daphnes is http_protocol.HTTPFactory
    monkeypatch.setattr(daphne.server, "HTTPFactory", daphnes)
    serve_without_twisteds_access_log()
    serve_without_twisteds_access_log()  # once only: the class is not wrapped again
    made = daphne.server.HTTPFactory
    assert made.__bases__ == (daphnes,) and issubclass(daphnes, http.HTTPFactory)

    formatted = []
    monkeypatch.setattr(http, "combinedLogFormatter",  # what a factory takes as it is made
                        lambda *args: formatted.append(args) or "line")

    class Server:  # what daphne's request tells its server of a connection
        def protocol_connected(self, protocol):
            pass

        def protocol_disconnected(self, protocol):
            pass

    def serve_one(factory) -> None:
        factory.startFactory()  # where Twisted sets its log file when none is named
        try:
            protocol = factory.buildProtocol(None)
            protocol.makeConnection(StringTransport())
            monkeypatch.setattr(protocol.requestFactory, "process",
                                lambda request: request.finish())
            protocol.dataReceived(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        finally:
            factory.stopFactory()

    serve_one(daphnes(Server()))
    assert len(formatted) == 1  # daphne's own factory: Twisted formats the request's line
    serve_one(made(Server()))
    assert len(formatted) == 1  # the site's: nothing more
