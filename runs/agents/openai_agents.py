"""OpenAI Agents SDK agents, controlled as ours: the one module that knows the SDK.

Wrap an agent you have and register it under a name::

    from agents import Agent, function_tool
    from runs.agents.openai_agents import wrap

    support = Agent(name="support", instructions="Answer in one line.",
                    tools=[function_tool(lookup_order)])
    wrap(support, name="shop.support")   # input: {"prompt": ..., "model"?: ...}

What the wrapper does, on the SDK's public API (``Runner.run``, ``RunConfig``,
``RunHooks``, ``OpenAIChatCompletionsModel``, the input list of ``to_input_list``):

* the model is an ``OpenAIChatCompletionsModel`` on the configured provider, through the
  runtime's metered OpenAI client, whatever model the agent names (``input.model`` picks
  another of that provider); the SDK's tracing export is off (it would call OpenAI);
* each turn (one model call and the tools it asks for) is one ``Runner.run`` with
  ``max_turns=1`` and one of our steps, committed with the run's input list; a later
  attempt goes on from it without asking the model again for a committed turn;
* the run races the attempt's token: on a cancel, stop, budget, lease loss or parent cancel
  the task driving the SDK is cancelled (its connection closes); nothing of the turn in
  progress is committed;
* tools pass the host's fence (``on_tool_start``), model and tool calls are activity
  entries with durations and tokens (``max_tokens``);
* messages posted to the live inbox join the input list as user messages before the next
  turn's model call.
"""

import time
from datetime import UTC, datetime

from runs.agents import Context, demo_agents_enabled
from runs.agents.wrapping import FrameworkAgent, wrapped

STATE_KEY = "openai_agents"


def wrap(agent, *, name: str, prompt=None, output=None, description: str = "",
         example: dict | None = None) -> type:
    """Register ``agent`` (an ``agents.Agent``, or a function that makes one, called once
    when first needed) as the awaken agent ``name``; ``prompt``, ``output``,
    ``description`` and ``example`` as in ``runs.agents.pydantic_ai.wrap``. Returns the
    registered class."""

    return wrapped(OpenAIAgentsAgent, agent, name=name,
                   ready=lambda made: hasattr(made, "instructions"), prefix="OpenAIAgents",
                   description=description, example=example, prompt=prompt, output=output)


class OpenAIAgentsAgent(FrameworkAgent):
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
        from agents import MaxTurnsExceeded, RunConfig, Runner, RunState, ToolApprovalItem
        from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel

        state = ctx.state.get(STATE_KEY) or {}
        if "output" in state:
            return state["output"]
        items = list(state.get("input") or [{"role": "user", "content": self.prompt(ctx.input)}])
        paused = None  # the SDK's RunState of a turn its tools' approvals interrupted
        if "run_state" in state:
            paused = await RunState.from_json(self.agent, state["run_state"])
        config = RunConfig(
            model=OpenAIChatCompletionsModel(model=ctx.model_name(ctx.input.get("model")),
                                             openai_client=ctx.provider_client()),
            tracing_disabled=True)
        hooks = _hooks(ctx)
        for _ in range(self.max_turns):
            if paused is not None:
                await self._decide(ctx, paused)
            async with ctx.step():
                if paused is None:
                    items += [{"role": "user", "content": _text(message)}
                              for message in ctx.inbox()]
                try:
                    result = await ctx.race(Runner.run(
                        self.agent, items if paused is None else paused,
                        max_turns=1,
                        run_config=config, hooks=hooks))
                except MaxTurnsExceeded as more:  # the turn ended with tools run: go on
                    data = more.run_data
                    start = data.input if isinstance(data.input, list) else [
                        {"role": "user", "content": data.input}]
                    items = [*start, *(item.to_input_item() for item in data.new_items
                                       if not isinstance(item, ToolApprovalItem))]
                    ctx.state[STATE_KEY] = {"input": _plain(items)}
                    paused = None
                    continue
                if result.interruptions:  # tools that need approval: committed, then asked
                    paused = result.to_state()
                    ctx.state[STATE_KEY] = {"input": _plain(items),
                                            "run_state": paused.to_json()}
                    continue
                ctx.state[STATE_KEY] = {"input": _plain(result.to_input_list()),
                                        "output": self.output(result.final_output,
                                                              result.to_input_list())}
            return ctx.state[STATE_KEY]["output"]
        raise RuntimeError(f"The agent still asked for tools after {self.max_turns} turns.")

    async def _decide(self, ctx: Context, paused) -> None:
        """Each tool call the SDK holds for approval becomes our approval ticket, one at a
        time (``Context.approval``: the run awaits the decision); approved, the call is
        approved in the SDK's state, refused, it is rejected with the reason, which the
        model is told. The SDK runs the arguments the model gave: an edit of them cannot be
        applied, so an edited approval is refused, saying so."""
        for item in paused.get_interruptions():
            arguments = _arguments(item.arguments)
            ctx.state[STATE_KEY] = {**ctx.state.get(STATE_KEY, {}),
                                    "run_state": paused.to_json()}
            decision = await ctx.approval(item.tool_name or item.name, arguments)
            if decision.approved and not decision.edited:
                paused.approve(item)
            else:
                paused.reject(item, rejection_message=(
                    "The tool call was refused" + (f": {decision.reason}" if decision.reason
                                                   else ".") if not decision.approved else
                    "Edited arguments cannot be applied to this agent's tool calls; the "
                    "call was not run."))


def _hooks(ctx: Context):
    from agents import RunHooks

    class Control(RunHooks):
        def __init__(self):
            self.model_started = {}
            self.tools = {}

        async def on_llm_start(self, context, agent, system_prompt, input_items):
            self.model_started[id(agent)] = (time.perf_counter(), datetime.now(UTC))

        async def on_llm_end(self, context, agent, response):
            started, at = self.model_started.pop(id(agent), (time.perf_counter(), None))
            usage = response.usage
            ctx.model_call(model=ctx.model_name(ctx.input.get("model")), at=at,
                           ms=(time.perf_counter() - started) * 1000,
                           tokens=usage.total_tokens if usage else 0,
                           data={"framework": "openai-agents"})

        async def on_tool_start(self, context, agent, tool):
            name = getattr(context, "tool_name", None) or tool.name
            arguments = _arguments(getattr(context, "tool_arguments", None))
            key = await ctx.start_tool(name, arguments)  # the fence: Interrupted if refused
            self.tools[getattr(context, "tool_call_id", None) or name] = (
                key, time.perf_counter(), datetime.now(UTC), name)

        async def on_tool_end(self, context, agent, tool, result):
            found = self.tools.pop(getattr(context, "tool_call_id", None) or tool.name, None)
            if found is None:
                return
            key, started, at, name = found
            ctx.end_tool(key)
            ctx.record_activity("tool", at=at, text=name,
                                ms=(time.perf_counter() - started) * 1000,
                                data={"ok": True, "framework": "openai-agents"})

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
