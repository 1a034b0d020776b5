"""The operator page in a real browser (Debian's chromium driven by Playwright), against the
embedded site started as a separate process."""

import os
import re

import pytest

from runs.providers.stub import DEFAULT_CANNED
from tests.accessibility import serious_violations
from tests.conftest import BROWSER_DEADLINE_MS, CHROMIUM, click_to_confirm

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason="needs Debian's chromium (apt-get install chromium)")


def answer_dialogs(page):
    """Accept every native dialog (a cancel's confirm()), or dismiss them while
    ``page.accepting`` is False; ``page.dialogs`` keeps their messages."""
    page.dialogs, page.accepting = [], True

    def answer(dialog):
        page.dialogs.append(dialog.message)
        dialog.accept() if page.accepting else dialog.dismiss()
    page.on("dialog", answer)
    return page


def logged_in(browser, site, username="admin", password=None):
    page = answer_dialogs(browser.new_page(viewport={"width": 1280, "height": 800}))
    page.set_default_timeout(BROWSER_DEADLINE_MS)
    page.goto(f"{site.base}/")
    assert "/accounts/login/" in page.url  # anonymous visitors go to the login form
    page.fill('input[name="username"]', username)
    page.fill('input[name="password"]', password or site.admin_password)
    page.click('button[type="submit"]')
    page.wait_for_selector('#live[data-status="live"]')
    return page


@pytest.fixture
def operator_page(browser, embedded_site):
    page = logged_in(browser, embedded_site)
    yield page
    page.close()


def start_from_form(page, agent, input_json):
    # The page hooks of API.md, as an outside test would use them.
    page.select_option('[name="agent"]', agent)
    page.fill('[name="input"]', input_json)
    before = set(page.eval_on_selector_all("tr.run", "rows => rows.map(r => r.dataset.runId)"))
    page.click('[data-action="create"]')
    page.wait_for_function(
        "n => document.querySelectorAll('tr.run').length > n", arg=len(before))
    rows = page.eval_on_selector_all(
        "tr.run", "rows => rows.map(r => [r.dataset.runId, r.dataset.agent])")
    # Child runs appear too (demo.parent): the new run is the one of the agent asked for.
    (run_id,) = [i for i, name in rows if i not in before and name == agent]
    return f'tr.run[data-run-id="{run_id}"]'


def test_a_run_started_from_the_form_goes_live_to_completed(operator_page):
    row = start_from_form(operator_page, "demo.steps", '{"steps": 3, "step_seconds": 0.3}')
    operator_page.wait_for_selector(f'{row}[data-state="running"]')
    operator_page.wait_for_selector(f'{row}[data-end-cause="completed"]')
    assert operator_page.text_content(f'{row} [data-field="status"]') == "completed"


def test_cancel_shows_cancelled_without_a_reload(operator_page):
    row = start_from_form(operator_page, "demo.hang", "{}")
    operator_page.wait_for_selector(f'{row}[data-state="running"]')
    operator_page.evaluate("window.__same_page = true")
    click_to_confirm(operator_page, f'{row} [data-action="cancel"]')
    operator_page.wait_for_selector(f'{row}[data-end-cause="cancelled"]')
    assert operator_page.evaluate("window.__same_page") is True  # no reload happened
    assert not operator_page.is_visible(f'{row} [data-action="cancel"]')


def test_stop_asks_for_a_reason_and_shows_it(operator_page):
    row = start_from_form(operator_page, "demo.hang_tool", "{}")
    operator_page.wait_for_selector(f'{row}[data-state="running"]')
    operator_page.click(f'{row} [data-action="stop"]')
    operator_page.fill('[name="reason"]', "over the time box")
    operator_page.click('[data-action="confirm-stop"]')
    operator_page.wait_for_selector(f'{row}[data-end-cause="stopped"]')
    assert operator_page.text_content(f'{row} [data-field="reason"]') == "over the time box"


def test_pause_and_resume(operator_page):
    row = start_from_form(operator_page, "demo.steps", '{"steps": 4, "step_seconds": 0.4}')
    operator_page.wait_for_selector(f'{row}[data-state="running"]')
    operator_page.click(f'{row} [data-action="pause"]')
    operator_page.wait_for_selector(f'{row}[data-state="awaiting"]')
    operator_page.click(f'{row} [data-action="resume"]')
    operator_page.click('[data-action="confirm-resume"]')
    operator_page.wait_for_selector(f'{row}[data-end-cause="completed"]', timeout=15_000)
    assert operator_page.text_content(f'{row} [data-field="generation"]') == "2"


# The control buttons a row shows, as the user sees them (a CSS rule may not unhide them).
SHOWN = """row => [...document.querySelector(row).querySelectorAll('button[data-action]')]
    .filter(button => button.checkVisibility()).map(button => button.dataset.action).join(' ')"""


def test_a_rows_buttons_follow_the_pushed_actions(operator_page, embedded_site):
    status, run = embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.steps", "input": {"steps": 40, "step_seconds": 0.3}})
    assert status == 201
    row = f'tr.run[data-run-id="{run["id"]}"]'
    operator_page.wait_for_selector(f'{row}[data-state="running"]')
    assert operator_page.evaluate(SHOWN, row) == "pause cancel stop"
    status, _ = embedded_site.call("POST", f"/api/runs/{run['id']}/pause/?wait=5")
    assert status == 200
    operator_page.wait_for_selector(f'{row}[data-state="awaiting"]')
    assert operator_page.evaluate(SHOWN, row) == "resume cancel stop"
    assert operator_page.get_attribute(row, "data-actions") == "resume cancel stop"
    embedded_site.call("POST", f"/api/runs/{run['id']}/cancel/")
    operator_page.wait_for_selector(f'{row}[data-end-cause="cancelled"]')
    assert operator_page.evaluate(SHOWN, row) == ""
    assert operator_page.get_attribute(row, "data-actions") == ""


def test_a_runs_page_shows_its_timeline_live(operator_page, embedded_site):
    row = start_from_form(operator_page, "demo.parent",
                          '{"children": 2, "child_agent": "demo.hang"}')
    run_id = operator_page.get_attribute(row, "data-run-id")
    operator_page.goto(f"{embedded_site.base}/runs/{run_id}/")
    operator_page.wait_for_selector('.tree li .badge[data-state="running"]')
    click_to_confirm(operator_page, f'tr.run[data-run-id="{run_id}"] [data-action="cancel"]')
    operator_page.wait_for_selector('.timeline li[data-kind="ended"]')
    operator_page.wait_for_function(
        "() => [...document.querySelectorAll('.tree li .badge')]"
        ".every(b => b.dataset.endCause === 'cancelled')")
    assert operator_page.is_visible("text=Control requests")


def test_stop_on_a_runs_page_asks_for_a_reason(operator_page, embedded_site):
    _, run = embedded_site.call("POST", "/api/runs/", {"agent": "demo.hang"})
    operator_page.goto(f"{embedded_site.base}/runs/{run['id']}/")
    row = f'tr.run[data-run-id="{run["id"]}"]'
    operator_page.wait_for_selector(f'{row}[data-state="running"]')
    operator_page.click(f'{row} [data-action="stop"]')
    operator_page.fill('[name="reason"]', "seen enough")
    operator_page.click('[data-action="confirm-stop"]')
    operator_page.wait_for_selector(f'{row}[data-end-cause="stopped"]')
    assert operator_page.text_content(f'{row} [data-field="reason"]') == "seen enough"


def test_a_runs_page_streams_the_answer_and_drops_it_on_cancel(operator_page, embedded_site):
    _, run = embedded_site.call("POST", "/api/runs/", {"agent": "demo.chat", "input": {
        "prompt": "Tell me more", "model": "canned+words=400"}})  # the stub: 16 s of text
    operator_page.goto(f"{embedded_site.base}/runs/{run['id']}/")
    operator_page.wait_for_selector("#live-output:not([hidden])")
    shown = operator_page.text_content("#live-output pre")
    words = DEFAULT_CANNED.split()
    streamed = " ".join(words[i % len(words)] for i in range(400))
    assert shown and shown.removeprefix("… ") in streamed  # "… ": joined mid-stream
    operator_page.wait_for_function(  # it grows as the stream goes on, in one piece
        "n => document.querySelector('#live-output pre').textContent.length > n + 40",
        arg=len(shown))
    assert operator_page.text_content("#live-output pre").removeprefix("… ") in streamed
    click_to_confirm(operator_page, f'tr.run[data-run-id="{run["id"]}"] [data-action="cancel"]')
    operator_page.wait_for_selector('.timeline li[data-kind="ended"]')
    operator_page.wait_for_selector("#live-output", state="hidden")
    assert operator_page.text_content("#live-output pre") == ""
    assert operator_page.query_selector('.timeline li[data-kind="step"]') is None


def test_a_runs_page_shows_each_steps_committed_answer(operator_page, embedded_site):
    _, run = embedded_site.call("POST", "/api/runs/", {"agent": "demo.chat", "input": {
        "prompts": ["Hello!"]}})
    operator_page.goto(f"{embedded_site.base}/runs/{run['id']}/")
    operator_page.wait_for_selector('.timeline li[data-kind="ended"]')
    assert operator_page.text_content('.timeline li[data-kind="step"] .message') == (
        "Hello! I am the provider stub of awaken-site, answering offline.")
    assert operator_page.is_hidden("#live-output")


def test_a_viewer_sees_no_controls(browser, embedded_site):
    # A running run, which shows an operator pause, cancel and stop.
    _, run = embedded_site.call("POST", "/api/runs/", {"agent": "demo.hang"})
    embedded_site.add_user("vera", "vera-password-1", "viewer")
    page = logged_in(browser, embedded_site, "vera", "vera-password-1")
    page.wait_for_selector(f'tr.run[data-run-id="{run["id"]}"][data-state="running"]')
    # No control: "Load more" (a long session's list) reads, and is not one.
    assert page.query_selector_all('[data-action]:not([data-action="more"])') == []
    assert page.query_selector("#new-run") is None
    page.close()
    embedded_site.call("POST", f"/api/runs/{run['id']}/cancel/")


def test_an_unauthenticated_socket_is_refused(browser, embedded_site):
    page = browser.new_page()
    page.goto(f"{embedded_site.base}/accounts/login/")
    outcome = page.evaluate("""() => new Promise(resolve => {
        const socket = new WebSocket(location.origin.replace('http', 'ws') + '/ws/runs/');
        socket.onopen = () => resolve('open');
        socket.onclose = () => resolve('refused');
    })""")
    assert outcome == "refused"
    page.close()


def test_login_rejects_a_wrong_password(browser, embedded_site):
    page = browser.new_page()
    page.goto(f"{embedded_site.base}/accounts/login/")
    page.fill('input[name="username"]', "admin")
    page.fill('input[name="password"]', "wrong")
    page.click('button[type="submit"]')
    assert re.search("didn't match", page.content())
    page.close()


def test_no_page_breaks_the_content_security_policy(browser, embedded_site):
    """Every page, logged in as a staff operator: no CSP violation and no script error, and
    each page does its work (its scripts ran)."""
    _, run = embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.parent", "input": {"children": 1, "child_agent": "demo.hang"}})
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.set_default_timeout(BROWSER_DEADLINE_MS)
    problems = []
    page.on("console", lambda message: problems.append(message.text)
            if "Content Security Policy" in message.text else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    shown = {
        "/accounts/login/": 'input[name="username"]',
        "/": '#live[data-status="live"]',
        f"/runs/{run['id']}/": '.tree li[data-depth="0"] .badge',
        "/admin/": "#site-name",
        f"/admin/runs/run/{run['id']}/change/": "#run_form",
        "/admin/auth/user/": "#changelist-form",
        "/api/docs/": ".swagger-ui .info .title",
    }
    for path, selector in shown.items():
        if path != "/accounts/login/" and "/accounts/login/" in page.url:
            page.fill('input[name="username"]', "admin")
            page.fill('input[name="password"]', embedded_site.admin_password)
            page.click('button[type="submit"]')
        response = page.goto(f"{embedded_site.base}{path}")
        assert "script-src 'self'" in response.headers["content-security-policy"], path
        page.wait_for_selector(selector, state="attached")
        page.wait_for_load_state("networkidle")
        assert problems == [], (path, problems)
    # The admin's page that shows a new API key once, reached through its action.
    embedded_site.add_user("keyholder", "keyholder-password-1", "viewer")
    page.goto(f"{embedded_site.base}/admin/auth/user/")
    page.check('tr:has(th a:text-is("keyholder")) input.action-select')
    page.select_option('select[name="action"]', "make_api_keys")
    page.click('button[name="index"]')
    key = page.text_content("code.api-key")
    assert embedded_site.call("GET", "/api/runs/", token=key)[0] == 200
    assert problems == [], ("the new key's page", problems)
    # The listener sees a violation when there is one: an injected inline script is refused.
    with page.expect_console_message(
            lambda message: "Content Security Policy" in message.text) as refused:
        page.evaluate("""() => { const s = document.createElement('script');
            s.textContent = 'window.__inline_ran = true'; document.body.append(s); }""")
    assert "inline script" in refused.value.text and problems
    assert page.evaluate("window.__inline_ran") is None
    page.close()


def test_the_operator_page_has_no_serious_accessibility_violations(operator_page):
    assert serious_violations(operator_page) == []
