"""LangGraph graphs, controlled as our agents: the one module that knows LangGraph.

Wrap a graph you have (its ``StateGraph``, not compiled: the wrapper compiles it with its
own checkpointer) and register it under a name. LangGraph has no model layer of its own:
its nodes call a model themselves. Nodes call ours through ``chat`` and their tools through
``tool``, so the calls go to the configured provider, stream, count and stop as ours do::

    from langgraph.graph import StateGraph, START, END
    from runs.agents.langgraph import chat, wrap

    async def answer(state):
        reply = await chat([{"role": "user", "content": state["prompt"]}])
        return {"text": reply.content}

    graph = StateGraph(State)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    wrap(graph, name="shop.answer")   # input: the graph's input; output: its last state

What the wrapper does, on LangGraph's public API (``BaseCheckpointSaver``, ``astream``
with ``stream_mode="checkpoints"`` and ``durability="sync"``, ``aget_state``,
``interrupt`` and ``Command``):

* each checkpoint LangGraph writes (a super-step) is one of our steps, and the checkpoint
  and its pending writes are committed with it in the run's state (``RunStateSaver``); a
  later attempt (crash, resume) goes on from the last committed checkpoint, so no node
  whose super-step committed runs again;
* the graph runs in the attempt's task and every step races the token: on a cancel, stop,
  budget, lease loss or parent cancel LangGraph's task is cancelled, the model call in it
  closes its connection, and nothing of the super-step in progress is committed;
* ``chat`` is ``Context.chat`` (streamed to the run's page, tokens toward ``max_tokens``,
  an activity entry each) and ``tool`` is ``Context.tool`` (the host's fence, abandoned on
  a cancel); ``inbox()`` gives a node the live inbox's messages;
* ``approval(tool, arguments)`` in a node is LangGraph's ``interrupt()``: the super-step
  commits with the interrupt, the run awaits an approval ticket bound to the call
  (``Context.approval``), and the resume goes on from that checkpoint with
  ``Command(resume=...)``, the node getting the decision.

A model client of another library called from a node (``langchain-openai``...) is not
controlled: its connection is not ours to close.
"""

import base64
import dataclasses
from contextvars import ContextVar

from runs.agents import Context, Decision, demo_agents_enabled
from runs.agents.wrapping import FrameworkAgent, wrapped

STATE_KEY = "langgraph"
START_NODE = "__start__"  # langgraph.constants.START
CONTEXT: ContextVar[Context | None] = ContextVar("awaken_langgraph_context", default=None)


def _ctx() -> Context:
    ctx = CONTEXT.get()
    if ctx is None:
        raise RuntimeError("runs.agents.langgraph.chat and tool work inside a wrapped graph's "
                           "run only")
    return ctx


async def chat(messages, **options):
    """A model call from a node: ``Context.chat`` of the attempt running the graph."""
    ctx = _ctx()
    options.setdefault("model", ctx.input.get("model"))
    return await ctx.chat(messages, **options)


async def tool(fn, /, *args, **kwargs):
    """A tool call from a node: ``Context.tool`` (the host's fence; abandoned on a cancel)."""
    return await _ctx().tool(fn, *args, **kwargs)


def approval(tool: str, arguments: dict, *, rationale: str | None = None) -> Decision:
    """In a node: a person's decision on one call of ``tool`` with ``arguments``, asked
    with LangGraph's ``interrupt()``; the wrapper makes it our approval ticket bound to the
    call, the run awaits, and the node runs again with the decision. Call it before the
    node's other work (LangGraph runs an interrupted node again from its start)."""
    from langgraph.types import interrupt

    return Decision(**interrupt({"tool": tool, "arguments": arguments,
                                 "rationale": rationale}))


def inbox() -> list:
    """The messages waiting in the run's live inbox, taken."""
    return _ctx().inbox()


def wrap(graph, *, name: str, input=None, output=None, description: str = "",
         example: dict | None = None) -> type:
    """Register ``graph`` (a ``StateGraph``, or a function that makes one) as the awaken
    agent ``name``. ``input(run_input) -> graph input`` (default: the run's input as is);
    ``output(last_state) -> JSON`` (default: the last state); ``description`` and
    ``example`` as in ``runs.agents.pydantic_ai.wrap``."""

    return wrapped(LangGraphAgent, graph, name=name, ready=lambda made: hasattr(made, "compile"),
                   prefix="LangGraph", description=description, example=example,
                   graph_input=input, output=output)


class LangGraphAgent(FrameworkAgent):
    # The graph's, and those LangChain's callbacks import at a graph's first run.
    modules = ("langgraph.graph", "langgraph.types", "langgraph.checkpoint.base",
               "langchain_core.tracers.context", "langchain_core.tracers.run_collector",
               "langchain_core.tracers.stdout")

    @property
    def graph(self):  # the StateGraph
        return self.framework_object()

    @staticmethod
    def graph_input(input: dict):
        return dict(input)

    @staticmethod
    def output(state):
        return state

    async def run(self, ctx: Context):
        from langgraph.types import Command

        state = ctx.state.get(STATE_KEY) or {}
        if "output" in state:
            return state["output"]
        saver = RunStateSaver(state.get("checkpoint"))
        compiled = self.graph.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": str(ctx.run_id)}}
        CONTEXT.set(ctx)
        given = self.graph_input(ctx.input) if saver.latest is None else None
        while True:
            if saver.latest is not None:
                snapshot = await compiled.aget_state(config)
                if snapshot.interrupts:  # decided (or the run pauses here for it)
                    given = Command(resume=await self._decide(ctx, saver,
                                                              snapshot.interrupts))
                elif not snapshot.next:
                    return self._finish(ctx, saver, snapshot.values)
            events = aiter(compiled.astream(given, config, stream_mode="checkpoints",
                                            durability="sync"))
            seen = saver.latest["id"] if saver.latest else None
            if saver.latest is None:
                # The input's checkpoints (the input, then LangGraph's __start__ writing
                # it): no node of the graph has run.
                event = await ctx.race(anext(events))
                while START_NODE in event["next"]:
                    event = await ctx.race(anext(events))
                seen = event["config"]["configurable"]["checkpoint_id"]
                if not event["next"]:
                    return self._finish(ctx, saver, event["values"])
            while True:
                async with ctx.step():
                    # One super-step, checkpointed; None: it stopped at an interrupt(),
                    # whose pending writes commit with this step.
                    event = await ctx.race(_next_checkpoint(events, seen))
                    ctx.state[STATE_KEY] = {"checkpoint": saver.latest}
                if event is None:
                    break
                seen = event["config"]["configurable"]["checkpoint_id"]
                if not event["next"]:
                    return self._finish(ctx, saver, event["values"])
            if not (await compiled.aget_state(config)).interrupts:
                raise RuntimeError("The graph stopped before its end without an interrupt.")
            given = None

    def _finish(self, ctx: Context, saver, values):
        ctx.state[STATE_KEY] = {"checkpoint": saver.latest, "output": self.output(values)}
        return ctx.state[STATE_KEY]["output"]

    @staticmethod
    async def _decide(ctx: Context, saver, interrupts) -> dict:
        """The resume values of the graph's pending interrupts, by interrupt id. An
        ``interrupt({"tool", "arguments", "rationale"?})`` (``approval``) is our approval
        ticket bound to that call (``Context.approval``: the run awaits the decision), and
        its node gets the decision as a dict (``Decision``'s fields). Each decision is kept
        in the run's state at once, so a pause for the next does not ask it again."""
        decided = dict((ctx.state.get(STATE_KEY) or {}).get("decided") or {})
        for pending in interrupts:
            if pending.id in decided:
                continue
            value = pending.value
            if not (isinstance(value, dict) and isinstance(value.get("tool"), str)
                    and isinstance(value.get("arguments"), dict)):
                raise RuntimeError("An interrupt() of a wrapped graph asks for the approval of "
                                   "one tool call: interrupt({'tool': name, 'arguments': "
                                   "{...}}), as runs.agents.langgraph.approval makes it.")
            decision = await ctx.approval(value["tool"], value["arguments"],
                                          rationale=value.get("rationale"))
            decided[pending.id] = dataclasses.asdict(decision)
            ctx.state[STATE_KEY] = {"checkpoint": saver.latest, "decided": decided}
        return decided


async def _next_checkpoint(events, seen):
    """The next checkpoint of the stream other than ``seen`` (a resumed stream gives the
    checkpoint it starts from first), or None when the stream ends without one."""
    async for event in events:
        if event["config"]["configurable"]["checkpoint_id"] != seen:
            return event
    return None


def _saver_class():
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        CheckpointTuple,
        writes_sort_key,
    )

    class Saver(BaseCheckpointSaver):
        """A checkpointer over the run's committed state: it keeps the latest checkpoint
        of the run's one thread and its pending writes, as JSON, which the adapter
        commits with each step."""

        def __init__(self, latest: dict | None):
            super().__init__()
            self.latest = latest

        def _typed(self, value) -> list:
            kind, data = self.serde.dumps_typed(value)
            return [kind, base64.b64encode(data).decode()]

        def _value(self, typed):
            return self.serde.loads_typed((typed[0], base64.b64decode(typed[1])))

        async def aget_tuple(self, config):
            latest = self.latest
            if latest is None:
                return None
            wanted = config["configurable"].get("checkpoint_id")
            if wanted is not None and wanted != latest["id"]:
                return None
            thread = config["configurable"]["thread_id"]
            ns = config["configurable"].get("checkpoint_ns", "")
            writes = sorted(latest["writes"], key=lambda w: writes_sort_key(w[4], w[0], w[3]))
            return CheckpointTuple(
                config={"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                                         "checkpoint_id": latest["id"]}},
                checkpoint=self._value(latest["checkpoint"]),
                metadata=self._value(latest["metadata"]),
                parent_config=({"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                                                 "checkpoint_id": latest["parent"]}}
                               if latest.get("parent") else None),
                pending_writes=[(w[0], w[1], self._value(w[2])) for w in writes])

        async def alist(self, config, *, filter=None, before=None, limit=None):
            found = await self.aget_tuple(config) if config else None
            if found is not None:
                yield found

        async def aput(self, config, checkpoint, metadata, new_versions):
            configurable = config["configurable"]
            self.latest = {"id": checkpoint["id"], "checkpoint": self._typed(checkpoint),
                           "metadata": self._typed(metadata),
                           "parent": configurable.get("checkpoint_id"), "writes": []}
            return {"configurable": {"thread_id": configurable["thread_id"],
                                     "checkpoint_ns": configurable.get("checkpoint_ns", ""),
                                     "checkpoint_id": checkpoint["id"]}}

        async def aput_writes(self, config, writes, task_id, task_path=""):
            if self.latest is None:
                return
            # As LangGraph's savers keep them: one write per task and index, a special
            # channel's (an interrupt, a resume...) replaced, another's kept as first put.
            kept = {(w[0], w[3]): n for n, w in enumerate(self.latest["writes"])}
            for index, (channel, value) in enumerate(writes):
                index = WRITES_IDX_MAP.get(channel, index)
                write = [task_id, channel, self._typed(value), index, task_path]
                if (task_id, index) not in kept:
                    kept[(task_id, index)] = len(self.latest["writes"])
                    self.latest["writes"].append(write)
                elif channel in WRITES_IDX_MAP:
                    self.latest["writes"][kept[(task_id, index)]] = write

        async def adelete_thread(self, thread_id):
            self.latest = None

    return Saver


_SAVER = None


def RunStateSaver(latest: dict | None):  # noqa: N802 - made as a class is
    """A LangGraph checkpointer holding ``latest`` (what a step committed, or None)."""
    global _SAVER
    if _SAVER is None:
        _SAVER = _saver_class()
    return _SAVER(latest)


def _chat_graph():
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class State(TypedDict, total=False):
        prompt: str
        model: str
        text: str

    async def answer(state):
        reply = await chat([{"role": "user", "content": state.get("prompt") or ""}])
        return {"text": reply.content}

    graph = StateGraph(State)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph


if demo_agents_enabled():  # the shipped agents (API.md, "Framework agents")
    wrap(_chat_graph, name="langgraph.chat",
         description="A LangGraph graph of one node that answers one message, on the "
                     "configured model.",
         example={"prompt": "What does a cancel stop?"},
         input=lambda input: {"prompt": input.get("prompt")},
         output=lambda state: {"text": state.get("text")})


def send_email(to: str, body: str) -> str:
    """Send an email (the shipped approval agent's tool: it only says it did)."""
    return f"sent to {to}"


def _approval_graph():
    import json
    import operator
    from typing import Annotated, TypedDict

    from langgraph.graph import END, START, StateGraph

    class State(TypedDict, total=False):
        messages: Annotated[list, operator.add]
        sent: Annotated[list, operator.add]

    async def model(state):
        reply = await chat(state["messages"], tools=[send_email])
        return {"messages": [reply.message]}

    async def send(state):
        results, sent = [], []
        for call in state["messages"][-1]["tool_calls"]:
            decision = approval("send_email", json.loads(call["function"]["arguments"]))
            if decision.approved:
                text = await tool(send_email, **decision.arguments)
                sent.append({"to": decision.arguments.get("to"),
                             "body": decision.arguments.get("body")})
            else:
                text = "The tool call was refused" + (f": {decision.reason}"
                                                      if decision.reason else ".")
            results.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        return {"messages": results, "sent": sent}

    graph = StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("send", send)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", lambda state: "send" if state["messages"][-1]
                                .get("tool_calls") else END)
    graph.add_edge("send", "model")
    return graph


if demo_agents_enabled():  # the shipped agents (API.md, "Framework agents")
    wrap(_approval_graph, name="langgraph.approval",
         description="A LangGraph graph whose send_email tool needs a person's approval.",
         example={"prompt": "Email team@example.com that the report is ready."},
         input=lambda input: {"messages": [{"role": "user", "content": input.get("prompt")
                                            or ""}], "sent": []},
         output=lambda state: {"text": state["messages"][-1].get("content"),
                               "sent": state.get("sent") or []})
