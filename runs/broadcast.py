"""Push committed transitions to the channel layer, all to one group (``runs``).

The services call ``runs_changed`` from ``transaction.on_commit`` only, so nothing that was
rolled back is ever announced. Messages are handed to one long-lived event loop per process
and sent in commit order; the sender never builds a loop per call.
"""

import asyncio
import json
import logging
import threading
from collections import deque
from contextlib import contextmanager

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

RUNS_GROUP = "runs"


def runs_changed(*, changes) -> None:
    """Announce committed ``(run, event)`` pairs, in the order given."""
    from runs.api.serializers import change_text

    # Encoded once here; every socket forwards the same text. One group feeds the
    # dashboards, the one-run sockets and the waiting API calls: ``run_id`` routes a change
    # to the sockets of its run (runs.fanout) and lets a process skip decoding a change
    # nobody there waits for.
    publisher.send([((RUNS_GROUP,), {"type": "run.changed", "run_id": str(run.id),
                                     "text": change_text(run=run, event=event)})
                    for run, event in changes])


class Publisher:
    """Sends group messages from any thread on one event loop, in the order given."""

    def __init__(self):
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._pending: deque = deque()
        self._drainer: asyncio.Task | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send on ``loop`` (the ASGI server's, say) instead of on a thread of our own."""
        with self._lock:
            self._loop = loop
            self._drainer = None  # a drainer belongs to the loop it was started on

    def send(self, messages: list) -> None:
        """Send each ``(groups, message)`` of ``messages`` to its groups, in order."""
        if get_channel_layer() is None:
            return
        self._event_loop().call_soon_threadsafe(self._enqueue, messages)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="broadcast",
                                 daemon=True).start()
            return self._loop

    def _enqueue(self, messages) -> None:  # on the loop
        self._pending.extend(messages)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    RETRY_DELAYS = (0.1, 0.5, 1.0)  # a dropped connection is re-made on the next try

    async def _drain(self) -> None:
        layer = get_channel_layer()
        while self._pending:
            groups, message = self._pending.popleft()
            for group in groups:
                for delay in (*self.RETRY_DELAYS, None):
                    try:
                        await layer.group_send(group, message)
                        break
                    except Exception:
                        if delay is None:  # still down: clients heal with "resume after seq"
                            log.warning("broadcast to %s failed", group, exc_info=True)
                        else:
                            await asyncio.sleep(delay)


publisher = Publisher()


class Watch:
    """The newest committed snapshot of one run pushed since the watch began."""

    def __init__(self):
        self._changed = threading.Event()
        self._lock = threading.Lock()
        self.run: dict | None = None
        self.live = True

    def offer(self, run: dict) -> None:
        with self._lock:
            # Pushes can arrive out of order; never step back to an older version.
            if self.run is None or run["version"] > self.run["version"]:
                self.run = run
        self._changed.set()

    def next(self, timeout: float) -> dict | None:
        """Wait up to ``timeout`` for a push; the newest snapshot, or None on time-out."""
        if not self._changed.wait(timeout):
            return None
        self._changed.clear()
        with self._lock:
            return self.run


class Watchers:
    """Wakes threads of this process that wait for a run to change.

    One subscription to the runs group per process, on the publisher's loop; a waiting
    thread registers before it reads the run, so no commit can slip between its read and
    its wake-up.
    """

    REFRESH_SECONDS = 3600  # group membership expires (channels' group_expiry, one day)

    def __init__(self):
        self._lock = threading.Lock()
        self._by_run: dict[str, set[threading.Event]] = {}
        self._subscribed = threading.Event()
        self._started = False

    @contextmanager
    def watch(self, run_id):
        """``with watchers.watch(run_id) as watch:`` then ``watch.next(timeout)``.

        While the channel layer is unreachable the watch is not ``live`` and gets no push:
        the caller answers with the state committed so far instead of waiting.
        """
        watch = Watch()
        watch.live = self._ensure_subscribed()
        key = str(run_id)
        with self._lock:
            self._by_run.setdefault(key, set()).add(watch)
        try:
            yield watch
        finally:
            with self._lock:
                waiting = self._by_run.get(key)
                if waiting is not None:
                    waiting.discard(watch)
                    if not waiting:
                        del self._by_run[key]

    def waited_for(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._by_run

    def notify(self, run: dict) -> None:
        with self._lock:
            waiting = list(self._by_run.get(str(run["id"]), ()))
        for watch in waiting:
            watch.offer(run)

    def _ensure_subscribed(self, timeout: float = 2.0) -> bool:
        if get_channel_layer() is None:
            return False
        with self._lock:
            start, self._started = not self._started, True
        if start:
            loop = publisher._event_loop()
            loop.call_soon_threadsafe(lambda: loop.create_task(self._listen()))
        return self._subscribed.wait(timeout)

    async def _listen(self) -> None:
        """Keep one subscription to the runs group, re-made whenever the layer fails."""
        layer = get_channel_layer()
        loop = asyncio.get_running_loop()
        channel, refreshed = None, None
        while True:
            try:
                if channel is None:
                    channel = await layer.new_channel()
                if refreshed is None or loop.time() - refreshed > self.REFRESH_SECONDS:
                    await layer.group_add(RUNS_GROUP, channel)
                    refreshed = loop.time()
                    self._subscribed.set()
                message = await asyncio.wait_for(layer.receive(channel), self.REFRESH_SECONDS)
            except TimeoutError:
                continue
            except Exception:  # the layer is down: waiters answer without a push meanwhile
                log.warning("run-change subscription failed; retrying", exc_info=True)
                self._subscribed.clear()
                channel, refreshed = None, None
                await asyncio.sleep(1)
                continue
            if message.get("type") == "run.changed" and self.waited_for(message["run_id"]):
                self.notify(json.loads(message["text"])["run"])


watchers = Watchers()
