"""The executor: every attempt of a worker process runs on one event loop in one thread.

A Celery task claims a run (``start``) and hands the attempt to the loop; the attempt then
lives here, registered in the process's active-attempt registry, until it commits its end
through the finish boundary. Database calls go to a small thread pool (each thread keeps
its own connection), blocking tools to another. One renewal loop keeps every attempt's lease
and picks up pending cancel or stop requests. Model calls share one provider client, with
its pool of connections, on the loop.
"""

import asyncio
import logging
import os
import random
import socket
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from operator import attrgetter

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections
from django.utils import timezone

from runs import changes, domain
from runs.domain import activity, selectors
from runs.domain.attempts import renewal_chunks
from runs.domain.catalogue import CATALOGUE
from runs.domain.core import Ending
from runs.domain.errors import Fenced
from runs.providers.client import ChatClient, ProviderConfig
from runs.runtime.agent import BudgetExceeded, Context, Interrupted, Paused
from runs.runtime.registry import Entry, Registry
from runs.runtime.token import CancellationToken, Why

log = logging.getLogger(__name__)


class ToolsExhausted(RuntimeError):
    """No thread is left for a blocking tool: abandoned calls hold every one."""

TOOL_THREADS = 64


class Executor:
    def __init__(self, *, node: str, lease_seconds: float | None = None,
                 capacity: int | None = None, db_threads: int | None = None,
                 tool_threads: int | None = None):
        self.node = node
        self.owner = f"{node}:{os.getpid()}"
        self.lease_seconds = lease_seconds or settings.AWAKEN_LEASE_SECONDS
        self.capacity = capacity or settings.AWAKEN_WORKER_CAPACITY
        self.registry = Registry()
        self.children: dict[tuple[str, int], list[asyncio.Task]] = {}
        self._db = ThreadPoolExecutor(db_threads or settings.AWAKEN_DB_THREADS,
                                      thread_name_prefix="awaken-db")
        self._tool_slots_size = tool_threads or TOOL_THREADS
        self._abandoned: set[asyncio.Future] = set()
        self.output_per_second = settings.AWAKEN_LIVE_OUTPUT_PER_SECOND
        self._provider: ChatClient | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="awaken-executor", daemon=True)
        self._thread.start()

    def _serve(self):
        asyncio.set_event_loop(self.loop)
        self._tool_slots = asyncio.Semaphore(self._tool_slots_size)
        self.loop.create_task(self._renew_forever())
        self.loop.run_forever()

    def close(self) -> None:
        """Close its database threads' connections and stop its loop. A worker process just
        exits; this is for an executor made in a process that goes on (a test)."""
        size = self._db._max_workers
        together = threading.Barrier(size)

        def close_connections(_):
            together.wait(10)  # one call per thread: each closes its own connection
            connections.close_all()

        list(self._db.map(close_connections, range(size)))
        self._db.shutdown()

        async def stop():
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            asyncio.get_running_loop().stop()

        asyncio.run_coroutine_threadsafe(stop(), self.loop)

    # --- entry from the Celery task ----------------------------------------------------------

    @property
    def room(self) -> int:
        """How many more attempts this process takes now."""
        return max(0, self.capacity - len(self.registry))

    def start(self, run_ids) -> int:
        """Claim the runs of ``run_ids`` (one transaction) and run their attempts on the
        loop. Returns how many were claimed."""
        attempts = domain.attempts_start(run_ids=run_ids, owner=self.owner,
                                         lease_seconds=self.lease_seconds)
        for attempt in attempts:
            view = selectors.attempt_view(run=attempt.run, generation=attempt.generation)
            entry = self._register(str(attempt.run_id), attempt.generation, view)
            if entry is not None:
                asyncio.run_coroutine_threadsafe(self._attempt(entry, view), self.loop)
        return len(attempts)

    def _register(self, run_id: str, generation: int, view,
                  token: CancellationToken | None = None) -> Entry | None:
        """Register a claimed attempt at once, before it is scheduled: from here on a live
        command finds it. A child whose parent's attempt lives here (a child re-queued
        after a crash, say) gets a token linked to the parent's. None: a newer generation
        of the run is registered already, so this claim is stale and must not run."""
        if token is None:
            parent = self.registry.get(view.parent_id) if view.parent_id else None
            token = parent.token.child() if parent is not None else CancellationToken()
        entry = Entry(run_id, generation, token, loop=self.loop)
        if not self.registry.register(entry):
            log.warning("run %s: generation %s is stale here; not started", run_id, generation)
            return None
        return entry

    # --- one attempt ---------------------------------------------------------------------

    async def db(self, fn, /, **kwargs):
        return await self.loop.run_in_executor(self._db, partial(_call_db, fn, kwargs))

    async def _attempt(self, entry: Entry, view):
        run_id, generation, token = entry.run_id, entry.generation, entry.token
        timer = ctx = None
        try:
            ctx = Context(run_id=run_id, generation=generation, input=view.input,
                          state=view.agent_state, resume=view.resume, token=token, host=self)
            ctx.entry, ctx.view = entry, view
            ctx.usage = {"steps": view.steps, "tokens": view.tokens}
            if view.max_seconds is not None:
                left = max(0.0, view.max_seconds - view.seconds_used)
                timer = self.loop.call_later(left, token.cancel, Why(
                    "budget", code="max_seconds",
                    detail=f"Time budget of {view.max_seconds:g} s reached."))
            ctx._check()  # a cancel that arrived before any work started
            output = await CATALOGUE[view.agent]().run(ctx)
            ctx._check()  # a cancel delivered while the agent returned wins over its result
            await self.db(domain.attempt_finish, run_id=run_id, generation=generation,
                          ending=Ending.completed(output))
        except Interrupted as stop:
            try:
                await self._interrupted(run_id, generation, stop.why, view)
            except Exception:  # the lease expires and the sweeper applies what is pending
                log.exception("run %s: could not record the end of attempt %s", run_id,
                              generation)
        except BudgetExceeded as budget:
            await self.db(domain.attempt_stop_by_policy, run_id=run_id, generation=generation,
                          code=budget.code, reason=budget.reason)
        except (Paused, Fenced):
            pass
        except Exception as error:
            log.info("run %s attempt %s failed", run_id, generation, exc_info=True)
            summary = f"{type(error).__name__}: {error}"
            if ctx is not None:  # the traceback goes to the activity log, before the end
                ctx._activity("error", text=summary, data={
                    "traceback": traceback.format_exc()[-activity.TRACEBACK:]})
                await self._activity_flushed(ctx)
            await self._fail(run_id, generation, summary)
        finally:
            if timer is not None:
                timer.cancel()
            if ctx is not None:
                await self._activity_flushed(ctx)
            self.children.pop((run_id, generation), None)  # children not waited for run on
            self.registry.unregister(run_id, generation)

    async def _interrupted(self, run_id, generation, why: Why | None, view):
        if why is None or why.kind == "fenced":
            return  # a fenced attempt commits nothing
        if why.kind == "budget":
            await self.db(domain.attempt_stop_by_policy, run_id=run_id, generation=generation,
                          code=why.code, reason=why.detail)
        elif why.kind == "parent":
            await self.db(domain.attempt_parent_gone, run_id=run_id, generation=generation,
                          parent_id=view.parent_id, why=why.detail, actor=why.actor,
                          source=why.source)
        else:
            await self.db(domain.attempt_interrupted, run_id=run_id, generation=generation,
                          actor=why.actor, source=why.source, accepted_at=why.at)

    async def _fail(self, run_id, generation, error: str):
        try:
            await self.db(domain.attempt_finish, run_id=run_id, generation=generation,
                          ending=Ending.failed(error))
        except Exception:
            log.exception("run %s: could not record its failure", run_id)

    # --- the host side of the agent interface -------------------------------------------------

    async def before_step(self, ctx: Context) -> None:
        ctx._check()
        if ctx.entry.pause_requested.is_set():
            await self.pause(ctx, reason="manual_pause", prompt=None,
                             source=ctx.entry.pause_source)
            raise Paused()
        view = ctx.view
        if view.max_steps is not None and ctx.usage["steps"] >= view.max_steps:
            raise BudgetExceeded("max_steps", f"Step budget of {view.max_steps} reached.")
        if view.max_tokens is not None and ctx.usage["tokens"] >= view.max_tokens:
            raise BudgetExceeded("max_tokens", f"Token budget of {view.max_tokens} reached.")

    async def commit_step(self, ctx: Context, *, tokens: int, data: dict | None = None) -> None:
        try:
            run = await self.db(domain.attempt_step, run_id=ctx.run_id,
                                generation=ctx.generation, tokens=tokens, agent_state=ctx.state,
                                data=data)
        except Fenced:
            ctx.token.cancel(Why("fenced"))
            raise
        ctx.usage = {"steps": run.steps, "tokens": run.tokens}

    async def pause(self, ctx: Context, *, reason: str, prompt, schema=None,
                    source: str | None = None) -> None:
        """Pause the run: asked by the agent (``wait_for_input``: the worker's doing), or
        an operator's pause taken at a step boundary, in that operator's name and source."""
        await self._activity_flushed(ctx)
        ticket = await self.db(domain.attempt_pause, run_id=ctx.run_id,
                               generation=ctx.generation, reason=reason, prompt=prompt,
                               schema=schema, agent_state=ctx.state,
                               actor=ctx.entry.pause_actor if source else None,
                               source=source or "worker")
        why = ctx.token.why
        if ticket is not None and why is not None and why.kind == "command":
            # A live-only cancel (no intent) taken while the pause committed: the run is
            # awaiting now, so the cancel goes the durable path instead of being lost.
            await self.db(domain.run_cancel, run_id=ctx.run_id, actor=why.actor or "worker",
                          source=why.source or "worker")

    async def receive(self, ctx: Context):
        """The next inbox item of the attempt: a message, or None for a wake. Waits for one,
        racing the token; a pause asked meanwhile is taken here, as at a step boundary."""
        entry = ctx.entry
        while True:
            if entry.pause_requested.is_set():
                await self.before_step(ctx)
            item = entry.take()
            if item is not None:
                return item.message
            await ctx.race(entry.arrival())

    def activity(self, ctx: Context, entry: dict) -> None:
        """Take an entry of the attempt's activity log; a task writes them in order, a few
        at a time, off the agent's path (``runs.domain.activity``)."""
        ctx.activity_pending.append(entry)
        if ctx.activity_writer is None or ctx.activity_writer.done():
            ctx.activity_writer = self.loop.create_task(self._write_activity(ctx))

    async def _write_activity(self, ctx: Context) -> None:
        while ctx.activity_pending:
            batch, ctx.activity_pending = ctx.activity_pending, []
            try:
                await self.db(activity.activity_record, run_id=ctx.run_id,
                              generation=ctx.generation, entries=batch)
            except Exception:  # a record, not state: the run goes on without it
                log.warning("run %s: activity not recorded", ctx.run_id, exc_info=True)

    async def _activity_flushed(self, ctx: Context) -> None:
        """Wait (a bounded time) for the entries taken so far to be written, so that what
        the agent did is on record before the run's end or pause is."""
        writer = ctx.activity_writer
        if writer is not None and not writer.done():
            await asyncio.wait({writer}, timeout=5)

    @property
    def provider(self) -> ChatClient:
        """The model provider's client of this process, made on first use (on the loop) from
        the settings of that moment, with a connection for every attempt it may hold."""
        if self._provider is None:
            self._provider = ChatClient(ProviderConfig.from_settings(),
                                        max_connections=self.capacity)
        return self._provider

    def publish_output(self, run_id: str, text: str) -> None:
        """Push a live output message of an attempt to the sockets of its run."""
        changes.publish_output(run_id=run_id, text=text)

    async def run_sync_tool(self, fn, *args, **kwargs):
        """Run a blocking tool in a daemon thread, at most ``tool_threads`` at once.

        A thread cannot be killed: when the attempt stops waiting, the thread is abandoned,
        and keeps its slot until it returns; being a daemon, it never holds up the worker's
        shutdown. Abandoned threads are counted (the worker reports them on /metrics). Once
        every slot is held by one, a blocking tool fails at once with ``ToolsExhausted``
        (its run ends ``failed``, saying so) instead of waiting for a slot that may never
        come back; the worker needs a restart to get its slots back.
        """
        if len(self._abandoned) >= self._tool_slots_size:
            raise ToolsExhausted(f"every one of the {self._tool_slots_size} threads for "
                                 "blocking tools is held by an abandoned call")
        await self._tool_slots.acquire()
        future = self.loop.create_future()

        def call():
            result, error = None, None
            try:
                result = fn(*args, **kwargs)
            except BaseException as raised:  # handed to the awaiting attempt
                error = raised
            self.loop.call_soon_threadsafe(self._tool_returned, future, result, error)

        threading.Thread(target=call, name="awaken-tool", daemon=True).start()
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if not future.done():
                self._abandoned.add(future)
            raise

    def _tool_returned(self, future, result, error) -> None:  # on the loop
        self._tool_slots.release()
        self._abandoned.discard(future)
        _settle(future, result, error)

    @property
    def abandoned_tools(self) -> int:
        """Blocking tool calls given up on whose threads have not returned."""
        return len(self._abandoned)

    async def spawn(self, ctx: Context, agent: str, input: dict):
        child, _ = await self.db(domain.run_create, agent=agent, input=input,
                                 parent_id=ctx.run_id, source="worker", dispatch=False)
        attempt = await self.db(domain.attempt_start, run_id=child.id, owner=self.owner,
                                lease_seconds=self.lease_seconds)
        if attempt is not None:
            view = await self.db(selectors.attempt_view, run=attempt.run,
                                 generation=attempt.generation)
            entry = self._register(str(child.id), attempt.generation, view,
                                   token=ctx.token.child())
            if entry is not None:
                task = self.loop.create_task(self._attempt(entry, view))
                self.children.setdefault((ctx.run_id, ctx.generation), []).append(
                    (child.id, task))
        return child.id

    async def wait_children(self, ctx: Context) -> list[dict]:
        children = self.children.pop((ctx.run_id, ctx.generation), [])
        tasks = [task for _, task in children]
        if tasks:
            # asyncio.wait, not gather: when the parent stops waiting (its own cancel), the
            # children must go on to commit their ends, not be cancelled with the waiter.
            await asyncio.wait(tasks)
        return await self.db(selectors.run_ends, run_ids=[run_id for run_id, _ in children])

    # --- leases ----------------------------------------------------------------------------

    async def _renew_forever(self):
        while True:
            # A third of the lease, less up to a fifth of that at random: workers started
            # together do not go on renewing (and loading the database) in step.
            await asyncio.sleep(self.lease_seconds / 3 * random.uniform(0.8, 1.0))
            try:
                await self.renew()
                await self.db(domain.worker_report, owner=self.owner,
                              live_attempts=len(self.registry),
                              abandoned_tools=self.abandoned_tools)
            except Exception:
                log.warning("lease renewal failed", exc_info=True)

    async def renew(self) -> None:
        """Renew every registered attempt's lease; fence the lost, cancel on pending intents.

        A chunk of run ids at a time (``renewal_chunks``): each chunk's update holds the
        row locks of its attempts only until it commits. The registry is read before the
        database: an attempt registered after this point may have claimed its run after
        the read and must not be judged by it.
        """
        for chunk in renewal_chunks(self.registry.snapshot(), run_id=attrgetter("run_id")):
            await self._renew(chunk)

    async def _renew(self, entries) -> None:
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


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _call_db(fn, kwargs):
    """Run a service in a database thread. Each thread keeps its pooled connection between
    calls (returning it to the pool after every call costs more than the call); after a
    database error it is given back, and the next call takes a fresh one."""
    try:
        return fn(**kwargs)
    except DatabaseError:
        close_old_connections()
        raise


_executor: Executor | None = None
_executor_lock = threading.Lock()


def get_executor(node: str | None = None) -> Executor:
    """This process's executor, started on first use."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = Executor(node=node or f"awaken@{socket.gethostname()}")
        return _executor


def current_executor() -> Executor | None:
    return _executor
