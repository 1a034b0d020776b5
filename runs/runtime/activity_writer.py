"""The writer of one attempt's activity log (``runs.domain.activity``).

The agent's ``ctx.log``, its steps, model calls and tools add entries without waiting. The
entries wait, for ``INTERVAL`` at most, for the attempt's next transition (a step, a pause,
its end), which writes them in its own statement (``taken``). An attempt that goes longer
than that between transitions has them written by a task of their own, a few at a time,
off the agent's path. An entry that cannot be written is dropped with a warning: the log
is a record, not state, and the run goes on without it.
"""

import asyncio
import logging

from runs.domain import activity

log = logging.getLogger(__name__)

# How long an entry waits for the transition it precedes. A step's entries (its progress,
# its lines, its calls) and its checkpoint then cost one transaction instead of one for
# each burst of entries, and the page sees an entry at most this late. It is long enough
# for a burst of work: with 50 runs claimed at once, a worker's steps wait their turn for a
# database thread for some tenths of a second, and a shorter wait wrote each run's entries
# in a transaction of their own just then (statement log, bench lifecycle in batches).
INTERVAL = 1.0
FLUSH_SECONDS = 5  # how long a transition waits for a write under way before it


class ActivityWriter:
    def __init__(self, *, run_id: str, generation: int, db):
        self.run_id = run_id
        self.generation = generation
        self.db = db  # WorkerLoop.db: a domain call on a database thread
        self._pending: list[dict] = []
        self._writer: asyncio.Task | None = None
        self._due: asyncio.TimerHandle | None = None

    def add(self, entry: dict) -> None:  # on the loop
        self._pending.append(entry)
        if self._due is None and not self._writing():
            self._due = asyncio.get_running_loop().call_later(INTERVAL, self._write_now)

    def _writing(self) -> bool:
        return self._writer is not None and not self._writer.done()

    def _write_now(self) -> None:
        self._due = None
        if not self._writing():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        while self._pending:  # entries added during a write go in the next
            batch, self._pending = self._pending, []
            try:
                await self.db(activity.activity_record, run_id=self.run_id,
                              generation=self.generation, entries=batch)
            except Exception:
                log.warning("run %s: activity not recorded", self.run_id, exc_info=True)

    async def _written(self) -> None:
        writer = self._writer
        if writer is not None and not writer.done():
            await asyncio.wait({writer}, timeout=FLUSH_SECONDS)

    async def taken(self) -> list[dict]:
        """The entries not written yet, for the transition about to be written to carry
        in its statement, so that what the attempt did is on record with its step, pause
        or end. A write under way is waited for (a bounded time) first: the entries keep
        their order."""
        if self._due is not None:
            self._due.cancel()
            self._due = None
        await self._written()
        taken, self._pending = self._pending, []
        return taken

    async def flushed(self) -> None:
        """Write what is pending now, and wait (a bounded time) for it: the attempt is
        over, and no transition of its own will carry it."""
        if self._due is not None:
            self._due.cancel()
            self._write_now()
        await self._written()
