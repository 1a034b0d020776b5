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
with ``stream_mode="checkpoints"`` and ``durability="sync"``, ``aget_state``):

* each checkpoint LangGraph writes (a super-step) is one of our steps, and the checkpoint
  and its pending writes are committed with it in the run's state (``RunStateSaver``); a
  later attempt (crash, resume) goes on from the last committed checkpoint, so no node
  whose super-step committed runs again;
* the graph runs in the attempt's task and every step races the token: on a cancel, stop,
  budget, lease loss or parent cancel LangGraph's task is cancelled, the model call in it
  closes its connection, and nothing of the super-step in progress is committed;
* ``chat`` is ``Context.chat`` (streamed to the run's page, tokens toward ``max_tokens``,
  an activity entry each) and ``tool`` is ``Context.tool`` (the host's fence, abandoned on
  a cancel); ``inbox()`` gives a node the live inbox's messages.

A model client of another library called from a node (``langchain-openai``...) is not
controlled: its connection is not ours to close.
"""

import base64
from contextvars import ContextVar

from runs.agents import Agent, Context, demo_agents_enabled, register

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


def inbox() -> list:
    """The messages waiting in the run's live inbox, taken."""
    return _ctx().inbox()


def wrap(graph, *, name: str, input=None, output=None) -> type:
    """Register ``graph`` (a ``StateGraph``, or a function that makes one) as the awaken
    agent ``name``. ``input(run_input) -> graph input`` (default: the run's input as is);
    ``output(last_state) -> JSON`` (default: the last state)."""

    class Wrapped(LangGraphAgent):
        pass

    made = hasattr(graph, "compile")
    Wrapped.name = name
    Wrapped.made = graph if made else None
    Wrapped.make = None if made else staticmethod(graph)
    if input is not None:
        Wrapped.graph_input = staticmethod(input)
    if output is not None:
        Wrapped.output = staticmethod(output)
    Wrapped.__qualname__ = Wrapped.__name__ = f"LangGraph_{name.replace('.', '_')}"
    return register(Wrapped)


class LangGraphAgent(Agent):
    made = None
    make = None

    @property
    def graph(self):
        cls = type(self)
        if cls.made is None:
            cls.made = cls.make()
        return cls.made

    @staticmethod
    def graph_input(input: dict):
        return dict(input)

    @staticmethod
    def output(state):
        return state

    async def run(self, ctx: Context):
        state = ctx.state.get(STATE_KEY) or {}
        if "output" in state:
            return state["output"]
        saver = RunStateSaver(state.get("checkpoint"))
        compiled = self.graph.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": str(ctx.run_id)}}
        CONTEXT.set(ctx)
        fresh = saver.latest is None
        stream = compiled.astream(self.graph_input(ctx.input) if fresh else None, config,
                                  stream_mode="checkpoints", durability="sync")
        events = aiter(stream)
        if fresh:
            # The input's checkpoints (the input, then LangGraph's __start__ writing it):
            # no node of the graph has run.
            event = await ctx.race(anext(events))
            while START_NODE in event["next"]:
                event = await ctx.race(anext(events))
            pending, values = event["next"], event["values"]
        else:
            snapshot = await compiled.aget_state(config)
            pending, values = snapshot.next, snapshot.values
        while pending:
            async with ctx.step():
                event = await ctx.race(anext(events))  # one super-step, checkpointed
                pending, values = event["next"], event["values"]
                ctx.state[STATE_KEY] = {"checkpoint": saver.latest,
                                        **({} if pending else {"output": self.output(values)})}
        if "output" not in ctx.state.get(STATE_KEY, {}):
            ctx.state[STATE_KEY] = {"checkpoint": saver.latest, "output": self.output(values)}
        return ctx.state[STATE_KEY]["output"]


def _saver_class():
    from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple, writes_sort_key

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
            for index, (channel, value) in enumerate(writes):
                self.latest["writes"].append([task_id, channel, self._typed(value), index,
                                              task_path])

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
         input=lambda input: {"prompt": input.get("prompt")},
         output=lambda state: {"text": state.get("text")})
