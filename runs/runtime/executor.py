"""The executor: it runs every attempt of a worker process, from its claim to its end.

A Celery task claims runs (``start``); each attempt is registered in the process's
active-attempt registry at once (from then on a live command finds it) and run on the
worker's loop until it commits its end through the finish boundary. The executor only
puts the parts together; each does one job in a module of its own:

* ``loop.WorkerLoop``: the asyncio loop and the database threads;
* ``registry.Registry``: the live attempts, by run id, for live commands;
* ``leases.LeaseRenewer``: every attempt's lease, and pending requests found on renewal;
* ``tool_threads.ToolThreads``: threads for blocking tools, abandoned ones counted;
* ``children.Children``: child runs started by an attempt, in this process;
* ``ends.Ends``: the ends of attempts, in one transaction when they come together;
* ``attempt_host.AttemptHost``: the host interface (``host.Host``) an attempt's context
  calls, one per attempt;
* the provider client, shared by the attempts of the process, with its connections;
* ``runs.telemetry``: each attempt's trace (its span, its model and tool calls, the
  controls it took), a no-op while traces are off.
"""

import asyncio
import gc
import logging
import os
import socket
import threading
import time
import traceback
from functools import partial
from urllib.parse import urlsplit

from django.conf import settings

from runs import domain, telemetry
from runs.changes.stream import stream
from runs.domain import activity, prices, selectors
from runs.domain.catalogue import CATALOGUE
from runs.domain.core import Ending
from runs.domain.errors import Fenced
from runs.providers import metering
from runs.providers.client import ChatClient, ProviderConfig, ProviderError
from runs.runtime.agent import Agent, BudgetExceeded, Context, Interrupted, Paused
from runs.runtime.attempt_host import AttemptHost
from runs.runtime.children import Children
from runs.runtime.ends import Ends
from runs.runtime.leases import LeaseRenewer
from runs.runtime.loop import WorkerLoop
from runs.runtime.registry import Entry, Registry
from runs.runtime.token import CancellationToken, Why
from runs.runtime.tool_threads import TOOL_THREADS, ToolsExhausted, ToolThreads, on_a_thread

__all__ = ["Executor", "ToolsExhausted", "current_executor", "get_executor"]

log = logging.getLogger(__name__)

# How long the preparations of a process's start wait for one part before they go on
# without it: a preparation that never returns keeps its thread, not the others' turn.
PREPARE_WAIT = 30.0


class Executor:
    def __init__(self, *, node: str, lease_seconds: float | None = None,
                 capacity: int | None = None, db_threads: int | None = None,
                 tool_threads: int | None = None, prepare_all: bool = False):
        self.node = node
        self.owner = f"{node}:{os.getpid()}"
        self.lease_seconds = lease_seconds or settings.AWAKEN_LEASE_SECONDS
        self.capacity = capacity or settings.AWAKEN_WORKER_CAPACITY
        self.output_per_second = settings.AWAKEN_LIVE_OUTPUT_PER_SECOND
        self.registry = Registry()
        self.worker_loop = WorkerLoop(db_threads=db_threads or settings.AWAKEN_DB_THREADS)
        self.loop = self.worker_loop.loop
        self.ends = Ends(self.worker_loop)
        self.tool_threads = ToolThreads(tool_threads or TOOL_THREADS)
        self.children = Children(db=self.worker_loop.db, owner=self.owner,
                                 lease_seconds=self.lease_seconds, launch=self.launch,
                                 room=lambda: self.room)
        self.leases = LeaseRenewer(registry=self.registry, db=self.worker_loop.db,
                                   owner=self.owner, lease_seconds=self.lease_seconds,
                                   abandoned_tools=lambda: self.tool_threads.abandoned,
                                   capacity=self.capacity)
        self._provider: ChatClient | None = None
        # Each agent's preparation in this process (Agent.prepare), by its class, on a
        # thread of its own (on_a_thread): one agent's slow preparation does not hold up
        # another's, and one that never returns does not hold up the process's exit.
        self._prepared: dict[type[Agent], asyncio.Future] = {}
        self._awaited: set[asyncio.Future] = set()  # preparations attempts wait for
        # The process's own slow parts, begun now: what the provider's connections need
        # (metering.prepare) and the price table (prices.prepare), which an attempt waits
        # for as for its agent's preparation, and the change stream (stream.prepare), which
        # a run's first commit publishes to.
        self._connections_prepared = _preparing(metering.prepare)
        self._prices_prepared = _preparing(prices.prepare)
        self._stream_prepared = _preparing(stream.prepare)
        # The process's executor (get_executor) also prepares every agent of the catalogue
        # from its start, so that no run waits for its framework's import; done when all
        # of it is made and frozen out of the collector's passes (_prepare_all).
        self._began = time.monotonic()
        self.prepared_in: float | None = None  # seconds from the start to the freeze
        self.prepared_all = self.worker_loop.submit(self._prepare_all()) if prepare_all else None
        self.worker_loop.submit(self.leases.renew_forever())

    def close(self) -> None:
        """Stop the loop and close its database connections (for a test; a worker exits)."""
        self.worker_loop.close()

    @property
    def provider(self) -> ChatClient:
        """The model provider's client of this process, made on first use (on the loop) from
        the settings of that moment, with a connection for every attempt it may hold."""
        if self._provider is None:
            self._provider = ChatClient(ProviderConfig.from_settings(),
                                        max_connections=self.capacity)
        return self._provider

    def host_for(self, entry: Entry, view) -> AttemptHost:
        """The host an attempt's context calls (``runs.runtime.host``)."""
        return AttemptHost(self, entry, view)

    # --- entry from the Celery task ----------------------------------------------------------

    @property
    def room(self) -> int:
        """How many more attempts this process takes now."""
        return max(0, self.capacity - len(self.registry))

    def start(self, run_ids) -> int:
        """Claim the runs of ``run_ids`` (one transaction) and run their attempts on the
        loop. Returns how many were claimed. WorkerDraining if an operator drained this
        process: it claims none."""
        attempts = domain.attempts_start(run_ids=run_ids, owner=self.owner,
                                         lease_seconds=self.lease_seconds,
                                         unless_draining=True)
        for attempt in attempts:
            view = selectors.attempt_view(run=attempt.run, generation=attempt.generation)
            entry = self._register(str(attempt.run_id), attempt.generation, view)
            if entry is not None:
                self.worker_loop.submit(self._attempt(entry, view))
        return len(attempts)

    def launch(self, run_id: str, generation: int, view,
               token: CancellationToken) -> asyncio.Task | None:
        """On the loop: register a claimed child attempt under ``token`` and start it;
        its task, or None if a newer generation is registered."""
        entry = self._register(run_id, generation, view, token=token)
        if entry is None:
            return None
        return self.loop.create_task(self._attempt(entry, view))

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
        entry.trace = telemetry.attempt(
            run_id=run_id, generation=generation, agent=view.agent, thread_id=view.thread_id,
            traceparent=view.traceparent,
            server=urlsplit(settings.AWAKEN_PROVIDER_BASE_URL or "").hostname)
        return entry

    # --- one attempt ---------------------------------------------------------------------

    async def _attempt(self, entry: Entry, view):
        run_id, generation, token = entry.run_id, entry.generation, entry.token
        db = self.worker_loop.db
        host = self.host_for(entry, view)
        timer = ctx = None
        outcome, error_text = "completed", None
        try:
            ctx = Context(run_id=run_id, generation=generation, input=view.input,
                          state=view.agent_state, resume=view.resume, token=token, host=host,
                          usage={"steps": view.steps, "tokens": view.tokens,
                                 "cost_usd": view.cost_usd})
            metering.CURRENT.set(ctx.meter)  # this task's, and its sub-tasks', provider calls
            if view.max_seconds is not None:
                left = max(0.0, view.max_seconds - view.seconds_used)
                timer = self.loop.call_later(left, token.cancel, Why(
                    "budget", code="max_seconds",
                    detail=f"Time budget of {view.max_seconds:g} s reached."))
            agent = CATALOGUE[view.agent]
            await self._prepared_for(agent, ctx)
            ctx.check()  # a cancel that arrived before any work started
            output = await agent().run(ctx)
            ctx.check()  # a cancel applied while the agent returned wins over its result
            # The agent's last step, if it is not written yet, and what it did since its
            # last transition are written with the end.
            step = await host.last_step()
            noted = await host.activity_log.taken()
            finished = await self.ends.finish(
                run_id=run_id, generation=generation, ending=Ending.completed(output),
                trace=ctx.stop_trace(), step=step, activity=noted, parent_id=view.parent_id)
            host.step_ended()
            if step is not None and not finished:  # refused as its step would be alone
                token.cancel(Why("fenced"))
                outcome = "fenced"
        except Interrupted as stop:
            kind = stop.why.kind if stop.why else "command"
            outcome = "interrupted" if kind in ("command", "parent") else kind
            try:
                if kind != "fenced" and not await self._step_alone(host):
                    outcome = "fenced"
                    return
                trace = await self._trace(ctx)
                # What the attempt did, the call it was stopped in included, is written
                # with its end, so the page drawn for the end shows it.
                noted = await host.activity_log.taken()
                await self._interrupted(run_id, generation, stop.why, view, trace=trace,
                                        traced=entry.trace, noted=noted)
            except Exception:  # the lease expires and the sweeper applies what is pending
                log.exception("run %s: could not record the end of attempt %s", run_id,
                              generation)
        except BudgetExceeded as budget:
            outcome = "budget"
            if not await self._step_alone(host):
                outcome = "fenced"
                return
            trace = await self._trace(ctx)
            await db(domain.attempt_budget_reached, run_id=run_id, generation=generation,
                     code=budget.code, reason=budget.reason, digest=budget.digest,
                     trace=trace, activity=await host.activity_log.taken())
        except Paused:
            outcome = "paused"
        except Fenced:
            outcome = "fenced"
        except Exception as error:
            log.info("run %s attempt %s failed", run_id, generation, exc_info=True)
            summary = error_text = f"{type(error).__name__}: {error}"
            outcome = "failed"
            if not await self._step_alone(host):
                outcome = "fenced"
                return
            if ctx is not None:  # the traceback goes to the activity log, with the end
                ctx.record_activity("error", text=summary, data={
                    "traceback": traceback.format_exc()[-activity.TRACEBACK:]})
            noted = await host.activity_log.taken()
            provider = _provider_failure(error)
            if provider is not None:
                await self._provider_failed(run_id, generation, summary, provider, noted)
            else:
                await self._fail(run_id, generation, summary, noted, view.parent_id)
        finally:
            if timer is not None:
                timer.cancel()
            await host.activity_log.flushed()  # what no transition of the attempt carried
            self.children.forget(parent_id=run_id, parent_generation=generation)
            self.registry.unregister(run_id, generation)
            entry.trace.end(outcome, error_text)

    async def _prepared_for(self, agent: type[Agent], ctx: Context) -> None:
        """Wait, racing the attempt's token, for ``agent``'s preparation in this process,
        on its own thread, begun as the process started (``_prepare_all``) or at the
        agent's first attempt here, again after one that failed; its error, if it failed."""
        preparing = self._preparation(agent)
        if not preparing.done():
            if preparing not in self._awaited:  # first in the start's turn (_prepare_all)
                self._awaited.add(preparing)
                preparing.add_done_callback(self._awaited.discard)
            # Shielded: a cancel of this attempt does not cancel the others' wait.
            await ctx.race(asyncio.shield(preparing))
        preparing.result()

    def _preparation(self, agent: type[Agent]) -> asyncio.Future:
        """``agent``'s preparation in this process (on the loop): the one begun, unless
        it failed, or one begun now."""
        preparing = self._prepared.get(agent)
        if preparing is None or (preparing.done() and (preparing.cancelled()
                                                       or preparing.exception() is not None)):
            preparing = self._prepared[agent] = asyncio.wrap_future(
                on_a_thread(partial(self._prepare, agent), name="awaken-prepare"),
                loop=self.loop)
        return preparing

    async def _prepare_all(self) -> int:
        """Every agent of the catalogue prepared, as the process starts, and then what
        the process made so far frozen (``gc.freeze``): the modules of the frameworks, some
        300,000 objects, which each full pass of the cyclic collector would otherwise go
        through again while every attempt waits on it. Returns how many objects are
        frozen.

        The agents are prepared in turn, the agents of waiting attempts first: imports on
        one interpreter lock take as long side by side as in turn, so an attempt that
        arrives now waits for its own agent's preparation, begun at once
        (``_prepared_for``), beside one other at most, not beside all of them. A part
        that fails is logged (an agent is prepared again by its first attempt); one that
        takes longer than ``PREPARE_WAIT`` is left to its thread, and the rest go on.

        What is frozen is never collected as a cycle: the cycles among what the attempts
        live at this moment hold (few, this early) once they end, and the garbage in
        cycles the imports left (25 to 172 objects a framework's agent). A full pass first
        would free the latter, but holds every attempt of the process for as long as one
        (100 ms and more), so there is none."""
        # The process's own preparations log their failures (_preparing).
        await _in_time("the process's own parts", asyncio.shield(asyncio.gather(*map(
            asyncio.wrap_future, (self._connections_prepared, self._prices_prepared,
                                  self._stream_prepared)))))
        agents = list(CATALOGUE.values())  # a class a name (catalogue.register)
        prepared, given_up = 0, set()
        for agent in agents:
            waiting = self._awaited - given_up
            if waiting:
                await asyncio.wait(waiting, timeout=PREPARE_WAIT)
                given_up.update(preparing for preparing in waiting if not preparing.done())
            preparing = self._preparation(agent)
            prepared += await _in_time(agent.name, asyncio.shield(preparing),
                                       0 if preparing in given_up else None)
        gc.freeze()  # moves the collector's lists whole, in no time
        frozen = gc.get_freeze_count()
        self.prepared_in = time.monotonic() - self._began
        log.info("prepared %d of %d agents in %.1f s; %d objects frozen out of the "
                 "collector's passes", prepared, len(agents), self.prepared_in, frozen)
        return frozen

    def _prepare(self, agent: type[Agent]) -> None:
        """On a preparing thread: the agent's own slow parts (``Agent.prepare``), then
        what the provider's connections need and the price table, once they are made, so
        that no attempt makes either on the loop."""
        agent.prepare()
        self._connections_prepared.result()
        self._prices_prepared.result()

    async def _step_alone(self, host: AttemptHost) -> bool:
        """Write the attempt's pending step before an end that does not take it (a stop,
        a budget, a failure): the step, then the end, as the agent made them. False if
        the step is refused: the attempt is fenced, and commits nothing more."""
        try:
            await host.step_written()
        except Fenced:
            return False
        except Exception:  # the step's write failed: the end is written without it
            log.warning("run %s: could not write the step before its end", host.entry.run_id,
                        exc_info=True)
        return True

    SETTLE_SECONDS = 2.0  # what a stopped attempt waits for its calls to close, at most

    async def _trace(self, ctx: Context | None):
        """The stop receipt's trace of a stopped attempt, once the provider connections
        of its cancelled calls have closed (they close on the loop's next turns)."""
        if ctx is None:
            return None
        await ctx.meter.settled(self.SETTLE_SECONDS)
        return ctx.stop_trace()

    async def _interrupted(self, run_id, generation, why: Why | None, view, *, trace=None,
                           traced: telemetry.NoAttempt = telemetry.NO_ATTEMPT,
                           noted: list[dict] = ()):
        db = self.worker_loop.db
        if why is None or why.kind == "fenced":
            if noted:  # a fenced attempt commits nothing but the record of what it did
                await db(activity.activity_record, run_id=run_id, generation=generation,
                         entries=noted)
            return
        if why.kind in ("command", "parent") and traced is not telemetry.NO_ATTEMPT:
            # The control the attempt took, as requested (a cancel, or a stop and its
            # reason); a live cancel with no request behind it in the name of its sender.
            intent = await db(selectors.pending_request, run_id=run_id)
            traced.control(intent.action if intent else "cancel",
                           actor=intent.requested_by if intent else why.actor,
                           source=intent.source if intent else why.source,
                           reason=intent.reason if intent else None, at=why.at)
        if why.kind == "budget":
            await db(domain.attempt_budget_reached, run_id=run_id, generation=generation,
                     code=why.code, reason=why.detail, trace=trace, activity=noted)
        elif why.kind == "parent":
            await db(domain.attempt_parent_gone, run_id=run_id, generation=generation,
                     parent_id=view.parent_id, why=why.detail, actor=why.actor,
                     source=why.source, trace=trace, activity=noted)
        else:
            await db(domain.attempt_interrupted, run_id=run_id, generation=generation,
                     actor=why.actor, source=why.source, accepted_at=why.at, trace=trace,
                     activity=noted)

    async def _provider_failed(self, run_id, generation, error: str,
                               failure: ProviderError, noted: list[dict]):
        """Fail the run, or pause it if the settings say so (``attempt_provider_failed``)."""
        try:
            await self.worker_loop.db(domain.attempt_provider_failed, run_id=run_id,
                                      generation=generation, error=error,
                                      status=failure.status, activity=noted)
        except Exception:
            log.exception("run %s: could not record its provider's failure", run_id)

    async def _fail(self, run_id, generation, error: str, noted: list[dict], parent_id):
        try:
            await self.ends.finish(run_id=run_id, generation=generation,
                                   ending=Ending.failed(error), activity=noted,
                                   parent_id=parent_id)
        except Exception:
            log.exception("run %s: could not record its failure", run_id)


async def _in_time(what: str, preparing, seconds: float | None = None) -> bool:
    """Whether ``preparing`` (shielded, or its thread's own) was made within ``seconds``
    more (``PREPARE_WAIT``; none for one that had its wait already); if not, why is
    logged, and the start's preparations go on."""
    try:
        await asyncio.wait_for(preparing, PREPARE_WAIT if seconds is None else seconds)
    except TimeoutError:
        log.warning("%s still preparing after %.0f s; the worker goes on without waiting",
                    what, PREPARE_WAIT)
    except Exception as error:
        log.warning("could not prepare %s as the process started (%s); its first attempt "
                    "prepares it again", what, error)
    else:
        return True
    return False


def _preparing(prepare):
    """``prepare()``, one of the process's own preparations, begun on a thread of its own.
    A failure is logged: the first call that needs the part makes it then, on the loop."""
    def logged():
        try:
            prepare()
        except Exception:
            log.exception("could not prepare %s.%s", prepare.__module__, prepare.__name__)

    return on_a_thread(logged, name="awaken-prepare")


def _provider_failure(error: BaseException) -> ProviderError | None:
    """The provider error that kept failing past the retries behind ``error`` (raised by
    the agent, or wrapped by its framework), if there is one."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ProviderError) and error.retries_exhausted:
            return error
        error = error.__cause__ or error.__context__
    return None


_executor: Executor | None = None
_executor_lock = threading.Lock()


def get_executor(node: str | None = None) -> Executor:
    """This process's executor, started on first use."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = Executor(node=node or f"awaken@{socket.gethostname()}",
                                 prepare_all=True)
        return _executor


def current_executor() -> Executor | None:
    return _executor
