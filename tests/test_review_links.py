"""Review links: single use, expiring, bound to one ticket, shown once, revocable; a spent
link changes nothing."""

import hashlib
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runs import domain
from runs.domain import outside, review
from runs.domain.errors import LinkStale, LinkUsed, NotAwaiting
from runs.models import Event, ReviewLink, Run, TicketState
from tests.conftest import db_state
from tests.factories import awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db

APPROVAL = {"type": "object", "properties": {"approved": {"type": "boolean"}},
            "required": ["approved"]}


def approval_run() -> tuple[Run, str]:
    run, generation = running_run(agent="demo.approval")
    ticket = domain.attempt_pause(run_id=run.id, generation=generation, reason="approval",
                                  prompt={"question": "Ship it?"}, schema=APPROVAL)
    return Run.objects.get(pk=run.id), str(ticket.pk)


def make_link(op_client, run, **body) -> dict:
    response = op_client.post(f"/api/runs/{run.id}/review-links/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def path_of(link: dict) -> str:
    return link["url"].split("testserver", 1)[1]


def state() -> dict:
    """Everything a refused use must leave as it was, the links included."""
    return {**db_state(), "links": sorted(ReviewLink.objects.values_list("id", "state"))}


def test_an_operator_makes_a_link_shown_once(op_client):
    run, ticket_id = approval_run()
    link = make_link(op_client, run)
    assert link["url"].startswith("http://testserver/review/")
    token = path_of(link).split("/")[2]
    assert len(token) >= 40
    assert (link["run_id"], link["ticket_id"], link["state"]) == (str(run.id), ticket_id, "open")
    assert link["created_by"] == "olga"
    stored = ReviewLink.objects.get(pk=link["id"])
    assert stored.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in str(list(ReviewLink.objects.values()))
    lifetime = stored.expires_at - stored.created_at
    assert abs(lifetime - timedelta(days=1)).total_seconds() < 5
    listed = op_client.get(f"/api/runs/{run.id}/review-links/").json()["results"]
    assert [item["id"] for item in listed] == [link["id"]] and "url" not in listed[0]


def test_the_link_shows_only_the_agent_and_the_prompt(op_client):
    run, _ = approval_run()
    link = make_link(op_client, run)
    response = Client().get(path_of(link))
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"agent", "reason", "prompt", "schema", "expires_at", "action"}
    assert (body["agent"], body["reason"], body["prompt"]) == (
        "demo.approval", "approval", {"question": "Ship it?"})
    assert body["schema"] == APPROVAL and str(run.id) not in response.content.decode()


def test_an_approval_through_the_link_resumes_the_run_in_the_reviewers_name(op_client):
    run, ticket_id = approval_run()
    link = make_link(op_client, run)
    response = Client().post(path_of(link), {"name": "  Rita Reviewer ", "decision": "approve"},
                             content_type="application/json")
    assert response.status_code == 200, response.json()
    assert response.json() == {"resumed": True}
    run = Run.objects.get(pk=run.id)
    assert run.state == "queued"
    ticket = run.tickets.get()
    assert (ticket.state, ticket.resume_input, ticket.closed_by) == (
        TicketState.CONSUMED, {"approved": True}, "Rita Reviewer")
    resumed = Event.objects.get(run=run, kind="resumed")
    assert (resumed.actor, resumed.source, resumed.data["ticket"]) == (
        "Rita Reviewer", "link", ticket_id)
    used = op_client.get(f"/api/runs/{run.id}/review-links/").json()["results"][0]
    assert (used["state"], used["closed_by"]) == ("used", "Rita Reviewer")


def test_a_rejection_and_a_typed_input(op_client):
    rejected, _ = approval_run()
    link = make_link(op_client, rejected)
    Client().post(path_of(link), {"name": "Rita", "decision": "reject"},
                  content_type="application/json")
    assert Run.objects.get(pk=rejected.id).tickets.get().resume_input == {"approved": False}
    typed, _ = approval_run()
    link = make_link(op_client, typed)
    response = Client().post(path_of(link), {"name": "Rita", "input": {"approved": True}},
                             content_type="application/json")
    assert response.status_code == 200
    assert Run.objects.get(pk=typed.id).tickets.get().resume_input == {"approved": True}


def test_a_used_link_is_gone_and_changes_nothing(op_client):
    run, _ = approval_run()
    link = make_link(op_client, run)
    Client().post(path_of(link), {"name": "Rita", "decision": "approve"},
                  content_type="application/json")
    before = state()
    for response in (Client().get(path_of(link)),
                     Client().post(path_of(link), {"name": "Mallory", "decision": "reject"},
                                   content_type="application/json")):
        assert (response.status_code, response.json()["code"]) == (410, "link_used")
        assert response.json()["detail"]
    assert state() == before


def test_an_expired_link_is_gone_and_changes_nothing(op_client):
    run, _ = approval_run()
    link = make_link(op_client, run, expires_in=60)
    ReviewLink.objects.filter(pk=link["id"]).update(expires_at=timezone.now())
    before = state()
    for response in (Client().get(path_of(link)),
                     Client().post(path_of(link), {"name": "Rita", "decision": "approve"},
                                   content_type="application/json")):
        assert (response.status_code, response.json()["code"]) == (410, "link_expired")
    assert state() == before
    listed = op_client.get(f"/api/runs/{run.id}/review-links/").json()["results"][0]
    assert listed["state"] == "expired"


def test_a_revoked_link_is_gone_and_changes_nothing(op_client):
    run, _ = approval_run()
    link = make_link(op_client, run)
    revoke = f"/api/runs/{run.id}/review-links/{link['id']}/revoke/"
    response = op_client.post(revoke)
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["closed_by"]) == ("revoked", "olga")
    assert op_client.post(revoke).json()["state"] == "revoked"  # again: as it is
    before = state()
    for response in (Client().get(path_of(link)),
                     Client().post(path_of(link), {"name": "Rita", "decision": "approve"},
                                   content_type="application/json")):
        assert (response.status_code, response.json()["code"]) == (410, "link_revoked")
    assert state() == before
    assert Run.objects.get(pk=run.id).state == "awaiting"


def test_a_used_link_cannot_be_revoked(op_client):
    run, _ = approval_run()
    link = make_link(op_client, run)
    Client().post(path_of(link), {"name": "Rita", "decision": "approve"},
                  content_type="application/json")
    response = op_client.post(f"/api/runs/{run.id}/review-links/{link['id']}/revoke/")
    assert (response.status_code, response.json()["code"]) == (410, "link_used")


def test_a_ticket_consumed_by_another_resume_is_no_longer_open_for_the_link(op_client):
    run, ticket_id = approval_run()
    link = make_link(op_client, run)
    op_client.post(f"/api/runs/{run.id}/resume/", {"ticket": ticket_id,
                                                   "input": {"approved": True}}, format="json")
    before = state()
    for response in (Client().get(path_of(link)),
                     Client().post(path_of(link), {"name": "Rita", "decision": "reject"},
                                   content_type="application/json")):
        assert (response.status_code, response.json()["code"]) == (410, "link_stale")
    assert state() == before


def test_the_link_is_bound_to_its_ticket_not_to_the_run(op_client):
    run, ticket_id = approval_run()
    link = make_link(op_client, run)
    domain.run_resume(run_id=run.id, ticket_id=ticket_id, input={"approved": True},
                      actor="olga", source="api")
    generation = domain.attempt_start(run_id=run.id, owner="w:1", lease_seconds=30).generation
    domain.attempt_pause(run_id=run.id, generation=generation, reason="approval",
                         schema=APPROVAL)  # awaiting again, with a new ticket
    before = state()
    response = Client().post(path_of(link), {"name": "Rita", "decision": "approve"},
                             content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (410, "link_stale")
    assert state() == before


def test_a_link_answers_its_own_run_and_no_other(op_client):
    mine, _ = approval_run()
    other, other_ticket = approval_run()
    link = make_link(op_client, mine)
    assert Client().get(path_of(link)).json()["prompt"] == {"question": "Ship it?"}
    Client().post(path_of(link), {"name": "Rita", "decision": "approve"},
                  content_type="application/json")
    assert Run.objects.get(pk=mine.id).state == "queued"
    other = Run.objects.get(pk=other.id)
    assert (other.state, str(other.ticket_id)) == ("awaiting", other_ticket)
    # Under the other run's address the link is not found.
    assert op_client.get(f"/api/runs/{other.id}/review-links/").json()["results"] == []
    response = op_client.post(f"/api/runs/{other.id}/review-links/{link['id']}/revoke/")
    assert (response.status_code, response.json()["code"]) == (404, "not_found")
    # Nor does the token stand in for the other run's ticket.
    token = path_of(link).split("/")[2]
    resumed = op_client.post(f"/api/runs/{other.id}/resume/", {"ticket": token},
                             format="json")
    assert resumed.status_code == 400 and Run.objects.get(pk=other.id).state == "awaiting"


def test_an_input_the_schema_refuses_leaves_the_link_usable(op_client):
    run, _ = approval_run()
    link = make_link(op_client, run)
    before = state()
    response = Client().post(path_of(link), {"name": "Rita", "input": {"approved": "yes"}},
                             content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert state() == before
    assert Client().get(path_of(link)).status_code == 200


@pytest.mark.parametrize("body, field", [
    ({"decision": "approve"}, "name"),
    ({"name": "", "decision": "approve"}, "name"),
    ({"name": "x" * 151, "decision": "approve"}, "name"),
    ({"name": "Rita", "decision": "maybe"}, "decision"),
    ({"name": "Rita", "decision": "approve", "input": {"approved": True}}, "decision"),
])
def test_a_bad_answer_is_a_400_and_changes_nothing(op_client, body, field):
    run, _ = approval_run()
    link = make_link(op_client, run)
    before = state()
    response = Client().post(path_of(link), body, content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert field in response.json()["detail"]
    assert state() == before


def test_an_unknown_link_is_not_found():
    for response in (Client().get("/review/not-a-token/"),
                     Client().post("/review/not-a-token/", {"name": "x"},
                                   content_type="application/json")):
        assert (response.status_code, response.json()["code"]) == (404, "not_found")


@pytest.mark.parametrize("who, target, body, status, code", [
    ("op", "queued", {}, 409, "not_awaiting"),
    ("op", "running", {}, 409, "not_awaiting"),
    ("op", "unknown", {}, 404, "not_found"),
    ("op", "awaiting", {"expires_in": 59}, 400, "invalid"),
    ("op", "awaiting", {"expires_in": 604801}, 400, "invalid"),
    ("viewer", "awaiting", {}, 403, "permission_denied"),
])
def test_a_link_is_made_only_for_an_awaiting_run_by_an_operator(
        op_client, viewer_client, who, target, body, status, code):
    runs = {"queued": queued_run().id, "running": running_run()[0].id,
            "awaiting": awaiting_run()[0].id, "unknown": "00000000-0000-0000-0000-000000000000"}
    client = op_client if who == "op" else viewer_client
    before = state()
    response = client.post(f"/api/runs/{runs[target]}/review-links/", body, format="json")
    assert (response.status_code, response.json()["code"]) == (status, code)
    assert state() == before


def test_a_viewer_reads_the_links_but_cannot_revoke(op_client, viewer_client):
    run, _ = approval_run()
    link = make_link(op_client, run)
    assert viewer_client.get(f"/api/runs/{run.id}/review-links/").status_code == 200
    response = viewer_client.post(f"/api/runs/{run.id}/review-links/{link['id']}/revoke/")
    assert response.status_code == 403
    assert ReviewLink.objects.get(pk=link["id"]).state == "open"


class KeptQueued:
    """The workers interface, but queued runs are kept in a list instead of sent."""

    def __init__(self, real):
        self.real = real
        self.queued = []

    def runs_queued(self, *, runs) -> None:
        self.queued.extend(run_id for run_id, _ in runs)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture
def runs_kept_here():
    """Runs queued by the test are not sent: a worker started for other tests (the
    session's shared one) would claim them and hold their rows while this test's database
    is flushed."""
    real = outside.workers
    kept = KeptQueued(real)
    outside.connect(workers=kept)
    yield kept
    outside.connect(workers=real)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_answers_at_once_resume_once(gang, operator, runs_kept_here):
    gang_of = gang(4)
    for _ in range(10):
        run, ticket_id = approval_run()
        _, token = review.review_link_create(run_id=run.id, actor="olga", seconds=600)

        def answer(name, token=token):
            return lambda: review.review_link_use(token=token, name=name,
                                                  input={"approved": True})

        def operator_resume(run_id=run.id, ticket_id=ticket_id):
            return domain.run_resume(run_id=run_id, ticket_id=ticket_id,
                                     input={"approved": False}, actor="olga", source="api")

        results = gang_of.run([answer("Rita"), answer("Rob"), answer("Ria"), operator_resume])
        winners = [r for r in results if isinstance(r, Run)]
        assert len(winners) == 1, results
        assert runs_kept_here.queued.count(run.id) == 1  # resumed, so queued, once
        for loser in results:
            if not isinstance(loser, Run):
                assert isinstance(loser, (LinkUsed, LinkStale, NotAwaiting)), loser
        assert Event.objects.filter(run_id=run.id, kind="resumed").count() == 1
        link = ReviewLink.objects.get(token_hash=review.token_hash(token))
        resumed = Event.objects.get(run_id=run.id, kind="resumed")
        # The link is used exactly when a reviewer's answer won.
        assert (link.state == "used") == (resumed.source == "link")
        if link.state == "used":
            assert link.closed_by == resumed.actor


def test_a_link_outlives_no_access_of_its_maker(op_client, operator):
    run, _ = approval_run()
    link = make_link(op_client, run)
    operator.is_active = False
    operator.save()
    before = state()
    for response in (Client().get(path_of(link)),
                     Client().post(path_of(link), {"name": "Rita", "decision": "approve"},
                                   content_type="application/json")):
        assert (response.status_code, response.json()["code"]) == (410, "link_revoked")
        assert "can no longer resume" in response.json()["detail"]
    assert state() == before
    operator.is_active = True
    operator.save()
    operator.groups.clear()  # no longer an operator: the same
    assert Client().get(path_of(link)).status_code == 410


def test_a_reviewers_name_loses_its_control_and_bidi_characters(op_client):
    run, _ = approval_run()
    link = make_link(op_client, run)
    response = Client().post(path_of(link), {"name": "Rita\u202e \x1b[31mRed\u2066\n",
                                             "decision": "approve"},
                             content_type="application/json")
    assert response.status_code == 200
    assert Event.objects.get(run=run, kind="resumed").actor == "Rita [31mRed"
    only_controls = make_link(op_client, approval_run()[0])
    response = Client().post(path_of(only_controls), {"name": "\u202e\u2066",
                                                      "decision": "approve"},
                             content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (400, "invalid")


def test_actor_names_are_isolated_where_the_run_page_shows_them(op_client, operator):
    from tests.conftest import browser_for

    run, _ = approval_run()
    link = make_link(op_client, run)
    Client().post(path_of(link), {"name": "Rita", "decision": "approve"},
                  content_type="application/json")
    panel = browser_for(operator).get(f"/runs/{run.id}/").content.decode()
    assert "by <bdi>Rita</bdi> via Review link" in panel
