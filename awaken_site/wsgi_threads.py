"""Django's WSGI application served to daphne, each request on a thread kept between requests.

Every view is synchronous, so a request's middleware and view run as one call of Django's
WSGI handler, on one thread. Django's ASGI handler would hop between the event loop and a
thread at each synchronous middleware, and enter a fresh thread for every request, so that
what Django keeps per thread (the database connection's wrapper and everything cached on it)
lasted one request.

``WsgiOnThreads`` is that WSGI server, on the ASGI specification alone. The body is read on
the loop; the request is handed to a thread of ``RequestThreads`` once, and comes back once:

* a response that is not streaming (Django's ``streaming`` is false) is rendered, closed and
  handed back whole, then sent from the loop: one hop out and one back, where asgiref's
  ``WsgiToAsgi`` made a round trip from the thread to the loop for the start, each chunk
  and the end (measured: ``docs/performance.md``, "The seventh round");
* a streaming response (a file, say) is sent chunk by chunk from its thread, each chunk
  once the loop has sent the one before.

Closing the response is Django's end of the request (PEP 3333: the ``request_finished``
signal gives the request's database connection back to the pool), so it is always closed on
the request's thread, once its body has been taken or the client has gone.
"""

import asyncio
import contextvars
import io
import logging
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

SEND_SECONDS = 60.0  # a streaming chunk the loop has not sent by then ends the response
DUPLICATE_HEADERS = 100  # more of one header than this is a bad request
# What the WSGI environ joins a repeated header's values with (RFC 9110 5.3; cookies: 6265).
JOINED_BY = {"HTTP_COOKIE": "; "}


class WsgiOnThreads:
    """ASGI application for HTTP: the WSGI application ``app``, on ``threads``."""

    def __init__(self, app, threads: "RequestThreads | None" = None):
        self.app = app
        self.threads = threads or RequestThreads()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"A WSGI application serves HTTP, not {scope['type']!r}.")
        body = await _body(receive)
        if body is None:  # the client left before its body was in
            return
        try:
            environ = _environ(scope, body)
        except ValueError as exc:
            await _send_whole(send, _plain(400, f"Bad Request: {exc}"))
            return
        loop = asyncio.get_running_loop()
        request = _Request(self.app, environ, loop, send)
        executor = self.threads.borrow()
        served = False
        try:
            # The request's thread runs in a copy of this context, as asgiref's would.
            whole = await loop.run_in_executor(
                executor, contextvars.copy_context().run, request.serve)
            served = True
        except asyncio.CancelledError:
            request.gone.set()  # a streaming body stops at its next chunk and is closed
            raise
        finally:
            self.threads.give_back(executor, idle=served)
        if whole is not None:
            await _send_whole(send, whole)


class _Request:
    """One request on its thread: the WSGI call, and its response as the loop sends it."""

    def __init__(self, app, environ: dict, loop, send):
        self.app = app
        self.environ = environ
        self.loop = loop
        self.send = send
        self.gone = threading.Event()
        self.start = None
        self.start_sent = False

    def start_response(self, status: str, headers, exc_info=None):
        if exc_info is not None and self.start_sent:
            raise exc_info[1].with_traceback(exc_info[2])
        if self.start is not None and exc_info is None:
            raise ValueError("start_response was called twice without exc_info.")
        self.start = {"type": "http.response.start", "status": int(status.split(" ", 1)[0]),
                      "headers": [(name.lower().encode("latin1"), value.encode("latin1"))
                                  for name, value in headers]}

    def serve(self):
        """The whole response, ``(start, body)``, or None once a streaming one is sent."""
        try:
            response = self.app(self.environ, self.start_response)
        except Exception:
            log.exception("The WSGI application failed on %s %s.", self.environ["REQUEST_METHOD"],
                          self.environ["PATH_INFO"])
            return _plain(500, "Internal Server Error")
        try:
            if not getattr(response, "streaming", True):
                body = b"".join(response)
                return self._started(), body
            self._stream(response)
            return None
        finally:
            close = getattr(response, "close", None)
            if close is not None:
                close()

    def _started(self) -> dict:
        if self.start is None:
            raise RuntimeError("The WSGI application returned without start_response.")
        return self.start

    def _stream(self, response) -> None:
        for chunk in response:
            if self.gone.is_set():
                return
            self._send_start()
            if chunk:
                self._send({"type": "http.response.body", "body": chunk, "more_body": True})
        self._send_start()
        self._send({"type": "http.response.body"})

    def _send_start(self) -> None:
        if not self.start_sent:
            self.start_sent = True
            self._send(self._started())

    def _send(self, message: dict) -> None:
        """``send`` on the loop, from this thread, once the loop has sent it; nothing once
        the client has gone, or the loop has not sent it within ``SEND_SECONDS``."""
        if self.gone.is_set():
            return
        sent = asyncio.run_coroutine_threadsafe(self.send(message), self.loop)
        try:
            sent.result(SEND_SECONDS)
        except BaseException:
            self.gone.set()
            sent.cancel()
            raise


async def _body(receive) -> bytes | None:
    """The request's body (``BodySizeLimit`` has bounded it), or None if the client left."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _send_whole(send, whole) -> None:
    start, body = whole
    await send(start)
    await send({"type": "http.response.body", "body": body})


def _plain(status: int, text: str):
    return ({"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"text/plain; charset=utf-8")]}, text.encode())


def _environ(scope: dict, body: bytes) -> dict:
    """The WSGI environ of an ASGI HTTP ``scope`` (PEP 3333; strings are latin-1, as
    WSGI's "native strings" are). ValueError: a header repeated too often."""
    script_name = scope.get("root_path", "").encode("utf8").decode("latin1")
    path_info = scope["path"].encode("utf8").decode("latin1")
    if script_name and path_info.startswith(script_name):
        path_info = path_info[len(script_name):]
    server = scope.get("server") or ("localhost", 80)
    environ = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": script_name,
        "PATH_INFO": path_info,
        "QUERY_STRING": scope.get("query_string", b"").decode("latin1"),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1] if server[1] is not None else 0),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if scope.get("client"):
        environ["REMOTE_ADDR"] = scope["client"][0]
    headers: dict[str, list[str]] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin1").upper().replace("-", "_")
        if name not in ("CONTENT_LENGTH", "CONTENT_TYPE"):
            name = "HTTP_" + name
        values = headers.setdefault(name, [])
        if len(values) >= DUPLICATE_HEADERS:
            raise ValueError(f"more than {DUPLICATE_HEADERS} {raw_name.decode('latin1')} "
                             "headers")
        values.append(raw_value.decode("latin1"))
    for name, values in headers.items():
        environ[name] = JOINED_BY.get(name, ",").join(values)
    return environ


class RequestThreads:
    """Single-thread executors for requests, kept for the next request when idle.

    Each request runs on one thread; at most ``idle`` threads wait for the next request,
    the others end."""

    def __init__(self, idle: int = 64):
        self.idle = idle
        self._free: list[ThreadPoolExecutor] = []
        self._lock = threading.Lock()

    def borrow(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._free:
                return self._free.pop()
        return ThreadPoolExecutor(1, thread_name_prefix="awaken-request")

    def give_back(self, executor: ThreadPoolExecutor, *, idle: bool = False) -> None:
        """Keep ``executor`` for the next request: at once when it is ``idle`` (its call has
        returned), else once it has done what it still has to (a view whose client went
        away finishes first), behind which a call is queued, which wakes its thread."""
        if idle:
            self._keep(executor)
        else:
            executor.submit(_nothing).add_done_callback(lambda _: self._keep(executor))

    @property
    def idle_count(self) -> int:
        """How many threads wait for the next request."""
        with self._lock:
            return len(self._free)

    def _keep(self, executor: ThreadPoolExecutor) -> None:
        with self._lock:
            if len(self._free) < self.idle:
                self._free.append(executor)
                return
        executor.shutdown(wait=False)


def _nothing() -> None:
    pass
