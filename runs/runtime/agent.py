"""The agent interface: what an agent's code sees of its run.

An agent is an async ``run(ctx)`` that returns the run's output. Its work is a series of
steps; each ``async with ctx.step():`` is a checkpoint committed with ``ctx.state``, and a
later attempt (after a resume or a crash) starts ``run`` again with that state, so agents
skip what their state says is done. Every wait goes through the context, which races it
against the attempt's cancellation token.
"""

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from runs.domain.catalogue import register
from runs.runtime.token import CancellationToken, Why

__all__ = ["Agent", "BudgetExceeded", "Context", "Interrupted", "Paused", "register"]


class Interrupted(Exception):
    """The attempt's token was cancelled: unwind now, commit nothing of your own."""

    def __init__(self, why: Why | None):
        super().__init__(why.kind if why else "cancelled")
        self.why = why


class Paused(Exception):
    """The run moved to ``awaiting``; this attempt is over."""


class BudgetExceeded(Exception):
    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


class Agent:
    """Subclass, give it a ``name`` and an async ``run(ctx)``; register with ``@register``
    (``runs.domain.catalogue.register``, re-exported here for agent authors)."""

    name: str = ""

    async def run(self, ctx: "Context") -> Any:  # pragma: no cover - interface
        raise NotImplementedError


class Context:
    """One attempt's view of its run. Created by the executor; agents only use it."""

    def __init__(self, *, run_id, generation: int, input: dict, state: dict | None,
                 resume: tuple[str, Any] | None, token: CancellationToken, host):
        self.run_id = run_id
        self.generation = generation
        self.input = input
        self.state: dict = dict(state or {})
        self.token = token
        self._resume = resume  # (ticket reason, resume input) when this attempt follows a resume
        self._host = host  # the executor's side: commits, pause signal, children, pools
        self._step_tokens = 0

    # --- steps -----------------------------------------------------------------------

    @asynccontextmanager
    async def step(self):
        """One step: checks cancel, pause and budgets before it starts; commits on exit."""
        await self._host.before_step(self)
        self._step_tokens = 0
        yield
        self._check()
        await self._host.commit_step(self, tokens=self._step_tokens)

    # --- waits, each raced against the token --------------------------------------------

    async def infer(self, call: Awaitable | Callable[[], Awaitable], *, tokens: int = 0):
        """Await a model call; ``tokens`` (or the result's ``tokens`` attribute) is counted."""
        result = await self.race(call() if callable(call) else call)
        self._step_tokens += getattr(result, "tokens", None) or tokens
        return result

    async def tool(self, fn: Callable, *args, **kwargs):
        """Call a tool: async ones are awaited, sync ones run in a thread; both are abandoned
        if the attempt is cancelled first (a thread cannot be killed, only left behind)."""
        if inspect.iscoroutinefunction(fn):
            return await self.race(fn(*args, **kwargs))
        return await self.race(self._host.run_sync_tool(fn, *args, **kwargs))

    async def race(self, awaitable: Awaitable):
        """The awaitable's result, or Interrupted as soon as the token is cancelled."""
        if self.token.cancelled:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never started, so never to be awaited
            raise Interrupted(self.token.why)
        work = asyncio.ensure_future(awaitable)
        cancelled = self.token.wait()
        try:
            await asyncio.wait({work, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not cancelled.done():
                cancelled.cancel()
        if work.done():
            return work.result()
        work.cancel()  # the loser; whatever it returns later is dropped
        raise Interrupted(self.token.why)

    async def sleep(self, seconds: float) -> None:
        await self.race(asyncio.sleep(seconds))

    # --- the live inbox ------------------------------------------------------------------

    async def receive(self):
        """The next message delivered to this attempt's live inbox (``deliver`` with
        ``message``), or None for a wake. Waits for one, racing the token; a pause asked
        meanwhile is taken here. The inbox is live: it is not kept across attempts."""
        return await self._host.receive(self)

    # --- pauses ------------------------------------------------------------------------

    async def wait_for_input(self, *, reason: str = "input", prompt: Any = None,
                             schema: dict | None = None):
        """Pause the run until someone resumes it with input; returns that input.

        The first call after a resume for the same reason returns the resume input; otherwise
        the run moves to ``awaiting`` with a ticket, and the attempt ends (Paused). With a
        ``schema`` (a JSON Schema), a resume whose input does not satisfy it is refused.
        """
        if self._resume is not None and self._resume[0] == reason:
            _, value = self._resume
            self._resume = None
            return value
        await self._host.pause(self, reason=reason, prompt=prompt, schema=schema)
        raise Paused()

    # --- children ------------------------------------------------------------------------

    async def spawn(self, agent: str, input: dict | None = None):
        """Start a child run in this process under a child token; returns its run id."""
        self._check()
        return await self._host.spawn(self, agent, input or {})

    async def wait_children(self) -> list[dict]:
        """Wait for every child started by this attempt; returns their committed ends."""
        return await self.race(self._host.wait_children(self))

    def _check(self) -> None:
        if self.token.cancelled:
            raise Interrupted(self.token.why)

