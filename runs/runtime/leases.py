"""The lease renewer: one loop per worker process keeps every registered attempt's lease.

Every third of a lease it renews the leases of all attempts in the registry, fences the
attempts whose claim is gone (their tokens cancelled as ``fenced``) and cancels those whose
run has a pending cancel or stop request: a live command that was lost still reaches its
attempt here. Then it reports the worker's figures for /metrics.
"""

import asyncio
import logging
import random
from collections.abc import Callable
from operator import attrgetter

from django.utils import timezone

from runs import domain
from runs.domain.attempts import renewal_chunks
from runs.runtime.registry import Registry
from runs.runtime.token import Why

log = logging.getLogger(__name__)


class LeaseRenewer:
    def __init__(self, *, registry: Registry, db, owner: str, lease_seconds: float,
                 abandoned_tools: Callable[[], int], capacity: int = 0):
        self.registry = registry
        self.capacity = capacity
        self.db = db  # WorkerLoop.db: a domain call on a database thread
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.abandoned_tools = abandoned_tools

    async def renew_forever(self) -> None:
        try:  # the workers page shows the process from its start
            await self.report()
        except Exception:
            log.warning("worker report failed", exc_info=True)
        while True:
            # A third of the lease, less up to a fifth of that at random: workers started
            # together do not go on renewing (and loading the database) in step.
            await asyncio.sleep(self.lease_seconds / 3 * random.uniform(0.8, 1.0))
            try:
                await self.renew()
                await self.report()
            except Exception:
                log.warning("lease renewal failed", exc_info=True)

    async def report(self) -> None:
        await self.db(domain.worker_report, owner=self.owner, live_attempts=len(self.registry),
                      abandoned_tools=self.abandoned_tools(), capacity=self.capacity)

    async def renew(self) -> None:
        """Renew every registered attempt's lease; fence the lost, cancel on pending intents.

        A chunk of run ids at a time (``renewal_chunks``): each chunk's update holds the
        row locks of its attempts only until it commits. The registry is read before the
        database: an attempt registered after this point may have claimed its run after
        the read and must not be judged by it.
        """
        for chunk in renewal_chunks(self.registry.snapshot(), run_id=attrgetter("run_id")):
            await self._renew_chunk(chunk)

    async def _renew_chunk(self, entries) -> None:
        renewal = await self.db(domain.attempt_renew, owner=self.owner,
                                attempts=[(e.run_id, e.generation) for e in entries],
                                lease_seconds=self.lease_seconds)
        for entry in entries:
            if (entry.run_id, entry.generation) not in renewal.renewed:
                entry.token.cancel(Why("fenced"))
                continue
            intent = renewal.intents.get(entry.run_id)
            if intent is not None:
                entry.token.cancel(Why("command", actor=intent.requested_by,
                                       source=intent.source, at=timezone.now()))
