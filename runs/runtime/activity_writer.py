"""The writer of one attempt's activity log (``runs.domain.activity``).

The agent's ``ctx.log``, its steps, model calls and tools add entries without waiting; a
task writes them in order, a few at a time, off the agent's path. An entry that cannot be
written is dropped with a warning: the log is a record, not state, and the run goes on
without it.
"""

import asyncio
import logging

from runs.domain import activity

log = logging.getLogger(__name__)

FLUSH_SECONDS = 5  # how long an end or a pause waits for the entries before it


class ActivityWriter:
    def __init__(self, *, run_id: str, generation: int, db):
        self.run_id = run_id
        self.generation = generation
        self.db = db  # WorkerLoop.db: a domain call on a database thread
        self._pending: list[dict] = []
        self._writer: asyncio.Task | None = None

    def add(self, entry: dict) -> None:  # on the loop
        self._pending.append(entry)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self.db(activity.activity_record, run_id=self.run_id,
                              generation=self.generation, entries=batch)
            except Exception:
                log.warning("run %s: activity not recorded", self.run_id, exc_info=True)

    async def flushed(self) -> None:
        """Wait (a bounded time) for the entries taken so far to be written, so that what
        the agent did is on record before the run's end or pause is."""
        writer = self._writer
        if writer is not None and not writer.done():
            await asyncio.wait({writer}, timeout=FLUSH_SECONDS)
