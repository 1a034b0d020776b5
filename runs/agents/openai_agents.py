"""OpenAI Agents SDK agents, controlled as ours: the one module that knows the SDK.

Wrap an agent you have and register it under a name::

    from agents import Agent, function_tool
    from runs.agents.openai_agents import wrap

    support = Agent(name="support", instructions="Answer in one line.",
                    tools=[function_tool(lookup_order)])
    wrap(support, name="shop.support")   # input: {"prompt": ..., "model"?: ...}

What the wrapper does, on the SDK's public API (``Runner.run_streamed``, ``RunConfig``,
``RunHooks``, ``OpenAIChatCompletionsModel``, the input list of ``to_input_list``,
``RunState``):

* the model is an ``OpenAIChatCompletionsModel`` on the configured provider, through the
  runtime's metered OpenAI client, whatever model the agent names (``input.model`` picks
  another of that provider); the SDK's tracing export is off (it would call OpenAI);
* each turn (one model call and the tools it asks for) is one ``Runner.run_streamed``
  with ``max_turns=1`` and one of our steps, committed with the run's input list; a later
  attempt goes on from it without asking the model again for a committed turn;
* the model's text streams to the run's page as it arrives (live output);
* the run races the attempt's token: on a cancel, stop, budget, lease loss or parent cancel
  the task driving the SDK is cancelled and the SDK's run with it (``cancel()``; its
  connection closes); nothing of the turn in progress is committed;
* tools pass the host's fence and loop guard (``on_tool_start``), model and tool calls are
  activity entries with durations and tokens (``max_tokens``);
* a ``needs_approval`` call is our approval ticket; approved with edited arguments, the
  agent's function tool runs with them and its output answers the call;
* messages posted to the live inbox join the input list as user messages before the next
  turn's model call.
"""

import time
from datetime import UTC, datetime

from runs.agents import BudgetExceeded, Context, Interrupted, demo_agents_enabled
from runs.agents.wrapping import FrameworkAgent, wrapped
from runs.providers.client import ChatClient

STATE_KEY = "openai_agents"
FRAMEWORK = {"framework": "openai-agents"}  # what its activity entries say of the framework


def wrap(agent, *, name: str, prompt=None, output=None, description: str = "",
         example: dict | None = None) -> type:
    """Register ``agent`` (an ``agents.Agent``, or a function that makes one, called once
    when first needed) as the awaken agent ``name``. ``prompt(input) -> str``: the user
    prompt from the run's input (default ``input["prompt"]``); ``output(final_output,
    items) -> JSON``: the run's output from the SDK's final output and the run's input
    list, each call in it with the arguments it ran with (an edited approval's), default
    ``{"text": str(final_output)}``; ``description`` and ``example`` as in
    ``runs.agents.pydantic_ai.wrap``. Returns the registered class."""

    return wrapped(OpenAIAgentsAgent, agent, name=name,
                   ready=lambda made: hasattr(made, "instructions"), prefix="OpenAIAgents",
                   description=description, example=example, prompt=prompt, output=output)


class OpenAIAgentsAgent(FrameworkAgent):
    modules = ("agents", "agents.models.openai_chatcompletions", *ChatClient.OPENAI_SDK)
    max_turns = 20

    @property
    def agent(self):  # the agents.Agent
        return self.framework_object()

    @staticmethod
    def prompt(input: dict) -> str:
        return str(input.get("prompt") or "")

    @staticmethod
    def output(value, items=()):
        return {"text": value if isinstance(value, str) else str(value)}

    async def run(self, ctx: Context):
        from agents import MaxTurnsExceeded, ModelSettings, RunConfig, RunState, ToolApprovalItem
        from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel

        state = ctx.state.get(STATE_KEY) or {}
        if "output" in state:
            return state["output"]
        items = list(state.get("input") or [{"role": "user", "content": self.prompt(ctx.input)}])
        # The calls approved with edited arguments, by call id: what ran, for ``output``.
        edited = dict(state.get("edited") or {})
        paused = None  # the SDK's RunState of a turn its tools' approvals interrupted
        if "run_state" in state:
            paused = await RunState.from_json(self.agent, state["run_state"])
        config = RunConfig(
            model=OpenAIChatCompletionsModel(model=ctx.model_name(ctx.input.get("model")),
                                             openai_client=ctx.provider_client()),
            # The provider's usage figures, which the SDK asks only of OpenAI's own API.
            model_settings=ModelSettings(include_usage=True),
            tracing_disabled=True)
        hooks = _hooks(ctx)
        for _ in range(self.max_turns):
            edits = await self._decide(ctx, paused) if paused is not None else []
            async with ctx.step():
                if paused is None:
                    items += [{"role": "user", "content": _text(message)}
                              for message in ctx.inbox()]
                for item, arguments in edits:  # edited approvals: run here, as approved
                    paused.reject(item, rejection_message=await _run_edited(
                        ctx, item, arguments))
                    edited[_call_id(item)] = arguments
                try:
                    result = await ctx.race(_turn(
                        ctx, self.agent, items if paused is None else paused,
                        run_config=config, hooks=hooks))
                except MaxTurnsExceeded as more:  # the turn ended with tools run: go on
                    data = more.run_data
                    start = data.input if isinstance(data.input, list) else [
                        {"role": "user", "content": data.input}]
                    items = [*start, *(item.to_input_item() for item in data.new_items
                                       if not isinstance(item, ToolApprovalItem))]
                    ctx.state[STATE_KEY] = {"input": _plain(items), "edited": edited}
                    paused = None
                    continue
                if result.interruptions:  # tools that need approval: committed, then asked
                    paused = result.to_state()
                    ctx.state[STATE_KEY] = {"input": _plain(items), "edited": edited,
                                            "run_state": paused.to_json()}
                    continue
                done = _plain(result.to_input_list())
                ctx.state[STATE_KEY] = {"input": done, "edited": edited, "output": self.output(
                    result.final_output, _as_run(done, edited))}
            return ctx.state[STATE_KEY]["output"]
        raise RuntimeError(f"The agent still asked for tools after {self.max_turns} turns.")

    async def _decide(self, ctx: Context, paused) -> list:
        """Each tool call the SDK holds for approval becomes our approval ticket, one at a
        time (``Context.approval``: the run awaits the decision), each decision kept in the
        run's state at once (a pause for the next does not ask it again). Approved, the
        call is approved in the SDK's state and the SDK runs it; refused, it is rejected
        with the reason, which the model is told. Edited: the edited call, which the step
        runs itself (``_run_edited``), with the item it answers."""
        state = ctx.state.get(STATE_KEY) or {}
        decided = dict(state.get("decided") or {})
        interruptions = paused.get_interruptions()
        for item in interruptions:
            key = _call_id(item)
            if key in decided:
                continue
            decision = await ctx.approval(item.tool_name or item.name,
                                          _arguments(item.arguments))
            decided[key] = {"approved": decision.approved, "edited": decision.edited,
                            "arguments": decision.arguments, "reason": decision.reason}
            ctx.state[STATE_KEY] = {**state, "run_state": paused.to_json(),
                                    "decided": decided}
        edits = []
        for item in interruptions:
            decision = decided[_call_id(item)]
            if decision["edited"]:
                edits.append((item, decision["arguments"]))
            elif decision["approved"]:
                paused.approve(item)
            else:
                paused.reject(item, rejection_message="The tool call was refused" + (
                    f": {decision['reason']}" if decision["reason"] else "."))
        return edits


async def _turn(ctx: Context, agent, start, *, run_config, hooks):
    """One turn (``Runner.run_streamed``, ``max_turns=1``): the model's text goes to the
    run's page as it arrives (``Context.output_stream``). Stopped before its end (a cancel
    cancels this task), the SDK's run is cancelled with it (``cancel()``): its connection
    closes, and the text shown is dropped."""
    from agents import AgentsException, MaxTurnsExceeded, Runner

    result = Runner.run_streamed(agent, start, max_turns=1, run_config=run_config,
                                 hooks=hooks)
    live = ctx.output_stream()
    finished = False
    try:
        async for event in result.stream_events():
            if (event.type == "raw_response_event"
                    and event.data.type == "response.output_text.delta"):
                live.write(event.data.delta)
        finished = True
    except MaxTurnsExceeded:
        finished = True  # the turn asked for tools and they ran
        raise
    except AgentsException as error:  # the SDK wraps what its tool hooks raise
        if isinstance(error.__cause__, Interrupted | BudgetExceeded):
            raise error.__cause__ from None  # the host's fence or loop guard refused a tool
        raise
    finally:
        live.close(keep=finished)
        if not finished:
            result.cancel()
            if ctx.token.cancelled:  # a model call stopped in the middle: for the trace
                for started, at, chunks in hooks.model_started.values():
                    ctx.model_cancelled(ctx.model_name(ctx.input.get("model")), at=at,
                                        started=started, chunks=chunks)
                hooks.model_started.clear()
    return result


async def _run_edited(ctx: Context, item, arguments: dict) -> str:
    """An approved call with edited arguments, which the SDK cannot run (it runs the
    arguments the model gave): the agent's function tool of that name is invoked with the
    edited ones (``FunctionTool.on_invoke_tool``), through the host's fence and loop guard
    and recorded in the step as any tool; its output, as the SDK would give it to the model
    (``ItemHelpers.tool_call_output_item``), is what the caller hands the SDK for the call
    (``RunState.reject(..., rejection_message=)``, which the SDK sends as the call's
    output, exactly)."""
    import json

    from agents import FunctionTool, ItemHelpers, RunContextWrapper
    from agents.tool_context import ToolContext

    name = item.tool_name or item.name
    tools = await item.agent.get_all_tools(RunContextWrapper(context=None))
    found = next((tool for tool in tools
                  if isinstance(tool, FunctionTool) and tool.name == name), None)
    if found is None:
        return (f"The tool call was approved with edited arguments, but {name} is not a "
                "function tool of the agent; the call was not run.")
    text = json.dumps(arguments, ensure_ascii=False)
    call_id = _call_id(item)
    key = await ctx.start_tool(name, arguments, call_id=call_id)
    try:
        result = await ctx.race(found.on_invoke_tool(ToolContext(
            context=None, tool_name=name, tool_call_id=call_id, tool_arguments=text), text))
    except BaseException as error:
        stopped = ctx.token.cancelled
        ctx.end_tool(key, stopped=stopped, data={**FRAMEWORK, "edited": True},
                     error=None if stopped else f"{type(error).__name__}: {error}")
        raise
    ctx.end_tool(key, data={**FRAMEWORK, "edited": True})
    output = ItemHelpers.tool_call_output_item(item.raw_item, result)["output"]
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)


def _as_run(items: list, edited: dict) -> list:
    """The input list as the calls ran: a call approved with edited arguments has those."""
    import json

    return [{**item, "arguments": json.dumps(edited[item.get("call_id")], ensure_ascii=False)}
            if isinstance(item, dict) and item.get("type") == "function_call"
            and item.get("call_id") in edited else item for item in items]


def _call_id(item) -> str:
    raw = item.raw_item
    found = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
    return found or item.tool_name or item.name


def _hooks(ctx: Context):
    from agents import RunHooks

    class Control(RunHooks):
        def __init__(self):
            self.model_started = {}
            self.tools = {}

        async def on_llm_start(self, context, agent, system_prompt, input_items):
            self.model_started[id(agent)] = (time.perf_counter(), datetime.now(UTC),
                                             ctx.meter.received)

        async def on_llm_end(self, context, agent, response):
            started, at, _ = self.model_started.pop(id(agent),
                                                    (time.perf_counter(), None, None))
            usage = response.usage
            ctx.model_call(model=ctx.model_name(ctx.input.get("model")), at=at,
                           ms=(time.perf_counter() - started) * 1000,
                           prompt_tokens=usage.input_tokens if usage else None,
                           completion_tokens=usage.output_tokens if usage else None,
                           data=FRAMEWORK)

        async def on_tool_start(self, context, agent, tool):
            name = getattr(context, "tool_name", None) or tool.name
            call_id = getattr(context, "tool_call_id", None)
            # The host's fence and loop guard: Interrupted or BudgetExceeded if refused.
            key = await ctx.start_tool(name, _arguments(getattr(context, "tool_arguments",
                                                                None)), call_id=call_id)
            self.tools[call_id or name] = key

        async def on_tool_end(self, context, agent, tool, result):
            key = self.tools.pop(getattr(context, "tool_call_id", None) or tool.name, None)
            if key is not None:
                ctx.end_tool(key, data=FRAMEWORK)

    return Control()


def _arguments(text):
    import json

    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {"text": text}
    return value if isinstance(value, dict) else {"value": value}


def _plain(items) -> list:
    """The input list as JSON (the SDK's items are dicts, or pydantic models)."""
    import json

    return json.loads(json.dumps(items, default=lambda value: value.model_dump(mode="json")
                                 if hasattr(value, "model_dump") else str(value)))


def _text(message) -> str:
    import json

    return message if isinstance(message, str) else json.dumps(message, ensure_ascii=False)


def _chat_agent():
    from agents import Agent as SDKAgent

    return SDKAgent(name="chat", instructions="Answer the user's message.")


if demo_agents_enabled():  # the shipped agents (API.md, "Framework agents")
    wrap(_chat_agent, name="openai_agents.chat",
         description="An OpenAI Agents SDK agent that answers one message, on the configured "
                     "model.",
         example={"prompt": "What does a cancel stop?"})


def send_email(to: str, body: str) -> str:
    """Send an email (the shipped approval agent's tool: it only says it did)."""
    return f"sent to {to}"


def _approval_agent():
    from agents import Agent as SDKAgent
    from agents import function_tool

    return SDKAgent(name="approval", instructions="Send the email the user asks for.",
                    tools=[function_tool(send_email, needs_approval=True)])


def _sent(value, items=()):
    """The approval agent's output: its answer and the emails that went out."""
    import json

    calls = {item.get("call_id"): item for item in items
             if isinstance(item, dict) and item.get("type") == "function_call"}
    sent = []
    for item in items:
        if (isinstance(item, dict) and item.get("type") == "function_call_output"
                and str(item.get("output", "")).startswith("sent to")):
            call = calls.get(item.get("call_id")) or {}
            arguments = json.loads(call.get("arguments") or "{}")
            sent.append({"to": arguments.get("to"), "body": arguments.get("body")})
    return {"text": value if isinstance(value, str) else str(value), "sent": sent}


if demo_agents_enabled():  # the shipped agents (API.md, "Framework agents")
    wrap(_approval_agent, name="openai_agents.approval", output=_sent,
         description="An OpenAI Agents SDK agent whose send_email tool needs a person's "
                     "approval.",
         example={"prompt": "Email team@example.com that the report is ready."})
