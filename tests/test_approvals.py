"""Approvals bound to one tool call (SPEC §7.15): the ticket's action, the three decisions
over the API, a digest that names another action, review links bound to the action, and
the crash edge (a decided call is not asked about again)."""

import copy
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client
from django.utils import timezone

from runs import domain
from runs.domain import selectors
from runs.domain.actions import action_digest
from runs.models import Attempt, Event, ReviewLink, Run, TicketState
from runs.providers.client import ChatClient, ProviderConfig
from runs.runtime.agent import Context, Paused, tool
from runs.runtime.token import CancellationToken
from tests.conftest import browser_for, db_state
from tests.factories import OWNER, running_run

pytestmark = pytest.mark.django_db

EMAIL = {"to": "team@example.com", "body": "The report is ready."}


def approval_run(arguments=None) -> tuple[Run, dict]:
    """A demo.email run awaiting approval of one send_email call; its ticket as JSON."""
    run, generation = running_run(agent="demo.email")
    domain.attempt_pause(run_id=run.id, generation=generation, reason="approval",
                         prompt="Tell the team.", action={
                             "tool": "send_email", "arguments": arguments or EMAIL,
                             "rationale": "Tell the team."})
    return Run.objects.get(pk=run.id), run_json(run.id)["ticket"]


def run_json(run_id) -> dict:
    from runs.domain.representation import run_data
    return run_data(selectors.run_get(run_id))


def resume(op_client, run, ticket, input):
    return op_client.post(f"/api/runs/{run.id}/resume/", {"ticket": ticket["id"],
                                                          "input": input}, format="json")


def resumed_event(run) -> Event:
    return Event.objects.filter(run_id=run.id, kind="resumed").get()


def test_the_ticket_is_bound_to_the_call_with_its_digest():
    _, ticket = approval_run()
    assert ticket["reason"] == "approval"
    assert ticket["action"] == {"tool": "send_email", "arguments": EMAIL,
                                "digest": action_digest("send_email", EMAIL),
                                "rationale": "Tell the team."}
    paused = Event.objects.filter(kind="paused").get()
    assert paused.data["digest"] == ticket["action"]["digest"]


@pytest.mark.parametrize("decision, stored, recorded", [
    pytest.param({"approved": True}, {"approved": True},
                 {"decision": "approved", "arguments": EMAIL}, id="approve"),
    pytest.param({"approved": True, "arguments": {"to": "boss@example.com", "body": "Done."}},
                 {"approved": True, "arguments": {"to": "boss@example.com", "body": "Done."}},
                 {"decision": "edited", "arguments": {"to": "boss@example.com", "body": "Done."},
                  "proposed_arguments": EMAIL}, id="edit"),
    pytest.param({"approved": False, "reason": "Not on a Sunday."},
                 {"approved": False, "reason": "Not on a Sunday."},
                 {"decision": "refused", "reason": "Not on a Sunday."}, id="reject"),
])
def test_a_decision_is_kept_and_the_timeline_says_who_what_and_from_where(
        op_client, decision, stored, recorded):
    run, ticket = approval_run()
    digest = ticket["action"]["digest"]
    response = resume(op_client, run, ticket, {**decision, "digest": digest})
    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "queued"
    closed = Run.objects.get(pk=run.id).tickets.get()
    assert (closed.state, closed.resume_input) == (TicketState.CONSUMED, stored)
    assert closed.action["arguments"] == EMAIL  # the proposed ones stay on the ticket
    event = resumed_event(run)
    assert (event.actor, event.source) == ("olga", "api")
    assert event.data == {"ticket": ticket["id"], "tool": "send_email", "digest": digest,
                          **recorded}


@pytest.mark.parametrize("bad", [
    None, {}, {"approved": "yes"}, {"approved": True, "extra": 1},
    {"approved": False, "arguments": EMAIL}, {"approved": True, "arguments": [1]},
    {"approved": False, "reason": 7}, {"approved": False, "reason": "x" * 501},
])
def test_anything_but_a_decision_is_invalid_and_changes_nothing(op_client, bad):
    run, ticket = approval_run()
    before = db_state()
    response = resume(op_client, run, ticket, bad)
    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert db_state() == before


def test_a_decision_for_another_action_is_a_mismatch_and_changes_nothing(op_client):
    run, ticket = approval_run()
    other = action_digest("send_email", {**EMAIL, "to": "all@example.com"})
    before = db_state()
    response = resume(op_client, run, ticket, {"approved": True, "digest": other})
    assert (response.status_code, response.json()["code"]) == (409, "ticket_mismatch")
    assert db_state() == before
    assert run_json(run.id)["ticket"]["id"] == ticket["id"]


def test_an_action_is_only_for_an_approval_and_its_arguments_are_an_object():
    run, generation = running_run(agent="demo.email")
    for reason, action in [("input", {"tool": "t", "arguments": {}}),
                           ("approval", {"tool": "t", "arguments": [1]}),
                           ("approval", {"tool": "", "arguments": {}})]:
        with pytest.raises(domain.InvalidRequest):
            domain.attempt_pause(run_id=run.id, generation=generation, reason=reason,
                                 action=action)
    assert Run.objects.get(pk=run.id).state == "running"


# --- the agent's side: ctx.approval across attempts ----------------------------------------


async def _awaited(awaitable):
    return await awaitable


def run_async(awaitable):
    """Await on a loop of its own; the host's domain calls come back to the test's thread
    (and so to its transaction) through sync_to_async."""
    return async_to_sync(_awaited)(awaitable)


class PausingHost:
    """A host that commits through the domain, as the worker's does, for one attempt."""

    output_per_second = 0
    provider = None  # set by a test that asks the model

    def __init__(self):
        self.pauses = []

    def publish_output(self, run_id, text):
        pass

    async def run_sync_tool(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)

    async def fence(self, ctx):  # the worker's reads the committed request (test_receipts)
        pass

    async def before_step(self, ctx):
        ctx.check()

    def before_tool(self, ctx, tool, arguments, pending):
        return action_digest(tool, arguments)  # no loop guard here

    async def commit_step(self, ctx, *, tokens, data=None):
        await sync_to_async(domain.attempt_step)(run_id=ctx.run_id,
                                generation=ctx.generation, tokens=tokens,
                                agent_state=ctx.state, data=data)

    async def pause(self, ctx, *, reason, prompt, schema=None, action=None):
        self.pauses.append(action)
        await sync_to_async(domain.attempt_pause)(run_id=ctx.run_id,
                                generation=ctx.generation, reason=reason, prompt=prompt,
                                action=action, agent_state=ctx.state)

    def activity(self, ctx, entry):
        pass


def next_attempt(run_id) -> Context:
    """Claim the queued run for a new attempt and give it the context the executor would."""
    attempt = domain.attempt_start(run_id=run_id, owner=OWNER, lease_seconds=30)
    view = selectors.attempt_view(run=attempt.run, generation=attempt.generation)
    return Context(run_id=str(run_id), generation=attempt.generation, input=view.input,
                   state=view.agent_state, resume=view.resume, token=CancellationToken(),
                   host=PausingHost())


def crash(run_id) -> None:
    """The attempt's worker dies: its lease runs out and the sweeper re-queues the run."""
    Attempt.objects.filter(run_id=run_id, state="live").update(
        lease_expires_at=timezone.now() - timedelta(minutes=5))
    assert domain.sweep()["requeued"] == 1


def test_an_approved_call_is_not_asked_again_after_a_crash_before_the_next_step(op_client):
    run, ticket = approval_run()
    edited = {**EMAIL, "to": "boss@example.com"}
    assert resume(op_client, run, ticket, {"approved": True, "arguments": edited}
                  ).status_code == 200
    ctx = next_attempt(run.id)
    decision = run_async(ctx.approval("send_email", EMAIL))
    assert (decision.approved, decision.arguments, decision.edited, decision.actor) == (
        True, edited, True, "olga")
    crash(run.id)  # the call may have run; no step committed after the decision

    ctx = next_attempt(run.id)
    again = run_async(ctx.approval("send_email", EMAIL))
    assert again == decision and ctx._host.pauses == []  # not asked again
    run_async(_one_step(ctx))

    crash(run.id)  # after the next committed step, the decision is spent: a new question
    ctx = next_attempt(run.id)
    with pytest.raises(Paused):
        run_async(ctx.approval("send_email", EMAIL))
    assert Run.objects.get(pk=run.id).ticket.action["arguments"] == EMAIL


async def _one_step(ctx):
    async with ctx.step():
        ctx.state["sent"] = True


def test_a_decision_never_applies_to_another_call(op_client):
    run, ticket = approval_run()
    assert resume(op_client, run, ticket, {"approved": True}).status_code == 200
    ctx = next_attempt(run.id)
    with pytest.raises(Paused):
        run_async(ctx.approval("send_email", {**EMAIL, "to": "all@example.com"}))
    run = Run.objects.get(pk=run.id)
    assert run.state == "awaiting" and run.ticket_id != ticket["id"]
    assert run.ticket.action["arguments"]["to"] == "all@example.com"


# --- converse: a tool that requires approval ----------------------------------------------


def test_converse_asks_before_a_tool_that_needs_approval_and_never_asks_the_model_twice(
        op_client, stub_server):
    sent = []

    @tool(requires_approval=True)
    def send_email(to: str, body: str) -> str:
        """Send an email."""
        sent.append({"to": to, "body": body})
        return f"sent to {to}"

    @tool
    def today() -> str:
        """Today's date."""
        return "Monday"

    hello = [{"role": "user", "content": "Tell the team"}]

    def attempt(ctx):
        async def main():
            client = ChatClient(ProviderConfig(base_url=stub_server.url, model="echo",
                                               max_retries=1))
            ctx._host.provider = client
            try:
                return await ctx.converse(hello, tools=[send_email, today])
            finally:
                await client.aclose()
        return run_async(main())

    queued = domain.run_create(agent="demo.assistant", dispatch=False)[0]
    ctx = next_attempt(queued.id)
    with pytest.raises(Paused):
        attempt(ctx)
    run = Run.objects.get(pk=queued.id)
    # The reply that asked for the tools committed with its step, before the pause.
    assert (run.state, run.steps, len(stub_server.stub.calls)) == ("awaiting", 1, 1)
    action = run.ticket.action
    assert (action["tool"], action["arguments"]) == (
        "send_email", {"to": "Tell the team", "body": "Tell the team"})
    assert sent == []
    ticket = run_json(run.id)["ticket"]
    assert resume(op_client, run, ticket, {"approved": False, "reason": "not today"}
                  ).status_code == 200

    ctx = next_attempt(run.id)
    answer = attempt(ctx)
    assert len(stub_server.stub.calls) == 2  # the committed round was not asked again
    assert sent == []
    assert "refused: not today" in answer and "Monday" in answer
    conversation = copy.deepcopy(ctx.state["conversation"])
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool", "tool",
                                                 "assistant"]


def test_an_approved_tool_runs_with_the_edited_arguments(op_client, stub_server):
    sent = []

    @tool(requires_approval=True)
    def send_email(to: str, body: str) -> str:
        """Send an email."""
        sent.append({"to": to, "body": body})
        return f"sent to {to}"

    def attempt(ctx):
        async def main():
            ctx._host.provider = ChatClient(ProviderConfig(base_url=stub_server.url,
                                                           model="echo", max_retries=1))
            try:
                return await ctx.converse([{"role": "user", "content": "hi"}],
                                          tools=[send_email])
            finally:
                await ctx._host.provider.aclose()
        return run_async(main())

    queued = domain.run_create(agent="demo.assistant", dispatch=False)[0]
    with pytest.raises(Paused):
        attempt(next_attempt(queued.id))
    run = Run.objects.get(pk=queued.id)
    edited = {"to": "boss@example.com", "body": "Done."}
    assert resume(op_client, run, run_json(run.id)["ticket"],
                  {"approved": True, "arguments": edited}).status_code == 200
    answer = attempt(next_attempt(run.id))
    assert sent == [edited] and "sent to boss@example.com" in answer
    step = Event.objects.filter(run_id=run.id, kind="step").order_by("seq").last()
    assert [(t["name"], t["ok"]) for t in step.data["tools"]] == [("send_email", True)]


# --- review links bound to the action ----------------------------------------------------


def make_link(op_client, run, **body) -> str:
    response = op_client.post(f"/api/runs/{run.id}/review-links/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["url"].split("testserver", 1)[1]


def answer(path, body):
    return Client().post(path, body, content_type="application/json")


def test_a_link_shows_the_action_and_decides_it_edited(op_client):
    run, ticket = approval_run()
    path = make_link(op_client, run)
    shown = Client().get(path).json()
    assert shown["action"] == ticket["action"]
    edited = {**EMAIL, "body": "The report is late."}
    response = answer(path, {"name": "Rita", "decision": "approve", "arguments": edited,
                             "digest": ticket["action"]["digest"]})
    assert response.status_code == 200, response.json()
    event = resumed_event(run)
    assert (event.actor, event.source, event.data["decision"], event.data["arguments"]) == (
        "Rita", "link", "edited", edited)


def test_a_link_rejects_with_a_reason(op_client):
    run, _ = approval_run()
    response = answer(make_link(op_client, run), {"name": "Rita", "decision": "reject",
                                                  "reason": "Wrong list."})
    assert response.status_code == 200, response.json()
    assert Run.objects.get(pk=run.id).tickets.get().resume_input == {
        "approved": False, "reason": "Wrong list."}


def test_a_link_for_another_digest_or_after_the_run_moved_on_changes_nothing(op_client):
    run, ticket = approval_run()
    path = make_link(op_client, run)
    before = {**db_state(), "links": list(ReviewLink.objects.values_list("state"))}
    wrong = answer(path, {"name": "Rita", "decision": "approve", "digest": "0" * 64})
    assert (wrong.status_code, wrong.json()["code"]) == (409, "ticket_mismatch")
    assert {**db_state(), "links": list(ReviewLink.objects.values_list("state"))} == before

    # The run moves on (resumed by an operator, then awaiting a new call): the link's
    # question is no longer asked, whatever it answers.
    assert resume(op_client, run, ticket, {"approved": True}).status_code == 200
    ctx = next_attempt(run.id)
    run_async(_one_step(ctx))
    with pytest.raises(Paused):
        run_async(ctx.approval("send_email", EMAIL))  # the same call, a new ticket
    before = db_state()
    for response in (Client().get(path), answer(path, {"name": "Rita", "decision": "approve"})):
        assert (response.status_code, response.json()["code"]) == (410, "link_stale")
    assert db_state() == before


def test_an_expired_link_decides_nothing(op_client):
    run, ticket = approval_run()
    path = make_link(op_client, run, expires_in=60)
    ReviewLink.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    before = db_state()
    response = answer(path, {"name": "Rita", "decision": "approve"})
    assert (response.status_code, response.json()["code"]) == (410, "link_expired")
    assert db_state() == before
    run = Run.objects.get(pk=run.id)
    assert (run.state, str(run.ticket_id)) == ("awaiting", ticket["id"])
    assert domain.sweep()  # nothing expires a ticket into a decision
    assert Run.objects.get(pk=run.id).state == "awaiting"


def test_the_timeline_says_what_was_decided_on_which_call(op_client, operator):
    run, ticket = approval_run()
    resume(op_client, run, ticket, {"approved": True, "arguments": {**EMAIL, "to": "b@x.org"}})
    page = browser_for(operator).get(f"/runs/{run.id}/panel/").content.decode()
    assert "edited send_email with to=b@x.org, body=The report is ready." in page
