"""The run list's search, filters and orders (GET /api/runs/), with keyset pages that stay
correct in every order."""

import base64
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from runs import domain
from runs.domain import selectors
from runs.models import Run
from tests.conftest import db_state
from tests.factories import OWNER, awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db


def ids(response) -> list[str]:
    assert response.status_code == 200, response.json()
    return [run["id"] for run in response.json()["results"]]


def failed_run(error: str, **kwargs) -> Run:
    run, generation = running_run(**kwargs)
    domain.attempt_finish(run_id=run.id, generation=generation,
                          ending=domain.Ending.failed(error))
    return Run.objects.get(pk=run.id)


def test_the_short_id_finds_its_run(viewer_client):
    runs = [queued_run() for _ in range(5)]
    wanted = runs[2]
    short = str(wanted.id)[:8]
    expected = [str(r.id) for r in reversed(runs) if str(r.id).startswith(short)]
    assert ids(viewer_client.get(f"/api/runs/?id_prefix={short}")) == expected
    assert ids(viewer_client.get(f"/api/runs/?id_prefix={short.upper()}")) == expected
    assert ids(viewer_client.get(f"/api/runs/?id_prefix={str(wanted.id)[:13]}")) == expected
    assert ids(viewer_client.get(f"/api/runs/?id_prefix={wanted.id}")) == [str(wanted.id)]


def test_search_finds_a_short_id_an_agent_or_a_thread(viewer_client):
    steps = queued_run(agent="demo.steps", thread_id="nightly")
    fail = queued_run(agent="demo.fail")
    hang = queued_run(agent="demo.hang", thread_id="nightly")
    assert ids(viewer_client.get(f"/api/runs/?q={str(fail.id)[:8]}")) == [str(fail.id)]
    assert ids(viewer_client.get("/api/runs/?q=demo.fail")) == [str(fail.id)]
    assert ids(viewer_client.get("/api/runs/?q=nightly")) == [str(hang.id), str(steps.id)]
    assert ids(viewer_client.get("/api/runs/?q=nothing-like-it")) == []


def test_the_page_search_finds_a_short_id_and_an_agent(viewer):
    from tests.conftest import browser_for

    fail = queued_run(agent="demo.fail")
    queued_run(agent="demo.steps")
    browser = browser_for(viewer)
    for term in (str(fail.id)[:8], "demo.fail"):
        page = browser.get(f"/?q={term}").content.decode()
        assert re.findall(r'data-run-id="([^"]+)"', page) == [str(fail.id)]


def test_error_text_finds_failed_runs_in_any_case(viewer_client):
    timeout = failed_run("TimeoutError: the provider took too long")
    failed_run("ValueError: bad input")
    queued_run()
    assert ids(viewer_client.get("/api/runs/?error=timeout")) == [str(timeout.id)]
    assert ids(viewer_client.get("/api/runs/?error=PROVIDER%20TOOK")) == [str(timeout.id)]
    # LIKE's own characters are matched as text.
    assert ids(viewer_client.get("/api/runs/?error=%25")) == []


def test_a_time_range_needs_offsets_and_is_half_open(viewer_client):
    runs = [queued_run() for _ in range(3)]
    base = timezone.now().replace(microsecond=0) - timedelta(hours=3)
    for hours, run in enumerate(runs):
        Run.objects.filter(pk=run.id).update(created_at=base + timedelta(hours=hours))
    after = (base + timedelta(hours=1)).isoformat()
    before = (base + timedelta(hours=2)).isoformat()
    params = {"created_after": after, "created_before": before}
    assert ids(viewer_client.get("/api/runs/", params)) == [str(runs[1].id)]
    assert ids(viewer_client.get("/api/runs/", {"created_after": after})) == [
        str(runs[2].id), str(runs[1].id)]
    # The same instant written in another zone.
    plus_two = (base + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%S+02:00")
    assert ids(viewer_client.get("/api/runs/", {"created_after": plus_two})) == [
        str(runs[2].id), str(runs[1].id)]
    naive = viewer_client.get("/api/runs/", {"created_after": after[:19]})
    assert (naive.status_code, naive.json()["code"]) == (400, "invalid")
    assert "offset" in naive.json()["detail"]
    backwards = viewer_client.get("/api/runs/", {"created_after": before,
                                                 "created_before": after})
    assert backwards.status_code == 400


def test_several_states_and_end_causes_at_once(viewer_client):
    queued = queued_run()
    running, _ = running_run()
    awaiting, _ = awaiting_run()
    failed = failed_run("boom")
    cancelled = queued_run()
    domain.run_cancel(run_id=cancelled.id, actor="olga", source="api")
    both = [str(failed.id), str(running.id)]
    assert ids(viewer_client.get("/api/runs/?status=running,failed")) == both
    assert ids(viewer_client.get("/api/runs/?status=running&status=failed")) == both
    assert ids(viewer_client.get("/api/runs/?status=queued,awaiting")) == [
        str(awaiting.id), str(queued.id)]
    assert ids(viewer_client.get("/api/runs/?status=ended")) == [
        str(cancelled.id), str(failed.id)]
    # The single filters still work, alone and with the others.
    assert ids(viewer_client.get("/api/runs/?state=ended&end_cause=cancelled")) == [
        str(cancelled.id)]
    assert ids(viewer_client.get("/api/runs/?state=ended&status=running,failed")) == [
        str(failed.id)]


@pytest.mark.parametrize("query", [
    "status=running,bogus", "status=,,,x", "id_prefix=xyz", "id_prefix=" + "a" * 33,
    "sort=colour", "sort=--created", "created_before=yesterday",
])
def test_bad_filters_are_a_400_naming_the_problem(viewer_client, query):
    queued_run()
    before = db_state()
    response = viewer_client.get(f"/api/runs/?{query}")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "invalid" and query.split("=")[0] in body["detail"]
    assert db_state() == before


@pytest.fixture
def runs_to_sort(db) -> list[Run]:
    """Runs with every kind of value in the sorted columns: none yet (queued, running),
    equal values (ties broken by id), and distinct ones."""
    now = timezone.now().replace(microsecond=0)
    made = []
    for index in range(9):
        run = queued_run()
        if index >= 2:
            domain.attempt_start(run_id=run.id, owner=OWNER, lease_seconds=30)
        if index >= 4:
            domain.attempt_finish(run_id=run.id, generation=1, ending=domain.Ending.completed())
        made.append(run)
    # Equal start and end times and running times for some, so ties are broken by id.
    for index, run in enumerate(made):
        started = now - timedelta(minutes=index % 3) if index >= 2 else None
        ended = now + timedelta(minutes=index % 2) if index >= 4 else None
        Run.objects.filter(pk=run.id).update(started_at=started, ended_at=ended,
                                             seconds_used=float(index % 4) / 3)
    return list(Run.objects.all())


def expected_order(runs: list[Run], sort: str) -> list[str]:
    column, descending = selectors.sort_column(sort)

    def key(run):
        value = getattr(run, column)
        return (value is None, value if value is not None else 0, run.id)

    ordered = sorted(runs, key=key, reverse=descending)
    return [str(run.id) for run in ordered]


@pytest.mark.parametrize("sort", selectors.SORT_CHOICES)
@pytest.mark.parametrize("limit", [1, 2, 4])
def test_every_order_pages_through_every_run_once(viewer_client, runs_to_sort, sort, limit):
    seen = []
    url = f"/api/runs/?sort={sort}&limit={limit}"
    while url:
        body = viewer_client.get(url).json()
        assert len(body["results"]) <= limit
        seen += [run["id"] for run in body["results"]]
        url = body["next"]
    assert seen == expected_order(runs_to_sort, sort)


@pytest.mark.parametrize("sort", ["-ended", "started"])
def test_an_order_pages_with_a_filter_too(viewer_client, runs_to_sort, sort):
    seen = []
    url = f"/api/runs/?sort={sort}&limit=2&status=queued,completed"
    while url:
        body = viewer_client.get(url).json()
        seen += [run["id"] for run in body["results"]]
        url = body["next"]
    chosen = [run for run in runs_to_sort if run.state in ("queued", "ended")]
    assert seen == expected_order(chosen, sort)


def test_a_cursor_of_another_order_is_refused(viewer_client, runs_to_sort):
    next_url = viewer_client.get("/api/runs/?sort=-ended&limit=2").json()["next"]
    cursor = next_url.split("cursor=")[1].split("&")[0]
    response = viewer_client.get(f"/api/runs/?sort=started&cursor={cursor}")
    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    forged = base64.urlsafe_b64encode(b"-duration|nan|" + str(runs_to_sort[0].id).encode())
    response = viewer_client.get(f"/api/runs/?sort=-duration&cursor={forged.decode()}")
    assert response.status_code == 400


def test_the_newest_first_cursor_keeps_its_format(viewer_client):
    runs = [queued_run() for _ in range(3)]
    middle = Run.objects.get(pk=runs[1].id)
    raw = f"{middle.created_at.isoformat()}|{middle.id}".encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert selectors.encode_cursor(middle) == cursor
    assert ids(viewer_client.get(f"/api/runs/?cursor={cursor}")) == [str(runs[0].id)]
