"""A run's trace (``runs.domain.trace``) as its page draws it: attempts, steps with their
model and tool calls under them, alike steps in a row as one row, a model call cancelled
mid-stream with its time until the abort and the tokens received, and the control requests
with who asked, all on one axis; bounded, with the way to the rest."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runs import domain
from runs.domain import activity, trace
from runs.models import Attempt, Run
from runs.pages.views import run_panel
from tests.conftest import make_user
from tests.factories import awaiting_run, queued_run, running_run


def entry(kind, text, at, ms=None, tokens=None, **data):
    return {"kind": kind, "text": text, "at": at, "ms": ms, "tokens": tokens,
            "data": data or None}


def a_run_with_a_model_call_a_tool_call_alike_steps_and_a_cancel_mid_stream():
    """Step 1: a model call that asks for a tool, and the tool; steps 2 to 5: one model
    call each; then a model call cancelled while it streamed, 7 tokens in, by olga."""
    run, generation = running_run()
    now = timezone.now()
    start = now - timedelta(seconds=6)
    Run.objects.filter(pk=run.pk).update(created_at=start - timedelta(seconds=0.5))
    Attempt.objects.filter(run=run, generation=generation).update(started_at=start)

    def at(seconds):
        return start + timedelta(seconds=seconds)

    entries = [entry("model", "canned", at(0.1), 300, 40, tools=["search_notes"]),
               entry("tool", "search_notes", at(0.45), 100, ok=True),
               entry("step", "step 1", at(0.0), 600, 40)]
    for number in range(2, 6):
        begun = number - 1.0
        entries += [entry("model", "canned", at(begun + 0.05), 200, 10, finish_reason="stop"),
                    entry("step", f"step {number}", at(begun), 300, 10)]
    entries.append(entry("model", "canned", at(5.2), 800, 7, cancelled=True,
                         finish_reason="cancelled", received=7))
    activity.activity_record(run_id=run.id, generation=generation, entries=entries)
    domain.run_cancel(run_id=run.id, actor="olga", source="api")
    domain.attempt_interrupted(run_id=run.id, generation=generation, actor="olga",
                               source="api", accepted_at=timezone.now())
    return Run.objects.get(pk=run.id)


@pytest.mark.django_db
def test_the_trace_nests_calls_in_steps_collapses_alike_steps_and_keeps_a_cancelled_call():
    run = a_run_with_a_model_call_a_tool_call_alike_steps_and_a_cancel_mid_stream()
    drawn = run_panel(run.id)["trace"]
    rows = drawn["rows"]
    assert [(row.kind, row.level) for row in rows] == [
        ("run", 0), ("attempt", 1), ("step", 2), ("model", 3), ("tool", 3), ("steps", 2),
        ("model", 2), ("control", 2)]
    root, attempt, first, model, tool, alike, cancelled, cancel = rows
    assert (first.label, first.tokens, round(first.seconds, 3)) == ("Step 1", 40, 0.6)
    assert (model.label, model.note) == ("Model call canned", "asked for search_notes")
    assert (tool.label, tool.outcome, round(tool.seconds, 3)) == ("Tool call search_notes",
                                                                  "ok", 0.1)
    # Steps 2 to 5 made the same call: one row, "Step 2–5", that opens on the four.
    assert (alike.label, alike.count, alike.tokens) == ("Step 2–5", 4, 40)
    assert [member.label for member in alike.members] == ["Step 2", "Step 3", "Step 4",
                                                          "Step 5"]
    assert alike.note == "each: Model call canned"
    assert round(alike.seconds, 3) == 3.3  # from step 2's start to step 5's end
    # The call the cancel cut short: its time until the abort, the tokens received by then.
    assert (cancelled.label, cancelled.outcome, cancelled.tokens) == ("Model call canned",
                                                                       "cancelled", 7)
    assert round(cancelled.seconds, 3) == 0.8
    assert (cancel.label, cancel.actor, cancel.source, cancel.outcome) == (
        "Cancel requested", "olga", "REST API", "ok")
    assert attempt.outcome == "cancelled" and root.outcome == "cancelled"
    # One axis, from the run's creation: every bar inside it, in the order things happened.
    for row in rows:
        assert 0 <= row.left and row.left + row.width <= trace.SCALE, row
    assert root.left == 0 and root.width == trace.SCALE
    assert first.left < model.left < tool.left < alike.left < cancelled.left < cancel.left
    assert drawn["rows_hidden"] == drawn["entries_hidden"] == 0


@pytest.mark.django_db
def test_the_run_page_draws_the_trace_with_text_for_every_bar():
    run = a_run_with_a_model_call_a_tool_call_alike_steps_and_a_cancel_mid_stream()
    page = Client()
    page.force_login(make_user("vera", "viewer"))
    html = page.get(f"/runs/{run.id}/").content.decode()
    section = html[html.index('<section id="trace"'):]
    section = section[:section.index("</section>")]
    assert section.count('<li class="trace-row"') == 8 + 4  # the rows and the four alike
    assert '<details class="trace-steps"><summary>' in section
    assert "Step 2–5" in section and "· 4 steps" in section
    assert "7 tokens received" in section and "cut short" in section
    assert "Cancel requested</span> by <bdi>olga</bdi>" in section
    # Every bar is drawn from the server's numbers; its words are next to it.
    assert section.count("<svg class=\"trace-bar\"") == 12
    assert 'aria-hidden="true"' in section and "style=" not in section
    # The panel the page re-renders has it too: the trace follows the run.
    panel = page.get(f"/runs/{run.id}/panel/").content.decode()
    assert '<section id="trace"' in panel and "Step 2–5" in panel


@pytest.mark.django_db
def test_the_activity_api_serves_what_the_trace_shows_the_cancelled_call_included(
        viewer_client):
    run = a_run_with_a_model_call_a_tool_call_alike_steps_and_a_cancel_mid_stream()
    answer = viewer_client.get(f"/api/runs/{run.id}/activity/")
    assert answer.status_code == 200
    results = answer.json()["results"]
    assert [item["kind"] for item in results].count("step") == 5
    (cut,) = [item for item in results if (item["data"] or {}).get("cancelled")]
    assert (cut["kind"], cut["text"], cut["ms"], cut["tokens"]) == ("model", "canned", 800.0, 7)
    later = viewer_client.get(f"/api/runs/{run.id}/activity/?after={cut['seq'] - 1}")
    assert [item["seq"] for item in later.json()["results"]] == [cut["seq"]]


@pytest.mark.django_db
def test_a_long_trace_is_capped_with_the_count_left_out_and_the_way_to_the_rest(monkeypatch):
    run = a_run_with_a_model_call_a_tool_call_alike_steps_and_a_cancel_mid_stream()
    monkeypatch.setattr(trace, "ROWS", 4)
    drawn = run_panel(run.id)["trace"]
    assert [row.kind for row in drawn["rows"]] == ["run", "attempt", "step", "model"]
    assert drawn["rows_hidden"] == 4
    monkeypatch.setattr(trace, "ENTRIES", 3)  # only the newest three entries are read
    drawn = run_panel(run.id)["trace"]
    assert drawn["entries_hidden"] == 9
    page = Client()
    page.force_login(make_user("vera", "viewer"))
    html = page.get(f"/runs/{run.id}/").content.decode()
    assert "more row" in html and "9 older entries not read" in html
    assert f'href="/api/runs/{run.id}/activity/"' in html


@pytest.mark.django_db
def test_requests_outside_an_attempt_and_resumes_are_on_the_axis_with_who_asked():
    run, ticket = awaiting_run()
    domain.run_resume(run_id=run.id, ticket_id=ticket, actor="rita", source="ui")
    rows = run_panel(run.id)["trace"]["rows"]
    (resumed,) = [row for row in rows if row.label == "Resumed"]
    assert (resumed.kind, resumed.level, resumed.actor, resumed.source, resumed.end) == (
        "control", 1, "rita", "Browser", None)
    queued = queued_run()
    domain.run_cancel(run_id=queued.id, actor="olga", source="cli")
    rows = run_panel(queued.id)["trace"]["rows"]
    assert [(row.kind, row.level, row.label, row.actor) for row in rows] == [
        ("run", 0, "Run demo.steps", None), ("control", 1, "Cancel requested", "olga")]


@pytest.mark.django_db
def test_a_pause_is_drawn_from_asked_to_taken_and_a_delivery_when_it_was_taken():
    run, generation = running_run()
    activity.control_taken(run_id=run.id, generation=generation, command="pause",
                           actor="paula", source="ui")
    activity.control_taken(run_id=run.id, generation=generation, command="message",
                           actor="dina", source="api")
    domain.attempt_step(run_id=run.id, generation=generation, actor="dina", source="api")
    domain.attempt_pause(run_id=run.id, generation=generation, actor="paula", source="ui")
    panel = run_panel(run.id)
    rows = panel["trace"]["rows"]
    requests = [(row.label, row.actor, row.source, row.outcome, row.end is None)
                for row in rows if row.kind == "control"]
    assert requests == [("Pause requested", "paula", "Browser", "ok", False),
                        ("Message delivered", "dina", "REST API", "", True)]
    # The page's control requests and timeline keep to the pauses.
    assert [row["action"] for row in panel["requests"]] == ["pause"]
    assert [entry.data["actor"] for entry in panel["live_requests"]] == ["paula"]
    (pause,) = [row for row in rows if row.label == "Pause requested"]
    assert pause.level == 2 and pause.seconds >= 0  # in the attempt, until it was taken
    # The run waits: an hour on, its axis still ends with what was last recorded.
    later = trace.run_trace(Run.objects.get(pk=run.id), attempts=list(run.attempts.all()),
                            requests=[], events=[], now=timezone.now() + timedelta(hours=1))
    root, attempt = later["rows"][:2]
    assert root.width == trace.SCALE and round(root.seconds) == 3600
    assert attempt.left + attempt.width >= trace.SCALE - 1


@pytest.mark.django_db
def test_a_run_at_its_activity_cap_draws_a_bounded_trace(django_assert_max_num_queries):
    """2,000 entries: a thousand steps, each with a call of a tool of its own (nothing alike
    to collapse). The trace reads the newest ``ENTRIES`` in one query and draws ``ROWS``."""
    run, generation = running_run()
    start = timezone.now() - timedelta(hours=1)
    entries = []
    for number in range(1, 1001):
        begun = start + timedelta(seconds=number)
        entries += [entry("tool", f"tool_{number}", begun + timedelta(milliseconds=5), 10,
                          ok=True),
                    entry("step", f"step {number}", begun, 50, 1)]
    activity.activity_record(run_id=run.id, generation=generation, entries=entries)
    attempts = list(Attempt.objects.filter(run=run))
    with django_assert_max_num_queries(2):
        drawn = trace.run_trace(run, attempts=attempts, requests=[], events=[])
    assert len(drawn["rows"]) == trace.ROWS
    assert drawn["entries_hidden"] == 2000 - trace.ENTRIES
    assert drawn["rows_hidden"] == 2 + trace.ENTRIES - trace.ROWS

