"""Each client gets a share of the web process, and reads leave room for controls.

A request holds a database connection for most of its life, and the pool behind them is
small (``DB_POOL_MAX``). So the requests a web process serves at once are bounded here,
before a thread or a connection is taken for them, by three rules:

1. at most ``AWAKEN_REQUEST_SLOTS`` requests run at once, fewer than the pool's connections
   (the sockets and the change stream take theirs too);
2. reads (GET, HEAD, OPTIONS) take at most ``AWAKEN_READ_SLOTS`` of them, so the rest are
   always there for controls (a cancel, a pause, a resume) whatever the readers do;
3. one client (its credential as presented: the ``Authorization`` header, else the session
   cookie, else its address) runs at most ``AWAKEN_CLIENT_SLOTS`` reads at once. Controls
   are not held to a client's share: a script that stops a hundred runs in parallel is
   served as fast as the places free up, in order.

A request that finds no room waits, in order of arrival, up to ``AWAKEN_BUSY_WAIT`` seconds
on the event loop (holding no thread and no connection), and is then answered 503 ``busy``
with ``Retry-After``. ``/healthz``, the static files and control requests that wait for a
push (``?wait=`` above 0, which hold no connection while they wait) are not counted.
Only the ASGI specification is relied on.
"""

import asyncio
import hashlib
import json
import threading
from collections import deque
from urllib.parse import parse_qs

from django.conf import settings
from prometheus_client import Counter

READS = frozenset({"GET", "HEAD", "OPTIONS"})
SHED = Counter("awaken_requests_shed", "HTTP requests answered 503 busy because the web "
               "process (or the client's share of it) was full.", ["kind"])
RETRY_AFTER = 1  # seconds, in the 503's Retry-After


class RequestShare:
    """ASGI middleware for HTTP: ``app`` is called only within the rules above."""

    def __init__(self, app, *, slots: int | None = None, read_slots: int | None = None,
                 client_slots: int | None = None, wait: float | None = None):
        self.app = app
        self.slots = slots or settings.AWAKEN_REQUEST_SLOTS
        self.read_slots = min(read_slots or settings.AWAKEN_READ_SLOTS, self.slots)
        self.client_slots = client_slots or settings.AWAKEN_CLIENT_SLOTS
        self.wait = settings.AWAKEN_BUSY_WAIT if wait is None else wait
        self.running = 0
        self.reading = 0
        self.by_client: dict[str, int] = {}  # reads in flight, by client
        self.waiting: deque[Waiter] = deque()
        self._lock = threading.Lock()  # the tests call one instance from several loops

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not counted(scope):
            return await self.app(scope, receive, send)
        waiter = Waiter(client_of(scope), scope.get("method", "GET") in READS)
        if not await self.enter(waiter):
            SHED.labels("read" if waiter.read else "control").inc()
            return await send_busy(send)
        try:
            await self.app(scope, receive, send)
        finally:
            self.leave(waiter)

    def fits(self, waiter: "Waiter") -> bool:
        return (self.running < self.slots
                and (not waiter.read or (self.reading < self.read_slots
                                         and self.by_client.get(waiter.client, 0)
                                         < self.client_slots)))

    def take(self, waiter: "Waiter") -> None:
        self.running += 1
        if waiter.read:
            self.reading += 1
            self.by_client[waiter.client] = self.by_client.get(waiter.client, 0) + 1

    async def enter(self, waiter: "Waiter") -> bool:
        """Take a place for ``waiter``, waiting up to ``self.wait`` seconds; whether it got
        one."""
        with self._lock:
            # Waiters are let in as soon as they fit (admit), so none that fits is ahead.
            if self.fits(waiter):
                self.take(waiter)
                return True
            if self.wait <= 0:
                return False
            waiter.future = asyncio.get_running_loop().create_future()
            self.waiting.append(waiter)
        try:
            await asyncio.wait_for(waiter.future, self.wait)
            return True
        except TimeoutError:
            with self._lock:
                if waiter.admitted:  # let in just as the wait ended: it keeps its place
                    return True
                self.waiting.remove(waiter)
                return False
        except asyncio.CancelledError:  # the client went away while it waited
            with self._lock:
                if waiter.admitted:
                    self._leave(waiter)
                else:
                    self.waiting.remove(waiter)
            raise

    def leave(self, waiter: "Waiter") -> None:
        with self._lock:
            self._leave(waiter)

    def _leave(self, waiter: "Waiter") -> None:
        self.running -= 1
        if waiter.read:
            self.reading -= 1
            left = self.by_client[waiter.client] - 1
            if left:
                self.by_client[waiter.client] = left
            else:
                del self.by_client[waiter.client]
        self.admit()

    def admit(self) -> None:
        """Under the lock: let in, oldest first, every waiter that now fits (a waiter that
        does not fit yet, a read when reads are full or a client at its share, does not
        hold up the others)."""
        for waiter in list(self.waiting):
            if self.running >= self.slots:
                return
            if self.fits(waiter):
                self.waiting.remove(waiter)
                self.take(waiter)
                waiter.admitted = True
                loop = waiter.future.get_loop()
                loop.call_soon_threadsafe(_resolve, waiter.future)


class Waiter:
    __slots__ = ("client", "read", "future", "admitted")

    def __init__(self, client: str, read: bool):
        self.client = client
        self.read = read
        self.future: asyncio.Future | None = None
        self.admitted = False


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(True)


def counted(scope) -> bool:
    """Whether the request takes a place: not health checks, static files, or controls
    that wait for a push."""
    path = scope.get("path", "")
    if path == "/healthz" or path.startswith(settings.STATIC_URL):
        return False
    if scope.get("method") not in READS:
        wait = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("wait", ["0"])
        try:
            return float(wait[-1]) <= 0
        except ValueError:
            return True  # refused by the view, at once
    return True


def client_of(scope) -> str:
    """Who asks, as far as can be told before anything is checked: a digest of the
    credential presented (API key or session), else the address."""
    headers = dict(scope.get("headers") or ())
    credential = headers.get(b"authorization")
    if credential is None:
        for part in headers.get(b"cookie", b"").split(b";"):
            name, _, value = part.strip().partition(b"=")
            if name == settings.SESSION_COOKIE_NAME.encode():
                credential = b"session:" + value
                break
    if credential:
        return hashlib.blake2b(credential, digest_size=12).hexdigest()
    client = scope.get("client") or ("", 0)
    return f"address:{client[0]}"


async def send_busy(send) -> None:
    body = json.dumps({"code": "busy", "detail": "This server is busy: too many requests at "
                       "once (from you, or reading). Try again shortly."}).encode()
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(RETRY_AFTER).encode())]})
    await send({"type": "http.response.body", "body": body})
