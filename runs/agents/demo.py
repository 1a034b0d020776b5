"""The built-in demo agents of API.md, each written against the agent interface."""

import asyncio
import threading

from runs.runtime.agent import Agent, Context, register

# Blocking demo tools wait on this; nothing sets it in production (tests release their
# abandoned threads with it).
RELEASE_BLOCKED_TOOLS = threading.Event()


async def simulated_inference(seconds: float, answer="ok"):
    await asyncio.sleep(seconds)
    return answer


async def never_returns():
    await asyncio.get_running_loop().create_future()


async def ignores_cancellation(seconds: float):
    """A provider that finishes its call whatever happens to the caller."""
    return await asyncio.shield(simulated_inference(seconds, answer="late"))


def blocking_forever():
    RELEASE_BLOCKED_TOOLS.wait()
    return "released"


async def run_steps(ctx: Context, total: int, seconds: float, tokens: int, key: str = "done"):
    while ctx.state.get(key, 0) < total:
        async with ctx.step():
            await ctx.infer(simulated_inference(seconds), tokens=tokens)
            ctx.state[key] = ctx.state.get(key, 0) + 1


@register
class Steps(Agent):
    """Steps through simulated inference calls, then completes with its output."""

    name = "demo.steps"

    async def run(self, ctx):
        steps = int(ctx.input.get("steps", 5))
        await run_steps(ctx, steps, float(ctx.input.get("step_seconds", 1.0)),
                        int(ctx.input.get("tokens_per_step", 100)))
        return ctx.input.get("output", {"steps": steps})


@register
class Hang(Agent):
    """Its first inference never returns."""

    name = "demo.hang"

    async def run(self, ctx):
        async with ctx.step():
            await ctx.infer(never_returns())


@register
class HangTool(Agent):
    """Calls a blocking (sync) tool that never returns."""

    name = "demo.hang_tool"

    async def run(self, ctx):
        async with ctx.step():
            await ctx.tool(blocking_forever)


@register
class Late(Agent):
    """Its inference ignores cancellation and answers after ``late_seconds``."""

    name = "demo.late"

    async def run(self, ctx):
        async with ctx.step():
            late = float(ctx.input.get("late_seconds", 2.0))
            answer = await ctx.infer(ignores_cancellation(late))
        return {"answer": answer}


APPROVAL_SCHEMA = {"type": "object", "properties": {"approved": {"type": "boolean"}},
                   "required": ["approved"]}


@register
class Approval(Agent):
    """Asks for approval after ``steps_before`` steps; resume input ``{"approved": bool}``."""

    name = "demo.approval"

    async def run(self, ctx):
        seconds = float(ctx.input.get("step_seconds", 0.2))
        await run_steps(ctx, int(ctx.input.get("steps_before", 1)), seconds, 100)
        if "approved" not in ctx.state:
            answer = await ctx.wait_for_input(reason="approval", prompt={"question": "Continue?"},
                                              schema=APPROVAL_SCHEMA)
            ctx.state["approved"] = bool((answer or {}).get("approved"))
        if not ctx.state["approved"]:
            raise PermissionError("not approved")
        await run_steps(ctx, int(ctx.input.get("steps_after", 1)), seconds, 100, key="after")
        return {"approved": True}


@register
class Fail(Agent):
    """Raises after its steps."""

    name = "demo.fail"

    async def run(self, ctx):
        steps = int(ctx.input.get("steps", 1))
        await run_steps(ctx, steps, float(ctx.input.get("step_seconds", 0.05)), 10)
        raise RuntimeError(f"demo.fail raised after {steps} step(s)")


@register
class Parent(Agent):
    """Starts child runs in-process and waits for all of them."""

    name = "demo.parent"

    async def run(self, ctx):
        count = int(ctx.input.get("children", 2))
        agent = ctx.input.get("child_agent", "demo.hang")
        child_input = ctx.input.get("child_input", {})
        if ctx.input.get("then_wait_for_input"):
            # Starts the children, then awaits input without waiting for them (its state,
            # committed with the pause, remembers that they were started).
            if "children" not in ctx.state:
                ctx.state["children"] = [str(await ctx.spawn(agent, child_input))
                                         for _ in range(count)]
            answer = await ctx.wait_for_input(reason="input", prompt={"question": "Input?"})
            return {"children": ctx.state["children"], "input": answer}
        children = [str(await ctx.spawn(agent, child_input)) for _ in range(count)]
        ends = await ctx.wait_children()
        return {"children": children, "ends": ends}


@register
class Inbox(Agent):
    """Waits on its live inbox; one step per message (a wake is a step with no message);
    completes when a message equals ``until``, with every message received."""

    name = "demo.inbox"

    async def run(self, ctx):
        until = ctx.input.get("until", {"done": True})
        messages = ctx.state.setdefault("messages", [])
        while not (messages and messages[-1] == until):
            message = await ctx.receive()
            async with ctx.step():
                if message is not None:
                    messages.append(message)
        return {"messages": messages}
