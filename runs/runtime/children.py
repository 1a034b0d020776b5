"""Child runs: started by an attempt in its own process, under a child of its token.

A child is created, claimed and started here at once (no task message), so a cancel of the
parent reaches it through the token without a round trip. The children an attempt started
are kept until it waits for them, or until it ends: children not waited for run on.

A child is a live attempt of this worker like any other: it takes a place of the worker's
capacity, and a spawn with no place left fails (``NoRoomForChild``) before the child run is
created. How many children one run may have is the domain's rule (``AWAKEN_MAX_CHILDREN``).
"""

import asyncio
from functools import partial

from runs import domain, telemetry
from runs.domain import selectors


class NoRoomForChild(RuntimeError):
    """The worker holds as many live attempts as its capacity: no child can start here."""


class Children:
    def __init__(self, *, db, owner: str, lease_seconds: float, launch, room):
        self.db = db  # WorkerLoop.db: a domain call on a database thread
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.room = room  # () -> how many more attempts the worker takes now
        self._starting = 0  # spawns on their way to registering their attempt
        # launch(run_id, generation, view, token) -> the attempt's task, or None if stale
        self.launch = launch
        self._started: dict[tuple[str, int], list[tuple[object, asyncio.Task]]] = {}

    async def spawn(self, *, parent_id: str, parent_generation: int, token, agent: str,
                    input: dict, traceparent: str = ""):
        """Create a child run of ``agent`` and start its attempt; returns its run id. With
        the ``traceparent`` of the parent's attempt, the child's attempt is traced under it.

        On the loop: the place is taken before the first await, so spawns at once never
        overfill the worker."""
        if self.room() - self._starting <= 0:
            raise NoRoomForChild("This worker holds as many live attempts as its capacity "
                                 "(AWAKEN_WORKER_CAPACITY): no child run can start.")
        self._starting += 1
        try:
            child, _ = await self.db(partial(telemetry.within, traceparent, domain.run_create),
                                     agent=agent, input=input, parent_id=parent_id,
                                     source="worker", dispatch=False)
            attempt = await self.db(domain.attempt_start, run_id=child.id, owner=self.owner,
                                    lease_seconds=self.lease_seconds)
            if attempt is not None:
                view = await self.db(selectors.attempt_view, run=attempt.run,
                                     generation=attempt.generation)
                task = self.launch(str(child.id), attempt.generation, view, token.child())
                if task is not None:
                    self._started.setdefault((parent_id, parent_generation), []).append(
                        (child.id, task))
        finally:
            self._starting -= 1
        return child.id

    async def wait(self, *, parent_id: str, parent_generation: int) -> list[dict]:
        """Wait for every child the parent's attempt started; their committed ends."""
        children = self._started.pop((parent_id, parent_generation), [])
        tasks = [task for _, task in children]
        if tasks:
            # asyncio.wait, not gather: when the parent stops waiting (its own cancel), the
            # children must go on to commit their ends, not be cancelled with the waiter.
            await asyncio.wait(tasks)
        return await self.db(selectors.run_ends, run_ids=[run_id for run_id, _ in children])

    def forget(self, *, parent_id: str, parent_generation: int) -> None:
        """The parent's attempt ended: its children not waited for run on, unwatched."""
        self._started.pop((parent_id, parent_generation), None)
