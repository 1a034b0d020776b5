"""Agents written with pydantic-ai, the OpenAI Agents SDK and LangGraph, run by the worker's
executor (in this process, on the test database) against the provider stub over real HTTP:
the frameworks themselves, never mocks of them (SPEC §7.16).

Each framework gets the same checks: a cancel while its model call hangs closes the
connection and commits nothing, with a stop receipt; a crash after a committed turn goes on
from it without asking the model again for it; a budget stops it; a tool that never returns
is abandoned on a cancel.
"""

import json
import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from harness.processes import wait_until
from runs import domain
from runs.models import Activity, Attempt, Event, Run
from runs.runtime.executor import Executor
from runs.runtime.token import Why

FRAMEWORKS = ["pydantic_ai", "openai_agents", "langgraph"]

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RELEASE = threading.Event()  # lets the tools that never return go (at the module's end)
STUCK = threading.Event()  # set when a tool that never returns has started


def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


def stuck(order: str) -> str:
    """A tool that never returns."""
    STUCK.set()
    RELEASE.wait(60)
    return "late"


def _pydantic_ai_agents():
    from pydantic_ai import Agent, Tool

    from runs.agents.pydantic_ai import send_email, wrap

    wrap(lambda: Agent(instructions="Use the tool.", tools=[lookup]), name="test.pai.tools")
    wrap(lambda: Agent(instructions="Use the tool.", tools=[stuck]), name="test.pai.stuck")
    wrap(lambda: Agent(instructions="Use the tools.", tools=[
        Tool(lookup, requires_approval=True), Tool(send_email, requires_approval=True)]),
        name="test.pai.two")
    return {"chat": "pydantic_ai.chat", "tools": "test.pai.tools", "stuck": "test.pai.stuck"}


def _openai_agents_agents():
    from agents import Agent, function_tool

    from runs.agents.openai_agents import send_email, wrap

    wrap(lambda: Agent(name="tools", instructions="Use the tool.",
                       tools=[function_tool(lookup)]), name="test.oai.tools")
    wrap(lambda: Agent(name="stuck", instructions="Use the tool.",
                       tools=[function_tool(stuck)]), name="test.oai.stuck")
    wrap(lambda: Agent(name="two", instructions="Use the tools.", tools=[
        function_tool(lookup, needs_approval=True),
        function_tool(send_email, needs_approval=True)]), name="test.oai.two")
    return {"chat": "openai_agents.chat", "tools": "test.oai.tools", "stuck": "test.oai.stuck"}


def _langgraph_agents():
    import operator
    from typing import Annotated, TypedDict

    from langgraph.graph import END, START, StateGraph

    from runs.agents.langgraph import approval, chat, tool, wrap

    class State(TypedDict):
        messages: Annotated[list, operator.add]

    def graph_of(fn):
        async def model(state):
            reply = await chat(state["messages"], tools=[fn])
            return {"messages": [reply.message]}

        async def tools(state):
            calls = state["messages"][-1]["tool_calls"]
            results = [await tool(fn, **json.loads(call["function"]["arguments"]))
                       for call in calls]
            return {"messages": [{"role": "tool", "tool_call_id": call["id"], "content": text}
                                 for call, text in zip(calls, results, strict=True)]}

        graph = StateGraph(State)
        graph.add_node("model", model)
        graph.add_node("tools", tools)
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", lambda state: "tools" if state["messages"][-1]
                                    .get("tool_calls") else END)
        graph.add_edge("tools", "model")
        return graph

    def text(state):
        return {"text": state["messages"][-1]["content"]}

    def given(input):
        return {"messages": [{"role": "user", "content": input["prompt"]}]}

    wrap(lambda: graph_of(lookup), name="test.lg.tools", input=given, output=text)
    wrap(lambda: graph_of(stuck), name="test.lg.stuck", input=given, output=text)

    class Asked(TypedDict):
        asked: Annotated[list, operator.add]

    def asking(to):
        def node(state):
            decision = approval("send_email", {"to": to, "body": "hi"})
            return {"asked": [[to, decision.approved]]}
        return node

    def two_at_once():  # two nodes of one super-step, each interrupted
        graph = StateGraph(Asked)
        for to in ("ann", "bob"):
            graph.add_node(to, asking(to))
            graph.add_edge(START, to)
            graph.add_edge(to, END)
        return graph

    wrap(two_at_once, name="test.lg.two", input=lambda input: {"asked": []},
         output=lambda state: sorted(state["asked"]))
    return {"chat": "langgraph.chat", "tools": "test.lg.tools", "stuck": "test.lg.stuck"}


AGENTS = {"pydantic_ai": _pydantic_ai_agents, "openai_agents": _openai_agents_agents,
          "langgraph": _langgraph_agents}


@pytest.fixture(scope="module")
def agents():
    made = {framework: make() for framework, make in AGENTS.items()}
    yield made
    RELEASE.set()


@pytest.fixture
def executor(stub_server, settings, monkeypatch):
    # These tests start their runs on this executor by hand: a requeued run is not sent to
    # the broker, where another test's worker would take it.
    monkeypatch.setattr("runs.workers.dispatch.runs_queued", lambda **kwargs: None)
    settings.AWAKEN_PROVIDER_BASE_URL = stub_server.url
    settings.AWAKEN_PROVIDER_MODEL = "echo"
    settings.AWAKEN_PROVIDER_MAX_RETRIES = 0
    made = Executor(node="frameworks", lease_seconds=3600, db_threads=2)
    yield made
    made.close()


def start(executor, agent, input, **extra) -> Run:
    run, _ = domain.run_create(agent=agent, input=input, dispatch=False, **extra)
    assert executor.start([run.id]) == 1
    return run


def ended(run_id, timeout=20) -> Run:
    return wait_until(lambda: (lambda run: run if run.state == "ended" else None)(
        Run.objects.select_related("control").get(pk=run_id)), timeout, "the run to end")


def kinds(run_id) -> list[str]:
    return list(Event.objects.filter(run_id=run_id).order_by("seq")
                .values_list("kind", flat=True))


def cancel(executor, run):
    """As the API does it: the intent committed first, then the live signal."""
    domain.run_cancel(run_id=run.id, actor="olga", source="api")
    run = Run.objects.get(pk=run.id)
    assert executor.registry.apply(str(run.id), run.generation, "cancel", actor="olga",
                                   source="api")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_chat_completes_through_the_framework(framework, agents, executor, stub_server):
    run = start(executor, agents[framework]["chat"], {"prompt": "hello there"})
    done = ended(run.id)
    assert (done.end_cause, done.output) == ("completed", {"text": "You said: hello there"})
    assert done.tokens > 0 and kinds(run.id) == ["created", "started", "step", "ended"]
    assert len([c for c in stub_server.stub.calls if c.model == "echo"]) == 1


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_cancel_while_the_model_hangs_closes_the_connection_with_a_receipt(
        framework, agents, executor, stub_server):
    model = f"echo+hang=0+{framework}"
    run = start(executor, agents[framework]["chat"], {"prompt": "never", "model": model})
    call = stub_server.stub.wait(lambda calls: next(
        (c for c in calls if c.model == model and c.holding), None), what="a hanging call")
    cancel(executor, run)
    done = ended(run.id)
    stub_server.stub.wait(lambda calls: call.disconnected, what="the connection to close")
    assert done.end_cause == "cancelled" and call.finished is None
    assert kinds(run.id) == ["created", "started", "cancel_requested", "ended"]
    assert done.tokens == 0 and done.output is None and done.agent_state in ({}, None)
    receipt = done.control.receipt
    assert receipt["provider_closed_at"] is not None
    assert receipt["tokens_after_request"] == 0 and receipt["tool_calls_refused"] == 0
    # The call cut short is in the activity log, which the run's trace draws.
    cut = [entry for entry in Activity.objects.filter(run_id=run.id, kind="model")
           if (entry.data or {}).get("cancelled")]
    assert len(cut) == 1 and cut[0].data["received"] == 0 and cut[0].ms > 0


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_new_attempt_goes_on_from_the_committed_turn(framework, agents, executor,
                                                       stub_server):
    """The first turn (the model asks for the tool, the tool runs) commits; the attempt is
    lost while the second model call hangs; the next attempt asks the model once more, for
    the second turn only."""
    model = f"echo+hang=0+crash-{framework}"
    stub = stub_server.stub
    run = start(executor, agents[framework]["tools"], {"prompt": "A-1", "model": model})
    stub.wait(lambda calls: [c for c in calls if c.model == model and c.holding],
              what="the first call")
    stub.release()
    wait_until(lambda: Run.objects.get(pk=run.id).steps >= 1, 20, "the first turn")
    stub.wait(lambda calls: len([c for c in calls if c.model == model and c.holding]) == 1
              and len([c for c in calls if c.model == model]) == 2, what="the second call")
    entry = executor.registry.get(str(run.id))
    entry.token.cancel(Why("fenced"))  # the worker is gone, as far as this attempt knows
    wait_until(lambda: executor.registry.get(str(run.id)) is None, 10, "the attempt to end")
    Attempt.objects.filter(run_id=run.id).update(
        lease_expires_at=timezone.now() - timedelta(minutes=1))
    assert domain.attempt_expire(run_id=run.id, generation=1, max_crash_retries=3) == "requeued"
    assert executor.start([run.id]) == 1
    stub.wait(lambda calls: len([c for c in calls if c.model == model]) == 3,
              what="the second turn asked again")
    stub.release()
    done = ended(run.id)
    assert done.end_cause == "completed", done.error
    assert "order A-1: shipped" in done.output["text"]
    assert len([c for c in stub.calls if c.model == model]) == 3  # not the first turn again


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_step_budget_stops_the_framework_between_turns(framework, agents, executor,
                                                         stub_server):
    run = start(executor, agents[framework]["tools"], {"prompt": "A-2", "model": "echo"},
                budget={"max_steps": 1})
    done = ended(run.id)
    assert (done.end_cause, done.stop_code, done.steps) == ("stopped", "max_steps", 1)
    assert done.control.receipt["tool_calls_in_flight"] == []


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_tool_that_never_returns_is_abandoned_on_a_cancel(framework, agents, executor,
                                                            stub_server):
    model = f"echo+stuck-{framework}"
    STUCK.clear()
    run = start(executor, agents[framework]["stuck"], {"prompt": "B-1", "model": model})
    assert STUCK.wait(10), "the tool did not start"
    entry = executor.registry.get(str(run.id))
    steps = Run.objects.get(pk=run.id).steps  # LangGraph's model node is a step of its own
    cancel(executor, run)
    done = ended(run.id)
    assert done.end_cause == "cancelled" and entry.token.cancelled
    assert done.steps == steps  # the tool's turn committed nothing
    (call,) = done.control.receipt["tool_calls_in_flight"]
    assert call["tool"] == "stuck"


@pytest.mark.parametrize("framework", ["pydantic_ai", "openai_agents"])
def test_a_message_to_the_live_inbox_reaches_the_model_before_its_next_call(
        framework, agents, executor, stub_server):
    """Posted while the first model call is out, the message goes to the model as the
    user's, in the next call (LangGraph's nodes take it themselves, with ``inbox()``)."""
    model = f"echo+hang=0+inbox-{framework}"
    stub = stub_server.stub
    run = start(executor, agents[framework]["tools"], {"prompt": "C-1", "model": model})
    stub.wait(lambda calls: [c for c in calls if c.model == model and c.holding],
              what="the first call")
    assert executor.registry.apply(str(run.id), 1, "message", message="steer", actor="olga",
                                   source="api")

    def released_or_ended():
        done = Run.objects.get(pk=run.id)
        if done.state == "ended":
            return done
        if any(c.model == model and c.holding for c in stub.calls):
            stub.release()
        return None

    done = wait_until(released_or_ended, 30, "the run to end")
    assert done.end_cause == "completed", done.error
    assert done.output["text"].startswith("You said: steer")


def awaiting(run_id, timeout=20) -> Run:
    return wait_until(lambda: (lambda run: run if run.state == "awaiting" else None)(
        Run.objects.select_related("ticket").get(pk=run_id)), timeout, "the run to await")


@pytest.mark.parametrize("framework, decision", [
    *((framework, decision) for framework in FRAMEWORKS
      for decision in ({"approved": True}, {"approved": False, "reason": "not today"})),
    *((framework, {"approved": True, "arguments": {"to": "ann@example.com", "body": "hi"}})
      for framework in FRAMEWORKS)])
def test_a_tool_that_needs_approval_waits_for_its_ticket_and_runs_only_approved(
        framework, decision, agents, executor, stub_server):
    run = start(executor, f"{framework}.approval", {"prompt": "bob@example.com"})
    paused = awaiting(run.id)
    action = paused.ticket.action
    assert action["tool"] == "send_email"
    assert action["arguments"] == {"to": "bob@example.com", "body": "bob@example.com"}
    domain.run_resume(run_id=run.id, ticket_id=paused.ticket.pk, input=decision,
                      actor="olga", source="api")
    assert executor.start([run.id]) == 1
    done = ended(run.id)
    assert done.end_cause == "completed", done.error
    if "arguments" in decision:  # exactly the edited ones run
        assert done.output["sent"] == [{"to": "ann@example.com", "body": "hi"}]
        assert "sent to ann@example.com" in done.output["text"]
    elif decision["approved"]:
        assert done.output["sent"] == [{"to": "bob@example.com", "body": "bob@example.com"}]
        assert "sent to bob@example.com" in done.output["text"]
    else:
        assert done.output["sent"] == [] and "not today" in done.output["text"]


def test_langgraph_interrupts_pending_at_once_are_asked_one_ticket_at_a_time(
        agents, executor, stub_server):
    run = start(executor, "test.lg.two", {})
    answers = {"ann": {"approved": True}, "bob": {"approved": False, "reason": "no"}}
    asked = []
    for _ in answers:
        paused = awaiting(run.id)
        to = paused.ticket.action["arguments"]["to"]
        asked.append(to)
        domain.run_resume(run_id=run.id, ticket_id=paused.ticket.pk, input=answers[to],
                          actor="olga", source="api")
        assert executor.start([run.id]) == 1
    done = ended(run.id)
    assert done.end_cause == "completed", done.error
    assert sorted(asked) == ["ann", "bob"]  # each asked once, the first not asked again
    assert done.output == [["ann", True], ["bob", False]]


# --- live output, the loop guard -----------------------------------------------------------


@pytest.fixture
def pushed(monkeypatch):
    """The live output messages the attempts push to their runs' sockets, decoded."""
    messages = []
    monkeypatch.setattr("runs.runtime.attempt_host.publish_output",
                        lambda *, run_id, text: messages.append(json.loads(text)))
    return messages


def shown(pushed, run_id) -> str:
    """The text the run's page shows from the live output so far (one model call)."""
    text = ""
    for message in [m for m in list(pushed) if m["run_id"] == str(run_id)]:
        assert message["type"] == "run.output" and message["call"] == 1
        assert message["offset"] == len(text) and "seq" not in message
        text += message["delta"]
    return text


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_models_text_streams_to_the_page_before_its_answer_ends(
        framework, agents, executor, stub_server, pushed):
    model = f"echo+words=12+hang=4+live-{framework}"
    stub = stub_server.stub
    run = start(executor, agents[framework]["chat"], {"prompt": "stream me", "model": model})
    call = stub.wait(lambda calls: next((c for c in calls if c.model == model and c.holding),
                                        None), what="the answer to hold")
    early = wait_until(lambda: (lambda text: text if "stream" in text else None)(
        shown(pushed, run.id)), 10, "the first words on the page")
    assert early.startswith("You said: ") and call.holding and call.finished is None
    assert Run.objects.get(pk=run.id).steps == 0  # the answer has not ended
    stub.release()
    done = ended(run.id)
    assert done.end_cause == "completed", done.error
    assert len(done.output["text"].split()) == 12
    assert shown(pushed, run.id) == done.output["text"]  # all of it, once, in order


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_cancel_mid_stream_closes_the_connection_and_its_receipt_counts_late_tokens(
        framework, agents, executor, stub_server, pushed):
    """The cancel is committed while the answer streams; two more chunks arrive before its
    live signal does: they are the receipt's late tokens. Nothing of the answer commits,
    and nothing more is shown once the attempt's token is cancelled."""
    model = f"echo+words=12+hang=2+hang=4+late-{framework}"
    stub = stub_server.stub
    run = start(executor, agents[framework]["chat"], {"prompt": "stream me", "model": model})
    call = stub.wait(lambda calls: next((c for c in calls if c.model == model and c.holding),
                                        None), what="two chunks")
    wait_until(lambda: shown(pushed, run.id) == "You said: ", 10, "the first words shown")
    domain.run_cancel(run_id=run.id, actor="olga", source="api")  # its signal comes later
    stub.release()
    wait_until(lambda: shown(pushed, run.id) == "You said: stream me ", 10,
               "the late chunks read")
    run = Run.objects.get(pk=run.id)
    assert executor.registry.apply(str(run.id), run.generation, "cancel", actor="olga",
                                   source="api")
    done = ended(run.id)
    stub.wait(lambda calls: call.disconnected, what="the connection to close")
    assert done.end_cause == "cancelled" and call.finished is None
    assert kinds(run.id) == ["created", "started", "cancel_requested", "ended"]
    assert done.tokens == 0 and done.output is None and done.agent_state in ({}, None)
    receipt = done.control.receipt
    assert receipt["provider_closed_at"] is not None
    assert receipt["tokens_after_request"] == 2
    stub.release()  # the provider sends on; the page shows nothing more
    stub.wait(lambda calls: call.late_chunks, what="a chunk after the close")
    assert shown(pushed, run.id) == "You said: stream me "


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_loop_guard_counts_the_frameworks_tool_calls(framework, agents, executor,
                                                          stub_server):
    """The model asks for the same call every turn: the second would be one more than
    max_repeats, so it never runs and the run pauses with a loop ticket."""
    from runs.domain.actions import action_digest

    run = start(executor, agents[framework]["tools"], {"prompt": "D-1",
                                                       "model": f"echo+loop+{framework}"},
                budget={"max_repeats": 1})
    paused = awaiting(run.id)
    digest = action_digest("lookup", {"order": "D-1"})
    assert paused.ticket.reason == "loop" and paused.ticket.prompt["digest"] == digest
    assert paused.repeats == {digest: 1}
    recorded = [tool for event in Event.objects.filter(run_id=run.id, kind="step")
                for tool in (event.data or {}).get("tools") or ()]
    assert [(tool["name"], tool["digest"], tool["ok"]) for tool in recorded] == [
        ("lookup", digest, True)]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_frameworks_model_calls_are_priced_into_the_runs_cost(
        framework, agents, executor, stub_server, settings):
    """Each model call is in its step's event with the provider's token counts, so its
    cost is the run's (never a silent 0), as a call of our interface's."""
    model = f"echo+cost-{framework}"
    settings.AWAKEN_MODEL_PRICES = json.dumps({model: {"input": 1_000_000,
                                                       "output": 2_000_000}})
    run = start(executor, agents[framework]["chat"], {"prompt": "price me", "model": model})
    done = ended(run.id)
    assert done.end_cause == "completed", done.error
    (step,) = Event.objects.filter(run_id=run.id, kind="step")
    (reply,) = step.data["replies"]
    prompt, completion = reply["usage"]["prompt"], reply["usage"]["completion"]
    assert reply["model"] == model and prompt > 0 and completion > 0
    assert done.tokens == prompt + completion
    assert done.cost_usd == pytest.approx(prompt + 2 * completion)


@pytest.mark.parametrize("agent", ["test.pai.two", "test.oai.two"])
def test_calls_pending_at_once_are_asked_one_ticket_at_a_time(agent, agents, executor,
                                                              stub_server):
    """One turn asks for two calls that need approval: each is asked once, the first
    decision kept while the second is asked, and both reach the framework."""
    run = start(executor, agent, {"prompt": "F-1", "model": f"echo+two-{agent}"})
    answers = {"lookup": {"approved": True},
               "send_email": {"approved": False, "reason": "not now"}}
    asked = []
    for _ in answers:
        paused = awaiting(run.id)
        tool = paused.ticket.action["tool"]
        asked.append(tool)
        domain.run_resume(run_id=run.id, ticket_id=paused.ticket.pk, input=answers[tool],
                          actor="olga", source="api")
        assert executor.start([run.id]) == 1
    done = ended(run.id)
    assert done.end_cause == "completed", done.error
    assert sorted(asked) == ["lookup", "send_email"]
    assert "order F-1: shipped" in done.output["text"]
    assert "The tool call was refused: not now" in done.output["text"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_streamed_calls_tokens_stop_the_run_at_its_token_budget(framework, agents, executor,
                                                                  stub_server):
    run = start(executor, agents[framework]["tools"], {"prompt": "G-1",
                                                       "model": f"echo+tokens-{framework}"},
                budget={"max_tokens": 1})
    done = ended(run.id)
    assert (done.end_cause, done.stop_code, done.steps) == ("stopped", "max_tokens", 1)
    assert done.tokens > 1
