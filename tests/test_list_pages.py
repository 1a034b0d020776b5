"""The list's filters as the URL holds them, the rows a live list asks about, the nesting of
child runs, the overview and bulk pages, the error pages and the favicon."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.http import QueryDict

from runs import domain
from runs.pages import filters
from tests.conftest import browser_for, make_user
from tests.factories import awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db

RUN_ID = re.compile(r'<tr class="run[^"]*" data-run-id="([0-9a-f-]{36})"')


def ids(html: str) -> list[str]:
    return RUN_ID.findall(html)


def test_the_filter_reads_several_states_a_time_range_in_a_zone_and_the_sort():
    chosen = filters.read(QueryDict(
        "status=running&status=failed,cancelled&by_agent=demo.steps&q=ab12&error=boom"
        "&from=2026-01-31T12:00&to=2026-02-01T00:00:00&tz=60&sort=-duration"))
    assert chosen.statuses == ["running", "failed", "cancelled"]
    assert chosen.since == datetime(2026, 1, 31, 11, 0, tzinfo=UTC)
    assert chosen.until == datetime(2026, 1, 31, 23, 0, tzinfo=UTC)
    assert chosen.sort == "-duration" and chosen.problems == []
    assert chosen.api() == {"status": ["running", "failed", "cancelled"],
                            "agent": "demo.steps", "error": "boom", "q": "ab12",
                            "created_after": chosen.since.isoformat(),
                            "created_before": chosen.until.isoformat()}
    # The query string it writes back reads as the same filter.
    again = filters.read(QueryDict(chosen.query()))
    assert (again.statuses, again.since, again.until, again.sort) == (
        chosen.statuses, chosen.since, chosen.until, chosen.sort)


def test_unusable_filter_values_are_named_and_left_out():
    chosen = filters.read(QueryDict(
        "status=bogus&by_agent=nobody&from=yesterday&sort=sideways&error=" + "x" * 300))
    assert not chosen.active and chosen.sort == "-created"
    assert len(chosen.problems) == 5


def test_the_page_filters_by_several_states_and_says_what_was_ignored():
    kept, ended = queued_run("demo.steps"), queued_run("demo.hang")
    domain.run_cancel(run_id=ended.id, actor="olga", source="api")
    other = queued_run("demo.fail")
    client = browser_for(make_user("vic", "viewer"))
    page = client.get("/", {"status": ["queued", "cancelled"], "by_agent": "demo.steps"})
    assert ids(page.content.decode()) == [str(kept.id)]
    page = client.get("/?status=queued,cancelled&status=bogus").content.decode()
    assert set(ids(page)) == {str(kept.id), str(ended.id), str(other.id)}
    assert "Unknown state &#x27;bogus&#x27; ignored." in page


def test_an_empty_filter_says_it_matches_nothing_and_an_empty_list_says_there_is_none():
    client = browser_for(make_user("olga", "operator"))
    assert "No runs yet: start one above." in client.get("/").content.decode()
    queued_run()
    page = client.get("/", {"q": "ffffffff"}).content.decode()
    assert "No runs match this filter." in page and "No runs yet" not in page


def test_a_time_range_in_the_viewers_zone():
    run = queued_run()
    client = browser_for(make_user("vic", "viewer"))
    local = (run.created_at + timedelta(hours=9)).replace(tzinfo=None)  # the viewer is at +9
    before = (local - timedelta(minutes=1)).isoformat(timespec="seconds")
    after = (local + timedelta(minutes=1)).isoformat(timespec="seconds")
    assert ids(client.get("/", {"from": before, "to": after, "tz": "540"}).content.decode()) \
        == [str(run.id)]
    assert ids(client.get("/", {"from": after, "tz": "540"}).content.decode()) == []


def test_the_sort_links_flip_the_order_and_keep_the_filter():
    client = browser_for(make_user("vic", "viewer"))
    page = client.get("/", {"status": "queued", "sort": "-duration"}).content.decode()
    assert 'aria-sort="descending"><a href="?status=queued&amp;sort=duration"' in page
    assert '<a href="?status=queued&amp;sort=-started"' in page


def test_children_follow_their_parent_on_the_page():
    parent = queued_run()
    queued_run()  # newer than the parent: listed before it
    child = queued_run(parent_id=parent.id)
    page = browser_for(make_user("vic", "viewer")).get("/").content.decode()
    order = ids(page)
    assert order.index(str(child.id)) == order.index(str(parent.id)) + 1
    assert f'data-run-id="{child.id}" ' in page and 'data-depth="1"' in page


def test_the_rows_asked_about_are_those_that_match_the_filter():
    queued, ended = queued_run(), queued_run()
    domain.run_cancel(run_id=ended.id, actor="olga", source="api")
    client = browser_for(make_user("vic", "viewer"))
    asked = f"{queued.id},{ended.id}"
    assert ids(client.get("/runs/rows/", {"status": "queued", "ids": asked})
               .content.decode()) == [str(queued.id)]
    assert set(ids(client.get("/runs/rows/", {"ids": asked}).content.decode())) == {
        str(queued.id), str(ended.id)}
    assert client.get("/runs/rows/", {"ids": "not-a-run"}).status_code == 400


def test_the_list_gives_the_bulk_dialog_its_filter_in_the_apis_terms():
    page = browser_for(make_user("olga", "operator")).get(
        "/", {"status": "running", "q": "abc"}).content.decode()
    assert '<script id="list-filter" type="application/json">' \
           '{"status": ["running"], "q": "abc"}</script>' in page
    assert 'id="bulk-dialog"' in page


@pytest.mark.parametrize("path", ["/overview/", "/bulk/"])
def test_the_overview_and_bulk_pages_need_a_role(path):
    assert browser_for(make_user("vic", "viewer")).get(path).status_code == 200
    assert browser_for(make_user("sam")).get(path).status_code == 403
    assert browser_for().get(path).status_code == 302


def test_the_bulk_page_lists_jobs_and_viewers_get_no_abort():
    run = queued_run()
    domain.bulk_create(action="cancel", ids=[run.id], requested_by="olga",
                         created_by=None, source="ui")
    operator = browser_for(make_user("olga", "operator")).get("/bulk/").content.decode()
    viewer = browser_for(make_user("vic", "viewer")).get("/bulk/").content.decode()
    assert "<bdi>olga</bdi> (ui)" in operator and 'data-bulk="abort"' in operator
    assert "<bdi>olga</bdi> (ui)" in viewer and 'data-bulk="abort"' not in viewer


def test_pushed_bulk_jobs_are_redrawn_from_the_servers_one_rendering():
    run = queued_run()
    job = domain.bulk_create(action="stop", reason="tidy", ids=[run.id], requested_by="olga",
                             created_by=None, source="ui")
    client = browser_for(make_user("olga", "operator"))
    row = client.get("/bulk/rows/", {"ids": f"{job.id},not-a-job"}).content.decode()
    assert row.count('<tr class="job"') == 1 and f'data-job-id="{job.id}"' in row
    assert "0 of 1 handled (0 applied, 0 already ended, 0 refused)" in row
    progress = client.get("/bulk/rows/", {"ids": str(job.id), "view": "progress"})
    assert f"Stop job {str(job.id)[:8]}: queued" in progress.content.decode()
    assert 'data-bulk="abort"' in progress.content.decode()
    assert client.get("/bulk/rows/", {"ids": str(job.id), "view": "x"}).status_code == 400
    assert browser_for(make_user("sam")).get("/bulk/rows/").status_code == 403


def a_handled_bulk_job():
    """A resume of a running run and an ended one (unchanged both) and an awaiting one
    (applied), handled."""
    running, _ = running_run(agent="demo.hang")
    ended = queued_run()
    domain.run_cancel(run_id=ended.id, actor="olga", source="ui")
    awaiting, _ = awaiting_run()
    job = domain.bulk_create(action="resume", ids=[running.id, ended.id, awaiting.id],
                             requested_by="olga", created_by=None, source="cli")
    domain.bulk_job_run(job_id=job.id)
    return job, {"running": running, "ended": ended, "awaiting": awaiting}


def test_a_bulk_job_page_shows_who_started_it_how_and_the_outcome_of_each_run():
    job, runs = a_handled_bulk_job()
    viewer = browser_for(make_user("vic", "viewer"))
    html = viewer.get(f"/bulk/{job.id}/").content.decode()
    assert "Resume of 3 chosen runs" in html and "3 chosen by id" in html
    assert "<bdi>olga</bdi> <span class=\"muted\">via Command line</span>" in html
    assert "3 of 3 handled (1 applied, 2 already ended, 0 refused)" in html
    outcomes = dict(re.findall(r'<a href="/runs/([0-9a-f-]{36})/">.*?'
                               r'<span class="badge outcome" data-outcome="(\w+)"', html, re.S))
    assert outcomes == {str(runs["running"].id): "unchanged", str(runs["ended"].id): "unchanged",
                        str(runs["awaiting"].id): "applied"}
    assert "not awaiting (running)" in html and "not awaiting (cancelled)" in html
    assert 'data-bulk="abort"' not in html  # a viewer sees, and cannot abort
    # The jobs page opens it.
    assert f'href="/bulk/{job.id}/"' in viewer.get("/bulk/").content.decode()


def test_a_bulk_job_filter_is_shown_and_its_runs_are_paged(monkeypatch):
    runs = [queued_run(agent="demo.hang") for _ in range(3)]
    job = domain.bulk_create(action="cancel", criteria={"agent": "demo.hang"},
                             requested_by="olga", created_by=None, source="ui")
    monkeypatch.setattr(domain.bulk, "ITEMS_PAGE", 2)
    client = browser_for(make_user("olga", "operator"))
    first = client.get(f"/bulk/{job.id}/").content.decode()
    assert "<code>agent=demo.hang</code>" in first
    assert first.count('<tr class="item"') == 2 and "not yet" in first
    assert 'data-bulk="abort"' in first  # an operator may abort it while it waits
    after = re.search(r'href="\?after=(\d+)"', first).group(1)
    rest = client.get(f"/bulk/{job.id}/", {"after": after, "items": "1"}).content.decode()
    assert rest.count('<tr class="item"') == 1 and "<html" not in rest
    shown = set(re.findall(r'href="/runs/([0-9a-f-]{36})/"', first + rest))
    assert shown == {str(run.id) for run in runs}
    assert client.get(f"/bulk/{job.id}/", {"after": "²"}).status_code == 400
    assert client.get(f"/bulk/{runs[0].id}/").status_code == 404
    assert browser_for(make_user("sam")).get(f"/bulk/{job.id}/").status_code == 403
    assert browser_for().get(f"/bulk/{job.id}/").status_code == 302


def test_error_pages_are_the_sites_own_with_a_way_back():
    client = browser_for(make_user("vic", "viewer"))
    for response in (client.get("/no-such-page/"), client.get("/", {"cursor": "garbage"})):
        assert response.status_code == 404
        body = response.content.decode()
        assert 'class="error-page' in body and 'href="/"' in body and "site.css" in body
    assert "does not exist" in client.get("/", {"cursor": "garbage"}).content.decode()
    refused = browser_for(make_user("sam")).get("/").content.decode()
    assert "viewer or operator role" in refused and 'class="error-page' in refused


def test_the_favicon_is_served():
    response = browser_for().get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith(".svg")
