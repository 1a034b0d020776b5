"""A run's activity log: numbered per run, capped with one note, pushed after commit; the
agent's ctx.log() and ctx.progress(), and the spans of steps, model calls and tools; the
pages that show it, and a review link opened in a browser."""

import asyncio

import pytest
from django.test import Client

from runs import domain
from runs.domain import activity, outside
from runs.domain.actions import action_digest
from runs.models import Activity, ActivityKind, Run
from runs.runtime.agent import Context
from runs.runtime.token import CancellationToken
from tests.factories import queued_run, running_run

pytestmark = pytest.mark.django_db


class Pushes:
    def __init__(self):
        self.sent = []

    def publish_activity(self, *, run_id, entries):
        self.sent.append((str(run_id), entries))

    def publish_changes(self, *, changes):
        pass

    def publish_bulk(self, *, job):
        pass


@pytest.fixture
def pushes(monkeypatch):
    recorder = Pushes()
    monkeypatch.setattr(outside, "changes", recorder)
    return recorder


def test_entries_are_numbered_per_run_and_pushed_after_commit(
        pushes, django_capture_on_commit_callbacks):
    run = queued_run()
    with django_capture_on_commit_callbacks(execute=True):
        activity.activity_record(run_id=run.id, generation=1, entries=[
            {"kind": "log", "text": "hello", "data": {"n": 1}},
            {"kind": "tool", "text": "search", "ms": 12.345, "data": {"ok": True}}])
        assert pushes.sent == []  # nothing is pushed before the commit
    activity.activity_record(run_id=run.id, generation=2, entries=[{"kind": "step", "ms": 5}])
    rows = list(Activity.objects.filter(run=run).order_by("seq"))
    assert [(row.seq, row.kind, row.generation) for row in rows] == [
        (1, "log", 1), (2, "tool", 1), (3, "step", 2)]
    assert rows[1].ms == 12.35
    (run_id, entries), = pushes.sent
    assert run_id == str(run.id) and [entry["seq"] for entry in entries] == [1, 2]


def test_a_run_keeps_at_most_cap_entries_and_says_so_once(pushes, monkeypatch):
    monkeypatch.setattr(activity, "CAP", 3)
    run = queued_run()
    for n in range(3):
        activity.activity_record(run_id=run.id, generation=1,
                                 entries=[{"kind": "log", "text": f"{n}"}, {"kind": "log"}])
    kinds = list(Activity.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))
    assert kinds == ["log", "log", "log", ActivityKind.TRUNCATED]


def test_at_the_cap_the_failure_and_the_control_entries_are_still_kept(pushes, monkeypatch):
    monkeypatch.setattr(activity, "CAP", 3)
    run = queued_run()
    activity.control_taken(run_id=run.id, generation=1, command="pause", actor="olga",
                           source="api")
    activity.activity_record(run_id=run.id, generation=1,
                             entries=[{"kind": "log"} for _ in range(5)])
    activity.control_taken(run_id=run.id, generation=1, command="pause", actor="olga",
                           source="api")
    activity.activity_record(run_id=run.id, generation=1, entries=[
        {"kind": "log"}, {"kind": "error", "text": "RuntimeError: boom",
                          "data": {"traceback": "Traceback..."}}])
    kinds = list(Activity.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))
    assert kinds == ["control", "log", "log", "log", ActivityKind.TRUNCATED, "control", "error"]
    assert activity.activity_facts(run_id=run.id)["failure"].text == "RuntimeError: boom"


def test_the_entries_counted_apart_have_a_cap_of_their_own(pushes, monkeypatch):
    monkeypatch.setattr(activity, "APART_CAP", 2)
    run = queued_run()
    for _ in range(3):
        activity.control_taken(run_id=run.id, generation=1, command="pause", actor="olga",
                               source="api")
        activity.activity_record(run_id=run.id, generation=1, entries=[{"kind": "log"}])
    kinds = list(Activity.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))
    assert kinds == ["control", "log", "control", "log", "log"]


def test_large_data_and_text_are_cut_down(pushes):
    run = queued_run()
    activity.activity_record(run_id=run.id, generation=1, entries=[
        {"kind": "log", "text": "x" * 900, "data": {"blob": "y" * 5000}}])
    row = Activity.objects.get(run=run)
    assert len(row.text) == activity.TEXT and row.data == {"truncated": True, "bytes": 5012}


def test_an_unknown_kind_is_refused_and_nothing_is_written(pushes):
    run = queued_run()
    with pytest.raises(ValueError):
        activity.activity_record(run_id=run.id, generation=1,
                                 entries=[{"kind": "log"}, {"kind": "gossip"}])
    assert not Activity.objects.filter(run=run).exists()


class Host:
    def __init__(self):
        self.entries = []

    async def fence(self, ctx):  # no request is ever committed here
        pass

    def before_tool(self, ctx, tool, arguments, pending):
        return action_digest(tool, arguments)  # no loop guard here

    async def before_step(self, ctx):
        pass

    async def commit_step(self, ctx, *, tokens, data=None):
        ctx.usage = {"steps": 1, "tokens": tokens}

    def activity(self, ctx, entry):
        self.entries.append(entry)

    async def run_sync_tool(self, fn, *args):
        return fn(*args)


def test_the_agent_logs_and_says_how_far_it_is_and_steps_are_timed():
    host = Host()
    ctx = Context(run_id="r", generation=1, input={}, state={}, resume=None,
                  token=CancellationToken(), host=host)

    async def agent():
        ctx.progress(1, 3, "reading")
        async with ctx.step():
            ctx.log("looking", page=2)
            await ctx.infer(asyncio.sleep(0, result="ok"), tokens=7)
            await ctx.tool(len, "abc")

    asyncio.run(agent())
    assert [entry["kind"] for entry in host.entries] == ["progress", "log", "model", "tool",
                                                         "step"]
    progress, log, model, tool, step = host.entries
    assert progress["data"] == {"done": 1, "total": 3} and progress["text"] == "reading"
    assert log["text"] == "looking" and log["data"] == {"page": 2}
    assert model["tokens"] == 7 and model["ms"] >= 0
    assert tool["text"] == "len" and tool["data"] == {"ok": True}
    assert step["text"] == "step 1" and step["tokens"] == 7 and step["at"] <= tool["at"]


def test_the_activity_partial_gives_the_entries_after_a_seq(operator, pushes):
    op_client = Client()
    op_client.force_login(operator)
    run = queued_run()
    activity.activity_record(run_id=run.id, generation=1, entries=[
        {"kind": "log", "text": "one"}, {"kind": "log", "text": "two"}])
    page = op_client.get(f"/runs/{run.id}/activity/?after=1").content.decode()
    assert "two" in page and "one" not in page
    assert op_client.get(f"/runs/{run.id}/activity/?after=x").status_code == 400
    whole = op_client.get(f"/runs/{run.id}/activity/?all=1").content.decode()
    assert "one" in whole and "<html" in whole


def test_a_review_link_opened_in_a_browser_is_a_page_and_json_for_a_script(op_client):
    running, generation = running_run(agent="demo.approval")
    domain.attempt_pause(run_id=running.id, generation=generation, reason="approval",
                         prompt={"question": "Ship it?"})
    run = running
    made = op_client.post(f"/api/runs/{run.id}/review-links/", {}, format="json").json()
    path = made["url"].split("testserver", 1)[1]
    browser = Client().get(path, HTTP_ACCEPT="text/html,application/xhtml+xml,*/*;q=0.8")
    assert browser.status_code == 200 and browser["Content-Type"].startswith("text/html")
    page = browser.content.decode()
    # The prompt as a field and its text, not as JSON.
    assert "<dt>question</dt><dd>Ship it?</dd>" in page and str(run.id) not in page
    script = Client().get(path)
    assert script.json()["prompt"] == {"question": "Ship it?"}
    gone = Client().get("/review/not-a-token/", HTTP_ACCEPT="text/html")
    assert gone.status_code == 404 and "no such review link" in gone.content.decode()


def test_the_api_docs_answer_a_visitor_with_a_login_link():
    response = Client().get("/api/docs/", HTTP_ACCEPT="text/html")
    assert response.status_code == 401
    assert 'href="/accounts/login/?next=/api/docs/"' in response.content.decode()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_writers_at_once_each_get_their_own_numbers(gang, pushes):
    # The worker writes a run's entries while the web process notes a pause request: the
    # run's row lock numbers them one writer at a time, and no entry is lost or numbered
    # twice.
    run = queued_run()

    def writer(n):
        return lambda: [activity.activity_record(run_id=run.id, generation=1, entries=[
            {"kind": "log", "text": f"{n}.{i}"}]) for i in range(10)]

    results = gang(4).run([writer(n) for n in range(4)])
    assert not [r for r in results if isinstance(r, BaseException)], results
    seqs = sorted(Activity.objects.filter(run=run).values_list("seq", flat=True))
    assert seqs == list(range(1, 41))


def test_a_failures_traceback_is_shown_to_staff_only(pushes, viewer,
                                                    django_capture_on_commit_callbacks):
    from tests.conftest import browser_for, make_user

    run = queued_run()
    Run.objects.filter(pk=run.id).update(error="RuntimeError: boom")
    with django_capture_on_commit_callbacks(execute=True):
        activity.activity_record(run_id=run.id, generation=1, entries=[{
            "kind": "error", "text": "RuntimeError: boom",
            "data": {"traceback": 'File "/srv/awaken/secret_module.py", line 3'}}])
    (_, entries), = pushes.sent
    assert entries[0]["text"] == "RuntimeError: boom" and "traceback" not in entries[0]["data"]
    seen = browser_for(viewer).get(f"/runs/{run.id}/").content.decode()
    assert "RuntimeError: boom" in seen and "secret_module.py" not in seen
    staff = browser_for(make_user("sam", "operator", is_staff=True))
    assert "secret_module.py" in staff.get(f"/runs/{run.id}/").content.decode()


def test_the_activity_api_gives_scripts_what_the_page_shows(viewer_client, pushes):
    run = queued_run()
    activity.activity_record(run_id=run.id, generation=1, entries=[
        {"kind": "log", "text": "one"}, {"kind": "step", "text": "step 1", "ms": 12,
                                         "tokens": 7}, {"kind": "log", "text": "three"}])
    answer = viewer_client.get(f"/api/runs/{run.id}/activity/?after=1")
    assert answer.status_code == 200
    results = answer.json()["results"]
    assert [(e["seq"], e["kind"], e["text"]) for e in results] == [
        (2, "step", "step 1"), (3, "log", "three")]
    assert (results[0]["ms"], results[0]["tokens"], results[0]["generation"]) == (12, 7, 1)
    assert set(results[0]) == {"seq", "generation", "kind", "text", "ms", "tokens", "data", "at"}
    page = viewer_client.get(f"/api/runs/{run.id}/activity/?after=0&limit=1").json()
    assert [e["seq"] for e in page["results"]] == [1]
    bad = viewer_client.get(f"/api/runs/{run.id}/activity/?after=x")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid")
    assert viewer_client.get("/api/runs/not-a-run/activity/").status_code == 404
    activity.activity_record(run_id=run.id, generation=1, entries=[{
        "kind": "error", "text": "RuntimeError: boom",
        "data": {"traceback": 'File "/srv/secret_module.py"'}}])
    (error,) = viewer_client.get(f"/api/runs/{run.id}/activity/?after=3").json()["results"]
    assert error["text"] == "RuntimeError: boom" and "traceback" not in error["data"]


ENTRIES = [{"kind": "progress", "text": "1 of 2"}, {"kind": "model", "text": "m", "ms": 3}]


def _log_of(run):
    return list(Activity.objects.filter(run=run).order_by("seq")
                .values_list("seq", "kind", "generation"))


@pytest.mark.postgres
def test_a_step_writes_the_entries_before_it_in_its_own_statement(pushes):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    run, generation = running_run()
    activity.activity_record(run_id=run.id, generation=generation, entries=[{"kind": "log"}])
    with CaptureQueriesContext(connection) as queries:
        domain.attempt_step(run_id=run.id, generation=generation, activity=ENTRIES)
    # The run's lock, then one statement: the step's run, event and the two entries (the
    # test's own transaction makes the step's a savepoint).
    sent = [q["sql"] for q in queries if "SAVEPOINT" not in q["sql"]]
    assert len(sent) == 2, [text[:80] for text in sent]
    assert 'INSERT INTO "runs_activity"' in sent[1]
    assert _log_of(run) == [(1, "log", generation), (2, "progress", generation),
                            (3, "model", generation)]
    counted = Run.objects.get(pk=run.id)
    assert (counted.activity_last, counted.activity_agent, counted.activity_apart) == (3, 3, 0)


def test_the_end_writes_the_call_it_stopped_and_a_refused_end_writes_it_too(pushes):
    run, generation = running_run()
    assert domain.attempt_finish(run_id=run.id, generation=generation + 1,
                                 ending=domain.Ending.completed(), activity=ENTRIES) is False
    assert Run.objects.get(pk=run.id).state == "running"
    assert _log_of(run) == [(1, "progress", generation + 1), (2, "model", generation + 1)]
    assert domain.attempt_finish(run_id=run.id, generation=generation,
                                 ending=domain.Ending.cancelled(), activity=ENTRIES[1:])
    assert _log_of(run)[2:] == [(3, "model", generation)]
    ended = Run.objects.get(pk=run.id)
    assert (ended.state, ended.activity_last) == ("ended", 3)


def test_a_fenced_step_or_pause_still_writes_what_its_attempt_did(pushes):
    from runs.domain.errors import Fenced
    run, generation = running_run()
    with pytest.raises(Fenced):
        domain.attempt_step(run_id=run.id, generation=generation + 1, activity=ENTRIES[:1])
    with pytest.raises(Fenced):
        domain.attempt_pause(run_id=run.id, generation=generation + 1, activity=ENTRIES[1:])
    assert _log_of(run) == [(1, "progress", generation + 1), (2, "model", generation + 1)]
    assert Run.objects.get(pk=run.id).steps == 0


def test_the_counters_of_a_log_written_before_them_are_counted_from_it(pushes):
    import importlib

    from django.apps import apps
    counters = importlib.import_module("runs.migrations.0030_run_activity_counters")
    run = queued_run()
    Activity.objects.bulk_create(
        [Activity(run=run, seq=n, generation=1, kind=kind, at=run.created_at)
         for n, kind in enumerate(["log", "error", "step", "control", "truncated"], 1)])
    counters.count_activity(apps, None)
    counted = Run.objects.get(pk=run.id)
    assert (counted.activity_last, counted.activity_agent, counted.activity_apart) == (5, 3, 2)
    activity.activity_record(run_id=run.id, generation=1, entries=[{"kind": "error"}])
    assert _log_of(run)[-1] == (6, "error", 1)


class Database:
    """What the writer is given as the worker loop's database call: here it writes at
    once, on the loop, and keeps what it was asked."""

    def __init__(self):
        self.calls = []

    async def __call__(self, fn, **kwargs):
        self.calls.append(kwargs["entries"])


def test_the_writer_gives_a_transition_what_waits_and_writes_what_waits_too_long():
    from runs.runtime import activity_writer

    async def scenario():
        db = Database()
        writer = activity_writer.ActivityWriter(run_id="r", generation=1, db=db)
        writer.add({"kind": "log", "text": "a"})
        writer.add({"kind": "log", "text": "b"})
        taken = await writer.taken()  # a step commits at once: the entries go with it
        assert [e["text"] for e in taken] == ["a", "b"] and db.calls == []
        writer.add({"kind": "log", "text": "c"})  # no transition comes
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while not db.calls and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert [[e["text"] for e in call] for call in db.calls] == [["c"]]
        assert await writer.taken() == []
        writer.add({"kind": "log", "text": "d"})
        await writer.flushed()  # the attempt is over: what is left is written now
        assert [e["text"] for e in db.calls[-1]] == ["d"]

    asyncio.run(scenario())
