"""The ends of a worker's attempts, committed together when they come together.

Attempts that a task message started together mostly end together. An end alone is a
transaction of its own through the finish boundary (``runs.domain.attempt_finish``). Ends
that come in the same turn of the loop, or while another is being written, go in one
transaction (``runs.domain.attempts_finish``): one statement locks their runs, each is then
written as it would be alone, and one commit makes them all. No end waits for a timer: an
end that comes alone goes at once, and one that comes meanwhile waits for the write before
it only.

An end is not gathered with others when its run has a parent (``attempts_finish`` says
why), nor with another of the same run. If a gathered transaction fails, nothing of it is
committed and each of its ends is made again alone, so each gets its own answer or error.
"""

import asyncio
import logging

from runs import domain

log = logging.getLogger(__name__)

# Ends in one transaction at most: a long one holds the runs' row locks, and a cancel of
# one of them waits for the whole transaction.
GATHER = 50


class Ends:
    def __init__(self, worker_loop):
        self.worker_loop = worker_loop
        self._waiting: list[tuple[dict, asyncio.Future]] = []
        self._writer: asyncio.Task | None = None

    async def finish(self, *, parent_id=None, **end) -> bool:
        """``attempt_finish(**end)``, with the ends that come meanwhile (run by run as
        ``attempts_finish`` orders them): whether it was committed."""
        if parent_id is not None:
            return await self.worker_loop.db(domain.attempt_finish, **end)
        waiting = asyncio.get_running_loop().create_future()
        self._waiting.append((end, waiting))
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write())
        return await waiting

    async def _write(self) -> None:
        ends = []
        try:
            while self._waiting:
                ends = self._taken()
                await self._commit(ends)
        except BaseException:  # cancelled with the loop: no end waits for ever
            for _, waiting in ends + self._waiting:
                waiting.cancel()
            self._waiting = []
            raise
        finally:
            self._writer = None

    def _taken(self) -> list[tuple[dict, asyncio.Future]]:
        """The next transaction's ends: the first ``GATHER`` that wait, one a run."""
        taken, runs, left = [], set(), []
        for waiting in self._waiting:
            run_id = str(waiting[0]["run_id"])
            if len(taken) < GATHER and run_id not in runs:
                taken.append(waiting)
                runs.add(run_id)
            else:
                left.append(waiting)
        self._waiting = left
        return taken

    async def _commit(self, ends: list[tuple[dict, asyncio.Future]]) -> None:
        if len(ends) > 1:
            try:
                committed = await self.worker_loop.db(
                    domain.attempts_finish, ends=[end for end, _ in ends])
            except Exception:  # each alone below: its own answer or error
                log.warning("%d ends not committed together; each goes alone", len(ends),
                            exc_info=True)
            else:
                for (_, waiting), finished in zip(ends, committed, strict=True):
                    _answer(waiting, finished)
                return
        for end, waiting in ends:
            try:
                finished = await self.worker_loop.db(domain.attempt_finish, **end)
            except Exception as error:
                _answer(waiting, error=error)
            else:
                _answer(waiting, finished)


def _answer(waiting: asyncio.Future, finished: bool | None = None, *,
            error: Exception | None = None) -> None:
    """Give an end's caller its answer, unless it stopped waiting (cancelled)."""
    if waiting.done():
        return
    if error is not None:
        waiting.set_exception(error)
    else:
        waiting.set_result(finished)
