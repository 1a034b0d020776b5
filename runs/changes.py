"""The change stream: committed changes out to the channel layer, and back in to whoever in
this process follows them.

Out: every committed transition is announced once, after commit (``announce``, the domain's
``changes`` port), encoded once, to one group of the channel layer. Messages are sent in
commit order from one long-lived event loop of the stream's own, in a thread; nothing else
in the process touches the channel layer, so it never matters which loop a caller is on.

In: each process holds at most one subscription to that group, whatever follows it there:

* sockets (``join``): the ones that follow every run and the ones that follow one run. Each
  has a bounded outbox written by a task of its own, so a slow socket holds up nobody;
* waiting REST calls (``watch``): a thread that waits for a run's next committed change
  registers before it reads the run, so no commit slips between its read and its wake-up.

The subscription renews its group membership well before the channel layer would expire it
(the in-memory layer drops a member after ``group_expiry``, one day by default), and is made
again whenever the layer fails.
"""

import asyncio
import json
import logging
import threading
from collections import deque
from contextlib import contextmanager

from channels.layers import get_channel_layer

from runs.domain import selectors
from runs.domain.representation import activity_text, bulk_text, change_text, run_data

log = logging.getLogger(__name__)

GROUP = "runs"
EVERY_RUN = None  # what the sockets of the whole list follow


def publish_output(*, run_id, text: str) -> None:
    """Send a live output message (``runs.runtime.output``) to the sockets of one run.

    It is not a committed change: no seq, no run, nothing stored; only the sockets that
    follow that one run get it, never the run list or a waiting call.
    """
    stream.publish([{"type": "run.output", "run_id": str(run_id), "text": text}])


def activity(*, run_id, entries: list[dict]) -> None:
    """Send new entries of a run's activity log to the sockets of that run, as live output
    goes: only the sockets that follow the one run get them."""
    publish_output(run_id=run_id, text=activity_text(run_id=run_id, entries=entries))


def announce(*, changes) -> None:
    """Announce committed ``(run, event)`` pairs, in the order given."""
    # ``run_id`` routes a change to the sockets of its run and lets a process skip decoding
    # a change nobody there waits for.
    stream.publish([{"type": "run.changed", "run_id": str(run.id),
                     "text": change_text(run=run, event=event)} for run, event in changes])


def bulk_changed(*, job) -> None:
    """Announce a bulk job's committed state and progress to the sockets of the run list."""
    stream.publish([{"type": "bulk.changed", "text": bulk_text(job)}])


class Watch:
    """The newest committed snapshot of one run pushed since the watch began. ``live`` is
    False while the stream has no subscription: no push will come."""

    def __init__(self, live: bool):
        self._changed = threading.Event()
        self._lock = threading.Lock()
        self.run: dict | None = None
        self.live = live

    def offer(self, run: dict) -> None:
        with self._lock:
            # Pushes can arrive out of order; never step back to an older version.
            if self.run is None or run["version"] > self.run["version"]:
                self.run = run
        self._changed.set()

    def next(self, timeout: float) -> dict | None:
        """Wait up to ``timeout`` for a push; the newest snapshot, or None on time-out. A run
        pushed truncated is read whole: the caller answers with the run as the API shows it."""
        if not self._changed.wait(timeout):
            return None
        self._changed.clear()
        with self._lock:
            run = self.run
        if run is not None and run.get("truncated"):
            run = run_data(selectors.run_get(run["id"]))
        return run


class Outbox:
    """What one socket has yet to be sent, and the task of its own that sends it.

    ``put`` never waits. A socket more than ``limit`` messages or ``max_bytes`` behind is not
    worth keeping up: ``overflow`` is called once (the socket closes itself, and its client
    resumes after the last seq it saw when it reconnects). ``writable``, if given, is awaited
    before each send and returns once the connection takes more, so that what a client does
    not read waits here, counted, and not in the server's write buffer. A ``held`` outbox
    sends nothing until ``release``.

    ``write_now``, if given, writes a message at once, without waiting: it returns False when
    the connection does not take it now. ``put`` tries it first whenever nothing is waiting
    or being sent, so that a message to many idle sockets is written in one pass on the loop
    instead of by one task each; anything else goes through the queue, in order.
    """

    def __init__(self, send, overflow, *, limit: int = 1000, max_bytes: int | None = None,
                 writable=None, held: bool = False, write_now=None):
        self._send, self._overflow, self._writable = send, overflow, writable
        self._write_now = write_now
        self._sending = False  # the task holds a message taken off the queue
        self._limit, self._max_bytes = limit, max_bytes
        self._queue: deque[str] = deque()
        self._bytes = 0
        self._ready = asyncio.Event()
        self._released = asyncio.Event()
        if not held:
            self._released.set()
        self._task = asyncio.get_running_loop().create_task(self._write())
        self.loop = asyncio.get_running_loop()
        self.closed = False

    def put(self, text: str) -> None:  # on the socket's loop
        if (self._write_now is not None and not self._queue and not self._sending
                and self._released.is_set() and not self.closed):
            try:
                if self._write_now(text):
                    return
            except Exception:
                log.info("a socket could not be written", exc_info=True)
                return
        self._add(text, first=False)

    def release(self, first: str) -> None:
        """Start sending: ``first``, then whatever was put meanwhile."""
        self._add(first, first=True)
        self._released.set()

    def _add(self, text: str, *, first: bool) -> None:
        if self.closed:
            return
        if len(self._queue) >= self._limit or (
                self._max_bytes is not None and self._bytes + len(text) > self._max_bytes):
            self.close()
            self.loop.create_task(self._overflow())
            return
        if first:
            self._queue.appendleft(text)
        else:
            self._queue.append(text)
        self._bytes += len(text)
        self._ready.set()

    async def _write(self) -> None:
        await self._released.wait()
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                if self._writable is not None:
                    await self._writable()
                text = self._queue.popleft()
                self._bytes -= len(text)
                self._sending = True
                try:
                    await self._send(text)
                except Exception:
                    log.info("a socket could not be written", exc_info=True)
                finally:
                    self._sending = False

    def close(self) -> None:
        self.closed = True
        self._queue.clear()
        self._bytes = 0
        self._task.cancel()


class Stream:
    """This process's side of the change stream: publishing and the one subscription."""

    REFRESH_SECONDS = 3600.0  # group membership is renewed at least this often
    RETRY_DELAYS = (0.1, 0.5, 1.0)  # a dropped connection is re-made on the next try

    def __init__(self):
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: deque = deque()
        self._drainer: asyncio.Task | None = None
        self._sockets: dict[str | None, set[Outbox]] = {}
        self._watches: dict[str, set[Watch]] = {}
        self._listener: asyncio.Task | None = None
        self._listening_on = None  # the channel layer the subscription was made on
        self._subscribed = threading.Event()
        self.renewals = 0  # group memberships made or renewed, for tests and metrics

    # --- the loop ---------------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                self._loop = asyncio.new_event_loop()
                self._drainer = self._listener = None
                threading.Thread(target=self._loop.run_forever, name="changes",
                                 daemon=True).start()
            return self._loop

    # --- out --------------------------------------------------------------------------------

    def publish(self, messages: list[dict]) -> None:
        """Send ``messages`` to the group, in order, from any thread."""
        if get_channel_layer() is None:
            return
        self.loop.call_soon_threadsafe(self._enqueue, messages)

    def _enqueue(self, messages) -> None:  # on the loop
        self._pending.extend(messages)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self._pending:
            message = self._pending.popleft()
            for delay in (*self.RETRY_DELAYS, None):
                try:
                    await get_channel_layer().group_send(GROUP, message)
                    break
                except Exception:
                    if delay is None:  # still down: clients heal with "resume after seq"
                        log.warning("announcing a change failed", exc_info=True)
                    else:
                        await asyncio.sleep(delay)

    # --- in: followers ----------------------------------------------------------------------

    async def join(self, outbox: Outbox, run_id: str | None = EVERY_RUN) -> None:
        """Follow every change (or one run's) with a socket's outbox; subscribed on return.
        Raises if the stream cannot subscribe (the channel layer is down)."""
        with self._lock:
            self._sockets.setdefault(run_id, set()).add(outbox)
        ready = self._ensure_listening()
        if not ready.is_set() and not await asyncio.get_running_loop().run_in_executor(
                None, ready.wait, 5.0):
            self.leave(outbox, run_id)
            raise ConnectionError("the change stream has no subscription")

    def leave(self, outbox: Outbox, run_id: str | None = EVERY_RUN) -> None:
        with self._lock:
            followers = self._sockets.get(run_id)
            if followers is not None:
                followers.discard(outbox)
                if not followers:
                    del self._sockets[run_id]

    def followers(self) -> int:
        """How many sockets of this process follow the stream."""
        with self._lock:
            return sum(len(outboxes) for outboxes in self._sockets.values())

    @contextmanager
    def watch(self, run_id, *, timeout: float = 2.0):
        """``with stream.watch(run_id) as watch:`` then ``watch.next(timeout)``, from a
        thread. While the channel layer is unreachable the watch is not ``live`` and gets no
        push: the caller answers with the state committed so far instead of waiting."""
        key = str(run_id)
        watch = Watch(self.listening(timeout))
        with self._lock:
            self._watches.setdefault(key, set()).add(watch)
        try:
            yield watch
        finally:
            with self._lock:
                waiting = self._watches.get(key)
                if waiting is not None:
                    waiting.discard(watch)
                    if not waiting:
                        del self._watches[key]

    def listening(self, timeout: float) -> bool:
        """Whether the stream is subscribed, waiting up to ``timeout`` for it (starting
        the subscription if need be)."""
        return get_channel_layer() is not None and self._ensure_listening().wait(timeout)

    # --- in: the subscription ---------------------------------------------------------------

    def _ensure_listening(self) -> threading.Event:
        """Start the subscription if it is not running (or was made on a channel layer that
        has since been replaced); returns the event set while it is subscribed."""
        loop = self.loop
        layer = get_channel_layer()
        with self._lock:
            if self._listener is None or self._listening_on is not layer:
                self._listening_on = layer
                self._subscribed.clear()
                old, self._listener = self._listener, True  # placeholder until it starts
                loop.call_soon_threadsafe(self._start_listener, old, layer)
        return self._subscribed

    def _start_listener(self, old, layer) -> None:  # on the loop
        if isinstance(old, asyncio.Task):
            old.cancel()
        self._listener = asyncio.get_running_loop().create_task(self._listen(layer))

    def _refresh_interval(self, layer) -> float:
        expiry = getattr(layer, "group_expiry", None)
        return min(self.REFRESH_SECONDS, expiry / 4) if expiry else self.REFRESH_SECONDS

    async def _listen(self, layer) -> None:
        """Keep one subscription to the group, renewed before it expires and made again
        whenever the layer fails."""
        loop = asyncio.get_running_loop()
        interval = self._refresh_interval(layer)
        channel, renewed = None, None
        while True:
            try:
                if channel is None:
                    channel = await layer.new_channel()
                if renewed is None or loop.time() - renewed >= interval:
                    await layer.group_add(GROUP, channel)
                    renewed = loop.time()
                    self.renewals += 1
                    self._subscribed.set()
                left = interval - (loop.time() - renewed)
                message = await asyncio.wait_for(layer.receive(channel), max(left, 0.01))
            except TimeoutError:
                continue
            except asyncio.CancelledError:
                raise
            except Exception:  # the layer is down: followers heal with a resume meanwhile
                log.warning("the change stream subscription failed; retrying", exc_info=True)
                self._subscribed.clear()
                channel, renewed = None, None
                await asyncio.sleep(1)
                continue
            try:
                if message.get("type") == "run.changed":
                    self._deliver(message)
                elif message.get("type") == "bulk.changed":
                    self._deliver_to_list(message["text"])
                elif message.get("type") == "run.output":
                    self._deliver_output(message)
            except Exception:  # one bad message never ends the subscription
                log.exception("a %s message could not be handed over", message.get("type"))

    def _deliver(self, message: dict) -> None:  # on the loop
        text, run_id = message["text"], message.get("run_id")
        with self._lock:
            outboxes = [*self._sockets.get(EVERY_RUN, ()), *self._sockets.get(run_id, ())]
            watches = list(self._watches.get(run_id, ()))
        _hand_over(outboxes, text)
        if watches:
            run = json.loads(text)["run"]
            for watch in watches:
                watch.offer(run)

    def _deliver_to_list(self, text: str) -> None:  # on the loop
        """Hand ``text`` to the sockets that follow every run (the run list)."""
        with self._lock:
            outboxes = list(self._sockets.get(EVERY_RUN, ()))
        _hand_over(outboxes, text)

    def _deliver_output(self, message: dict) -> None:  # on the loop
        """Hand a live output message to the sockets that follow its one run."""
        with self._lock:
            outboxes = list(self._sockets.get(message.get("run_id"), ()))
        _hand_over(outboxes, message["text"])


def _hand_over(outboxes: list[Outbox], text: str) -> None:
    by_loop: dict[asyncio.AbstractEventLoop, list[Outbox]] = {}
    for outbox in outboxes:
        by_loop.setdefault(outbox.loop, []).append(outbox)
    for loop, group in by_loop.items():  # one hand-over per loop (daphne's), not per socket
        if not loop.is_closed():
            loop.call_soon_threadsafe(_put_each, group, text)


def _put_each(outboxes: list[Outbox], text: str) -> None:  # on the sockets' loop
    for outbox in outboxes:
        outbox.put(text)


stream = Stream()
