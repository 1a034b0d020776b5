"""The operator list, the overview, bulk jobs and the error pages in a real browser (Debian's
chromium driven by Playwright) against the embedded site, at 1280×800 and 390×844."""

import os
import re
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, suppress

import pytest

from harness.processes import ROOT
from tests.accessibility import serious_violations
from tests.conftest import BROWSER_DEADLINE_MS, CHROMIUM, box_of, click_to, click_to_confirm
from tests.test_browser import answer_dialogs

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}

pytestmark = [pytest.mark.sites_stream,
              pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                 reason="needs Debian's chromium (apt-get install chromium)")]


class Tab:
    """A logged-in page that records console errors and uncaught exceptions."""

    def __init__(self, browser, site, viewport=DESKTOP, **context):
        touch = viewport["width"] < 500
        self.context = browser.new_context(viewport=viewport, has_touch=touch,
                                           is_mobile=touch, **context)
        self.page = answer_dialogs(self.context.new_page())
        self.page.set_default_timeout(BROWSER_DEADLINE_MS)
        self.site = site
        self.errors = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error"
                     else None)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(f"{site.base}/accounts/login/")
        self.page.fill('input[name="username"]', "admin")
        self.page.fill('input[name="password"]', site.admin_password)
        self.page.click('button[type="submit"]')
        self.page.wait_for_selector('#live[data-status="live"]')

    def open(self, path, ready='#live[data-status="live"]'):
        self.page.goto(f"{self.site.base}{path}")
        if ready:
            self.page.wait_for_selector(ready)
        return self.page

    def close(self):
        self.context.close()


@pytest.fixture
def tab(browser, embedded_site):
    opened = Tab(browser, embedded_site)
    yield opened
    assert opened.errors == []
    opened.close()


@pytest.fixture
def phone(browser, embedded_site):
    opened = Tab(browser, embedded_site, PHONE)
    yield opened
    assert opened.errors == []
    opened.close()


def start(site, agent, input=None, **extra):
    status, run = site.call("POST", "/api/runs/", {"agent": agent, "input": input or {},
                                                    **extra})
    assert status == 201, run
    return run


def row_of(run):
    return f'tr.run[data-run-id="{run["id"]}"]'


def wait_state(site, run, status):
    from harness.processes import wait_until

    def there():
        _, now = site.call("GET", f"/api/runs/{run['id']}/")
        return status in (now["state"], now["end_cause"])

    wait_until(there, 30, f"run {run['id']} to be {status}")


# --- bugs ---------------------------------------------------------------------------------

def test_a_filtered_list_lets_go_of_a_run_that_no_longer_matches(tab, embedded_site):
    run = start(embedded_site, "demo.hang")
    page = tab.open("/?status=running")
    page.wait_for_selector(f'{row_of(run)}[data-state="running"]')
    embedded_site.call("POST", f"/api/runs/{run['id']}/cancel/?wait=2")
    page.wait_for_selector(row_of(run), state="detached")
    page.wait_for_function(
        "id => document.querySelector('#announce').textContent.includes(id)",
        arg=run["id"][:8])


def test_a_filtered_list_takes_in_a_run_that_comes_to_match(tab, embedded_site):
    run = start(embedded_site, "demo.hang")
    page = tab.open("/?status=cancelled")
    wait_state(embedded_site, run, "running")
    assert page.query_selector(row_of(run)) is None
    embedded_site.call("POST", f"/api/runs/{run['id']}/cancel/?wait=2")
    page.wait_for_selector(f'{row_of(run)}[data-end-cause="cancelled"]')


def test_a_run_that_comes_to_match_takes_its_place_below_newer_rows(tab, embedded_site):
    older, newer = start(embedded_site, "demo.hang"), start(embedded_site, "demo.hang")
    for run in (older, newer):
        wait_state(embedded_site, run, "running")
    embedded_site.call("POST", f"/api/runs/{newer['id']}/cancel/?wait=2")
    page = tab.open("/?by_agent=demo.hang&status=cancelled")
    page.wait_for_selector(row_of(newer))
    embedded_site.call("POST", f"/api/runs/{older['id']}/cancel/?wait=2")
    page.wait_for_selector(f'{row_of(older)}[data-end-cause="cancelled"]')
    shown = page.eval_on_selector_all("tr.run", "rows => rows.map(r => r.dataset.runId)")
    assert shown.index(newer["id"]) < shown.index(older["id"])
    created = page.eval_on_selector_all(
        "tr.run time[data-field=created]", "times => times.map(t => Date.parse(t.dateTime))")
    assert created == sorted(created, reverse=True)


def test_search_finds_the_short_id_shown_and_the_agent(tab, embedded_site):
    run = start(embedded_site, "demo.steps", {"steps": 1, "step_seconds": 0.05})
    page = tab.open(f"/?q={run['id'][:8]}")
    assert page.eval_on_selector_all("tr.run", "rows => rows.map(r => r.dataset.runId)") == [
        run["id"]]
    page.fill('#filters [name="q"]', "demo.steps")
    page.click('#filters button[type="submit"]')
    page.wait_for_url(re.compile(r"q=demo\.steps"))
    agents = page.eval_on_selector_all("tr.run", "rows => rows.map(r => r.dataset.agent)")
    assert agents and set(agents) == {"demo.steps"}


def test_a_filter_without_matches_says_so(tab):
    page = tab.open("/?q=0000000f")
    text = page.text_content("#empty")
    assert page.is_visible("#empty") and "No runs match this filter" in text
    assert "No runs yet" not in text


def test_starting_a_run_the_filter_hides_says_so(tab):
    page = tab.open("/?status=failed")
    page.select_option('#new-run [name="agent"]', "demo.steps")
    page.fill('[name="input"]', '{"steps": 1, "step_seconds": 0.05}')
    page.click('[data-action="create"]')
    page.wait_for_selector("#toast:not([hidden])")
    assert "filter hides it" in page.text_content("#toast")
    assert page.get_attribute("#toast a", "href").startswith("/runs/")


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_picking_an_agent_shows_its_description_and_example_input(browser, embedded_site,
                                                                  viewport):
    tab = Tab(browser, embedded_site, viewport)
    try:
        page = tab.open("/")
        page.evaluate("() => { document.querySelector('#new-run-box').open = true; }")
        field = '#new-run [name="input"]'
        shown = "#agent-help [data-agent-help]:not([hidden])"
        assert page.get_attribute(shown, "data-agent-help") == "demo.steps"
        assert '"steps": 5' in page.input_value(field)
        page.select_option('#new-run [name="agent"]', "demo.email")
        page.wait_for_selector('[data-agent-help="demo.email"]:not([hidden])')
        assert page.locator(shown).count() == 1
        assert "approve one send_email" in page.text_content(shown)
        assert '"to": "team@example.com"' in page.input_value(field)  # its example replaced
        assert page.is_visible(f'{shown} [data-action="use-example"]')
        box = page.locator(shown).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"]

        # An input written by hand stays when another agent is picked; "Use it" puts the
        # example back.
        page.fill(field, '{"steps": 2}')
        page.select_option('#new-run [name="agent"]', "demo.fail")
        assert page.input_value(field) == '{"steps": 2}'
        page.click(f'{shown} [data-action="use-example"]')
        assert page.input_value(field) == '{"steps": 1}'

        # A bad input: the server's words, gone once the input changes.
        page.fill(field, "[1, 2]")
        page.click('[data-action="create"]')
        error = '#new-run [data-field="form-error"]'
        page.wait_for_function(
            "sel => document.querySelector(sel).textContent !== ''", arg=error)
        text = page.text_content(error)
        assert "must be a JSON object" in text and "not a list" in text
        assert "dictionary" not in text.lower()
        assert page.is_visible(error)
        page.fill(field, '{"steps": 1}')
        assert page.text_content(error) == ""
        assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
    finally:
        tab.close()
    assert [e for e in tab.errors if "status of 400" not in e] == []  # the refused start


def test_times_are_live_and_show_the_local_time_with_its_zone(browser, embedded_site):
    tab = Tab(browser, embedded_site, timezone_id="Asia/Tokyo", locale="en-GB")
    try:
        run = start(embedded_site, "demo.steps", {"steps": 1, "step_seconds": 0.05})
        page = tab.open("/")
        created = f'{row_of(run)} time[data-field="created"]'
        page.wait_for_selector(created)
        title = page.get_attribute(created, "title")
        assert "GMT+9" in title or "JST" in title
        # Relative times move on: "just now" becomes "... sec. ago" without a reload.
        page.wait_for_function(
            "sel => /sec|min/.test(document.querySelector(sel).textContent)", arg=created,
            timeout=20_000)
        assert tab.errors == []
    finally:
        tab.close()


@pytest.mark.parametrize("width", [360, 390])
def test_the_phone_layout_fits_and_its_buttons_are_big(browser, embedded_site, width):
    tab = Tab(browser, embedded_site, {"width": width, "height": 844})
    try:
        run = start(embedded_site, "demo.hang")
        page = tab.open("/")
        row = f'{row_of(run)}[data-state="running"]'
        page.wait_for_selector(row)
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        for action in ("pause", "cancel", "stop"):
            box = box_of(page, f'{row} [data-action="{action}"]')
            assert box["height"] >= 44 and box["x"] >= 0 and box["x"] + box["width"] <= width
        page.check(f"{row} [data-select]")  # nothing covers the checkbox of a card
        assert page.is_visible("#bulk-bar")
        click_to_confirm(page, f'{row} [data-action="cancel"]')
        page.wait_for_selector(f'{row_of(run)}[data-end-cause="cancelled"]')
        assert tab.errors == []
    finally:
        tab.close()


@pytest.mark.parametrize("viewport", [DESKTOP, {"width": 360, "height": 800}])
def test_every_rows_controls_fit_whatever_other_rows_say(browser, embedded_site, viewport):
    tab = Tab(browser, embedded_site, viewport)
    try:
        pausing, plain = start(embedded_site, "demo.hang"), start(embedded_site, "demo.hang")
        awaiting = start(embedded_site, "demo.approval", {"steps_before": 0})
        for agent in ("demo.fail", "demo.hang_tool"):  # long names and errors take room too
            start(embedded_site, agent, {"steps": 1})
        wait_state(embedded_site, plain, "running")
        wait_state(embedded_site, pausing, "running")
        assert embedded_site.call("POST", f"/api/runs/{pausing['id']}/pause/?wait=0")[0] == 202
        wait_state(embedded_site, awaiting, "awaiting")
        page = tab.open("/")
        page.wait_for_selector(f'{row_of(pausing)}[data-pending="pause"]')
        # Inside the viewport and not clipped by the list's own box.
        edge = page.evaluate("""w => Math.min(w, document.querySelector('.table-wrap')
            .getBoundingClientRect().right)""", viewport["width"])
        boxes = page.evaluate("""() => [...document.querySelectorAll(
            'tr.run button[data-action]')].filter(b => b.checkVisibility()).map(b => {
              const r = b.getBoundingClientRect();
              return [b.closest('tr').dataset.runId, b.dataset.action, r.left, r.right, r.width];
            })""")
        mine = {(run_id, action) for run_id, action, *_ in boxes}
        assert {(pausing["id"], "pause"), (plain["id"], "stop"), (awaiting["id"], "resume")} <= mine
        for run_id, action, left, right, _ in boxes:
            assert 0 <= left and right <= edge, (run_id, action, left, right, edge)
        if viewport is DESKTOP:  # one width for every button, so one column for each action
            assert page.evaluate("""() => { const w = document.querySelector('.table-wrap');
                return w.scrollWidth - w.clientWidth; }""") == 0  # nothing to scroll to
            assert len({round(width) for *_, width in boxes}) == 1, boxes
            stops = {round(right) for _, action, _, right, _ in boxes if action == "stop"}
            assert len(stops) == 1, stops
        for run in (pausing, plain, awaiting):
            embedded_site.call("POST", f"/api/runs/{run['id']}/cancel/?wait=2")
        assert tab.errors == []
    finally:
        tab.close()


def test_a_lost_connection_shows_a_banner_disables_controls_and_reconnects_now(
        browser, embedded_site):
    tab = Tab(browser, embedded_site)
    try:
        page = tab.page
        sockets = {"down": False, "open": []}

        def socket(route):
            if sockets["down"]:
                route.close()
                return
            route.connect_to_server()
            sockets["open"].append(route)
        page.route_web_socket(re.compile(r"/ws/runs/$"), socket)
        run = start(embedded_site, "demo.hang")
        tab.open("/")
        row = f'{row_of(run)}[data-state="running"]'
        page.wait_for_selector(row)
        sockets["down"] = True
        for route in sockets["open"]:
            route.close()
        page.wait_for_selector("#offline-banner:has-text('what you see may be stale')")
        page.wait_for_selector(f'{row} [data-action="cancel"]:disabled')
        page.click('#offline-banner [data-action="reconnect"]')  # still down: still offline
        page.wait_for_selector('#live[data-status="offline"]')
        assert page.is_visible("#offline-banner")
        sockets["down"] = False
        page.click('#offline-banner [data-action="reconnect"]')
        page.wait_for_selector('#live[data-status="live"]', timeout=3_000)
        page.wait_for_selector("#offline-banner", state="hidden")
        page.wait_for_selector(f'{row} [data-action="cancel"]:enabled')
        # A request that cannot reach the server says so in words, not "Failed to fetch".
        page.route("**/api/runs/*/pause/**", lambda route: route.abort())
        said = page.evaluate("""async id => {
            const { send } = await import("/static/runs/controls.js");
            try { await send("POST", `/api/runs/${id}/pause/`); } catch (e) { return e.message; }
        }""", run["id"])
        assert said.startswith("The server could not be reached"), said
        embedded_site.call("POST", f"/api/runs/{run['id']}/cancel/?wait=2")
        assert [e for e in tab.errors if "ERR_FAILED" not in e] == []
    finally:
        tab.close()


def test_error_pages_are_styled_with_a_way_back(tab, embedded_site):
    page = tab.page
    missing_run = "/runs/00000000-0000-0000-0000-0000000000ff/"
    for path in ("/no-such-page/", "/?cursor=garbage", missing_run):
        response = page.goto(f"{embedded_site.base}{path}")
        assert response.status == 404
        assert page.is_visible(".error-page") and page.is_visible('.error-page a[href="/"]')
        assert page.evaluate("getComputedStyle(document.body).margin") == "0px"  # styled
    tab.errors.clear()  # the browser logs each 404 document itself
    icon = page.goto(f"{embedded_site.base}/favicon.ico")
    assert icon.status == 200 and icon.headers["content-type"].startswith("image/svg")


def test_the_columns_show_a_short_thread_and_the_error(tab, embedded_site):
    run = start(embedded_site, "demo.fail", {"steps": 1})
    page = tab.open("/")
    row = f'{row_of(run)}[data-end-cause="failed"]'
    page.wait_for_selector(row)
    thread = page.locator(f'{row} [data-field="thread-short"]')
    assert thread.text_content() == run["thread_id"][:8]
    assert thread.get_attribute("title") == run["thread_id"]
    page.wait_for_function(
        "sel => document.querySelector(sel).textContent.includes('demo.fail')",
        arg=f'{row} [data-field="error"]')
    assert page.is_visible(f'{row} [data-field="error"]')


# --- features ------------------------------------------------------------------------------

def test_children_are_nested_under_their_parent_and_fold(tab, embedded_site):
    parent = start(embedded_site, "demo.parent")
    page = tab.open("/")
    page.wait_for_function(
        "id => document.querySelectorAll(`tr.run[data-parent='${id}']`).length >= 2",
        arg=parent["id"])
    page.reload()
    page.wait_for_selector('#live[data-status="live"]')
    order = page.eval_on_selector_all(
        "tr.run", "rows => rows.map(r => [r.dataset.runId, r.dataset.parent, r.dataset.depth])")
    at = [run_id for run_id, _, _ in order].index(parent["id"])
    children = order[at + 1:at + 3]
    assert all(p == parent["id"] and depth == "1" for _, p, depth in children)
    page.click(f'{row_of(parent)} [data-toggle="children"]')
    for child_id, _, _ in children:
        assert not page.is_visible(f'tr.run[data-run-id="{child_id}"]')
    page.click(f'{row_of(parent)} [data-toggle="children"]')
    assert page.is_visible(f'tr.run[data-run-id="{children[0][0]}"]')
    embedded_site.call("POST", f"/api/runs/{parent['id']}/cancel/?wait=2")


def test_sorting_by_a_column_and_the_url_holds_it(tab, embedded_site):
    start(embedded_site, "demo.steps", {"steps": 1, "step_seconds": 0.05})
    page = tab.open("/?status=completed")
    page.click("th >> text=Duration")
    page.wait_for_url(re.compile(r"sort=-duration"))
    assert "status=completed" in page.url
    assert page.get_attribute("th:has(a:text('Duration'))", "aria-sort") == "descending"
    page.wait_for_selector("tr.run")
    # The top-level runs are in order; a child run is folded under its parent, wherever
    # its own duration would put it.
    durations = page.eval_on_selector_all(
        "tr.run:not(.child) [data-field='duration']",
        "nodes => nodes.map(n => Number(n.dataset.seconds))")
    assert len(durations) >= 1 and durations == sorted(durations, reverse=True)


def test_several_states_at_once_and_a_time_range(tab, embedded_site):
    failed = start(embedded_site, "demo.fail", {"steps": 1})
    done = start(embedded_site, "demo.steps", {"steps": 1, "step_seconds": 0.05})
    wait_state(embedded_site, failed, "failed")
    wait_state(embedded_site, done, "completed")
    page = tab.open("/")
    page.click("#state-picker summary")
    page.check('#state-picker input[value="failed"]')
    page.check('#state-picker input[value="completed"]')
    page.click("#state-picker summary")  # closed again: open, its list covers the form
    page.fill('#filters [name="from"]', "2000-01-01T00:00:00")
    page.click('#filters button[type="submit"]')
    page.wait_for_url(re.compile(r"status=failed.*status=completed|status=completed.*status=failed"))
    assert "from=2000-01-01" in page.url and "tz=" in page.url
    shown = set(page.eval_on_selector_all("tr.run", "rows => rows.map(r => r.dataset.runId)"))
    assert {failed["id"], done["id"]} <= shown
    states = page.eval_on_selector_all("tr.run", "rows => rows.map(r => r.dataset.endCause)")
    assert set(states) <= {"failed", "completed"}
    page.goto(f"{embedded_site.base}/?to=2000-01-01T00:00:00&tz=0")
    assert page.is_visible("#empty")


def test_copy_buttons_copy_the_full_id(browser, embedded_site):
    tab = Tab(browser, embedded_site)
    tab.context.grant_permissions(["clipboard-read", "clipboard-write"],
                                  origin=embedded_site.base)
    try:
        run = start(embedded_site, "demo.steps", {"steps": 1, "step_seconds": 0.05})
        page = tab.open("/")
        page.click(f'{row_of(run)} td.id [data-copy]')
        page.wait_for_selector("#toast:not([hidden])")
        assert page.evaluate("navigator.clipboard.readText()") == run["id"]
        assert tab.errors == []
    finally:
        tab.close()


def test_keyboard_shortcuts_are_documented_and_work(tab, embedded_site):
    start(embedded_site, "demo.steps", {"steps": 1, "step_seconds": 0.05})
    page = tab.open("/")
    page.wait_for_selector("tr.run")
    page.keyboard.press("?")
    assert page.is_visible("#shortcuts") and "Next and previous run" in page.text_content(
        "#shortcuts")
    page.keyboard.press("j")
    assert page.evaluate("document.activeElement.closest('tr.run') !== null")
    assert page.query_selector("tr.run.focused") is not None
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.name") == "q"


def test_live_changes_are_announced(tab, embedded_site):
    run = start(embedded_site, "demo.hang")
    page = tab.open("/")
    page.wait_for_selector(f'{row_of(run)}[data-state="running"]')
    assert page.get_attribute("#announce", "aria-live") == "polite"
    embedded_site.call("POST", f"/api/runs/{run['id']}/cancel/?wait=2")
    page.wait_for_function(
        "id => document.querySelector('#announce').textContent.includes(`${id} is cancelled`)",
        arg=run["id"][:8])


def test_the_overview_draws_charts_that_follow_the_figures(tab, embedded_site):
    page = tab.open("/overview/")
    page.wait_for_function("() => document.querySelectorAll('.uplot canvas').length === 4")
    page.wait_for_function(
        "() => document.querySelector('[data-figure=running]').textContent !== '–'")
    running = int(page.text_content('[data-figure="running"]'))
    run = start(embedded_site, "demo.hang")
    wait_state(embedded_site, run, "running")
    page.wait_for_function(
        "n => Number(document.querySelector('[data-figure=\"running\"]').textContent) > n",
        arg=running, timeout=20_000)
    embedded_site.call("POST", f"/api/runs/{run['id']}/cancel/?wait=2")
    done = start(embedded_site, "demo.steps", {"steps": 1, "step_seconds": 0.01})
    wait_state(embedded_site, done, "completed")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    # "Ended by cause": each cause's bar in its own colour (completed green, cancelled amber).
    page.wait_for_function("""() => {
        const canvas = document.querySelector('[data-chart="ended"] canvas');
        const { data } = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
        const seen = new Set();
        for (let i = 0; i < data.length; i += 4) {
          const rgb = [data[i], data[i + 1], data[i + 2]].join();
          if (rgb === "22,163,74" || rgb === "217,119,6") seen.add(rgb);
        }
        return seen.size === 2;
    }""", timeout=15_000)


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_the_overview_has_a_range_in_its_url_a_table_by_agent_and_a_live_history(
        browser, embedded_site, viewport):
    start(embedded_site, "demo.fail", {"steps": 1})
    hung = start(embedded_site, "demo.hang")
    wait_state(embedded_site, hung, "running")
    tab = Tab(browser, embedded_site, viewport)
    try:
        page = tab.open("/overview/?window=604800")
        assert page.input_value("#window") == "604800"
        page.wait_for_selector('tr[data-agent="demo.hang"]')
        row = page.locator('tr[data-agent="demo.hang"]')
        assert int(row.locator('[data-label="running"]').text_content()) >= 1
        assert "(per 56 min)" in page.text_content('[data-field="bucket"]')
        assert page.get_attribute('[data-field="api-link"]', "href") == (
            "/api/overview/?window=604800")
        # The history of live runs by state is the sweeper's samples: there on opening.
        history = page.evaluate("""async () => (await (await fetch(
            '/api/overview/?window=3600')).json()).live_series""")
        assert any(point["running"] is not None for point in history[:-1])
        assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
        box = box_of(page, 'tr[data-agent="demo.hang"]')
        assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"]

        # A range of one's own: from and to, kept in the URL.
        page.select_option("#window", "custom")
        assert page.is_visible('#range [name="since"]')
        page.fill('#range [name="since"]', "2026-01-01T10:00")
        page.fill('#range [name="until"]', "2026-01-01T12:00")
        page.click('#range button[type="submit"]')
        page.wait_for_url(re.compile(r"since=2026-01-01T\d\d%3A00%3A00.*until="))
        page.wait_for_function(
            "() => document.querySelector('[data-figure=ended]').textContent === '0'")
        assert "since=" in page.get_attribute('[data-field="api-link"]', "href")
        page.reload()
        page.wait_for_selector('#live[data-status="live"]')
        assert page.input_value("#window") == "custom"
        assert page.input_value('#range [name="since"]') == "2026-01-01T10:00"

        # A range that ends before it starts: the server says so, and nothing else breaks.
        page.fill('#range [name="until"]', "2026-01-01T09:00")
        page.click('#range button[type="submit"]')
        error = '#range [data-field="range-error"]'
        page.wait_for_function("sel => document.querySelector(sel).textContent !== ''",
                               arg=error)
        assert "before its end" in page.text_content(error)
        page.select_option("#window", "3600")
        page.wait_for_function("sel => document.querySelector(sel).textContent === ''",
                               arg=error)
        page.wait_for_url(re.compile(r"window=3600$"))
    finally:
        tab.close()
    assert [e for e in tab.errors if "status of 400" not in e] == []  # the refused range


def test_a_bulk_cancel_of_selected_runs_shows_its_progress(tab, embedded_site):
    runs = [start(embedded_site, "demo.hang") for _ in range(2)]
    page = tab.open("/?by_agent=demo.hang&status=running")
    for run in runs:
        page.wait_for_selector(f'{row_of(run)}[data-state="running"]')
        page.check(f"{row_of(run)} [data-select]")
    assert page.text_content('[data-field="bulk-count"]') == "2 selected"
    page.click('#bulk-bar [data-bulk="cancel"]')
    page.wait_for_function(
        "() => document.querySelector('[data-field=bulk-preview]').textContent"
        ".startsWith('2 runs')")
    page.click('#bulk-dialog [data-bulk="confirm"]')
    page.wait_for_selector('#bulk-progress[data-state="done"]', timeout=30_000)
    assert "2 applied" in page.text_content("#bulk-progress")
    for run in runs:
        wait_state(embedded_site, run, "cancelled")
    page = tab.open("/bulk/")
    first = page.locator("tr.job").first
    assert first.get_attribute("data-state") == "done"
    assert "admin" in first.text_content() and "2 applied" in first.text_content()


def test_a_bulk_stop_without_a_reason_keeps_its_dialog_open_and_says_why(tab, embedded_site):
    run = start(embedded_site, "demo.hang")
    page = tab.open("/?by_agent=demo.hang&status=running")
    page.wait_for_selector(f'{row_of(run)}[data-state="running"]')
    page.check(f"{row_of(run)} [data-select]")
    page.click('#bulk-bar [data-bulk="stop"]')
    page.wait_for_selector('#bulk-dialog [data-bulk="confirm"]:enabled')
    page.click('#bulk-dialog [data-bulk="confirm"]')
    page.wait_for_selector("#bulk-dialog[open] [data-field='bulk-error']:has-text('Give a reason')")
    assert embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]["state"] == "running"
    page.fill('[name="bulk_reason"]', "stuck")
    page.click('#bulk-dialog [data-bulk="confirm"]')
    page.wait_for_selector('#bulk-progress[data-state="done"]', timeout=30_000)
    assert not page.is_visible("#bulk-dialog")
    wait_state(embedded_site, run, "stopped")


def test_a_bulk_job_over_a_filter_can_be_aborted(tab, embedded_site):
    page = tab.open("/bulk/")
    runs = [start(embedded_site, "demo.hang") for _ in range(3)]
    for run in runs:
        wait_state(embedded_site, run, "running")
    status, job = embedded_site.call("POST", "/api/bulk/", {
        "action": "stop", "reason": "clearing the queue", "filter": {"agent": "demo.hang"}})
    assert status == 201
    row = f'tr.job[data-job-id="{job["id"]}"]'
    page.wait_for_selector(row)
    from playwright.sync_api import TimeoutError as NotClickable

    try:  # the job may finish between the button showing and the click
        page.click(f'{row} [data-bulk="abort"]', timeout=3000)
    except NotClickable:
        assert page.get_attribute(row, "data-state") == "done"
    page.wait_for_selector(f'{row}[data-state="aborted"], {row}[data-state="done"]')
    assert not page.is_visible(f'{row} [data-bulk="abort"]')


@contextmanager
def writes_held(site, at_most: float = 10.0):
    """No write commits on the embedded ``site`` inside the block: the test holds its SQLite
    database's write lock, so a worker's next write waits while pages are read (WAL lets
    readers on). Released after ``at_most`` seconds whatever happens, so a request that
    would write is held up, never stuck.

    The lock is asked for again at once each time the site holds it, not with SQLite's
    growing sleeps between tries: a worker that writes one transaction after another (a
    bulk job's runs) would take it back during each sleep and finish first."""
    hold = sqlite3.connect(site.database, timeout=0, isolation_level=None,
                           check_same_thread=False)
    deadline = time.monotonic() + at_most
    while True:
        try:
            hold.execute("BEGIN IMMEDIATE")
            break
        except sqlite3.OperationalError:  # "database is locked": the site is writing
            if time.monotonic() > deadline:
                hold.close()
                raise

    def release():
        with suppress(sqlite3.Error):  # released already
            hold.execute("ROLLBACK")

    timer = threading.Timer(at_most, release)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        release()
        hold.close()


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_a_bulk_job_opens_on_its_runs_and_follows_the_job_live(browser, embedded_site,
                                                               viewport):
    """From /bulk/ a job opens on its page: who started it, from where, its progress and
    each run with its outcome, linked; it follows the job while it runs (rendered once by
    the server, then redrawn from pushes), in light and dark."""
    later = "2999-01-01T00:00:00Z"
    status, made = embedded_site.call("POST", "/api/runs/batch/", {"runs": [
        {"agent": "demo.steps", "start_after": later} for _ in range(120)]})
    assert status == 201, made
    runs = made["results"]
    tab = Tab(browser, embedded_site, viewport)
    try:
        page = tab.open("/bulk/")
        status, job = embedded_site.call("POST", "/api/bulk/", {
            "action": "cancel", "ids": [run["id"] for run in runs]})
        assert status == 201
        link = f'tr.job[data-job-id="{job["id"]}"] a[href="/bulk/{job["id"]}/"]'
        with writes_held(embedded_site):  # the job cannot finish before its page is drawn
            click_to(page, link, f'#bulk-job[data-job-id="{job["id"]}"]')
            # Drawn while the job still runs: the rest comes from pushes.
            assert page.get_attribute("#bulk-progress .bulk-job", "data-state") != "done"
            assert page.locator("#bulk-items tr.item[data-outcome=pending]").count() > 0
        page.wait_for_selector('#live[data-status="live"]')
        page.wait_for_selector('#bulk-progress .bulk-job[data-state="done"]', timeout=30_000)
        page.wait_for_function(
            "() => document.querySelectorAll('#bulk-items tr.item[data-outcome=applied]')"
            ".length === 100")
        assert "via REST API" in page.text_content("#bulk-job")
        assert "120 chosen by id" in page.text_content('[data-field="selection"]')
        first = page.locator("#bulk-items tr.item a").first
        assert first.get_attribute("href").startswith("/runs/")
        page.click(".pager a:has-text('Next')")
        page.wait_for_function(
            "() => document.querySelectorAll('#bulk-items tr.item').length === 20")
        assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            assert serious_violations(page) == [], scheme
        assert tab.errors == []
    finally:
        tab.close()


# --- accessibility, both sizes, both schemes ----------------------------------------------

@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_pages_have_no_serious_accessibility_violations(browser, embedded_site, viewport,
                                                           scheme):
    start(embedded_site, "demo.fail", {"steps": 1})
    tab = Tab(browser, embedded_site, viewport, color_scheme=scheme)
    try:
        for path, ready in (("/", "tr.run"), ("/?status=failed&q=zz", "#empty"),
                            ("/overview/", ".uplot canvas"), ("/bulk/", "#live"),
                            ("/workers/", "tr.worker"), ("/no-such-page/", ".error-page")):
            page = tab.open(path, ready)
            assert serious_violations(page) == [], path
            assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
        assert [e for e in tab.errors if "404" not in e] == []
    finally:
        tab.close()


@pytest.mark.ignores_database_url  # the command starts an embedded site of its own
def test_the_screenshot_command_draws_the_pages_chosen_at_the_sizes_chosen(tmp_path):
    """`make screenshot` redraws the README's pictures; here into a temporary directory, and
    only the pages and sizes asked for: the run list at both sizes, and a bulk job."""
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "manage.py", "screenshot", "--output-dir", str(tmp_path),
         "--page", "list", "--page", "bulk", "--size", "1280x800", "--size", "390x844"],
        cwd=ROOT, env={**env, "SECRET_KEY": "screenshot-test"}, capture_output=True,
        text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    names = sorted(path.name for path in tmp_path.glob("*.png"))
    assert names == ["bulk-1280x800.png", "bulk-390x844.png",
                     "list-1280x800.png", "list-390x844.png"]
    for name, size in (("list-1280x800.png", (1280, 800)), ("bulk-390x844.png", (390, 844))):
        png = (tmp_path / name).read_bytes()
        assert png.startswith(b"\x89PNG") and struct.unpack(">II", png[16:24]) == size, name
        assert len(png) > 10_000, name
