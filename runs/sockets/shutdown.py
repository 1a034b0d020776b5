"""The web's shutdown: on SIGTERM it answers what it holds and exits within seconds.

Daphne stops on SIGTERM (Twisted's reactor takes the signal). Before the reactor stops,
daphne cancels every application instance and waits for them. A cancel alone does not end a
request whose view waits for a run's change (``?wait=``, up to 30 s): its thread goes on
waiting, the process's exit waits for that thread, and the client gets no answer. An event
stream or a socket would be cut without its end.

So ``Drain.begin`` runs when the reactor begins to shut down (a Twisted system event trigger,
registered through ``runs.sockets.daphne.on_shutdown``):

* every wait of this process ends at once and answers with the run as committed, as a wait
  that ran out answers (202 while the request is pending, ``../shared/API.md``), and a wait
  that begins afterwards does not wait;
* every event stream ends its response (the client reconnects with ``Last-Event-ID``) and
  every socket is closed with 4012 (the page reconnects).

``Draining``, the outermost ASGI middleware, runs each application instance in a task of its
own: daphne's cancel reaches the middleware, which, once the drain has begun, lets the
instance finish its answer for up to ``GRACE_SECONDS`` before it cancels it. Both of
daphne's steps happen in one turn of the loop (the shutdown's "before" triggers are called
one after the other), so the drain has begun by the time a cancelled instance runs again.
The reactor stops once the drain has settled: every instance has ended (one that began
during the drain too: daphne takes connections until the reactor stops), and the loop has
had ``LINGER_SECONDS`` more to write what they sent (when it stops, Twisted drops every
connection, written or not). Then the process exits at once, without the interpreter's
last walk of the whole heap.
"""

import asyncio
import gc
import logging

from runs.changes.stream import stream
from runs.sockets.daphne import daphne_protocol, on_shutdown
from runs.sockets.recheck import rechecks

log = logging.getLogger(__name__)

GRACE_SECONDS = 1.2  # what an instance may take to answer once the drain has begun
LINGER_SECONDS = 0.1  # then, for the loop to write the answers out
GOING_AWAY = 4012  # the close code of a socket closed as its server shuts down (1012, service
# restart, is not one an application may send: autobahn allows 1000 and 3000-4999)


class Drain:
    """Whether this process has begun to shut down, and what ends then."""

    def __init__(self):
        self.begun = False
        self.registered = False
        self.instances: set[asyncio.Task] = set()  # what Draining runs now
        self._endings: set[asyncio.Task] = set()

    def register(self) -> None:
        """Drain when the server begins to shut down; once (under daphne)."""
        if not self.registered:
            self.registered = True
            on_shutdown(self.begin)

    def begin(self):
        """End every wait, stream and socket of this process (on daphne's loop); returns
        what settles once the instances have ended and their answers had time to go out."""
        self.begun = True
        waits = stream.watches.end_all()
        held = rechecks.members()
        loop = asyncio.get_running_loop()
        for member in held:
            task = loop.create_task(member.going_away())
            self._endings.add(task)
            task.add_done_callback(self._endings.discard)
        log.info("shutting down: %d waits ended, %d streams and sockets closed", waits, len(held))
        return self.settled()

    async def settled(self) -> None:
        """Once every instance has ended, those begun since the drain began too (the server
        takes connections until the reactor stops), or ``GRACE_SECONDS`` have passed and a
        little more; then ``LINGER_SECONDS`` for their answers to go out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GRACE_SECONDS + 0.3
        while self.instances and (left := deadline - loop.time()) > 0:
            await asyncio.wait(set(self.instances), timeout=left)
        await asyncio.sleep(LINGER_SECONDS)
        # The interpreter's last collection would walk every object of the process before
        # it exits (1 to 3 s for this one, most of the time to exit): what lives now is
        # frozen out of it (gc.freeze), and its memory goes back with the process.
        gc.freeze()


drain = Drain()


class Draining:
    """ASGI middleware, the outermost: under daphne it registers the drain; once the drain
    has begun, a cancelled instance is given ``GRACE_SECONDS`` to finish its answer."""

    def __init__(self, app, state: Drain = drain):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        if not self.state.registered and daphne_protocol(send) is not None:
            self.state.register()
        task = asyncio.get_running_loop().create_task(self.app(scope, receive, send))
        self.state.instances.add(task)
        task.add_done_callback(self.state.instances.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not self.state.begun:  # a cancel as any other: the instance ends, then this
                task.cancel()
                await asyncio.wait({task})
                raise
        # Shutting down: the drain ends what this instance waits for; it answers, or is cut.
        # Returning (not raising) keeps daphne waiting for the other instances too.
        done, _ = await asyncio.wait({task}, timeout=GRACE_SECONDS)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=0.2)
        elif not task.cancelled() and task.exception() is not None:
            log.warning("an instance failed while shutting down", exc_info=task.exception())
