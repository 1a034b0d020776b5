"""The built-in demo agents of API.md, each written against the agent interface.

``demo.chat`` and ``demo.research`` call the configured model provider (under ``make run``
with nothing configured, the provider stub); the others simulate their inference.
"""

import asyncio
import re
import threading

from runs.agents import Agent, Context, register, tool

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
        done = ctx.state.get(key, 0)
        ctx.progress(done + 1, total)
        async with ctx.step():
            ctx.log(f"thinking about step {done + 1} of {total}")
            await ctx.infer(simulated_inference(seconds), tokens=tokens)
            ctx.state[key] = done + 1


@register
class Steps(Agent):
    """Steps through simulated inference calls, then completes with its output."""

    name = "demo.steps"
    example = {"steps": 5, "step_seconds": 1.0, "tokens_per_step": 100}

    async def run(self, ctx):
        steps = int(ctx.input.get("steps", 5))
        await run_steps(ctx, steps, float(ctx.input.get("step_seconds", 1.0)),
                        int(ctx.input.get("tokens_per_step", 100)))
        return ctx.input.get("output", {"steps": steps})


@register
class Hang(Agent):
    """Its first inference never returns."""

    name = "demo.hang"
    example = {}

    async def run(self, ctx):
        async with ctx.step():
            await ctx.infer(never_returns())


@register
class HangTool(Agent):
    """Calls a blocking (sync) tool that never returns."""

    name = "demo.hang_tool"
    example = {}

    async def run(self, ctx):
        async with ctx.step():
            await ctx.tool(blocking_forever)


@register
class Late(Agent):
    """Its inference ignores cancellation and answers after ``late_seconds``."""

    name = "demo.late"
    example = {"late_seconds": 2.0}

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
    example = {"steps_before": 1, "steps_after": 1, "step_seconds": 0.2}

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
class Email(Agent):
    """Asks a person to approve one ``send_email(to, body)`` call, then sends it (or not).

    Input: ``to``, ``body``, ``steps_before`` (1), ``step_seconds`` (0.1), ``send_seconds``
    (0: how long sending takes, within the step after the decision). The approval
    ticket is bound to that call; approved (or edited), the email "sent" is the decided
    one; refused, nothing is sent and the run completes saying why.
    """

    name = "demo.email"
    example = {"to": "team@example.com", "body": "The weekly report is ready.",
               "steps_before": 1}

    async def run(self, ctx):
        seconds = float(ctx.input.get("step_seconds", 0.1))
        await run_steps(ctx, int(ctx.input.get("steps_before", 1)), seconds, 50)
        if "outcome" not in ctx.state:
            decision = await ctx.approval(
                "send_email", {"to": str(ctx.input.get("to", "team@example.com")),
                               "body": str(ctx.input.get("body", "The weekly report is ready."))},
                rationale="The report is done; the team asked to be told.")
            async with ctx.step():  # the decision holds until this step commits
                if decision.approved:
                    ctx.log("sending the email", to=decision.arguments.get("to"))
                    await ctx.sleep(float(ctx.input.get("send_seconds", 0)))
                    await ctx.tool(send_email, **decision.arguments)
                ctx.state["outcome"] = {
                    "sent": [decision.arguments] if decision.approved else [],
                    "edited": decision.edited, "refused": None if decision.approved
                    else decision.reason or "refused", "decided_by": decision.actor}
        return ctx.state["outcome"]


async def send_email(to: str, body: str) -> str:
    """Send an email (the demo only says so)."""
    await asyncio.sleep(0)
    return f"sent to {to}"


@register
class Assistant(Agent):
    """A model with one tool, ``send_email(to, body)``, that needs approval: the model asks
    for it, the run waits for a person's decision on that exact call, and the model is
    told the result (or the refusal) and answers.

    Input: ``prompt``, ``model`` (AWAKEN_PROVIDER_MODEL).
    """

    name = "demo.assistant"
    example = {"prompt": "Email team@example.com that the report is ready."}

    async def run(self, ctx):
        sent = ctx.state.setdefault("sent", [])

        @tool(requires_approval=True)
        async def send_email(to: str, body: str) -> str:
            """Send an email to ``to``."""
            sent.append({"to": to, "body": body})
            return f"sent to {to}"

        answer = await ctx.converse(
            [{"role": "system", "content": "You send emails for the user when asked."},
             {"role": "user", "content": str(ctx.input.get("prompt") or "Tell the team.")}],
            tools=[send_email], model=ctx.input.get("model"))
        return {"text": answer, "sent": sent}


ORDER_SCHEMA = {
    "type": "object", "required": ["colour", "count"],
    "properties": {
        "colour": {"enum": ["red", "green", "blue"], "title": "Colour"},
        "count": {"type": "integer", "minimum": 1, "maximum": 10, "title": "How many"},
        "note": {"type": "string", "maxLength": 200, "title": "Note"},
        "urgent": {"type": "boolean", "title": "Urgent"},
    },
}


@register
class Ask(Agent):
    """Asks for typed input (a JSON Schema the page makes a form of; input ``schema``, any
    other), then returns it."""

    name = "demo.ask"
    example = {}

    async def run(self, ctx):
        answer = await ctx.wait_for_input(
            reason="input", prompt={"question": "Which colour, and how many?"},
            schema=ctx.input.get("schema", ORDER_SCHEMA))
        ctx.log("got an answer", colour=answer.get("colour"))
        return {"ordered": answer}


@register
class Fail(Agent):
    """Raises after its steps."""

    name = "demo.fail"
    example = {"steps": 1}

    async def run(self, ctx):
        steps = int(ctx.input.get("steps", 1))
        await run_steps(ctx, steps, float(ctx.input.get("step_seconds", 0.05)), 10)
        raise RuntimeError(f"demo.fail raised after {steps} step(s)")


@register
class Parent(Agent):
    """Starts child runs in-process and waits for all of them."""

    name = "demo.parent"
    example = {"children": 2, "child_agent": "demo.steps", "child_input": {"steps": 3}}

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
    example = {"until": {"done": True}}

    async def run(self, ctx):
        until = ctx.input.get("until", {"done": True})
        messages = ctx.state.setdefault("messages", [])
        while not (messages and messages[-1] == until):
            message = await ctx.receive()
            async with ctx.step():
                if message is not None:
                    messages.append(message)
        return {"messages": messages}


@register
class Chat(Agent):
    """A chat with the model: one step per prompt, each answer streamed to the run's page.

    Input: ``prompts`` (a list) or ``prompt``, ``model`` (AWAKEN_PROVIDER_MODEL), ``system``.
    """

    name = "demo.chat"
    example = {"prompts": ["Hello!", "What can you do?"]}

    async def run(self, ctx):
        prompts = ctx.input.get("prompts") or [ctx.input.get("prompt") or "Hello!"]
        if not isinstance(prompts, list):
            raise ValueError("prompts must be a list of messages")
        system = ctx.input.get("system") or "You are a concise, friendly assistant."
        conversation = ctx.state.setdefault("conversation", [
            {"role": "system", "content": str(system)}])
        replies = ctx.state.setdefault("replies", [])
        for prompt in prompts[len(replies):]:
            async with ctx.step():
                asked = [*conversation, {"role": "user", "content": str(prompt)}]
                reply = await ctx.chat(asked, model=ctx.input.get("model"))
                conversation[:] = [*asked, reply.message]
                replies.append(reply.content)
        return {"replies": replies}


NOTES = {
    "cancel": "A cancel is a durable intent first; the live signal cancels the attempt's "
              "token, and every await of the attempt races that token.",
    "provider": "A model call that is cancelled closes its HTTP connection at once, so the "
                "provider stops generating; its partial answer is dropped.",
    "lease": "A live attempt renews its lease every third of AWAKEN_LEASE_SECONDS; the "
             "sweeper applies the pending intent of an attempt whose lease expired.",
    "step": "Each step is a checkpoint: it commits the agent's state, and a later attempt "
            "continues from the last committed step.",
    "budget": "Budgets of steps, seconds and tokens stop a run with a machine-readable code; "
              "tokens are the provider's own usage figures.",
}


def research_tools(tool_seconds: float) -> list:
    """The tools of ``demo.research``; the search blocks ``tool_seconds`` first (a slow,
    blocking tool, abandoned if the run is cancelled meanwhile)."""

    @tool
    def search_notes(query: str) -> str:
        """Search the awaken-site notes; returns the passages that best match the query."""
        if tool_seconds > 0:
            RELEASE_BLOCKED_TOOLS.wait(tool_seconds)
        words = set(re.findall(r"\w+", query.lower()))
        ranked = sorted(NOTES.items(), key=lambda item: -len(
            words & set(re.findall(r"\w+", f"{item[0]} {item[1]}".lower()))))
        return " ".join(text for _, text in ranked[:2])

    @tool
    def count_words(text: str) -> int:
        """Count the words of a text."""
        return len(text.split())

    return [search_notes, count_words]


@register
class Research(Agent):
    """Answers a question with tools: the model asks for a search of the notes and a word
    count, Python runs them, and their results go back to the model.

    Input: ``question``, ``model`` (AWAKEN_PROVIDER_MODEL), ``tool_seconds`` (0).
    """

    name = "demo.research"
    example = {"question": "How does a cancel stop a model call?"}

    async def run(self, ctx):
        question = ctx.input.get("question") or "How does a cancel stop a model call?"
        answer = await ctx.converse(
            [{"role": "system", "content": "Answer from the notes; search them first."},
             {"role": "user", "content": str(question)}],
            tools=research_tools(float(ctx.input.get("tool_seconds", 0))),
            model=ctx.input.get("model"))
        return {"answer": answer}
