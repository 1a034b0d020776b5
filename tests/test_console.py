"""What the operations console asks of a run: its page's url and its duration, Run again,
and typed resume input (a ticket's JSON Schema)."""

import asyncio
from datetime import timedelta

import pytest
from django.urls import resolve

from runs import domain
from runs.agents.demo import APPROVAL_SCHEMA, Approval
from runs.domain.errors import InvalidRequest
from runs.domain.representation import run_data
from runs.models import Event, Run, TicketState
from runs.pages import views as pages
from runs.runtime.agent import Context, Paused
from runs.runtime.token import CancellationToken
from tests.conftest import db_state
from tests.factories import awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db


# --- url and duration -----------------------------------------------------------------------


def test_the_url_of_a_run_is_its_page(viewer_client):
    run = queued_run()
    body = viewer_client.get(f"/api/runs/{run.id}/").json()
    assert body["url"] == f"/runs/{run.id}/"
    match = resolve(body["url"])
    assert match.func == pages.detail and str(match.kwargs["run_id"]) == str(run.id)


def test_duration_counts_closed_attempts_and_the_live_one_so_far(monkeypatch):
    run, _ = running_run()
    Run.objects.filter(pk=run.id).update(seconds_used=2.5)
    run = Run.objects.get(pk=run.id)
    later = run.claimed_at + timedelta(seconds=4)
    monkeypatch.setattr("django.utils.timezone.now", lambda: later)
    # It should be the closed attempts' 2.5 s and the live attempt's 4 s.
    assert run_data(run)["duration"] == pytest.approx(6.5)


def test_duration_of_a_run_not_running_is_its_running_time():
    queued = queued_run()
    assert run_data(queued)["duration"] == 0
    run, _ = awaiting_run()
    # It should not count the time spent awaiting.
    assert run_data(run)["duration"] == run.seconds_used


# --- Run again --------------------------------------------------------------------------------


def test_run_again_copies_agent_input_budget_and_thread_and_links_the_old_run(op_client):
    old = queued_run(agent="demo.fail", input={"steps": 3}, thread_id="t-9",
                     budget={"max_steps": 4, "max_seconds": 2.5, "max_cost_usd": 0.5,
                             "on_exhausted": "pause"})
    domain.run_stop(run_id=old.id, actor="olga", source="api", reason="try again")
    response = op_client.post(f"/api/runs/{old.id}/rerun/")
    assert response.status_code == 201, response.json()
    new = response.json()
    assert new["id"] != str(old.id) and new["rerun_of"] == str(old.id)
    assert (new["agent"], new["input"], new["thread_id"]) == ("demo.fail", {"steps": 3}, "t-9")
    assert new["budget"] == {"max_steps": 4, "max_seconds": 2.5, "max_tokens": None,
                             "max_cost_usd": 0.5, "max_repeats": None, "on_exhausted": "pause"}
    assert (new["state"], new["version"]) == ("queued", 1)
    stored = Run.objects.get(pk=new["id"])
    assert stored.created_by.username == "olga" and stored.rerun_of_id == old.id
    created = Event.objects.get(run_id=new["id"])
    assert (created.kind, created.actor, created.source) == ("created", "olga", "api")
    assert created.data["rerun_of"] == str(old.id)
    # The old run is as it was.
    assert op_client.get(f"/api/runs/{old.id}/").json()["rerun_of"] is None


def test_run_again_does_not_keep_the_parent():
    parent = queued_run()
    child = queued_run(parent_id=parent.id)
    domain.run_cancel(run_id=parent.id, actor="olga", source="api")
    again, created = domain.run_rerun(run_id=child.id, source="api")
    assert created and again.parent_id is None and again.thread_id == child.thread_id


def test_run_again_with_an_idempotency_key_replays(op_client):
    old = queued_run()
    first = op_client.post(f"/api/runs/{old.id}/rerun/", HTTP_IDEMPOTENCY_KEY="again-1")
    replay = op_client.post(f"/api/runs/{old.id}/rerun/", HTTP_IDEMPOTENCY_KEY="again-1")
    assert (first.status_code, replay.status_code) == (201, 200)
    assert first.json()["id"] == replay.json()["id"]
    other = queued_run()
    conflict = op_client.post(f"/api/runs/{other.id}/rerun/", HTTP_IDEMPOTENCY_KEY="again-1")
    assert (conflict.status_code, conflict.json()["code"]) == (409, "idempotency_conflict")
    assert Run.objects.filter(rerun_of__isnull=False).count() == 1


@pytest.mark.parametrize("who, run_id, status, code", [
    ("viewer", "{run}", 403, "permission_denied"),
    ("op", "00000000-0000-0000-0000-000000000000", 404, "not_found"),
    ("op", "not-a-uuid", 404, "not_found"),
])
def test_run_again_refusals_change_nothing(op_client, viewer_client, who, run_id, status, code):
    run = queued_run()
    client = op_client if who == "op" else viewer_client
    before = db_state()
    response = client.post(f"/api/runs/{run_id.format(run=run.id)}/rerun/")
    assert (response.status_code, response.json()["code"]) == (status, code)
    assert db_state() == before


# --- typed resume input -------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"count": {"type": "integer", "minimum": 1}},
          "required": ["count"], "additionalProperties": False}


def awaiting_with_schema(schema=SCHEMA) -> tuple[Run, str]:
    run, generation = running_run()
    ticket = domain.attempt_pause(run_id=run.id, generation=generation, reason="input",
                                  prompt={"question": "How many?"}, schema=schema)
    return Run.objects.get(pk=run.id), str(ticket.pk)


def test_the_ticket_carries_its_schema_in_the_run(viewer_client):
    run, ticket_id = awaiting_with_schema()
    ticket = viewer_client.get(f"/api/runs/{run.id}/").json()["ticket"]
    assert ticket["id"] == ticket_id and ticket["schema"] == SCHEMA
    assert ticket["prompt"] == {"question": "How many?"}
    plain, _ = awaiting_run()
    assert viewer_client.get(f"/api/runs/{plain.id}/").json()["ticket"]["schema"] is None


@pytest.mark.parametrize("value, where", [
    ({"count": 0}, "input['count']"),
    ({"count": "two"}, "input['count']"),
    ({}, "input"),
    ({"count": 2, "extra": 1}, "input"),
    (None, "input"),
    ([1], "input"),
])
def test_an_input_the_schema_refuses_is_a_400_and_changes_nothing(op_client, value, where):
    run, ticket_id = awaiting_with_schema()
    before = db_state()
    response = op_client.post(f"/api/runs/{run.id}/resume/", {"ticket": ticket_id,
                                                              "input": value}, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "invalid" and body["detail"].startswith(f"{where}: ")
    assert db_state() == before


def test_an_input_the_schema_accepts_resumes(op_client):
    run, ticket_id = awaiting_with_schema()
    response = op_client.post(f"/api/runs/{run.id}/resume/",
                              {"ticket": ticket_id, "input": {"count": 3}}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "queued"
    ticket = Run.objects.get(pk=run.id).tickets.get()
    assert (ticket.state, ticket.resume_input) == (TicketState.CONSUMED, {"count": 3})


def test_a_ticket_with_an_invalid_schema_is_refused_and_changes_nothing():
    run, generation = running_run()
    before = db_state()
    with pytest.raises(InvalidRequest, match="not a valid JSON Schema"):
        domain.attempt_pause(run_id=run.id, generation=generation, reason="input",
                             schema={"type": "no-such-type"})
    assert db_state() == before


class Host:
    """Just enough of the executor for an agent to reach its pause."""

    def __init__(self):
        self.paused = None

    async def fence(self, ctx):  # no request is ever committed here
        pass

    async def before_step(self, ctx):
        pass

    async def commit_step(self, ctx, *, tokens):
        pass

    def activity(self, ctx, entry):
        pass

    async def pause(self, ctx, *, reason, prompt, schema=None):
        self.paused = {"reason": reason, "prompt": prompt, "schema": schema}


def test_demo_approval_declares_its_schema():
    host = Host()
    ctx = Context(run_id="r", generation=1, input={"steps_before": 0}, state={}, resume=None,
                  token=CancellationToken(), host=host)
    with pytest.raises(Paused):
        asyncio.run(Approval().run(ctx))
    assert host.paused["reason"] == "approval"
    assert host.paused["schema"] == APPROVAL_SCHEMA == {
        "type": "object", "properties": {"approved": {"type": "boolean"}},
        "required": ["approved"]}


def test_an_approval_needs_a_boolean_answer(op_client):
    run, ticket_id = awaiting_with_schema(APPROVAL_SCHEMA)
    refused = op_client.post(f"/api/runs/{run.id}/resume/",
                             {"ticket": ticket_id, "input": {"approved": "yes"}}, format="json")
    assert refused.status_code == 400
    assert refused.json()["detail"] == "input['approved']: 'yes' is not of type 'boolean'"
    accepted = op_client.post(f"/api/runs/{run.id}/resume/",
                              {"ticket": ticket_id, "input": {"approved": True}}, format="json")
    assert accepted.status_code == 200


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_approval_run_refuses_an_untyped_answer_then_completes(worker):
    from harness.processes import wait_until
    from tests.conftest import client_for, make_user

    api = client_for(make_user("olga", "operator"))
    created = api.post("/api/runs/", {"agent": "demo.approval",
                                      "input": {"step_seconds": 0.02}}, format="json").json()
    run = wait_until(lambda: (lambda r: r if r["state"] == "awaiting" else None)(
        api.get(f"/api/runs/{created['id']}/").json()), 10, "the approval pause")
    assert run["ticket"]["schema"] == APPROVAL_SCHEMA
    ticket = run["ticket"]["id"]
    refused = api.post(f"/api/runs/{run['id']}/resume/", {"ticket": ticket, "input": {}},
                       format="json")
    assert (refused.status_code, refused.json()["code"]) == (400, "invalid")
    assert api.post(f"/api/runs/{run['id']}/resume/", {"ticket": ticket,
                    "input": {"approved": True}}, format="json").status_code == 200
    done = wait_until(lambda: (lambda r: r if r["state"] == "ended" else None)(
        api.get(f"/api/runs/{run['id']}/").json()), 10, "completion")
    assert done["end_cause"] == "completed" and done["output"] == {"approved": True}

