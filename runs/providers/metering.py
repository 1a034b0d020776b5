"""What one attempt's model calls did on the wire, for its stop receipt.

Every HTTP request to the model provider goes through a ``metered_transport``: our own
client's (``runs.providers.client``, on httpx) and the OpenAI-compatible client handed to
the agent frameworks (on httpx2, which they use). The transport finds the attempt's
``Meter`` in the context of the task making the request (``CURRENT``, set by the executor
for the attempt's task; its sub-tasks, a framework's included, inherit it) and records
when each connection opened and closed and when each streamed chunk (a server-sent event)
arrived. The connection is closed by the response's ``aclose``, which httpx runs when the
task reading it is cancelled: that is the moment the receipt reports.
"""

import asyncio
import ssl
import time
from array import array
from collections import deque
from contextvars import ContextVar
from functools import cache
from importlib import import_module

import anyio
import httpx

CURRENT: ContextVar["Meter | None"] = ContextVar("awaken_meter", default=None)

EVENT = b"data:"


class Meter:
    KEEP_CHUNKS = 1 << 16  # arrival times kept at most (the newest); enough around a stop
    KEEP_CONNECTIONS = 32

    def __init__(self):
        self.connections: deque[list] = deque(maxlen=self.KEEP_CONNECTIONS)
        self.chunk_times = array("d")
        self.received = 0  # chunks ever received (the arrival times are trimmed, not this)
        self.open = 0
        self._idle: asyncio.Event | None = None

    def opened(self) -> list:
        connection = [time.time(), None]
        self.connections.append(connection)
        self.open += 1
        return connection

    def closed(self, connection: list) -> None:
        if connection[1] is not None:
            return
        connection[1] = time.time()
        self.open -= 1
        if self.open == 0 and self._idle is not None:
            self._idle.set()

    def chunks(self, count: int) -> None:
        if count <= 0:
            return
        self.received += count
        self.chunk_times.extend([time.time()] * count)
        if len(self.chunk_times) > 2 * self.KEEP_CHUNKS:
            del self.chunk_times[:-self.KEEP_CHUNKS]

    async def settled(self, timeout: float) -> bool:
        """Wait until no connection of the attempt is open (a cancelled call closes its own
        on the loop's next turns), ``timeout`` seconds at most."""
        if self.open <= 0:
            return True
        self._idle = asyncio.Event()
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False


_TRANSPORTS: dict = {}


@cache
def tls_context() -> ssl.SSLContext:
    """The TLS context of every provider connection of the process, httpx's default (the
    roots of SSL_CERT_FILE or SSL_CERT_DIR, else certifi's), made once: making one reads
    the roots, 20-35 ms of CPU here, which each client made on the worker's loop paid."""
    return httpx.create_ssl_context()


def prepare() -> None:
    """Make, off the worker's loop, what the first provider call of a process would
    otherwise make on it, 40-60 ms of CPU here: the TLS context, and the modules httpx
    loads at its first connection (httpcore, and anyio's asyncio backend, which running
    anyio once loads)."""
    tls_context()
    import_module("httpcore")
    anyio.run(asyncio.sleep, 0)


def metered_transport(http, **options):
    """A transport of the httpx-like module ``http`` (httpx or httpx2: the same interface)
    whose requests are recorded on the current attempt's meter, over ``tls_context()``;
    ``options`` go to the module's ``AsyncHTTPTransport`` (``limits``...)."""
    kind = _TRANSPORTS.get(http)
    if kind is None:
        kind = _TRANSPORTS[http] = _transport_class(http)
    return kind(http.AsyncHTTPTransport(verify=tls_context(), **options))


def _transport_class(http):
    class MeteredStream(http.AsyncByteStream):
        def __init__(self, inner, meter: Meter, connection: list, events: bool):
            self.inner = inner
            self.meter = meter
            self.connection = connection
            self.events = events

        async def __aiter__(self):
            tail = b""
            async for chunk in self.inner:
                if self.events:
                    both = tail + chunk
                    self.meter.chunks(both.count(EVENT) - tail.count(EVENT))
                    tail = both[-(len(EVENT) - 1):]
                yield chunk

        async def aclose(self):
            try:
                await self.inner.aclose()
            finally:
                self.meter.closed(self.connection)

    class MeteredTransport(http.AsyncBaseTransport):
        def __init__(self, inner):
            self.inner = inner

        async def handle_async_request(self, request):
            meter = CURRENT.get()
            if meter is None:
                return await self.inner.handle_async_request(request)
            connection = meter.opened()
            try:
                response = await self.inner.handle_async_request(request)
            except BaseException:
                meter.closed(connection)
                raise
            events = response.headers.get("content-type", "").startswith("text/event-stream")
            return http.Response(status_code=response.status_code, headers=response.headers,
                                 stream=MeteredStream(response.stream, meter, connection,
                                                      events),
                                 extensions=response.extensions, request=request)

        async def aclose(self):
            await self.inner.aclose()

    return MeteredTransport
