"""The stream: this process's one connection to the channel layer, both ways.

Out (``publish``): messages are sent to one group of the channel layer in the order given,
from one long-lived event loop of the stream's own, in a thread named ``changes``; nothing
else in the process touches the channel layer, so it never matters which loop a caller is
on. The messages pending when a send begins go as one ``batch`` message, in order (one
Redis publish for them all, and one message for each process to receive). A web process also
lets a send begin no sooner than ``linger`` after the last one began
(``AWAKEN_PUBLISH_LINGER``), so that a burst's changes go together; a change after a quiet
spell goes at once. A send that fails is tried again a few times, then dropped: clients
heal with "resume after seq".

In: the process holds at most one subscription to that group, whatever follows it here,
and forwards each message it receives:

* to sockets (``join``): the ones that follow every run and the ones that follow one run,
  through their outboxes (``runs.changes.outbox``);
* to waiting REST calls (``watch``, ``runs.changes.waiting``).

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

from runs.changes.outbox import Outbox, forward
from runs.changes.waiting import Watches, discard_member

log = logging.getLogger(__name__)

GROUP = "runs"
EVERY_RUN = None  # what the sockets of the whole list follow


class Stream:
    """This process's side of the change stream: publishing and the one subscription."""

    REFRESH_SECONDS = 3600.0  # group membership is renewed at least this often
    RETRY_DELAYS = (0.1, 0.5, 1.0)  # a dropped connection is re-made on the next try
    # Messages pending together are sent as one group message of at most this many, and
    # of texts of at most this size (a larger message is sent alone).
    BATCH_MESSAGES = 100
    BATCH_BYTES = 256 * 1024

    def __init__(self):
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: deque = deque()
        self._drainer: asyncio.Task | None = None
        self._sockets: dict[str | None, set[Outbox]] = {}
        self.watches = Watches()
        self._listener: asyncio.Task | None = None
        self._listening_on = None  # the channel layer the subscription was made on
        self._subscribed = threading.Event()
        self.renewals = 0  # group memberships made or renewed, for tests and metrics
        # A send begins at least this many seconds after the last one began, so that the
        # changes published within it go together; a change after a quiet spell goes at
        # once. A web process sets it as it starts (awaken_site.asgi); 0: each at once.
        self.linger = 0.0
        self._last_send = float("-inf")  # when the last send began, on the loop's clock

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

    def prepare(self) -> None:
        """The channel layer made (its backend's modules imported) and the stream's loop
        started, as a web process (``awaken_site.asgi``) or a worker
        (``runs.runtime.executor``) starts: its first change, published after its commit,
        and its first socket's join, on the server's loop, then wait for neither."""
        if get_channel_layer() is not None:
            self.loop  # noqa: B018 - started on first use

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

    def _next_send(self) -> dict:  # on the loop
        """The oldest pending message, or, when more are pending, a ``batch`` of the oldest
        ones in order, up to ``BATCH_BYTES`` of their texts (at least one): one group
        message, one Redis publish, for all the changes published meanwhile."""
        first = self._pending.popleft()
        if not self._pending:
            return first
        messages, size = [first], len(first.get("text", ""))
        while self._pending and len(messages) < self.BATCH_MESSAGES:
            size += len(self._pending[0].get("text", ""))
            if size > self.BATCH_BYTES:
                break
            messages.append(self._pending.popleft())
        return first if len(messages) == 1 else {"type": "batch", "messages": messages}

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            if (wait := self._last_send + self.linger - loop.time()) > 0:
                await asyncio.sleep(wait)  # the changes published meanwhile go with these
            self._last_send = loop.time()
            message = self._next_send()
            for delay in (*self.RETRY_DELAYS, None):
                try:
                    await get_channel_layer().group_send(GROUP, message)
                    break
                except Exception:
                    if delay is None:  # still down: clients heal with "resume after seq"
                        log.warning("publishing a change failed", exc_info=True)
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
            discard_member(self._sockets, run_id, outbox)

    def followers(self) -> int:
        """How many sockets of this process follow the stream."""
        with self._lock:
            return sum(len(outboxes) for outboxes in self._sockets.values())

    @contextmanager
    def watch(self, run_id, *, timeout: float = 2.0):
        """``with stream.watch(run_id) as watch:`` then ``watch.next(timeout)``, from a
        thread. While the channel layer is unreachable the watch is not ``live`` and gets no
        push: the caller answers with the state committed so far instead of waiting."""
        with self.watches.watch(run_id, live=self.listening(timeout)) as watch:
            yield watch

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
            if message.get("type") == "batch":
                for each in message.get("messages", ()):
                    self._forward(each)
            else:
                self._forward(message)

    def _forward(self, message: dict) -> None:  # on the loop
        """Forward one message of the group to the followers here."""
        try:
            if message.get("type") == "run.changed":
                self._forward_change(message)
            elif message.get("type") == "bulk.changed":
                self._forward_to_list(message["text"])
            elif message.get("type") == "run.output":
                self._forward_output(message)
        except Exception:  # one bad message never ends the subscription
            log.exception("a %s message could not be forwarded", message.get("type"))

    def _forward_change(self, message: dict) -> None:  # on the loop
        """Forward a committed change to the sockets that follow every run or its run, and
        offer the run to the watches waiting on it."""
        text, run_id = message["text"], message.get("run_id")
        with self._lock:
            outboxes = [*self._sockets.get(EVERY_RUN, ()), *self._sockets.get(run_id, ())]
        watches = self.watches.of(run_id)
        forward(outboxes, text)
        if watches:
            run = json.loads(text)["run"]
            for watch in watches:
                watch.offer(run)

    def _forward_to_list(self, text: str) -> None:  # on the loop
        """Forward ``text`` to the sockets that follow every run (the run list)."""
        with self._lock:
            outboxes = list(self._sockets.get(EVERY_RUN, ()))
        forward(outboxes, text)

    def _forward_output(self, message: dict) -> None:  # on the loop
        """Forward a live output message to the sockets that follow its one run."""
        with self._lock:
            outboxes = list(self._sockets.get(message.get("run_id"), ()))
        forward(outboxes, message["text"])


stream = Stream()
