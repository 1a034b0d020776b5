"""pydantic-ai agents, controlled as ours: the one module that knows pydantic-ai.

Wrap an agent you have and register it under a name::

    from pydantic_ai import Agent
    from runs.agents.pydantic_ai import wrap

    support = Agent(instructions="Answer in one line.", tools=[lookup_order])
    wrap(support, name="shop.support")   # input: {"prompt": ..., "model"?: ...}

What the wrapper does, on pydantic-ai's public API (``Agent.iter``, capabilities, its
``CancellationToken``, ``ModelMessagesTypeAdapter``):

* the model is an ``OpenAIChatModel`` on the configured provider, through the runtime's
  metered OpenAI client (``Context.provider_client``), whatever model the agent was built
  with; ``input.model`` names another model of that provider;
* each turn (one model request and the tools it asks for) is one of our steps, committed
  with the message history; a later attempt (crash, resume) goes on from it and never asks
  the model again for a committed turn;
* each model request is streamed (``node.stream``): its text goes to the run's page as it
  arrives (live output);
* every wait of the run races the attempt's token: on a cancel, stop, budget, lease loss or
  parent cancel the task driving pydantic-ai is cancelled (its connection closes) and its
  own ``CancellationToken`` fired; nothing of the turn in progress is committed;
* tools run through the host's fence (refused once a cancel or stop is committed) and
  loop guard, and
  model and tool calls are activity entries with durations and tokens (``max_tokens``);
* messages posted to the live inbox reach the model as user messages before its next
  request.
"""

import time
from datetime import UTC, datetime

from runs.agents import Context, Interrupted, demo_agents_enabled
from runs.agents.wrapping import FrameworkAgent, wrapped
from runs.domain.actions import action_digest
from runs.providers.client import ChatClient

STATE_KEY = "pydantic_ai"
FRAMEWORK = {"framework": "pydantic-ai"}  # what its activity entries say of the framework


def wrap(agent, *, name: str, prompt=None, output=None, description: str = "",
         example: dict | None = None) -> type:
    """Register ``agent`` (a ``pydantic_ai.Agent``, or a function that makes one, called
    once when first needed) as the awaken agent ``name``.

    ``prompt(input) -> str``: the user prompt from the run's input (default
    ``input["prompt"]``); ``output(result_output, messages) -> JSON``: the run's output
    from the agent's and the run's message history (default ``{"text": str(output)}``);
    ``description`` and ``example``: what the new-run form says of it and the input it
    offers (``runs.agents.Agent``). Returns the registered class."""

    return wrapped(PydanticAIAgent, agent, name=name, ready=lambda made: hasattr(made, "iter"),
                   prefix="PydanticAI", description=description, example=example,
                   prompt=prompt, output=output)


class PydanticAIAgent(FrameworkAgent):
    modules = ("pydantic_ai", "pydantic_ai.models.openai", "pydantic_ai.providers.openai",
               *ChatClient.OPENAI_SDK)

    @property
    def agent(self):  # the pydantic_ai.Agent
        return self.framework_object()

    @staticmethod
    def prompt(input: dict) -> str:
        return str(input.get("prompt") or "")

    @staticmethod
    def output(value, messages=()):
        return {"text": value if isinstance(value, str) else str(value)}

    async def run(self, ctx: Context):
        from pydantic_ai import CancellationToken
        from pydantic_ai.messages import ModelMessagesTypeAdapter

        state = ctx.state.get(STATE_KEY) or {}
        if "output" in state:
            return state["output"]
        history = ModelMessagesTypeAdapter.validate_python(state.get("messages") or [])
        first = not history
        token = CancellationToken()
        capability = _control(ctx)
        try:
            async with self.agent.iter(
                    self.prompt(ctx.input) if first else None,
                    message_history=history or None, model=_model(ctx),
                    cancellation_token=token, capabilities=[capability]) as run:
                node = run.next_node
                while not self.agent.is_end_node(node):
                    async with ctx.step():
                        # One turn: the model's request, then the tools it asked for.
                        while not (self.agent.is_model_request_node(node)
                                   or self.agent.is_end_node(node)):
                            node = await ctx.race(run.next(node))  # the prompt's node
                        if self.agent.is_model_request_node(node):
                            node = await ctx.race(_streamed(ctx, run, node))
                        if self.agent.is_call_tools_node(node):
                            node = await ctx.race(run.next(node))
                        done = self.agent.is_end_node(node)
                        messages = run.all_messages()
                        ctx.state[STATE_KEY] = {
                            "messages": ModelMessagesTypeAdapter.dump_python(
                                messages, mode="json"),
                            **({"output": self.output(node.data.output, messages)}
                               if done else {})}
                return ctx.state[STATE_KEY]["output"]
        except Interrupted:
            token.cancel()  # pydantic-ai's own cancel, for whatever it still holds
            raise


def _model(ctx: Context):
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(ctx.model_name(ctx.input.get("model")),
                           provider=OpenAIProvider(openai_client=ctx.provider_client()))


def _control(ctx: Context):
    """The capability that puts pydantic-ai's model requests and tools under the host."""
    from pydantic_ai.capabilities import AbstractCapability

    class Control(AbstractCapability):
        async def before_model_request(self, run_ctx, request_context):
            for message in ctx.inbox():  # the live inbox, into this request and the history
                run_ctx.enqueue(message if isinstance(message, str) else _json(message))
            return request_context

        async def wrap_model_request(self, run_ctx, *, request_context, handler):
            started, at, chunks = time.perf_counter(), datetime.now(UTC), ctx.meter.received
            try:
                response = await handler(request_context)
            except BaseException:
                if ctx.token.cancelled:  # stopped in the middle: the trace shows the call
                    ctx.model_cancelled(ctx.model_name(ctx.input.get("model")), at=at,
                                        started=started, chunks=chunks)
                raise
            usage = response.usage
            ctx.model_call(model=response.model_name or "model", at=at,
                           ms=(time.perf_counter() - started) * 1000,
                           prompt_tokens=usage.input_tokens,
                           completion_tokens=usage.output_tokens,
                           data={**FRAMEWORK, "finish_reason": response.finish_reason})
            return response

        async def handle_deferred_tool_calls(self, run_ctx, *, requests):
            """Tools made with ``requires_approval=True``: each call becomes our approval
            ticket (``Context.approval``; the run awaits the decision), one at a time, each
            decision kept in the run's state by the call's digest at once, so a pause for
            the next does not ask it again. Approved, it runs with the approved (or edited)
            arguments; refused, the model is told why."""
            from pydantic_ai.tools import DeferredToolResults, ToolApproved, ToolDenied

            if requests.calls:
                return None  # calls run outside the agent are not ours to answer
            state = ctx.state.get(STATE_KEY) or {}
            decided = dict(state.get("decided") or {})  # until the turn commits
            approvals = {}
            for call in requests.approvals:
                arguments = call.args_as_dict()
                digest = action_digest(call.tool_name, arguments)
                if digest not in decided:
                    decision = await ctx.approval(call.tool_name, arguments)
                    decided[digest] = {"approved": decision.approved,
                                       "edited": decision.edited,
                                       "arguments": decision.arguments,
                                       "reason": decision.reason}
                    ctx.state[STATE_KEY] = {**state, "decided": decided}
                decision = decided[digest]
                approvals[call.tool_call_id] = (
                    ToolApproved(override_args=decision["arguments"] if decision["edited"]
                                 else None)
                    if decision["approved"] else
                    ToolDenied("The tool call was refused" + (
                        f": {decision['reason']}" if decision["reason"] else ".")))
            return DeferredToolResults(approvals=approvals)

        async def wrap_tool_execute(self, run_ctx, *, call, tool_def, args, handler):
            # The host's fence and loop guard, then the call, recorded in the step.
            key = await ctx.start_tool(call.tool_name, call.args_as_dict(),
                                       call_id=call.tool_call_id)
            try:
                result = await handler(args)
            except BaseException as error:
                stopped = ctx.token.cancelled
                ctx.end_tool(key, stopped=stopped, data=FRAMEWORK,
                             error=None if stopped else f"{type(error).__name__}: {error}")
                raise
            ctx.end_tool(key, data=FRAMEWORK)
            return result

    return Control()


async def _streamed(ctx: Context, run, node):
    """A model request streamed (``node.stream``, as ``Agent.iter`` documents it): its
    text goes to the run's page as it arrives (``Context.output_stream``), and is dropped
    there if the request fails or is cancelled. Then the node that follows it."""
    from pydantic_ai.messages import PartDeltaEvent, PartStartEvent, TextPart, TextPartDelta

    live = ctx.output_stream()
    try:
        async with node.stream(run.ctx) as events:
            async for event in events:
                if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                    live.write(event.part.content)
                elif (isinstance(event, PartDeltaEvent)
                      and isinstance(event.delta, TextPartDelta)):
                    live.write(event.delta.content_delta)
    except BaseException:
        live.close(keep=False)
        raise
    live.close(keep=True)
    return await run.next(node)


def _json(value) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


def _chat_agent():
    from pydantic_ai import Agent as PydanticAgent

    return PydanticAgent(instructions="Answer the user's message.", name="chat")


if demo_agents_enabled():  # the shipped agents (API.md, "Framework agents")
    wrap(_chat_agent, name="pydantic_ai.chat",
         description="A pydantic-ai agent that answers one message, on the configured model.",
         example={"prompt": "What does a cancel stop?"})


def send_email(to: str, body: str):
    """Send an email (the shipped approval agent's tool: it only says it did). What it
    sent goes with its answer as metadata, which the model is not shown: after an edited
    approval, the call in the history still has the arguments the model proposed."""
    from pydantic_ai.messages import ToolReturn

    return ToolReturn(return_value=f"sent to {to}", metadata={"to": to, "body": body})


def _approval_agent():
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai import Tool

    return PydanticAgent(instructions="Send the email the user asks for.", name="approval",
                         tools=[Tool(send_email, requires_approval=True)])


def _sent(value, messages=()):
    """The approval agent's output: its answer and the emails that went out."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart

    calls = {part.tool_call_id: part for message in messages
             if isinstance(message, ModelResponse) for part in message.parts
             if isinstance(part, ToolCallPart)}
    sent = []
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if (isinstance(part, ToolReturnPart) and part.tool_name == "send_email"
                        and str(part.content).startswith("sent to")):
                    arguments = (part.metadata if isinstance(part.metadata, dict)
                                 else calls[part.tool_call_id].args_as_dict())
                    sent.append({"to": arguments.get("to"), "body": arguments.get("body")})
    return {"text": value if isinstance(value, str) else str(value), "sent": sent}


if demo_agents_enabled():  # the shipped agents (API.md, "Framework agents")
    wrap(_approval_agent, name="pydantic_ai.approval", output=_sent,
         description="A pydantic-ai agent whose send_email tool needs a person's approval.",
         example={"prompt": "Email team@example.com that the report is ready."})
