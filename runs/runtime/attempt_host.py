"""The worker's host of one attempt: the ``Host`` interface (``runs.runtime.host``) made real.

One is made for each attempt the executor runs. It holds what the host side knows of the
attempt (its registry entry, its view of the run as claimed, its activity writer) and
reaches the process's shared parts through the executor's public attributes: the loop's
database threads, the tool threads, the children, the provider client.

A committed step is not written at once: it waits (``pending_step``) until something
needs it durable or may act on the world (the next step's start, a tool, a pause, a
child, a wait for the inbox or for children), or ``STEP_DELAY`` has passed, whichever
comes first. The agent's last step is so written with its end, in the end's transaction
(``runs.domain.attempt_finish``). Until it is written, the context's usage and the loop
guard's counts are what the write will give (``runs.domain.attempts.step_totals``).
"""

import asyncio
import json

from django.utils import timezone

from runs import domain
from runs.changes.publishing import publish_output
from runs.domain import selectors
from runs.domain.actions import action_digest
from runs.domain.attempts import step_totals
from runs.domain.errors import Fenced
from runs.runtime.activity_writer import ActivityWriter
from runs.runtime.agent import BudgetExceeded, Context, Paused
from runs.runtime.registry import Entry
from runs.runtime.token import Why


class AttemptHost:
    # How long a committed step may wait to be written, at most. An agent that ends with a
    # step returns from it within a few milliseconds, so its last step goes with its end;
    # one that computes on for longer has its step written by then. A tenth of a second is
    # short beside the lease and the time anyone watching sees, and a step lost to a crash
    # within it is redone by the next attempt, like one the crash came just before.
    STEP_DELAY = 0.1

    def __init__(self, executor, entry: Entry, view):
        self.executor = executor
        self.entry = entry
        self.view = view  # runs.domain.selectors.AttemptView: the run as claimed
        self.db = executor.worker_loop.db
        self.activity_log = ActivityWriter(run_id=entry.run_id, generation=entry.generation,
                                           db=self.db)
        self.output_per_second = executor.output_per_second
        self.repeats = dict(view.repeats or {})  # committed tool calls by digest
        self.delivered = None  # the inbox item taken since the last step: its sender
        self.pending_step: dict | None = None  # attempt_step's arguments, not written yet
        self._step_ctx = None  # the context of the pending step
        self._step_timer: asyncio.TimerHandle | None = None
        self._step_write: asyncio.Future | None = None  # the last write begun

    # --- steps -----------------------------------------------------------------------

    async def before_step(self, ctx: Context) -> None:
        ctx.check()
        await self.step_written()
        if self.entry.pause_requested.is_set():
            await self.pause(ctx, reason="manual_pause", prompt=None,
                             source=self.entry.pause_source)
            raise Paused()
        view = self.view
        if view.max_steps is not None and ctx.usage["steps"] >= view.max_steps:
            raise BudgetExceeded("max_steps", f"Step budget of {view.max_steps} reached.")
        if view.max_tokens is not None and ctx.usage["tokens"] >= view.max_tokens:
            raise BudgetExceeded("max_tokens", f"Token budget of {view.max_tokens} reached.")
        cost = ctx.usage.get("cost_usd")
        if view.max_cost_usd is not None and cost is not None and cost >= view.max_cost_usd:
            raise BudgetExceeded("max_cost", f"Cost budget of ${view.max_cost_usd:g} reached "
                                             f"(${cost:.6g} spent).")

    def before_tool(self, ctx: Context, tool: str, arguments, pending: dict) -> str:
        """The loop guard: the digest of a call of ``tool`` with ``arguments``; raise
        ``BudgetExceeded`` (code ``max_repeats``) if the run's committed calls of that digest,
        with the step's own (``pending``), would be more than ``max_repeats``."""
        digest = action_digest(tool, arguments)
        limit = self.view.max_repeats
        if limit is not None and self.repeats.get(digest, 0) + pending.get(digest, 0) >= limit:
            raise BudgetExceeded("max_repeats", f"The tool {tool} was called with the same "
                                                f"arguments {limit} time(s) already (loop "
                                                f"guard: max_repeats {limit}).", digest=digest)
        return digest

    async def commit_step(self, ctx: Context, *, tokens: int, data: dict | None = None) -> None:
        """Take the step, to be written at the next boundary or after ``STEP_DELAY``
        (``step_written``), or with the end; ``ctx.usage`` and the loop guard's counts are
        set at once to what its write gives."""
        await self.step_written()  # one step waits at most
        # The state and the event's data as they are now, not as the agent may change them
        # before the write: their JSON, which is what is stored (what is not JSON fails
        # here, as it did when the step was written at once).
        state, data = json.loads(json.dumps([ctx.state, data]))
        delivered, self.delivered = self.delivered, None
        view = self.view
        usage = ctx.usage or {}
        totals = step_totals(steps=usage.get("steps") or 0, tokens=usage.get("tokens") or 0,
                             cost_usd=usage.get("cost_usd"), repeats=self.repeats,
                             max_repeats=view.max_repeats, step_tokens=tokens, data=data)
        self.pending_step = {"tokens": tokens, "agent_state": state, "data": data,
                             "actor": delivered.actor if delivered else None,
                             "source": (delivered and delivered.source) or "worker"}
        self._step_ctx = ctx
        self._step_timer = asyncio.get_running_loop().call_later(self.STEP_DELAY,
                                                                 self._write_pending)
        ctx.usage = {"steps": totals.steps, "tokens": totals.tokens,
                     "cost_usd": totals.cost_usd}
        if totals.repeats is not None:
            self.repeats = totals.repeats

    async def step_written(self) -> None:
        """Write the pending step now, if there is one, and wait for the write begun last.
        A step refused (the attempt is not the live one any more) cancels the token
        (``fenced``) and raises ``Fenced``, here and at every later call."""
        self._write_pending()
        if self._step_write is not None:
            await asyncio.shield(self._step_write)

    async def last_step(self) -> dict | None:
        """The pending step for the end's transaction to write (``attempt_finish``'s
        ``step``), or None, once the write begun last is done (``Fenced`` if it was
        refused). It stays pending, no more on a delay, until ``step_ended`` says the end
        took it, or ``step_written`` writes it alone."""
        if self._step_timer is not None:
            self._step_timer.cancel()  # first: no write of it alone begins while we wait
        if self._step_write is not None:
            await asyncio.shield(self._step_write)
        return self.pending_step

    def step_ended(self) -> None:
        """The end's transaction took the pending step (written, or refused with it)."""
        self.pending_step = self._step_ctx = None

    def _write_pending(self) -> None:
        """Begin the pending step's write (at a boundary, or once ``STEP_DELAY`` is up). A
        refusal is kept for the next ``step_written``, which raises it; the token is
        cancelled at once, so the agent stops at its next wait."""
        if self.pending_step is None:
            return
        request, self.pending_step = self.pending_step, None
        # The context goes with the step, not kept here: it holds this host (a cycle, which
        # would keep the agent's state, its last answer among it, until a full collection).
        ctx, self._step_ctx = self._step_ctx, None
        self._step_timer.cancel()
        self._step_write = asyncio.ensure_future(self._write_step(ctx, request))
        self._step_write.add_done_callback(_retrieved)

    async def _write_step(self, ctx: Context, request: dict) -> None:
        try:
            noted = await self.activity_log.taken()  # written with the step
            run = await self.db(domain.attempt_step, run_id=ctx.run_id,
                                generation=ctx.generation, **request, activity=noted)
        except Fenced:
            ctx.token.cancel(Why("fenced"))
            raise
        if self.pending_step is None:  # no newer step taken meanwhile: the committed figures
            ctx.usage = {"steps": run.steps, "tokens": run.tokens, "cost_usd": run.cost_usd}
            self.repeats = dict(run.repeats or {})

    async def fence(self, ctx: Context) -> None:
        await self.step_written()  # before a tool runs, the step before it is durable
        intent = await self.db(selectors.pending_request, run_id=ctx.run_id)
        if intent is not None:
            ctx.token.cancel(Why("command", actor=intent.requested_by, source=intent.source,
                                 at=timezone.now()))

    # --- pauses and the live inbox ---------------------------------------------------------

    async def pause(self, ctx: Context, *, reason: str, prompt, schema=None, action=None,
                    source: str | None = None) -> None:
        """Pause the run: asked by the agent (``wait_for_input``: the worker's doing), or
        an operator's pause taken at a step boundary, in that operator's name and source."""
        await self.step_written()
        ticket = await self.db(domain.attempt_pause, run_id=ctx.run_id,
                               generation=ctx.generation, reason=reason, prompt=prompt,
                               schema=schema, action=action, agent_state=ctx.state,
                               actor=self.entry.pause_actor if source else None,
                               source=source or "worker",
                               activity=await self.activity_log.taken())
        why = ctx.token.why
        if ticket is not None and why is not None and why.kind == "command":
            # A live-only cancel (no intent) taken while the pause committed: the run is
            # awaiting now, so the cancel goes the durable path instead of being lost.
            await self.db(domain.run_cancel, run_id=ctx.run_id, actor=why.actor or "worker",
                          source=why.source or "worker")

    async def receive(self, ctx: Context):
        """The next inbox item of the attempt: a message, or None for a wake. Waits for one,
        racing the token; a pause asked meanwhile is taken here, as at a step boundary."""
        await self.step_written()
        entry = self.entry
        while True:
            if entry.pause_requested.is_set():
                await self.before_step(ctx)
            item = entry.take()
            if item is not None:
                self.delivered = item  # the step it leads to names its sender
                return item.message
            await ctx.race(entry.arrival())

    def take_inbox(self, ctx: Context) -> list:
        taken = []
        while (item := self.entry.take()) is not None:
            if item.message is not None:
                taken.append(item.message)
        return taken

    # --- the activity log --------------------------------------------------------------

    def activity(self, ctx: Context, entry: dict) -> None:
        self.activity_log.add(entry)
        self.entry.trace.activity(entry)  # a model or tool call is a span of the attempt's

    # --- child runs --------------------------------------------------------------------

    async def spawn(self, ctx: Context, agent: str, input: dict):
        await self.step_written()
        return await self.executor.children.spawn(
            parent_id=ctx.run_id, parent_generation=ctx.generation, token=ctx.token,
            agent=agent, input=input, traceparent=self.entry.trace.traceparent)

    async def wait_children(self, ctx: Context) -> list[dict]:
        await self.step_written()
        return await self.executor.children.wait(parent_id=ctx.run_id,
                                                 parent_generation=ctx.generation)

    # --- the model provider and live output ------------------------------------------------

    @property
    def provider(self):
        return self.executor.provider

    def publish_output(self, run_id: str, text: str) -> None:
        """Push a live output message of the attempt to the sockets of its run."""
        publish_output(run_id=run_id, text=text)

    # --- blocking tools ----------------------------------------------------------------

    async def run_sync_tool(self, fn, *args, **kwargs):
        await self.step_written()
        return await self.executor.tool_threads.run(fn, *args, **kwargs)


def _retrieved(write: asyncio.Future) -> None:
    """A step's write that was refused: its ``Fenced`` is raised at the next boundary, if
    the agent reaches one (the token is cancelled already), so the loop need not report
    it as never retrieved."""
    if not write.cancelled():
        write.exception()
