"""The HTML pages: who sees what, and the partials the live page swaps in."""

import re
import threading
from html.parser import HTMLParser

import pytest

from runs import domain
from tests.conftest import browser_for, make_user, site_command
from tests.factories import awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db

ROW = re.compile(r'<tr class="run" data-run-id="[0-9a-f-]{36}"')


class Rows(HTMLParser):
    """The run rows of a page: per run id, its ``data-actions`` and the actions of the
    control buttons it shows (those without the ``hidden`` attribute)."""

    def __init__(self, html: str):
        super().__init__()
        self.rows, self.row = {}, None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and attrs.get("class") == "run":
            self.row = self.rows[attrs["data-run-id"]] = {"data-actions": attrs["data-actions"],
                                                           "shown": []}
        elif (tag == "button" and self.row is not None and "data-action" in attrs
              and "hidden" not in attrs):
            self.row["shown"].append(attrs["data-action"])

    def handle_endtag(self, tag):
        if tag == "tr":
            self.row = None


def test_anonymous_visitors_are_sent_to_the_login_form():
    response = browser_for().get("/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    login = browser_for().get("/accounts/login/")
    assert b'name="username"' in login.content and b'name="password"' in login.content


def test_a_user_without_a_role_is_refused():
    assert browser_for(make_user("sam")).get("/").status_code == 403


@pytest.mark.parametrize("role", ["operator", "viewer"])
def test_each_role_sees_the_runs(role):
    run = queued_run()
    page = browser_for(make_user("someone", role)).get("/").content.decode()
    assert f'data-run-id="{run.id}"' in page and 'data-state="queued"' in page


def test_operators_get_controls_and_the_form_viewers_do_not():
    queued_run()
    operator_page = browser_for(make_user("olga", "operator")).get("/").content.decode()
    viewer_page = browser_for(make_user("vic", "viewer")).get("/").content.decode()
    assert 'data-action="cancel"' in operator_page and 'data-action="create"' in operator_page
    assert "data-action=" not in viewer_page


def test_filters_and_search():
    steps, hang = queued_run("demo.steps", thread_id="t-1"), queued_run("demo.hang")
    domain.run_cancel(run_id=hang.id, actor="olga", source="api")
    client = browser_for(make_user("vic", "viewer"))
    cancelled = client.get("/", {"status": "cancelled"}).content.decode()
    assert str(hang.id) in cancelled and str(steps.id) not in cancelled
    by_agent = client.get("/", {"by_agent": "demo.steps"}).content.decode()
    assert str(steps.id) in by_agent and str(hang.id) not in by_agent
    assert str(steps.id) in client.get("/", {"q": "t-1"}).content.decode()
    assert str(hang.id) in client.get("/", {"q": str(hang.id)}).content.decode()


@pytest.mark.parametrize("path", ["/", "/runs/rows/"])
def test_a_search_with_a_nul_is_a_bad_request_page(path):
    queued_run(thread_id="t-1")
    response = browser_for(make_user("vic", "viewer")).get(path, {"q": "t-1\x00"})
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")


def test_load_more_pages_through_the_same_partial():
    runs = [queued_run() for _ in range(55)]
    client = browser_for(make_user("vic", "viewer"))
    first = client.get("/").content.decode()
    assert len(ROW.findall(first)) == 50 and 'data-action="more"' in first
    cursor = first.split('data-cursor="')[1].split('"')[0]
    rest = client.get("/runs/rows/", {"cursor": cursor}).content.decode()
    assert len(ROW.findall(rest)) == 5 and str(runs[0].id) in rest
    assert client.get("/runs/rows/", {"cursor": "garbage"}).status_code == 404


def test_a_runs_page_shows_its_story():
    parent = queued_run()
    child = queued_run(parent_id=parent.id)
    domain.run_stop(run_id=parent.id, actor="olga", source="ui", reason="enough for today")
    client = browser_for(make_user("vic", "viewer"))
    page = client.get(f"/runs/{parent.id}/").content.decode()
    assert "enough for today" in page and "Control requests" in page
    assert f'data-run-id="{child.id}"' in page
    assert client.get(f"/runs/{parent.id}/panel/").status_code == 200
    assert client.get("/runs/00000000-0000-0000-0000-000000000000/").status_code == 404


def test_healthz_needs_no_user():
    body = browser_for().get("/healthz").json()
    assert body["db"] == "ok" and body["broker"] in ("ok", "down", "unknown")
    assert isinstance(body["workers"], int)


def test_without_debug_the_server_refuses_to_start_without_a_secret_key(tmp_path):
    result = site_command("check", var_dir=tmp_path, DEBUG="0")
    assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr


def test_a_setting_out_of_its_range_stops_the_server_with_its_name(tmp_path):
    result = site_command("check", var_dir=tmp_path, SECRET_KEY="x", AWAKEN_DISPATCH_LINGER="30")
    assert result.returncode != 0
    assert "AWAKEN_DISPATCH_LINGER must be at most 1, not 30.0" in result.stderr


def test_metrics_report_stop_health():
    durable = queued_run()
    domain.run_cancel(run_id=durable.id, actor="olga", source="api")
    queued_run()
    body = browser_for().get("/metrics").content.decode()
    assert 'awaken_runs{end_cause="cancelled",state="ended"} 1.0' in body
    assert 'awaken_runs{end_cause="",state="queued"} 1.0' in body
    assert "awaken_pending_intents 0.0" in body
    assert 'awaken_time_to_stop_seconds_count{path="durable"} 1.0' in body
    assert 'awaken_time_to_stop_seconds_bucket{le="+Inf",path="durable"} 1.0' in body
    assert "awaken_lease_expiries_total 0.0" in body


def test_not_active_answers_are_counted(operator):
    from tests.conftest import client_for

    run = queued_run()
    before = browser_for().get("/metrics").content.decode()
    client_for(operator).post(f"/api/runs/{run.id}/deliver/", {"command": "wake"}, format="json")
    after = browser_for().get("/metrics").content.decode()

    def count(text):
        line = [x for x in text.splitlines()
                if x.startswith('awaken_not_active_total{command="wake"}')]
        return float(line[0].split()[-1]) if line else 0.0

    assert count(after) == count(before) + 1


@pytest.mark.parametrize("hook", [
    pytest.param('name="agent"', id="agent-field"),
    pytest.param('name="input"', id="input-field"),
    pytest.param('name="reason"', id="reason-field"),
    pytest.param('data-action="create"', id="create-action"),
    pytest.param('data-action="confirm-stop"', id="confirm-stop-action"),
])
def test_the_page_hooks_are_unambiguous(hook):
    queued_run()
    page = browser_for(make_user("olga", "operator")).get("/").content.decode()
    assert page.count(hook) == 1


@pytest.mark.parametrize("hook", [
    pytest.param('data-action="stop"', id="stop-action"),
    pytest.param('name="reason"', id="reason-field"),
    pytest.param('data-action="confirm-stop"', id="confirm-stop-action"),
    pytest.param('data-action="confirm-resume"', id="confirm-resume-action"),
])
def test_the_run_page_hooks_are_unambiguous(hook):
    run = queued_run()
    page = browser_for(make_user("olga", "operator")).get(f"/runs/{run.id}/").content.decode()
    assert page.count(hook) == 1


def test_a_row_shows_exactly_the_buttons_its_state_allows():
    queued = queued_run()
    running, _ = running_run()
    awaiting, _ = awaiting_run()
    ended = queued_run()
    domain.run_cancel(run_id=ended.id, actor="olga", source="api")
    expected = {queued.id: ["cancel", "stop"], running.id: ["pause", "cancel", "stop"],
                awaiting.id: ["resume", "cancel", "stop"], ended.id: []}
    client = browser_for(make_user("olga", "operator"))
    rows = Rows(client.get("/").content.decode()).rows
    assert rows.pop("") == {"data-actions": "", "shown": []}  # the template new rows clone
    assert rows == {str(run_id): {"data-actions": " ".join(actions), "shown": actions}
                    for run_id, actions in expected.items()}
    for run_id, actions in expected.items():
        page = Rows(client.get(f"/runs/{run_id}/").content.decode()).rows
        assert page[str(run_id)]["shown"] == actions


def test_healthz_reports_the_database_alone_while_the_broker_threads_are_all_stuck(monkeypatch):
    """A broker outage ties up every broker thread (deliveries waiting on it): the database
    is still reported up, and the answer is 200."""
    from runs.pages import health
    from runs.workers.broker import broker_threads

    monkeypatch.setattr(health, "prober", health.Prober())
    outage = threading.Event()
    stuck = 0
    try:
        while broker_threads().post(outage.wait, timeout=30) is not None:
            stuck += 1
        response = browser_for().get("/healthz")
        assert (response.status_code, response.json()) == (
            200, {"db": "ok", "broker": "unknown", "workers": 0})
    finally:
        outage.set()
    assert stuck > 0


def test_a_run_page_shows_its_newest_events_and_first_descendants_only(settings):
    """A run of many events and children costs its page the same as a small one; the
    events API pages through the rest with ``limit``."""
    settings.AWAKEN_MAX_CHILDREN = 1000
    from runs.domain import selectors
    from runs.models import Event
    from tests.conftest import client_for

    run, generation = running_run()
    for _ in range(selectors.PAGE_EVENTS + 50):
        domain.attempt_step(run_id=run.id, generation=generation)
    for _ in range(selectors.PAGE_TREE + 5):
        queued_run(parent_id=run.id)
    total = Event.objects.filter(run=run).count()
    page = browser_for(make_user("pager", "viewer")).get(f"/runs/{run.id}/panel/")
    text = page.content.decode()
    assert text.count('<li data-kind="step"') == selectors.PAGE_EVENTS
    assert f"{total - selectors.PAGE_EVENTS} older events not shown" in text
    assert text.count("<li data-depth=") == selectors.PAGE_TREE
    assert "Only the first 200 descendants are shown" in text
    api = client_for(make_user("pager-api", "viewer"))
    first = api.get(f"/api/runs/{run.id}/events/?limit=100").json()["results"]
    assert len(first) == 100
    rest = api.get(f"/api/runs/{run.id}/events/?after={first[-1]['seq']}&limit=1000"
                   ).json()["results"]
    assert len(first) + len(rest) == total
    assert api.get(f"/api/runs/{run.id}/events/?limit=1001").status_code == 400


class RenderWatch:
    """Whether a connection was held when each template began to render, and the queries
    run once the first had begun (``template_rendered`` is sent as a template starts)."""

    def __init__(self):
        self.held: list[bool] = []
        self.queries: list[str] = []
        self.read_before = 0  # the view's own reads, before any template began

    def rendered(self, sender, **kwargs):
        from django.db import connection

        self.held.append(connection.connection is not None)

    def __call__(self, execute, sql, params, many, context):
        if self.held:
            self.queries.append(sql)
        else:
            self.read_before += 1
        return execute(sql, params, many, context)


def busy_run():
    """A run with something in every part of its page: events, activity, a child, a ticket
    with a review link and a rerun."""
    from runs.domain import review
    from runs.domain.activity import activity_record

    run, generation = running_run(agent="demo.approval")
    activity_record(run_id=run.id, generation=generation,
                    entries=[{"kind": "log", "text": "hello"}])
    queued_run(parent_id=run.id)
    domain.attempt_pause(run_id=run.id, generation=generation)
    maker = make_user("pager", "operator")  # a link works while its maker may resume
    _, token = review.review_link_create(run_id=run.id, actor=maker.username, seconds=600)
    domain.run_rerun(run_id=run.id)
    run.review_token = token
    return run


def pages_of(run) -> list[str]:
    return [f"/runs/{run.id}/", f"/runs/{run.id}/panel/", f"/review/{run.review_token}/",
            f"/runs/{run.id}/panel/?parts=summary,ask,timeline&after=1", "/", "/?state=awaiting",
            f"/runs/rows/?ids={run.id}", "/runs/rows/", f"/runs/{run.id}/activity/",
            f"/runs/{run.id}/activity/?all=1", f"/runs/{run.id}/activity/?after=0",
            "/workers/", "/bulk/", "/overview/"]


def render_watched(paths, user):
    from django.db import connection
    from django.test.signals import template_rendered

    browser = browser_for(user)
    watched = {}
    for path in paths:
        watch = RenderWatch()
        template_rendered.connect(watch.rendered)
        try:
            with connection.execute_wrapper(watch):
                response = browser.get(path, HTTP_ACCEPT="text/html")
        finally:
            template_rendered.disconnect(watch.rendered)
        assert response.status_code == 200, (path, response.status_code)
        watched[path] = watch
    return watched


def test_no_page_reads_the_database_while_it_renders():
    """A page reads what it shows, then renders: no template queries (each would hold a
    connection of the pool for the rest of the render)."""
    run = busy_run()
    watched = render_watched(pages_of(run), make_user("renderer", "operator"))
    assert {path: watch.queries for path, watch in watched.items() if watch.queries} == {}
    # Each read the database, then rendered a template.
    assert all(watch.read_before and watch.held for watch in watched.values())


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_page_gives_its_connection_back_to_the_pool_before_it_renders(monkeypatch):
    # The rerun's dispatch commits here: no worker may take it and write while the tables
    # are emptied after the test (a TRUNCATE and a transition can deadlock).
    monkeypatch.setattr("runs.workers.dispatch.runs_queued", lambda *, runs: None)
    run = busy_run()
    watched = render_watched(pages_of(run)[:8], make_user("pooled", "operator"))
    assert {path: watch.held for path, watch in watched.items() if any(watch.held)} == {}


def test_the_panel_renders_the_parts_asked_the_events_after_a_seq_and_child_rows():
    from runs.models import Event

    run, generation = running_run()
    child = queued_run(parent_id=run.id)
    grandchild = queued_run(parent_id=child.id)
    for _ in range(3):
        domain.attempt_step(run_id=run.id, generation=generation)
    seqs = list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    browser = browser_for(make_user("parts", "viewer"))
    base = f"/runs/{run.id}/panel/"
    text = browser.get(f"{base}?parts=summary,timeline&after={seqs[-2]}").content.decode()
    assert 'data-part="summary"' in text and 'data-part="timeline-new"' in text
    assert 'data-part="tree"' not in text and 'data-part="io"' not in text
    assert re.findall(r'data-seq="(\d+)"', text) == [str(seqs[-1])]
    rows = browser.get(f"{base}?rows={grandchild.id},{child.id},{run.id}").content.decode()
    assert re.findall(r'<li data-depth="(\d)" data-run-id="([\w-]+)"', rows) == [
        ("1", str(grandchild.id)), ("0", str(child.id))]  # the run itself is no row
    for query in ("parts=everything", "parts=summary&after=²", "rows=nope"):
        assert browser.get(f"{base}?{query}").status_code == 400, query
