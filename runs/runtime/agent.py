"""The agent interface: what an agent's code sees of its run.

An agent is an async ``run(ctx)`` that returns the run's output. Its work is a series of
steps; each ``async with ctx.step():`` is a checkpoint committed with ``ctx.state``, and a
later attempt (after a resume or a crash) starts ``run`` again with that state, so agents
skip what their state says is done. Every wait goes through the context, which races it
against the attempt's cancellation token: a model call (``chat``), a tool, a child, a sleep.
"""

import asyncio
import inspect
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from runs.domain.actions import action_digest
from runs.domain.catalogue import register
from runs.domain.receipts import Trace
from runs.domain.text import clipped
from runs.providers.client import ProviderError, Reply, ToolCall
from runs.providers.metering import Meter
from runs.runtime.host import Host
from runs.runtime.output import LiveOutput, OutputStream
from runs.runtime.token import CancellationToken, Why
from runs.runtime.tools import Tool, Toolbox, as_tool, tool

__all__ = ["Agent", "BudgetExceeded", "Context", "Decision", "Interrupted", "Paused",
           "ProviderError", "Reply", "Tool", "register", "tool"]

RECORDED_TEXT = 16_000  # characters of a reply or of tool arguments kept in a step's event


class Interrupted(Exception):
    """The attempt's token was cancelled: unwind now, commit nothing of your own."""

    def __init__(self, why: Why | None):
        super().__init__(why.kind if why else "cancelled")
        self.why = why


class Paused(Exception):
    """The run moved to ``awaiting``; this attempt is over."""


@dataclass(frozen=True)
class Decision:
    """A person's decision on one tool call (``Context.approval``)."""

    approved: bool
    arguments: dict  # the ones to run: the edited ones if edited, else those asked for
    edited: bool
    reason: str | None  # why, as the decider said (a refusal's reason, most often)
    actor: str | None  # who decided


class BudgetExceeded(Exception):
    """A budget of the run is reached (``code``: its stop code); ``digest``: the repeated
    call, for the loop guard. The host stops or pauses the run, as the run asked."""

    def __init__(self, code: str, reason: str, digest: str | None = None):
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.digest = digest


class Agent:
    """Subclass, give it a ``name`` and an async ``run(ctx)``; register with ``@register``
    (``runs.domain.catalogue.register``, re-exported here for agent authors).

    The new-run form shows the agent's ``description`` (by default the first paragraph of
    the class's own docstring) and offers its ``example``, an input it runs with."""

    name: str = ""
    description: str = ""
    example: dict | None = None

    async def run(self, ctx: "Context") -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    @classmethod
    def prepare(cls) -> None:
        """Called once in each worker process before the agent's first attempt there, on a
        thread of its own: not on the worker's loop, which every attempt of the process
        shares. Import and make here what is slow and synchronous (a framework, a model's
        client, a compiled graph), so that no other attempt waits on it. The agent's
        attempts wait for it, and a cancel ends them meanwhile; if it raises, the attempt
        fails with its error, and the next attempt calls it again."""


class Context:
    """One attempt's view of its run. Created by the executor; agents only use it.

    Everything that needs the world outside the agent goes through ``host``, the
    interface of ``runs.runtime.host``; the context adds the racing of every wait against
    ``token``, step bookkeeping and the recording of model calls and tools.
    """

    def __init__(self, *, run_id, generation: int, input: dict, state: dict | None,
                 resume: tuple[str, Any] | None, token: CancellationToken, host: "Host",
                 usage: dict | None = None):
        self.run_id = run_id
        self.generation = generation
        self.input = input
        self.state: dict = dict(state or {})
        self.token = token
        # The run's steps, tokens and cost as last committed: set by the host at each commit.
        self.usage: dict | None = usage
        # The resume this attempt follows (runs.domain.selectors.Resumed: the ticket's
        # reason, the resume input, the action and who decided), until it is taken.
        self._resume = resume
        self._host = host
        self._step_tokens = 0
        self._step_data: dict = {}  # what the step's event records: replies, tool calls
        self._step_calls: dict = {}  # the step's tool calls by digest, for the loop guard
        self._output: LiveOutput | None = None
        # For the stop receipt: the attempt's provider connections and chunks (recorded by
        # the provider's transport), its tool calls in flight and those refused.
        self.meter = Meter()
        self._in_flight: dict[int, dict] = {}
        self._tool_starts: dict[int, tuple] = {}  # calls started: their record, when
        self._refused = 0
        self._tool_keys = itertools.count()

    # --- the activity log ----------------------------------------------------------------

    def log(self, text: str, **data) -> None:
        """Write a line to the run's activity log, shown live on its page (``data``: a few
        small JSON fields to go with it). Not committed with a step: kept even if the step
        is not, and never read back by the run."""
        self.record_activity("log", text=str(text), data=data or None)

    def progress(self, done: int, total: int | None = None, text: str = "") -> None:
        """Say how far the run is: the page shows "step ``done`` of ``total``"."""
        self.record_activity("progress", text=text,
                       data={"done": int(done), "total": None if total is None else int(total)})

    def record_activity(self, kind: str, **entry) -> None:
        """Hand an entry of ``kind`` (log, progress, step, model, tool, error) to the host
        for the run's activity log, stamped now unless ``entry`` has its own ``at``."""
        self._host.activity(self, {"kind": kind, "at": _now(), **entry})

    # --- steps -----------------------------------------------------------------------

    @asynccontextmanager
    async def step(self):
        """One step: checks cancel, pause and budgets before it starts; commits on exit,
        with the replies and tool calls it made in its event."""
        await self._host.before_step(self)
        self._step_tokens = 0
        self._step_data = {}
        self._step_calls = {}
        started, at = time.perf_counter(), _now()
        yield
        self.check()
        await self._host.commit_step(self, tokens=self._step_tokens,
                                     data=self._step_data or None)
        self._resume = None  # a resume reaches the agent until its next committed step
        steps = (self.usage or {}).get("steps")
        self.record_activity("step", at=at, text=f"step {steps}" if steps else "step",
                       ms=(time.perf_counter() - started) * 1000, tokens=self._step_tokens)

    # --- waits, each raced against the token --------------------------------------------

    async def infer(self, call: Awaitable | Callable[[], Awaitable], *, tokens: int = 0):
        """Await a model call; ``tokens`` (or the result's ``tokens`` attribute) is counted."""
        started, at = time.perf_counter(), _now()
        try:
            result = await self.race(call() if callable(call) else call)
        except Interrupted:
            self.model_cancelled("inference", at=at, started=started, chunks=None)
            raise
        used = getattr(result, "tokens", None) or tokens
        self._step_tokens += used
        self.record_activity("model", at=at, text=getattr(result, "model", None) or "inference",
                       ms=(time.perf_counter() - started) * 1000, tokens=used)
        return result

    def model_call(self, *, model: str, ms: float, prompt_tokens: int | None,
                   completion_tokens: int | None, at=None, data: dict | None = None) -> None:
        """Count a model call a framework made on its own (``runs.agents.*``), with the
        tokens the provider reported (None: it reported none): they go into the step's
        usage (and so toward ``max_tokens``), the call into the step's event ``replies``
        (so it is priced into ``cost_usd``, or makes the cost unknown, as ``chat``'s), and
        an activity entry of kind ``model`` is recorded with its duration."""
        tokens = int(prompt_tokens or 0) + int(completion_tokens or 0)
        self._step_tokens += tokens
        reply: dict = {"model": model or "model", "ms": round(ms, 2), **(data or {})}
        if prompt_tokens is not None or completion_tokens is not None:
            reply["usage"] = {"prompt": int(prompt_tokens or 0),
                              "completion": int(completion_tokens or 0)}
        self._step_data.setdefault("replies", []).append(reply)
        self.record_activity("model", **({"at": at} if at else {}), text=model or "model",
                             ms=ms, tokens=tokens, data={
                                 **(data or {}),
                                 **_token_split(prompt_tokens, completion_tokens)} or None)

    def model_cancelled(self, model: str, *, at, started: float, chunks: int | None) -> None:
        """A model call the attempt was stopped in the middle of, for the run's trace: the
        time from its start (``at``, and ``started`` on ``time.perf_counter``) until the
        abort and, streamed, the tokens (chunks) received by then, counted from ``chunks``,
        the attempt's ``meter.received`` when it started. They count toward no step: the
        step they were for does not commit. ``chat`` and ``infer`` record their own; an
        adapter whose framework makes its own model calls records them so."""
        received = None if chunks is None else max(0, self.meter.received - chunks)
        self.record_activity("model", at=at, text=model or "model",
                             ms=(time.perf_counter() - started) * 1000, tokens=received,
                             data={"cancelled": True, "finish_reason": "cancelled",
                                   **({} if received is None else {"received": received})})

    def model_name(self, name: str | None = None) -> str:
        """``name``, or the configured provider's default model (AWAKEN_PROVIDER_MODEL)."""
        return name or self._host.provider.config.model

    def provider_client(self):
        """The OpenAI SDK client of the configured provider, metered and closed like our own
        calls (``runs.providers.client.ChatClient.openai_client``): for the adapters."""
        return self._host.provider.openai_client()

    async def chat(self, messages: Iterable[dict], *, model: str | None = None,
                   tools: Iterable | None = None, stream: bool = True,
                   timeout: float | None = None, **params) -> Reply:
        """Ask the model (an OpenAI-compatible provider, see ``runs.providers.client``).

        Streamed, its text goes to the run's page as it arrives. The call races the token:
        a cancel closes its connection at once and drops the partial answer. Its tokens,
        as the provider counts them, go into the step's usage, and the answer into the
        step's event when the step commits. ``tools``: functions, ``Tool``s or spec dicts.
        """
        self.check()
        specs = [item if isinstance(item, dict) else as_tool(item).spec()
                 for item in tools or ()]
        live = self.output_stream() if stream else None
        at, started, chunks = _now(), time.perf_counter(), self.meter.received
        call = self._host.provider.chat(
            messages, model=model, tools=specs or None, stream=stream, timeout=timeout,
            on_delta=live.write if live else None,
            on_retry=(lambda tries, delay: live.restart()) if live else None, **params)
        try:
            reply = await self.race(call)
        except BaseException as error:
            if live is not None:
                live.close(keep=False)
            # Interrupted here, or cancelled from above (a LangGraph node's task): a stop.
            if isinstance(error, Interrupted) or self.token.cancelled:
                self.model_cancelled(self.model_name(model), at=at, started=started,
                                     chunks=chunks)
            raise
        if live is not None:
            live.close(keep=True)
        self._step_tokens += reply.tokens
        self._step_data.setdefault("replies", []).append(_reply_record(reply))
        self.record_activity("model", at=at, text=reply.model or model or "model",
                       ms=reply.seconds * 1000, tokens=reply.tokens, data={
                           "finish_reason": reply.finish_reason, "tries": reply.tries,
                           **(_token_split(reply.usage.prompt_tokens,
                                           reply.usage.completion_tokens)
                              if reply.usage is not None else {}),
                           **({"tools": [call.name for call in reply.tool_calls]}
                              if reply.tool_calls else {})})
        return reply

    async def converse(self, messages: Iterable[dict], *, tools: Iterable = (),
                       model: str | None = None, key: str = "conversation",
                       max_rounds: int = 10, **params) -> str:
        """Chat until the model answers without asking for a tool; returns that answer.

        Each round is a step: one model call, then the tools it asks for (run together,
        each timed and recorded in the step's event), whose results go back to the model
        in the next round. A tool that raises sends its error to the model instead. The
        conversation is kept in ``ctx.state[key]``, so a later attempt goes on from the
        last committed round; ``messages`` only starts it.

        A tool made with ``requires_approval=True`` runs only once a person approves the
        call (``approval``): a reply that asks for one commits with its step, calls
        unanswered, and the next step asks; the run waits in ``awaiting`` without asking
        the model again. Approved, the call runs with the decided (maybe edited)
        arguments; refused, the model gets ``refused: <reason>`` as its result and the
        conversation goes on.
        """
        toolbox = Toolbox(tools)
        conversation = list(self.state.get(key) or [dict(message) for message in messages])
        rounds = 0
        while not _answered(conversation):
            if rounds >= max_rounds:
                raise RuntimeError(f"The model still asked for tools after {max_rounds} "
                                   "rounds.")
            rounds += 1
            async with self.step():
                if _unanswered(conversation):  # the calls of a committed reply
                    conversation = await self._answer_calls(toolbox, conversation, key)
                reply = await self.chat(conversation, model=model,
                                        tools=toolbox.tools or None, **params)
                conversation = [*conversation, reply.message]
                self.state[key] = conversation
                if not any(_needs_approval(toolbox, call) for call in reply.tool_calls):
                    conversation = await self._answer_calls(toolbox, conversation, key)
                # else the reply commits with this step, its calls unanswered: the next
                # step asks for their approval (a pause there is a checkpoint after it).
        return conversation[-1].get("content") or ""

    async def _answer_calls(self, toolbox: Toolbox, conversation: list[dict],
                            key: str) -> list[dict]:
        """The conversation with the results of the last reply's calls not answered yet.
        Calls that need approval go first, one at a time, each result kept in
        ``ctx.state[key]`` at once: a pause for the next approval commits it with the
        ticket, so a decided call is not asked about again. The others run together."""
        calls = _unanswered(conversation)

        def answered(call, result):
            return {"role": "tool", "tool_call_id": call.id, "content": result}

        for call in calls:
            if _needs_approval(toolbox, call):
                result = await self._approved_call(toolbox, call)
                conversation = [*conversation, answered(call, result)]
                self.state[key] = conversation
        rest = [call for call in calls if not _needs_approval(toolbox, call)]
        results = await asyncio.gather(*(self._tool_call(toolbox, call) for call in rest),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        conversation = [*conversation, *(answered(call, result)
                                         for call, result in zip(rest, results, strict=True))]
        self.state[key] = conversation
        return conversation

    async def _approved_call(self, toolbox: Toolbox, call: ToolCall) -> str:
        """A call of a tool that needs approval: run with the decided arguments once
        approved (or edited); a refusal is sent to the model as ``refused: <reason>``."""
        try:
            arguments = call.parsed()
        except ValueError:  # nothing to approve: the model is told, as for any tool
            return await self._tool_call(toolbox, call)
        decision = await self.approval(call.name, arguments)
        if not decision.approved:
            self._step_data.setdefault("tools", []).append({
                "name": call.name, "call_id": call.id, "ok": False, "ms": 0.0,
                "refused": True, **({"error": decision.reason} if decision.reason else {})})
            return f"refused: {decision.reason or 'no reason given'}"
        return await self._tool_call(toolbox, call, arguments=decision.arguments)

    def output_stream(self) -> OutputStream:
        """The live output of one model call (``runs.runtime.output``): ``write`` its text
        as it arrives and it goes to the run's page; ``close(keep=True)`` once the call
        answered, ``close(keep=False)`` if it failed or was cancelled. ``chat`` opens one
        per call; an adapter whose framework streams its model calls opens one the same
        way. Nothing is pushed once the token is cancelled."""
        return self._live_output().open()

    async def tool(self, fn: Callable, *args, **kwargs):
        """Call a tool: async ones are awaited, sync ones run in a thread; both are abandoned
        if the attempt is cancelled first (a thread cannot be killed, only left behind).
        The call and its duration are recorded in the step's event."""
        return await self._timed(fn, args, kwargs, name=getattr(fn, "__name__", str(fn)))

    async def start_tool(self, name: str, arguments, *, call_id: str | None = None) -> int:
        """Before any tool call that goes through the host (``tool``, the tool loop of
        ``converse``, an adapter's framework), in this order:

        * the fence: refused (``Interrupted``, counted on the stop receipt, the tool never
          runs) once a cancel or stop of the run is asked, whether its live signal has
          cancelled the token yet or only the request is committed (the host checks);
        * the loop guard: ``BudgetExceeded`` (``max_repeats``) when the run's calls of
          this tool with these arguments (one action digest) would be more than the limit.

        Else the call is counted in the step (its event records it, with its digest) and
        is in flight until ``end_tool``: a key for it."""
        if not self.token.cancelled:
            await self._host.fence(self)
        if self.token.cancelled:
            self._refused += 1
            self.record_activity("tool", text=name, data={"ok": False, "refused": True})
            raise Interrupted(self.token.why)
        digest = self._host.before_tool(self, name, _json_safe(arguments), self._step_calls)
        self._step_calls[digest] = self._step_calls.get(digest, 0) + 1
        key = next(self._tool_keys)
        self._in_flight[key] = {"tool": name, "digest": digest}
        self._tool_starts[key] = ({"name": name, **({"call_id": call_id} if call_id else {}),
                                   "digest": digest}, time.perf_counter(), _now())
        return key

    def end_tool(self, key: int, *, error: str | None = None, stopped: bool = False,
                 data: dict | None = None) -> None:
        """The call ``key`` returned, or failed with ``error``: recorded in the step's event
        (name, call id, digest, duration, ``ok``, error) and in the activity log (with
        ``data``). With ``stopped`` it was abandoned by the stop: it stays in flight on the
        receipt and is not recorded (its step does not commit)."""
        started = self._tool_starts.pop(key, None)
        if stopped or started is None:
            return
        self._in_flight.pop(key, None)
        record, began, at = started
        record = {**record, "ok": error is None,
                  **({"error": _capped(error, 500)[0]} if error is not None else {}),
                  "ms": round((time.perf_counter() - began) * 1000, 2)}
        self._step_data.setdefault("tools", []).append(record)
        self.record_activity("tool", at=at, text=record["name"], ms=record["ms"], data={
            "ok": record["ok"], **({"error": record["error"]} if "error" in record else {}),
            **({"call_id": record["call_id"]} if "call_id" in record else {}),
            **(data or {})})

    def inbox(self) -> list:
        """The messages waiting in the live inbox now, taken (wakes dropped); never waits.
        The adapters hand them to their framework before its next model call."""
        return self._host.take_inbox(self)

    def stop_trace(self) -> Trace:
        """What the stop receipt is made of (``runs.domain.receipts``)."""
        return Trace(connections=[tuple(c) for c in self.meter.connections],
                     chunk_times=list(self.meter.chunk_times),
                     tools_in_flight=list(self._in_flight.values()),
                     tools_refused=self._refused, stopped_at=self.token.cancelled_at)

    async def _timed(self, fn: Callable, args, kwargs, *, name: str, call_id=None):
        key = await self.start_tool(name, {"args": list(args), **kwargs} if args else kwargs,
                                    call_id=call_id)
        try:
            if inspect.iscoroutinefunction(fn):
                result = await self.race(fn(*args, **kwargs))
            else:
                result = await self.race(self._host.run_sync_tool(fn, *args, **kwargs))
        except BaseException as error:
            stopped = isinstance(error, Interrupted) or self.token.cancelled
            self.end_tool(key, stopped=stopped,
                          error=None if stopped else f"{type(error).__name__}: {error}")
            raise
        self.end_tool(key)
        return result

    async def _tool_call(self, toolbox: Toolbox, call: ToolCall, *,
                         arguments: dict | None = None) -> str:
        """Run one tool the model asked for (with ``arguments`` instead of the model's, when
        given: an approval's edited ones); its result (or error) as the text to send."""
        found = toolbox.get(call.name)
        try:
            if found is None:
                raise LookupError(f"no tool is named {call.name!r}")
            arguments = call.parsed() if arguments is None else arguments
        except (LookupError, ValueError) as error:
            self._step_data.setdefault("tools", []).append({
                "name": call.name, "call_id": call.id, "ok": False, "ms": 0.0,
                "error": _capped(str(error), 500)[0]})
            return f"error: {error}"
        try:
            result = await self._timed(found.fn, (), arguments, name=found.name,
                                       call_id=call.id)
        except (Interrupted, BudgetExceeded):
            raise
        except Exception as error:
            return f"error: {type(error).__name__}: {error}"
        return result if isinstance(result, str) else json.dumps(result, default=str)

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
        except asyncio.CancelledError:
            # The task racing was cancelled itself (a framework cancelling the task that
            # runs a node, say): the work goes with it, never left running on its own.
            work.cancel()
            raise
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
        """The next message sent to this attempt's live inbox (the live command
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
        resumed = self._resume
        if resumed is not None and resumed.reason == reason and resumed.action is None:
            self._resume = None
            return resumed.input
        await self._host.pause(self, reason=reason, prompt=prompt, schema=schema)
        raise Paused()

    async def approval(self, tool: str, arguments: dict, *,
                       rationale: str | None = None) -> Decision:
        """A person's decision on one call of ``tool`` with ``arguments``, before it runs.

        After a resume of the approval ticket of this exact call (same digest,
        ``runs.domain.actions.action_digest``), returns its decision: approved, edited
        (``Decision.arguments`` are then the edited ones, the ones to run) or refused with
        a reason; every attempt until the next committed step gets it, so a crash after
        the decision does not ask again. Otherwise the run moves to ``awaiting`` with an
        approval ticket bound to this call (its ``action``: tool, arguments, digest and
        ``rationale``) and the attempt ends (Paused). A decision never applies to another
        call: asked for other arguments, it pauses with a new ticket.
        """
        self.check()
        digest = action_digest(tool, arguments)
        resumed = self._resume
        if (resumed is not None and resumed.reason == "approval" and resumed.action
                and resumed.action.get("digest") == digest):
            self._resume = None
            value = resumed.input if isinstance(resumed.input, dict) else {}
            approved = value.get("approved") is True
            return Decision(approved=approved,
                            arguments=value.get("arguments", arguments) if approved
                            else arguments,
                            edited=approved and "arguments" in value,
                            reason=value.get("reason"), actor=resumed.actor)
        await self._host.pause(self, reason="approval", prompt=rationale, schema=None,
                               action={"tool": tool, "arguments": arguments,
                                       "rationale": rationale})
        raise Paused()

    # --- children ------------------------------------------------------------------------

    async def spawn(self, agent: str, input: dict | None = None):
        """Start a child run in this process under a child token; returns its run id."""
        self.check()
        return await self._host.spawn(self, agent, input or {})

    async def wait_children(self) -> list[dict]:
        """Wait for every child started by this attempt; returns their committed ends."""
        return await self.race(self._host.wait_children(self))

    def check(self) -> None:
        """Raise ``Interrupted`` now if the attempt's token is cancelled."""
        if self.token.cancelled:
            raise Interrupted(self.token.why)

    def _live_output(self) -> LiveOutput:
        if self._output is None:
            self._output = LiveOutput(run_id=self.run_id, generation=self.generation,
                                      token=self.token, publish=self._host.publish_output,
                                      per_second=self._host.output_per_second)
        return self._output


def _now():
    return datetime.now(UTC)


def _token_split(input_tokens: int | None, output_tokens: int | None) -> dict:
    """A model call's input and output tokens, as its activity entry records them."""
    return {key: int(value) for key, value in (("input_tokens", input_tokens),
                                               ("output_tokens", output_tokens))
            if value is not None}


def _json_safe(arguments):
    """A call's arguments as JSON can hold them: those that are not JSON as text."""
    try:
        action_digest("", arguments)
        return arguments
    except (TypeError, ValueError):
        return json.loads(json.dumps(arguments, default=repr))


def _answered(conversation: list[dict]) -> bool:
    last = conversation[-1] if conversation else {}
    return last.get("role") == "assistant" and not last.get("tool_calls")


def _unanswered(conversation: list[dict]) -> list[ToolCall]:
    """The calls of the conversation's last reply that have no result in it yet."""
    for index in range(len(conversation) - 1, -1, -1):
        message = conversation[index]
        if message.get("role") == "assistant":
            done = {later.get("tool_call_id") for later in conversation[index + 1:]
                    if later.get("role") == "tool"}
            return [ToolCall(call.get("id"), (call.get("function") or {}).get("name", ""),
                             (call.get("function") or {}).get("arguments") or "{}")
                    for call in message.get("tool_calls") or () if call.get("id") not in done]
        if message.get("role") != "tool":
            return []
    return []


def _needs_approval(toolbox: Toolbox, call: ToolCall) -> bool:
    found = toolbox.get(call.name)
    return found is not None and found.requires_approval


def _capped(text: str, limit: int = RECORDED_TEXT) -> tuple[str, bool]:
    cut = clipped(text, limit)
    return cut, cut is not text


def _reply_record(reply: Reply) -> dict:
    """A reply as its step's event records it: the final message and what it cost."""
    content, cut = _capped(reply.content)
    record: dict = {"model": reply.model, "content": content,
                    "finish_reason": reply.finish_reason, "tries": reply.tries,
                    "ms": round(reply.seconds * 1000, 2)}
    if reply.usage is not None:
        record["usage"] = {"prompt": reply.usage.prompt_tokens,
                           "completion": reply.usage.completion_tokens}
    if reply.tool_calls:
        calls = []
        for call in reply.tool_calls:
            arguments, clipped = _capped(call.arguments)
            cut = cut or clipped
            calls.append({"id": call.id, "name": call.name, "arguments": arguments})
        record["tool_calls"] = calls
    if cut:
        record["truncated"] = True
    return record

