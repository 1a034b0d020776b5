"""The REST contract of API.md: shapes, status codes, error codes, who may do what."""

import uuid
from datetime import timedelta

import jsonschema
import pytest
import yaml
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from rest_framework import serializers
from rest_framework.test import APIClient

from runs import domain
from runs.domain import selectors
from runs.domain.representation import bulk_data, event_data, run_data, when
from runs.models import BulkJob, Event, Run
from tests.conftest import browser_for, client_for, db_state
from tests.factories import awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db

RUN_KEYS = {
    "id", "agent", "input", "thread_id", "parent_id", "state", "end_cause", "stop_code",
    "stop_reason", "error", "output", "generation", "ticket", "control", "budget", "usage",
    "version", "created_at", "started_at", "ended_at", "updated_at",
}


def test_create_returns_the_run(op_client):
    response = op_client.post("/api/runs/", {"agent": "demo.steps", "input": {"steps": 2},
                                             "budget": {"max_steps": 5}}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert RUN_KEYS <= set(body)
    assert body["state"] == "queued" and body["generation"] == 0 and body["version"] == 1
    assert body["budget"] == {"max_steps": 5, "max_seconds": None, "max_tokens": None,
                              "max_cost_usd": None, "max_repeats": None, "on_exhausted": "stop"}
    assert body["usage"]["cost_usd"] == 0
    assert body["usage"]["steps"] == 0
    assert Run.objects.get(pk=body["id"]).created_by.username == "olga"


def test_an_input_that_is_not_an_object_is_refused_in_plain_words(op_client):
    response = op_client.post("/api/runs/", {"agent": "demo.steps", "input": [1, 2]},
                              format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid"
    assert "must be a JSON object" in body["detail"] and "dictionary" not in body["detail"]
    assert not Run.objects.exists()


def test_a_batch_creates_every_run_in_order_and_dispatches_each(
        op_client, monkeypatch, django_capture_on_commit_callbacks):
    sent = []
    monkeypatch.setattr("runs.workers.dispatch.runs_queued", lambda runs: sent.extend(runs))
    parent = queued_run()
    items = [{"agent": "demo.steps", "input": {"steps": 1}},
             {"agent": "demo.fail", "budget": {"max_steps": 2}, "thread_id": "t-1"},
             {"agent": "demo.steps", "parent_id": str(parent.id)}]
    with django_capture_on_commit_callbacks(execute=True):
        response = op_client.post("/api/runs/batch/", {"runs": items}, format="json")
    assert response.status_code == 201, response.json()
    made = response.json()["results"]
    assert [run["agent"] for run in made] == ["demo.steps", "demo.fail", "demo.steps"]
    assert made[1]["budget"]["max_steps"] == 2 and made[1]["thread_id"] == "t-1"
    assert made[2]["parent_id"] == str(parent.id) and made[2]["thread_id"] == parent.thread_id
    for run in made:
        assert RUN_KEYS <= set(run)
        assert (run["state"], run["version"]) == ("queued", 1)
        stored = Run.objects.get(pk=run["id"])
        assert stored.created_by.username == "olga"
        assert list(stored.events.values_list("kind", "version", "source")) == [
            ("created", 1, "api")]
    assert [str(run_id) for run_id, _ in sent] == [run["id"] for run in made]


def test_a_batch_with_an_idempotency_key_is_refused(op_client):
    response = op_client.post("/api/runs/batch/", {"runs": [{"agent": "demo.steps"}]},
                              format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert not Run.objects.exists()


def test_create_with_an_idempotency_key_replays(op_client):
    payload = {"agent": "demo.steps"}
    first = op_client.post("/api/runs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="abc")
    again = op_client.post("/api/runs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="abc")
    other = op_client.post("/api/runs/", {"agent": "demo.fail"}, format="json",
                           HTTP_IDEMPOTENCY_KEY="abc")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert other.status_code == 409 and other.json()["code"] == "idempotency_conflict"


def test_list_filters_and_pages_newest_first(op_client):
    runs = [queued_run(agent="demo.steps", thread_id="t") for _ in range(5)]
    domain.run_cancel(run_id=runs[0].id, actor="olga", source="api")
    body = op_client.get("/api/runs/?limit=2").json()
    assert [r["id"] for r in body["results"]] == [str(runs[4].id), str(runs[3].id)]
    seen = [r["id"] for r in body["results"]]
    while body["next"]:
        body = op_client.get(body["next"]).json()
        seen += [r["id"] for r in body["results"]]
    assert seen == [str(r.id) for r in reversed(runs)]
    ended = op_client.get("/api/runs/?state=ended&end_cause=cancelled").json()["results"]
    assert [r["id"] for r in ended] == [str(runs[0].id)]
    assert len(op_client.get("/api/runs/?thread_id=t&agent=demo.steps").json()["results"]) == 5


def test_detail_and_events(viewer_client):
    run = queued_run()
    domain.run_cancel(run_id=run.id, actor="olga", source="api", reason="why not")
    detail = viewer_client.get(f"/api/runs/{run.id}/").json()
    assert detail["end_cause"] == "cancelled" and detail["version"] == 3
    assert detail["control"]["action"] == "cancel"
    assert detail["control"]["requested_by"] == "olga"
    assert detail["control"]["applied_at"] is not None
    events = viewer_client.get(f"/api/runs/{run.id}/events/").json()["results"]
    assert [e["kind"] for e in events] == ["created", "cancel_requested", "ended"]
    assert {"seq", "run_id", "kind", "state", "end_cause", "generation", "actor", "source",
            "data", "at"} <= set(events[0])
    after = viewer_client.get(f"/api/runs/{run.id}/events/?after={events[0]['seq']}").json()
    assert [e["kind"] for e in after["results"]] == ["cancel_requested", "ended"]


def test_global_event_feed_pages_in_seq_order(viewer_client):
    for _ in range(3):
        queued_run()
    first = viewer_client.get("/api/events/?limit=2").json()["results"]
    rest = viewer_client.get(f"/api/events/?after={first[-1]['seq']}").json()["results"]
    seqs = [e["seq"] for e in first + rest]
    assert seqs == sorted(seqs) and len(seqs) == 3


def test_cancel_of_a_queued_run_answers_200_ended(op_client):
    run = queued_run()
    response = op_client.post(f"/api/runs/{run.id}/cancel/", {}, format="json")
    assert response.status_code == 200
    assert response.json()["end_cause"] == "cancelled"
    assert response.json()["control"]["source"] == "api"


def test_cancel_of_a_running_run_answers_202_with_the_intent(op_client):
    run, _ = running_run()
    response = op_client.post(f"/api/runs/{run.id}/cancel/?wait=0", {}, format="json")
    assert response.status_code == 202
    body = response.json()
    assert body["state"] == "running"
    assert body["control"]["action"] == "cancel" and body["control"]["applied_at"] is None


def _resumed():
    run, ticket = awaiting_run()
    return run, "resume/", {"ticket": ticket}


@pytest.mark.parametrize("asked", [
    lambda: (queued_run(), "cancel/", {}),
    lambda: (running_run()[0], "cancel/?wait=0", {}),
    lambda: (awaiting_run()[0], "stop/", {"reason": "over budget"}),
    lambda: (domain.run_cancel(run_id=queued_run().id, actor="t", source="cli").run,
             "cancel/", {}),
    _resumed,
])
def test_a_control_with_nothing_to_wait_for_answers_with_what_it_committed_unread(
        op_client, asked):
    """A cancel or stop that ends the run itself, finds it ended, or is not to wait, and a
    resume, answer with the run as their own transaction left it: the run is not read again
    after the commit, and the answer is what a read of the run then shows."""
    run, path, body = asked()
    with CaptureQueriesContext(connection) as queries:
        response = op_client.post(f"/api/runs/{run.id}/{path}", body, format="json")
    assert response.status_code in (200, 202), response.json()
    reads = [q["sql"] for q in queries.captured_queries
             if 'FROM "runs_run"' in q["sql"] and "parent_id\" =" not in q["sql"]]
    assert len(reads) == 1, reads  # the one that locks the run (the other reads its children)
    answer, read = response.json(), op_client.get(f"/api/runs/{run.id}/").json()
    if answer["state"] != "ended":  # how long it has run so far, at each answer's time
        del answer["duration"], read["duration"]
    assert answer == read


def test_stop_answers_with_the_reason(op_client):
    run = queued_run()
    response = op_client.post(f"/api/runs/{run.id}/stop/", {"reason": "over budget"},
                              format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["end_cause"], body["stop_code"], body["stop_reason"]) == (
        "stopped", "operator", "over budget")


def test_cancel_of_an_ended_run_returns_the_committed_state(op_client):
    run = queued_run()
    op_client.post(f"/api/runs/{run.id}/stop/", {"reason": "first"}, format="json")
    before = db_state()
    response = op_client.post(f"/api/runs/{run.id}/cancel/", {}, format="json")
    assert response.status_code == 200
    assert response.json()["end_cause"] == "stopped"
    assert db_state() == before


def test_resume_wakes_an_awaiting_run(op_client):
    run, ticket_id = awaiting_run()
    response = op_client.post(f"/api/runs/{run.id}/resume/",
                              {"ticket": ticket_id, "input": {"approved": True}}, format="json")
    assert response.status_code == 200
    assert response.json()["state"] == "queued" and response.json()["ticket"] is None


def test_session_auth_records_source_ui_and_needs_csrf(operator):
    run = queued_run()
    browser = browser_for(operator, enforce_csrf_checks=True)
    refused = browser.post(f"/api/runs/{run.id}/cancel/", {}, content_type="application/json")
    assert refused.status_code == 403
    browser.get("/accounts/login/")
    token = browser.cookies["csrftoken"].value
    response = browser.post(f"/api/runs/{run.id}/cancel/", {}, content_type="application/json",
                            HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200
    assert response.json()["control"]["source"] == "ui"


def test_schema_is_served_to_users(viewer_client):
    response = viewer_client.get("/api/schema/")
    assert response.status_code == 200
    assert "/api/runs/{run_id}/cancel/" in yaml.safe_load(response.content)["paths"]
    assert viewer_client.get("/api/docs/").status_code == 200


def test_the_schema_refuses_in_json_like_the_rest_of_the_api(anon_client, stranger):
    for client, status, code in [(anon_client, 401, "not_authenticated"),
                                 (client_for(stranger), 403, "permission_denied")]:
        response = client.get("/api/schema/")
        assert response.status_code == status
        assert response["Content-Type"] == "application/json"
        assert response.json()["code"] == code


# --- hostile input: refused before anything is stored ---------------------------------------


def nested(depth: int) -> str:
    """A JSON array ``depth`` levels deep, as text (``json.dumps`` would recurse)."""
    return "[" * depth + "]" * depth


def test_json_nested_64_deep_is_accepted_and_65_is_not(op_client):
    # The body is an object (1) holding input (2): 62 arrays more make 64 levels.
    fits = '{"agent": "demo.steps", "input": {"a": ' + nested(62) + "}}"
    over = '{"agent": "demo.steps", "input": {"a": ' + nested(63) + "}}"
    created = op_client.generic("POST", "/api/runs/", fits, content_type="application/json")
    assert created.status_code == 201, created.json()
    refused = op_client.generic("POST", "/api/runs/", over, content_type="application/json")
    assert (refused.status_code, refused.json()["code"]) == (400, "invalid")
    assert "64" in refused.json()["detail"]
    assert Run.objects.count() == 1


def test_unicode_beyond_the_basic_plane_is_text_not_a_surrogate(op_client):
    body = r'{"agent": "demo.steps", "input": {"\u00e9": "\ud83d\ude00 \u00e9"}}'
    response = op_client.generic("POST", "/api/runs/", body, content_type="application/json")
    assert response.status_code == 201, response.json()
    assert response.json()["input"] == {"é": "😀 é"}
    assert Run.objects.get().input == {"é": "😀 é"}


def test_a_lone_surrogate_stores_nothing_and_every_page_still_answers(op_client, operator):
    queued_run()
    before = db_state()
    body = r'{"agent": "demo.steps", "input": {"note": "\ud800"}}'
    response = op_client.generic("POST", "/api/runs/", body, content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert db_state() == before
    assert op_client.get("/api/runs/").status_code == 200
    assert browser_for(operator).get("/").status_code == 200


def test_an_idempotency_key_with_a_nul_is_refused(op_client):
    response = op_client.post("/api/runs/", {"agent": "demo.steps"}, format="json",
                              HTTP_IDEMPOTENCY_KEY="a\x00b")
    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert not Run.objects.exists()


# --- the list page: large runs listed without their input and output ------------------------


def test_a_large_run_is_listed_truncated_and_whole_on_its_own(op_client, settings):
    settings.AWAKEN_LIST_PAYLOAD_BYTES = 1000
    small = queued_run(input={"note": "x" * 900})
    large = queued_run(input={"note": "x" * 1000})
    listed = {run["id"]: run for run in op_client.get("/api/runs/").json()["results"]}
    assert listed[str(small.id)]["input"] == {"note": "x" * 900}
    assert "truncated" not in listed[str(small.id)]
    assert listed[str(large.id)]["truncated"] is True
    assert "input" not in listed[str(large.id)] and "output" not in listed[str(large.id)]
    assert listed[str(large.id)]["state"] == "queued"
    whole = op_client.get(f"/api/runs/{large.id}/").json()
    assert whole["input"] == {"note": "x" * 1000} and "truncated" not in whole


def test_a_page_of_large_runs_stays_small(op_client):
    # Inputs near AWAKEN_MAX_INPUT_BYTES: a page of 500 of them was 84 MB.
    for _ in range(20):
        queued_run(input={"note": "x" * 200_000})
    response = op_client.get("/api/runs/?limit=500")
    assert response.status_code == 200
    assert all(run["truncated"] for run in response.json()["results"])
    assert len(response.content) < 20 * 2000


# --- every error path: the documented code, never a 500, nothing changed --------------------


@pytest.fixture
def some_runs(db):
    queued = queued_run()
    awaiting, _ = awaiting_run()
    return {"queued": queued, "awaiting": awaiting}


UNKNOWN = str(uuid.uuid4())

# (id, who, method, url, payload, status, code); a str or bytes payload is sent as the raw
# body, and {queued}, {awaiting} and {unknown} in the url stand for those runs' ids.
ERROR_CASES = [
    ("detail-of-an-unknown-run", "op", "get", "/api/runs/{unknown}/", None, 404, "not_found"),
    ("detail-of-a-malformed-id", "op", "get", "/api/runs/not-a-uuid/", None, 404, "not_found"),
    # The id "batch" is a malformed id too, though a path of its own is beside it.
    ("detail-of-the-id-batch", "viewer", "get", "/api/runs/batch/", None, 404, "not_found"),
    ("cancel-of-a-malformed-id", "op", "post", "/api/runs/not-a-uuid/cancel/", {}, 404,
     "not_found"),
    ("cancel-of-an-unknown-run", "op", "post", "/api/runs/{unknown}/cancel/", {}, 404,
     "not_found"),
    ("events-of-an-unknown-run", "op", "get", "/api/runs/{unknown}/events/", None, 404,
     "not_found"),
    ("unknown-url", "op", "get", "/api/nothing-here/", None, 404, "not_found"),
    ("create-with-bad-json", "op", "post", "/api/runs/", "{not json", 400, "parse_error"),
    ("create-with-an-unknown-agent", "op", "post", "/api/runs/", {"agent": "no.such.agent"},
     400, "invalid"),
    ("create-without-an-agent", "op", "post", "/api/runs/", {"input": {}}, 400, "invalid"),
    ("create-with-a-text-input", "op", "post", "/api/runs/",
     {"agent": "demo.steps", "input": "text"}, 400, "invalid"),
    ("create-with-a-negative-budget", "op", "post", "/api/runs/",
     {"agent": "demo.steps", "budget": {"max_steps": -1}}, 400, "invalid"),
    ("create-with-a-text-budget", "op", "post", "/api/runs/",
     {"agent": "demo.steps", "budget": "lots"}, 400, "invalid"),
    ("create-with-a-huge-budget", "op", "post", "/api/runs/",
     {"agent": "demo.steps", "budget": {"max_steps": 2**66}}, 400, "invalid"),
    ("create-with-a-bad-start-after", "op", "post", "/api/runs/",
     {"agent": "demo.steps", "start_after": "tomorrow"}, 400, "invalid"),
    ("create-with-an-unknown-field", "op", "post", "/api/runs/",
     {"agent": "demo.steps", "colour": "red"}, 400, "invalid"),
    ("create-with-a-list", "op", "post", "/api/runs/", [1, 2], 400, "invalid"),
    ("batch-of-no-runs", "op", "post", "/api/runs/batch/", {"runs": []}, 400, "invalid"),
    ("batch-of-501-runs", "op", "post", "/api/runs/batch/",
     {"runs": [{"agent": "demo.steps"}] * 501}, 400, "invalid"),
    ("batch-with-an-unknown-agent", "op", "post", "/api/runs/batch/",
     {"runs": [{"agent": "demo.steps"}, {"agent": "no.such.agent"}]}, 400, "invalid"),
    ("batch-with-an-unknown-field", "op", "post", "/api/runs/batch/",
     {"runs": [{"agent": "demo.steps", "colour": 1}]}, 400, "invalid"),
    ("batch-with-an-unknown-parent", "op", "post", "/api/runs/batch/",
     {"runs": [{"agent": "demo.steps"}, {"agent": "demo.steps", "parent_id": UNKNOWN}]},
     400, "invalid"),
    ("batch-with-a-zero-budget", "op", "post", "/api/runs/batch/",
     {"runs": [{"agent": "demo.steps", "budget": {"max_tokens": 0}}]}, 400, "invalid"),
    ("batch-without-runs", "op", "post", "/api/runs/batch/", {"agent": "demo.steps"}, 400,
     "invalid"),
    ("batch-with-bad-json", "op", "post", "/api/runs/batch/", "[", 400, "parse_error"),
    ("batch-by-a-viewer", "viewer", "post", "/api/runs/batch/",
     {"runs": [{"agent": "demo.steps"}]}, 403, "permission_denied"),
    ("batch-by-nobody", "anon", "post", "/api/runs/batch/",
     {"runs": [{"agent": "demo.steps"}]}, 401, "not_authenticated"),
    ("stop-without-a-reason", "op", "post", "/api/runs/{queued}/stop/", {}, 400, "invalid"),
    ("stop-with-an-empty-reason", "op", "post", "/api/runs/{queued}/stop/", {"reason": ""},
     400, "invalid"),
    ("stop-with-a-long-reason", "op", "post", "/api/runs/{queued}/stop/",
     {"reason": "x" * 501}, 400, "invalid"),
    ("cancel-with-a-long-reason", "op", "post", "/api/runs/{queued}/cancel/",
     {"reason": "x" * 501}, 400, "invalid"),
    ("cancel-waiting-too-long", "op", "post", "/api/runs/{queued}/cancel/?wait=31", {}, 400,
     "invalid"),
    ("cancel-with-a-text-wait", "op", "post", "/api/runs/{queued}/cancel/?wait=soon", {}, 400,
     "invalid"),
    ("cancel-with-bad-json", "op", "post", "/api/runs/{queued}/cancel/", "{", 400,
     "parse_error"),
    ("list-by-an-unknown-state", "op", "get", "/api/runs/?state=bogus", None, 400, "invalid"),
    ("list-of-no-runs", "op", "get", "/api/runs/?limit=0", None, 400, "invalid"),
    ("list-from-a-bad-cursor", "op", "get", "/api/runs/?cursor=%%%", None, 400, "invalid"),
    ("events-after-a-negative-seq", "op", "get", "/api/events/?after=-1", None, 400,
     "invalid"),
    ("events-over-the-limit", "op", "get", "/api/events/?limit=1001", None, 400, "invalid"),
    ("resume-of-a-queued-run", "op", "post", "/api/runs/{queued}/resume/",
     {"ticket": UNKNOWN}, 409, "not_awaiting"),
    ("resume-with-another-ticket", "op", "post", "/api/runs/{awaiting}/resume/",
     {"ticket": UNKNOWN}, 409, "ticket_mismatch"),
    ("resume-with-a-malformed-ticket", "op", "post", "/api/runs/{awaiting}/resume/",
     {"ticket": "nope"}, 400, "invalid"),
    ("resume-with-a-nul-input", "op", "post", "/api/runs/{awaiting}/resume/",
     {"ticket": UNKNOWN, "input": "\x00"}, 400, "invalid"),
    ("create-by-a-viewer", "viewer", "post", "/api/runs/", {"agent": "demo.steps"}, 403,
     "permission_denied"),
    ("cancel-by-a-viewer", "viewer", "post", "/api/runs/{queued}/cancel/", {}, 403,
     "permission_denied"),
    ("stop-by-a-viewer", "viewer", "post", "/api/runs/{queued}/stop/", {"reason": "r"}, 403,
     "permission_denied"),
    ("resume-by-a-viewer", "viewer", "post", "/api/runs/{awaiting}/resume/",
     {"ticket": UNKNOWN}, 403, "permission_denied"),
    ("list-by-a-user-without-a-role", "stranger", "get", "/api/runs/", None, 403,
     "permission_denied"),
    ("list-by-nobody", "anon", "get", "/api/runs/", None, 401, "not_authenticated"),
    ("detail-by-nobody", "anon", "get", "/api/runs/{queued}/", None, 401,
     "not_authenticated"),
    ("events-by-nobody", "anon", "get", "/api/events/", None, 401, "not_authenticated"),
    ("schema-by-nobody", "anon", "get", "/api/schema/", None, 401, "not_authenticated"),
    ("cancel-by-nobody", "anon", "post", "/api/runs/{queued}/cancel/", {}, 401,
     "not_authenticated"),
    ("create-by-nobody", "anon", "post", "/api/runs/", {"agent": "demo.steps"}, 401,
     "not_authenticated"),
    ("list-with-a-bad-token", "bad-token", "get", "/api/runs/", None, 401,
     "authentication_failed"),
    ("schema-by-a-user-without-a-role", "stranger", "get", "/api/schema/", None, 403,
     "permission_denied"),
    # Hostile or careless input.
    ("create-nested-5000-deep", "op", "post", "/api/runs/",
     '{"agent": "demo.steps", "input": {"a": ' + nested(5000) + "}}", 400, "invalid"),
    ("create-with-1e400", "op", "post", "/api/runs/",
     '{"agent": "demo.steps", "input": {"a": 1e400}}', 400, "invalid"),
    ("create-with-minus-1e400", "op", "post", "/api/runs/",
     '{"agent": "demo.steps", "input": {"a": [-1e400]}}', 400, "invalid"),
    ("create-with-nan", "op", "post", "/api/runs/",
     '{"agent": "demo.steps", "input": {"a": NaN}}', 400, "invalid"),
    ("create-with-infinity", "op", "post", "/api/runs/",
     '{"agent": "demo.steps", "budget": {"max_seconds": Infinity}}', 400, "invalid"),
    ("create-with-a-lone-surrogate", "op", "post", "/api/runs/",
     r'{"agent": "demo.steps", "input": {"a": "\ud800"}}', 400, "invalid"),
    ("create-with-a-lone-surrogate-key", "op", "post", "/api/runs/",
     r'{"agent": "demo.steps", "input": {"\udfff": 1}}', 400, "invalid"),
    ("create-with-a-nul", "op", "post", "/api/runs/",
     r'{"agent": "demo.steps", "input": {"a": ["x\u0000"]}}', 400, "invalid"),
    ("create-with-a-nul-thread", "op", "post", "/api/runs/",
     r'{"agent": "demo.steps", "thread_id": "t\u0000"}', 400, "invalid"),
    ("create-with-a-key-twice", "op", "post", "/api/runs/",
     '{"agent": "demo.steps", "agent": "demo.fail"}', 400, "invalid"),
    ("create-with-bad-utf8", "op", "post", "/api/runs/",
     b'{"agent": "demo.steps", "input": {"a": "\xff"}}', 400, "parse_error"),
    ("create-with-an-unknown-budget-key", "op", "post", "/api/runs/",
     {"agent": "demo.steps", "budget": {"max_step": 2}}, 400, "invalid"),
    ("create-starting-after-a-time-without-offset", "op", "post", "/api/runs/",
     {"agent": "demo.steps", "start_after": "2030-01-01T00:00:00"}, 400, "invalid"),
    ("create-with-an-input-over-256-kib", "op", "post", "/api/runs/",
     {"agent": "demo.steps", "input": {"a": "x" * (256 * 1024)}}, 400, "invalid"),
    ("create-with-a-body-over-1-mib", "op", "post", "/api/runs/",
     {"agent": "demo.steps", "input": {"a": "x" * (1024 * 1024)}}, 413, "too_large"),
    ("batch-nested-5000-deep", "op", "post", "/api/runs/batch/",
     '{"runs": [{"agent": "demo.steps", "input": {"a": ' + nested(5000) + "}}]}", 400,
     "invalid"),
    ("batch-with-a-lone-surrogate", "op", "post", "/api/runs/batch/",
     r'{"runs": [{"agent": "demo.steps"}, {"agent": "demo.steps", "thread_id": "\ud800"}]}',
     400, "invalid"),
    ("batch-with-an-unknown-budget-key", "op", "post", "/api/runs/batch/",
     {"runs": [{"agent": "demo.steps", "budget": {"max_tokens": 5, "max_token": 5}}]}, 400,
     "invalid"),
    ("batch-with-an-unknown-top-level-field", "op", "post", "/api/runs/batch/",
     {"runs": [{"agent": "demo.steps"}], "dry_run": True}, 400, "invalid"),
    ("batch-with-a-body-over-1-mib", "op", "post", "/api/runs/batch/",
     {"runs": [{"agent": "demo.steps", "input": {"a": "x" * 200_000}}] * 6}, 413,
     "too_large"),
    ("resume-with-a-lone-surrogate", "op", "post", "/api/runs/{awaiting}/resume/",
     f'{{"ticket": "{UNKNOWN}", "input": {{"a": "\\udc00"}}}}', 400, "invalid"),
    ("resume-nested-5000-deep", "op", "post", "/api/runs/{awaiting}/resume/",
     f'{{"ticket": "{UNKNOWN}", "input": {nested(5000)}}}', 400, "invalid"),
    ("resume-with-an-input-over-256-kib", "op", "post", "/api/runs/{awaiting}/resume/",
     {"ticket": UNKNOWN, "input": ["x" * (256 * 1024)]}, 400, "invalid"),
    ("resume-with-an-unknown-field", "op", "post", "/api/runs/{awaiting}/resume/",
     {"ticket": UNKNOWN, "inupt": {}}, 400, "invalid"),
    ("deliver-with-1e400", "op", "post", "/api/runs/{queued}/deliver/",
     '{"command": "message", "message": {"n": 1e400}}', 400, "invalid"),
    ("deliver-with-an-unknown-field", "op", "post", "/api/runs/{queued}/deliver/",
     {"command": "wake", "urgent": True}, 400, "invalid"),
    ("cancel-with-an-unknown-field", "op", "post", "/api/runs/{queued}/cancel/",
     {"reasn": "typo"}, 400, "invalid"),
    ("cancel-with-a-lone-surrogate", "op", "post", "/api/runs/{queued}/cancel/",
     r'{"reason": "\ud800"}', 400, "invalid"),
    ("stop-with-a-nul", "op", "post", "/api/runs/{queued}/stop/",
     r'{"reason": "a\u0000"}', 400, "invalid"),
    ("stop-with-an-unknown-field", "op", "post", "/api/runs/{queued}/stop/",
     {"reason": "r", "stop_code": "policy"}, 400, "invalid"),
    ("pause-with-a-field", "op", "post", "/api/runs/{queued}/pause/", {"now": True}, 400,
     "invalid"),
    ("list-with-a-nul", "op", "get", "/api/runs/?thread_id=%00", None, 400, "invalid"),
]


@pytest.mark.parametrize("who, method, url, payload, status, code",
                         [pytest.param(*case, id=name) for name, *case in ERROR_CASES])
def test_every_error_path_has_its_code_and_changes_nothing(
        some_runs, operator, viewer, stranger, who, method, url, payload, status, code):
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    client = {"op": client_for(operator), "viewer": client_for(viewer),
              "stranger": client_for(stranger), "anon": APIClient(), "bad-token": bad}[who]
    url = url.format(queued=some_runs["queued"].id, awaiting=some_runs["awaiting"].id,
                     unknown=UNKNOWN)
    before = db_state()
    if isinstance(payload, str | bytes):
        response = client.generic(method.upper(), url, payload, content_type="application/json")
    else:
        response = getattr(client, method)(url, payload, format="json")
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["detail"], str) and body["detail"]
    assert db_state() == before


def _answer_schema(component: str) -> dict:
    """The OpenAPI document's schema of ``component`` as JSON Schema: ``nullable`` becomes
    "or null", and every object of an answer is closed (``additionalProperties: false``),
    so a key the representation writes that the document does not declare fails, as does
    a declared required key it leaves out."""
    document = SchemaGenerator().get_schema(request=None, public=True)

    def convert(node):
        if isinstance(node, list):
            return [convert(item) for item in node]
        if not isinstance(node, dict):
            return node
        node = {key: convert(value) for key, value in node.items()}
        if node.get("type") == "object" and "properties" in node:
            node.setdefault("additionalProperties", False)
        if node.pop("nullable", False):
            return {"anyOf": [node, {"type": "null"}]}
        return node

    schemas = convert(document["components"]["schemas"])
    return {"$ref": f"#/components/schemas/{component}", "components": {"schemas": schemas}}


def _check_answer(component: str, data: dict) -> None:
    jsonschema.Draft7Validator(_answer_schema(component),
                               format_checker=jsonschema.FormatChecker()).validate(data)


@pytest.fixture
def runs_of_every_shape(db) -> dict:
    """Runs that between them fill every part of a run and its events: an ended parent, a
    child with a budget, an input and a start time, an awaiting run (its ticket) and a
    running run asked to stop (its control)."""
    parent = queued_run()
    child = queued_run(parent_id=parent.id, budget={"max_steps": 3, "max_seconds": 1.5},
                       input={"steps": 2}, start_after=timezone.now() - timedelta(seconds=1))
    awaiting, _ = awaiting_run()
    approving, approving_generation = running_run(agent="demo.email")
    domain.attempt_pause(run_id=approving.id, generation=approving_generation,
                         reason="approval", action={"tool": "send_email", "arguments": {
                             "to": "a@example.com", "body": "hi"}, "rationale": "asked"})
    running, generation = running_run()
    domain.run_stop(run_id=running.id, actor="olga", source="api", reason="budget")
    domain.attempt_step(run_id=running.id, generation=generation, tokens=7)
    domain.run_cancel(run_id=parent.id, actor="olga", source="api")
    made = {"ended-parent": parent, "child": child, "awaiting": awaiting,
            "approving": approving, "stopping": running}
    runs = {shape: Run.objects.get(pk=run.id) for shape, run in made.items()}
    # Every part is covered.
    assert runs["awaiting"].ticket is not None and runs["stopping"].control is not None
    assert runs["ended-parent"].ended_at is not None and runs["child"].parent_id == parent.id
    return runs


@pytest.mark.parametrize("shape", ["ended-parent", "child", "awaiting", "approving",
                                   "stopping"])
def test_a_run_as_the_api_writes_it_is_what_the_document_declares(runs_of_every_shape, shape):
    data = run_data(runs_of_every_shape[shape])
    _check_answer("Run", data)
    declared = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]
    assert set(data) == set(declared["Run"]["properties"]) - {"truncated"}
    for part, component in [("ticket", "Ticket"), ("control", "Control"),
                            ("budget", "Budget"), ("usage", "Usage")]:
        if data[part] is not None:
            assert set(data[part]) == set(declared[component]["properties"]), part
    if shape == "approving":
        assert set(data["ticket"]["action"]) == set(declared["Action"]["properties"])


def test_a_truncated_run_is_what_the_document_declares(runs_of_every_shape):
    run = runs_of_every_shape["child"]
    (listed,), _ = selectors.run_list(filters={"id_prefix": run.pk.hex}, payload_bytes=0)
    whole, cut = run_data(run), run_data(listed)
    _check_answer("Run", cut)
    assert cut == {**{key: value for key, value in whole.items()
                      if key not in ("input", "output")}, "truncated": True}
    document = SchemaGenerator().get_schema(request=None, public=True)
    assert not {"input", "output", "truncated"} & set(
        document["components"]["schemas"]["Run"]["required"])


def test_events_as_the_api_writes_them_are_what_the_document_declares(runs_of_every_shape):
    declared = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]
    for event in Event.objects.all():
        data = event_data(event)
        _check_answer("Event", data)
        assert set(data) == set(declared["Event"]["properties"])


def test_a_bulk_job_as_the_api_writes_it_is_what_the_document_declares(runs_of_every_shape):
    job = domain.bulk_create(action="cancel", requested_by="olga", source="api",
                               ids=[run.id for run in runs_of_every_shape.values()])
    _check_answer("BulkJob", bulk_data(BulkJob.objects.get(pk=job.pk)))


def test_times_are_written_as_drf_writes_them(runs_of_every_shape):
    """The representation writes its times itself (``when``); they are what DRF's own
    DateTimeField would answer, in the current time zone, UTC as ``Z``."""
    field = serializers.DateTimeField()
    for run in runs_of_every_shape.values():
        for value in (run.created_at, run.updated_at, run.started_at, run.ended_at,
                      run.start_after):
            if value is not None:
                assert when(value) == field.to_representation(value)


def test_a_run_and_an_event_are_written_in_the_time_zone_active_as_drf_writes_them(
        runs_of_every_shape):
    """``run_data`` reads the current time zone once for all its times: each is what DRF
    writes in the zone active at the call, whichever it is."""
    field = serializers.DateTimeField()
    run = next(run for run in runs_of_every_shape.values() if run.ended_at is not None)
    event = Event.objects.filter(run=run).first()
    for zone in ("UTC", "Asia/Kolkata", "America/New_York"):
        with timezone.override(zone):
            data = run_data(run)
            for key in ("created_at", "updated_at", "started_at", "ended_at"):
                assert data[key] == field.to_representation(getattr(run, key)), (zone, key)
            assert event_data(event)["at"] == field.to_representation(event.at)
            assert data["created_at"].endswith(
                {"UTC": "Z", "Asia/Kolkata": "+05:30"}.get(zone, "-05:00")) or (
                zone == "America/New_York" and data["created_at"].endswith("-04:00"))


def test_numeric_query_parameters_take_plain_ascii_digits_only(op_client):
    """int() and float() take "١٢", " 1_0 ", "nan"; str.isdigit() takes "²": each is a 400,
    never a 500 and never a number."""
    run = queued_run()
    for path in (f"/api/runs/{run.id}/events/?after=", "/api/events/?after=",
                 "/api/events/?limit=", "/api/runs/?limit=", "/api/bulk/?limit=",
                 "/api/overview/?window="):
        for bad in ("²", "١٢", "1_0", "+5", " 5", "0x10", "1e3"):
            response = op_client.get(path + bad)
            assert response.status_code == 400, (path, bad, response.status_code)
            assert response.json()["code"] == "invalid"
        assert op_client.get(path + {"/api/overview/?window=": "600"}.get(path, "5")
                             ).status_code == 200, path
    for bad in ("١", "nan", "inf", "1e1", "-0"):
        response = op_client.post(f"/api/runs/{run.id}/cancel/?wait={bad}", {}, format="json")
        assert response.status_code == 400, bad
    assert Run.objects.get(pk=run.id).state == "queued"
    browser = browser_for(User.objects.get(username="olga"))
    assert browser.get(f"/runs/{run.id}/activity/?after=²").status_code == 400
    assert browser.get(f"/runs/{run.id}/activity/?after=0").status_code == 200


def test_a_404_quotes_no_more_of_the_id_than_an_id_takes(op_client):
    long_id = "x" * 10000
    for path in (f"/api/runs/{long_id}/", f"/api/runs/{long_id}/cancel/"):
        response = (op_client.get(path) if path.endswith("s/" + long_id + "/")
                    else op_client.post(path, {}, format="json"))
        assert response.status_code == 404
        assert len(response.content) < 300, response.content[:300]


def test_the_schema_documents_review_links(viewer_client):
    document = yaml.safe_load(viewer_client.get("/api/schema/").content)
    review = document["paths"]["/review/{token}/"]
    assert review["get"]["operationId"] == "review_retrieve"
    assert review["post"]["operationId"] == "review_answer"
