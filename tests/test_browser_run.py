"""A run's page in a real browser (Debian's chromium, Playwright) against the embedded site:
its dialogs and controls, the activity log, approvals and typed input, review links,
failures and Run again; the admin's run page and the API docs for a visitor not logged in.
Each page is scanned with axe-core, and no page may log a script error."""

import re

import pytest

from harness.processes import EmbeddedSite, wait_until
from harness.watching import Watcher
from tests.accessibility import serious_violations
from tests.conftest import CHROMIUM, box_of, click_to, click_to_confirm
from tests.test_browser import logged_in

pytestmark = [pytest.mark.sites_stream,
              pytest.mark.skipif(not __import__("os").path.exists(CHROMIUM),
                                 reason="needs Debian's chromium")]

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def page(browser, embedded_site):  # noqa: F811
    page = logged_in(browser, embedded_site)
    page.errors = []
    page.on("console", lambda message: page.errors.append(message.text)
            if message.type == "error" and "favicon" not in message.text else None)
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    yield page
    assert page.errors == []
    page.close()


def open_run(page, site, agent, input=None):
    status, run = site.call("POST", "/api/runs/", {"agent": agent, "input": input or {}})
    assert status == 201
    page.goto(f"{site.base}{run['url']}")
    page.wait_for_selector('#live[data-status="live"]')
    return run["id"], f'tr.run[data-run-id="{run["id"]}"]'


def test_the_resume_dialog_on_a_runs_page_resumes_it(page, embedded_site):
    run_id, row = open_run(page, embedded_site, "demo.steps", {"steps": 30, "step_seconds": 0.2})
    page.wait_for_selector(f'{row}[data-state="running"]')
    assert embedded_site.call("POST", f"/api/runs/{run_id}/pause/?wait=5")[0] == 200
    page.wait_for_selector(f'{row}[data-state="awaiting"] [data-action="resume"]:not([disabled])')
    click_to(page, f'{row} [data-action="resume"]', "#resume-dialog[open]")
    # The dialog asks the server for the ticket as it stands, then says why it is open.
    page.wait_for_selector('[data-field="resume-why"]:has-text("Paused by an operator")')
    page.click('[data-action="confirm-resume"]')
    page.wait_for_selector(f'{row}[data-state="running"]')
    assert not page.is_visible("#resume-dialog")
    assert serious_violations(page) == []


def test_a_pause_that_waits_for_its_step_says_so(page, embedded_site):
    # Steps long enough that the request is still pending while a loaded machine draws it.
    run_id, row = open_run(page, embedded_site, "demo.steps", {"steps": 3, "step_seconds": 12})
    page.wait_for_selector(f'{row}[data-state="running"]')
    page.click(f'{row} [data-action="pause"]')
    page.wait_for_selector("#toast:has-text('takes effect when the current step ends')")
    button = f'{row}[data-pending="pause"] [data-action="pause"]'
    page.wait_for_selector(f"{button}:disabled:text-is('Pause')")
    page.wait_for_selector(f'{row} [data-field="pending"]:has-text("Pause requested")')
    # The request is on record at once: in the activity log and under control requests.
    page.wait_for_selector('.activity-log li[data-kind="control"]:has-text("pause requested")')
    page.wait_for_selector('tr[data-action-kind="pause"]:has-text("admin")')
    page.wait_for_selector(
        '.timeline li[data-kind="pause_requested"]:has-text("by admin via Browser")')
    page.wait_for_selector(f'{row}[data-state="awaiting"]', timeout=30_000)
    # Taken at the step's end, in the operator's name and from where they asked.
    page.wait_for_selector('.timeline li[data-kind="paused"]:has-text("by admin via Browser")')
    assert "pending" not in page.text_content('tr[data-action-kind="pause"]')


def test_times_are_in_the_readers_zone_with_the_full_date_on_hover(browser, embedded_site):  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 800},
                                  timezone_id="Asia/Tokyo")
    page = context.new_page()
    page.goto(f"{embedded_site.base}/accounts/login/")
    page.fill('input[name="username"]', "admin")
    page.fill('input[name="password"]', embedded_site.admin_password)
    page.click('button[type="submit"]')
    page.wait_for_selector('#live[data-status="live"]')
    _, run = embedded_site.call("POST", "/api/runs/", {"agent": "demo.fail"})
    page.goto(f"{embedded_site.base}{run['url']}")
    page.wait_for_selector('.timeline li[data-kind="ended"]')
    assert "Asia/Tokyo (UTC+09:00)" in page.text_content('[data-field="zone"]')
    stamp = page.locator(".timeline time").first
    utc = stamp.get_attribute("datetime")
    hours, minutes = int(utc[11:13]), int(utc[14:16])
    local = (hours * 60 + minutes + 540) % 1440
    assert stamp.text_content().startswith(f"{local // 60:02d}:{local % 60:02d}")
    assert "GMT+9" in stamp.get_attribute("title")
    assert re.search(r"ago|now", page.text_content('.now time[data-relative]'))
    context.close()


def test_running_time_goes_on_while_the_run_runs(page, embedded_site):
    _, row = open_run(page, embedded_site, "demo.hang")
    page.wait_for_selector('[data-ticker="elapsed"]')
    first = page.text_content('.now [data-ticker="elapsed"]')
    page.wait_for_function(
        "t => document.querySelector('.now [data-ticker=\"elapsed\"]').textContent !== t",
        arg=first)
    assert page.text_content('.now [data-ticker="elapsed"]') != "0.00 s"
    page.click(f'{row} [data-action="stop"]')
    page.fill('[name="reason"]', "done looking")
    page.click('[data-action="confirm-stop"]')
    page.wait_for_selector(f'{row}[data-end-cause="stopped"]')


def test_input_and_output_are_shown_as_json_and_the_prompt_as_fields(page, embedded_site):
    run_id, row = open_run(page, embedded_site, "demo.approval", {"steps_before": 1})
    page.wait_for_selector(f'{row}[data-state="awaiting"]')
    page.wait_for_selector(".ask dl.prompt-fields")
    assert page.text_content(".ask dl.prompt-fields dt") == "question"
    assert page.text_content(".ask dl.prompt-fields dd") == "Continue?"
    assert '"steps_before": 1' in page.text_content(".io pre.json")
    assert "{'" not in page.text_content("#panel")
    page.click('[data-run-action="approve"]')
    page.wait_for_selector(f'{row}[data-end-cause="completed"]')
    page.wait_for_selector('.io h3:text-is("Output") + pre.json')
    assert '"approved": true' in page.text_content('.io h3:text-is("Output") + pre.json')


def test_reject_answers_an_approval_no(page, embedded_site):
    _, row = open_run(page, embedded_site, "demo.approval", {"steps_before": 1})
    page.wait_for_selector(f'{row}[data-state="awaiting"]')
    page.accepting = False  # a dismissed confirm rejects nothing
    click_to_confirm(page, '[data-run-action="reject"]')
    assert page.dialogs[-1].startswith("Reject the request of run")
    assert page.get_attribute(row, "data-state") == "awaiting"
    page.accepting = True
    click_to_confirm(page, '[data-run-action="reject"]')
    page.wait_for_selector(f'{row}[data-end-cause="failed"]')
    assert "not approved" in page.text_content(".failure .error-text")


@pytest.mark.parametrize("size", [PHONE, {"width": 1280, "height": 800}])
def test_the_run_page_and_its_dialogs_fit_the_screen(page, embedded_site, size):
    page.set_viewport_size(size)
    _, row = open_run(page, embedded_site, "demo.hang")
    page.wait_for_selector(f'{row}[data-state="running"]')
    assert page.evaluate("document.documentElement.scrollWidth") <= size["width"]
    heights = page.evaluate("""row => Object.fromEntries([...document.querySelectorAll(
        row + ' button[data-action]')].filter(b => b.checkVisibility()).map(
        b => [b.dataset.action, b.getBoundingClientRect().height]))""", row)
    assert set(heights) == {"pause", "cancel", "stop"}
    assert min(heights.values()) >= (44 if size is PHONE else 28), heights
    page.click(f'{row} [data-action="stop"]')
    box = page.locator("#stop-dialog").bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= size["width"]
    assert box["y"] >= 0 and box["y"] + box["height"] <= size["height"]
    confirm = page.locator('[data-action="confirm-stop"]').bounding_box()
    assert confirm["x"] + confirm["width"] <= size["width"]
    assert serious_violations(page) == []
    page.fill('[name="reason"]', "layout checked")
    page.click('[data-action="confirm-stop"]')
    page.wait_for_selector(f'{row}[data-end-cause="stopped"]')


def test_cancel_is_sent_at_once_after_a_confirm_and_a_dismissed_one_sends_nothing(
        page, embedded_site):
    run_id, row = open_run(page, embedded_site, "demo.hang")
    page.wait_for_selector(f'{row}[data-state="running"]')
    sent = []
    page.on("request", lambda r: sent.append(r.url) if "/cancel/" in r.url else None)
    page.accepting = False
    click_to_confirm(page, f'{row} [data-action="cancel"]')
    assert "cannot be undone" in page.dialogs[-1]
    status, run = embedded_site.call("GET", f"/api/runs/{run_id}/")
    assert (sent, run["state"], run["control"]) == ([], "running", None)
    page.accepting = True
    # The confirm's click itself sends the cancel: no undo window, no delay on the page.
    with page.expect_request(lambda request: "/cancel/" in request.url):
        click_to_confirm(page, f'{row} [data-action="cancel"]')
    page.wait_for_selector(f'{row}[data-end-cause="cancelled"]')  # demo.hang never ends alone
    assert len(sent) == 1 and not page.is_visible(".toast.notice")  # no undo, no delay
    assert embedded_site.call("GET", f"/api/runs/{run_id}/")[1]["end_cause"] == "cancelled"
    page.wait_for_selector("#toast:has-text('is cancelled')")


def test_a_stop_dialog_open_when_the_run_ends_by_itself_says_nothing_was_stopped(
        page, embedded_site):
    # The run waits for an approval, so it ends only when the test answers, after the
    # dialog is open: its own last steps then complete it, however slow the machine.
    run_id, row = open_run(page, embedded_site, "demo.approval",
                           {"steps_before": 0, "steps_after": 1, "step_seconds": 0.05})
    page.wait_for_selector(f'{row}[data-state="awaiting"]')
    page.click(f'{row} [data-action="stop"]')
    page.fill('[name="reason"]', "too slow")
    ticket = embedded_site.call("GET", f"/api/runs/{run_id}/")[1]["ticket"]["id"]
    assert embedded_site.call("POST", f"/api/runs/{run_id}/resume/",
                              {"ticket": ticket, "input": {"approved": True}})[0] == 200
    page.wait_for_selector(f'{row}[data-end-cause="completed"]')
    page.wait_for_selector("#stop-dialog[open] [data-field='dialog-error']:has-text("
                           "'had already completed; nothing was stopped')")
    assert not page.is_visible('[data-action="confirm-stop"]')
    assert page.text_content('#stop-dialog button[value="cancel"]') == "Close"
    assert embedded_site.call("GET", f"/api/runs/{run_id}/")[1]["control"] is None
    page.click('#stop-dialog button[value="cancel"]')
    # A request answered by a run that had ended says the same, whichever request it was.
    said = page.evaluate("""async id => {
        const { alreadyEnded } = await import("/static/runs/controls.js");
        const run = { id, state: "ended", end_cause: "completed" };
        return [alreadyEnded(run, "stop"), alreadyEnded(run, "cancel"),
                alreadyEnded({ ...run, end_cause: "cancelled" }, "cancel")];
    }""", run_id)
    short = run_id[:8]
    assert said == [f"Run {short} had already completed; nothing was stopped.",
                    f"Run {short} had already completed; nothing was cancelled.", None]


def test_the_activity_log_grows_live_with_steps_calls_and_log_lines(page, embedded_site):
    _, row = open_run(page, embedded_site, "demo.steps", {"steps": 4, "step_seconds": 0.5})
    page.wait_for_selector('.activity-log li[data-kind="step"]')
    page.wait_for_selector('.activity-log li[data-kind="log"]:has-text("thinking about step")')
    model = page.locator('.activity-log li[data-kind="model"]').first
    assert re.search(r"\d+ ms · 100\stokens", model.text_content())  # kept on one line
    page.wait_for_selector('.now [data-field="progress"]:has-text("of 4")')
    page.wait_for_selector(f'{row}[data-end-cause="completed"]')
    page.wait_for_function("() => document.querySelectorAll"
                           "('.activity-log li[data-kind=\"step\"]').length === 4")
    seqs = page.eval_on_selector_all(".activity-log li[data-seq]",
                                     "items => items.map(i => Number(i.dataset.seq))")
    assert seqs == sorted(set(seqs))  # each entry once, in order
    page.wait_for_function(  # the count is the server's, and follows the log
        "() => document.querySelector('[data-field=\"activity-count\"]').textContent"
        " === `${document.querySelectorAll('.activity-log li[data-seq]').length} entries`")
    assert serious_violations(page) == []


def test_typed_input_is_a_form_made_from_the_agents_schema(page, embedded_site):
    run_id, row = open_run(page, embedded_site, "demo.ask")
    page.wait_for_selector(f'{row}[data-state="awaiting"]')
    page.click('[data-run-action="answer"]')
    page.wait_for_selector('#resume-dialog [data-field="schema-form"]:not([hidden])')
    page.select_option('[name="schema:colour"]', '"green"')
    page.fill('[name="schema:count"]', "0")
    page.click('[data-action="confirm-resume"]')  # the browser refuses 0 (minimum 1)
    assert page.is_visible("#resume-dialog")
    page.fill('[name="schema:count"]', "3")
    page.check('[name="schema:urgent"]')
    assert serious_violations(page) == []
    page.click('[data-action="confirm-resume"]')
    page.wait_for_selector(f'{row}[data-end-cause="completed"]')
    output = embedded_site.call("GET", f"/api/runs/{run_id}/")[1]["output"]
    assert output == {"ordered": {"colour": "green", "count": 3, "urgent": True}}


def test_a_review_link_lets_a_reviewer_without_an_account_answer(page, browser, embedded_site):  # noqa: F811
    run_id, row = open_run(page, embedded_site, "demo.approval", {"steps_before": 1})
    page.wait_for_selector(f'{row}[data-state="awaiting"]')
    url = page.locator('[data-field="new-link-url"]')
    page.click('[data-run-action="make-link"]')  # a first link, withdrawn at once
    page.wait_for_function("() => document.querySelector('[data-field=\"new-link-url\"]')"
                           "?.value.includes('/review/')")
    revoked = url.input_value()
    page.click('.review-links li[data-link-state="open"] [data-run-action="revoke-link"]')
    page.wait_for_selector('.review-links li[data-link-state="revoked"]')
    page.click('[data-run-action="make-link"]')  # the one to send
    page.wait_for_function("old => document.querySelector('[data-field=\"new-link-url\"]')"
                           ".value !== old", arg=revoked)
    link = url.input_value()
    page.wait_for_selector('.review-links li[data-link-state="open"]')

    reviewer = browser.new_context(viewport=PHONE)
    review = reviewer.new_page()
    errors = []
    review.on("pageerror", lambda error: errors.append(str(error)))
    response = review.goto(revoked)
    assert response.status == 410 and "withdrawn" in review.text_content(".review-page")
    assert review.locator("form").count() == 0
    review.goto(link)
    # The prompt as fields a person reads, not JSON.
    assert review.text_content(".review-page dl.prompt-fields dd") == "Continue?"
    assert "{" not in review.text_content('[data-field="review-prompt"]')
    assert run_id not in review.content()  # nothing beyond the prompt
    assert review.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert serious_violations(review) == []
    review.fill('[name="name"]', "Rita Reviewer")
    review.click('button[value="approve"]')
    review.wait_for_selector("#review-done:not([hidden])")
    assert errors == []
    reviewer.close()
    page.wait_for_selector(f'{row}[data-end-cause="completed"]')
    page.wait_for_selector('.timeline li[data-kind="resumed"]'
                           ':has-text("by Rita Reviewer via Review link")')


def test_a_long_runs_page_shows_its_numbers_whole_on_a_phone_too(page, embedded_site):
    """A hundred and more timeline entries, figures of five digits, and a phone's width:
    the timeline's numbers are not clipped, the activity rows show their "gen 1", and the
    attempts table shows its Duration without a sideways scroll."""
    run_id, row = open_run(page, embedded_site, "demo.steps",
                           {"steps": 110, "step_seconds": 0.001, "tokens_per_step": 12345})
    page.wait_for_selector(f'{row}[data-end-cause="completed"]', timeout=60_000)
    page.reload()
    page.wait_for_selector('#live[data-status="live"]')
    for viewport in ({"width": 1280, "height": 800}, PHONE):
        page.set_viewport_size(viewport)
        room, needed, count = page.evaluate("""() => {
            const list = document.querySelector('.timeline');
            const items = list.querySelectorAll(':scope > li');
            const marker = getComputedStyle(items[0], '::marker');
            const pen = document.createElement('canvas').getContext('2d');
            pen.font = `${marker.fontSize} ${marker.fontFamily}`;
            return [parseFloat(getComputedStyle(list).paddingLeft),
                    pen.measureText(`${items.length}. `).width, items.length];
        }""")
        assert count >= 100 and needed <= room, (viewport, count, needed, room)
        clipped = page.evaluate("""() => [...document.querySelectorAll(
            '.activity-log li:not(.empty) .figures')].filter(node => {
              const box = node.getBoundingClientRect();
              const log = node.closest('.activity-log').getBoundingClientRect();
              return node.scrollWidth > node.clientWidth + 1 || box.right > log.right + 1;
            }).map(node => node.textContent)""")
        assert clipped == [], viewport
        assert "gen\u00a01" in page.text_content(".activity-log li[data-kind='step'] .figures")
        if viewport == PHONE:  # the header: its name on one line, the rest on the next
            tops = page.evaluate("""() => [...document.querySelectorAll('.run-head > *')]
                .filter(n => n.checkVisibility()).map(n => [n.tagName,
                  Math.round(n.getBoundingClientRect().top),
                  Math.round(n.getBoundingClientRect().bottom)])""")
            below = [(top + bottom) / 2 for tag, top, bottom in tops if tag != "H1"]
            assert tops[0][0] == "H1" and min(t for tag, t, _ in tops if tag != "H1") >= (
                tops[0][2]), tops
            assert max(below) - min(below) <= 4, tops  # on one line, centred alike
        table = page.evaluate("""() => { const box = document.querySelector('table.attempts')
            .closest('.scroll'); return [box.scrollWidth, box.clientWidth]; }""")
        assert table[0] <= table[1], (viewport, table)
        assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]


def test_the_activity_log_follows_new_entries_after_a_server_restart(browser, tmp_path):
    """The page is reconnected after the restart; the panel's refresh and the entries
    missed come at once, and the log still keeps to its newest entry."""
    with EmbeddedSite(tmp_path, extra_env={"AWAKEN_LEASE_SECONDS": "3"}) as site:
        site.wait_ready(60)
        status, run = site.call("POST", "/api/runs/", {"agent": "demo.steps", "input": {
            "steps": 2000, "step_seconds": 0.05}})
        assert status == 201
        page = logged_in(browser, site)
        try:
            page.goto(f"{site.base}{run['url']}")
            page.wait_for_selector('#live[data-status="live"]')
            at_end = """n => { const log = document.querySelector('.activity-log');
                const last = Number(log.lastElementChild?.dataset.seq || 0);
                return last > n && log.scrollHeight > log.clientHeight
                  && log.scrollTop + log.clientHeight >= log.scrollHeight - 8; }"""
            page.wait_for_function(at_end, arg=40, timeout=30_000)
            before = page.evaluate(
                "() => Number(document.querySelector('.activity-log').lastElementChild"
                ".dataset.seq)")
            site.restart().wait_ready(60)
            # Entries written after the restart arrive, and the log is at its end.
            page.wait_for_function(at_end, arg=before + 60, timeout=45_000)
        finally:
            page.close()


def test_a_review_form_preselects_no_value_of_a_required_choice(browser, embedded_site):
    status, run = embedded_site.call("POST", "/api/runs/", {"agent": "demo.ask", "input": {}})
    assert status == 201
    wait_until(lambda: embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]["state"]
               == "awaiting", 30, "the run to ask")
    status, link = embedded_site.call("POST", f"/api/runs/{run['id']}/review-links/", {})
    assert status == 201
    reviewer = browser.new_context(viewport=PHONE)
    try:
        review = reviewer.new_page()
        review.goto(link["url"] if link["url"].startswith("http")
                    else f"{embedded_site.base}{link['url']}")
        colour = '[name="schema:colour"]'
        review.wait_for_selector(colour)
        assert review.input_value(colour) == ""  # not "red", the first of the enum
        assert review.eval_on_selector(colour, "s => s.selectedOptions[0].textContent") == (
            "choose…")
        assert review.text_content("dl.prompt-fields dd") == "Which colour, and how many?"
        review.fill('[name="name"]', "Rita Reviewer")
        review.fill('[name="schema:count"]', "2")
        review.click('button[value="answer"]')
        assert review.eval_on_selector(colour, "s => s.validity.valueMissing")
        assert review.is_hidden("#review-done")
        review.select_option(colour, label="green")
        review.click('button[value="answer"]')
        review.wait_for_selector("#review-done:not([hidden])")
    finally:
        reviewer.close()
    def answered():
        output = embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]["output"] or {}
        return output.get("ordered")

    ordered = wait_until(answered, 30, "the answer")
    assert (ordered["colour"], ordered["count"]) == ("green", 2)


def test_a_failure_shows_its_traceback_and_runs_again(page, embedded_site):
    run_id, row = open_run(page, embedded_site, "demo.fail", {"steps": 1})
    page.wait_for_selector(f'{row}[data-end-cause="failed"]')
    page.wait_for_selector(".failure .traceback")
    assert "RuntimeError: demo.fail raised after 1 step(s)" in page.text_content(".failure")
    assert "Traceback (most recent call last)" in page.text_content(".failure .traceback")
    # The error box takes the width of the failure box, not a table cell's.
    widths = page.evaluate("""() => [document.querySelector('.failure .error-text'),
        document.querySelector('.failure')].map(n => n.getBoundingClientRect().width)""")
    assert widths[0] >= widths[1] - 40, widths
    page.wait_for_selector('.activity-log li[data-kind="error"]')
    assert serious_violations(page) == []
    page.click('[data-run-action="rerun"]')
    page.wait_for_url(re.compile(r"/runs/(?!" + run_id + r")[0-9a-f-]{36}/$"))
    page.wait_for_selector(f'.now a[href="/runs/{run_id}/"]')  # "Runs again" the old one
    page.goto(f"{embedded_site.base}/runs/{run_id}/")
    assert page.locator('.now dt:text-is("Run again as") + dd a').count() == 1


def test_the_admin_run_page_lists_recent_events_and_links_to_the_operator_page(
        page, embedded_site):
    _, run = embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.steps", "input": {"steps": 30, "step_seconds": 0.01}})
    run_id = run["id"]
    state = wait_until(lambda: (lambda found: found if found["state"] == "ended" else None)(
        embedded_site.call("GET", f"/api/runs/{run_id}/")[1]), timeout=20, what="the run's end")
    page.goto(f"{embedded_site.base}/admin/runs/run/{run_id}/change/")
    seqs = [int(text) for text in page.locator(
        "#events-group tbody td.field-seq").all_text_contents()]
    assert len(seqs) == 10 and seqs == sorted(seqs, reverse=True), seqs
    page.click(f'a[href="/runs/{run_id}/"]')
    page.wait_for_selector(f'tr.run[data-run-id="{run_id}"]')
    page.click('a:text-is("Open in admin")')
    page.wait_for_url(re.compile(f"/admin/runs/run/{run_id}/change/"))
    page.click(f'a[href*="run__id__exact={run_id}"]')
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == state["version"]


def test_the_api_docs_ask_a_visitor_to_log_in(browser, embedded_site):  # noqa: F811
    page = browser.new_page()
    response = page.goto(f"{embedded_site.base}/api/docs/")
    assert response.status == 401
    page.click('a:text-is("Log in")')
    page.fill('input[name="username"]', "admin")
    page.fill('input[name="password"]', embedded_site.admin_password)
    page.click('button[type="submit"]')
    page.wait_for_selector(".swagger-ui .info .title")
    assert page.url.endswith("/api/docs/")
    page.close()


def test_a_pause_waiting_on_a_hung_step_shows_from_server_state_until_cancel_ends_it(
        page, embedded_site):
    _, hung = embedded_site.call("POST", "/api/runs/", {"agent": "demo.hang", "input": {}})
    row = f'tr.run[data-run-id="{hung["id"]}"]'
    page.wait_for_selector(f'{row}[data-state="running"]')
    labels = page.eval_on_selector_all(f"{row} button[data-action]",
                                       "bs => bs.map(b => b.textContent)")
    page.click(f'{row} [data-action="pause"]')
    page.wait_for_selector("#toast:has-text('takes effect when the current step ends')")
    page.wait_for_selector(f'{row}[data-pending="pause"] [data-action="pause"]:disabled')
    page.reload()  # from server state: the list keeps it
    page.wait_for_selector('#live[data-status="live"]')
    page.wait_for_selector(f'{row}[data-pending="pause"]')
    note = page.locator(f'{row} [data-field="pending"]')
    page.wait_for_function("n => /running for \\d/.test(n.textContent)",
                           arg=note.element_handle())
    assert "Cancel or Stop ends the run now" in note.text_content()
    assert page.is_disabled(f'{row} [data-action="pause"]')
    assert page.eval_on_selector_all(f"{row} button[data-action]",
                                     "bs => bs.map(b => b.textContent)") == labels
    click_to_confirm(page, f'{row} [data-action="cancel"]')
    # demo.hang's step never ends by itself: the cancel ended it, not the step's end.
    page.wait_for_selector(f'{row}[data-end-cause="cancelled"][data-pending=""]')


HOSTILE_SCHEMA = {"type": "object", "required": ["__proto__", "note"], "properties": {
    "__proto__": {"type": "string", "title": "Proto"},
    "note": {"type": "string", "maxLength": 2147483648, "title": "Note"},
    "count": {"type": "integer", "maximum": 1e308, "default": 2}}}


def test_an_agents_schema_cannot_break_the_review_form(browser, embedded_site):  # noqa: F811
    _, run = embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.ask", "input": {"schema": HOSTILE_SCHEMA}})
    wait_until(lambda: embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]["state"] ==
               "awaiting", 10, "the run to ask")
    link = embedded_site.call("POST", f"/api/runs/{run['id']}/review-links/", {})[1]["url"]
    reviewer = browser.new_context()
    review = reviewer.new_page()
    errors, requests = [], []
    review.on("pageerror", lambda error: errors.append(str(error)))
    review.on("request", lambda request: requests.append((request.method, request.url)))
    review.goto(link)
    review.fill('[name="name"]', "Rita")
    review.fill('[name="schema:__proto__"]', "first")
    review.fill('[name="schema:note"]', "second")
    review.click('button[value="answer"]')
    review.wait_for_selector("#review-done:not([hidden])")
    assert errors == []
    assert not [url for method, url in requests if "Rita" in url]  # never in a URL
    reviewer.close()
    done = wait_until(lambda: (lambda r: r if r["state"] == "ended" else None)(
        embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]), 10, "the run to end")
    assert done["output"] == {"ordered": {"__proto__": "first", "note": "second", "count": 2}}


def test_a_message_from_the_runs_page_steers_the_agent_with_a_receipt(page, embedded_site):
    run_id, row = open_run(page, embedded_site, "demo.inbox")
    page.wait_for_selector(f'{row}[data-state="running"]')
    page.fill("#steer-message", '{"n": 1}')
    page.click('[data-action="send-message"]')
    page.wait_for_selector('[data-field="steer-receipt"]:has-text("Delivered to attempt 1")')

    def step_by_admin():
        events = embedded_site.call("GET", f"/api/runs/{run_id}/events/")[1]["results"]
        return [(e["actor"], e["source"]) for e in events if e["kind"] == "step"]
    wait_until(lambda: step_by_admin() == [("admin", "ui")], 10, "the step naming admin")
    page.fill("#steer-message", "plain words")  # not JSON: sent as a string
    page.click('[data-action="send-message"]')
    page.wait_for_selector('[data-field="steer-receipt"]:has-text("Delivered")')
    page.fill("#steer-message", '{"done": true}')
    page.click('[data-action="send-message"]')
    page.wait_for_selector(f'{row}[data-end-cause="completed"]')
    output = embedded_site.call("GET", f"/api/runs/{run_id}/")[1]["output"]
    assert output == {"messages": [{"n": 1}, "plain words", {"done": True}]}
    # Each delivery is on the trace's axis where the attempt took it, with who sent it.
    delivered = '#trace .trace-row[data-kind="control"]:has-text("Message delivered")'
    page.wait_for_selector(f"{delivered} >> nth=2")
    assert page.locator(delivered).count() == 3
    assert "by admin via Browser" in page.locator(delivered).first.text_content()
    page.fill("#steer-message", '"too late"')
    page.click('[data-action="send-message"]')
    page.wait_for_selector('[data-field="steer-receipt"][data-outcome="refused"]'
                           ':has-text("the run is ended (completed)")')
    assert serious_violations(page) == []
    page.errors[:] = [e for e in page.errors if "409 (Conflict)" not in e]  # the refusal's


def panel_traffic(page, run_id: str) -> Watcher:
    """What a run's page asks the server for its panel, and the pushes of the run's tree
    its list socket received (``harness.watching``, as ``bench watch`` counts them)."""
    return Watcher(run_id, tree={run_id}).watch(page)


def panel_facts(page) -> dict:
    """What the panel shows of the run: its state and version, the timeline's events and
    live requests, and the child rows with their states."""
    return page.evaluate("""() => ({
      state: document.querySelector('[data-part="summary"]').dataset.state,
      version: document.querySelector('[data-part="summary"]').dataset.version,
      row: document.querySelector('[data-part="summary"] tr.run').dataset.state,
      timeline: [...document.querySelectorAll('[data-part="timeline"] ol.timeline > li')]
        .map((li) => li.dataset.seq || li.dataset.kind),
      hidden: document.querySelector('[data-part="events-hidden"]').textContent.trim(),
      children: [...document.querySelectorAll('[data-part="tree"] li')]
        .map((li) => [li.dataset.runId, li.querySelector('.badge').dataset.state]),
      output: document.querySelector('[data-part="io"]').textContent.includes('Output'),
    })""")


def settled_like_a_fresh_load(page, browser, site, run_id):
    """The page, once the run has ended and its fetches are done, shows what a page loaded
    now shows."""
    fresh = logged_in(browser, site)
    try:
        fresh.goto(f"{site.base}/runs/{run_id}/")
        fresh.wait_for_selector('#live[data-status="live"]')
        expected = panel_facts(fresh)
    finally:
        fresh.close()
    wait_until(lambda: panel_facts(page) == expected, 10, "the page to show the ended run")
    return expected


def test_a_busy_runs_page_follows_its_steps_part_by_part(page, browser, embedded_site):
    """Each change of the run asks for its changed parts once at most (never the whole
    panel after the first load), and the page ends as a fresh load shows the run."""
    status, run = embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.steps", "input": {"steps": 40, "step_seconds": 0.05}})
    assert status == 201
    traffic = panel_traffic(page, run["id"])
    page.goto(f"{embedded_site.base}{run['url']}")
    wait_until(lambda: embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]["state"]
               == "ended", 30, "the run to end")
    expected = settled_like_a_fresh_load(page, browser, embedded_site, run["id"])
    assert expected["state"] == "ended" and expected["output"]
    assert len([seq for seq in expected["timeline"] if seq.isdigit()]) > 40
    assert traffic.pushes > 20  # those after the page connected
    # One whole panel per connection (its snapshot), then parts: at most one per push.
    assert len(traffic.whole) <= 1, traffic.whole
    assert len(traffic.urls) <= traffic.pushes + 1, (len(traffic.urls), traffic.pushes)
    assert all("after=" in url for url in traffic.urls if "?" in url), traffic.urls


def test_a_parents_page_follows_its_children_row_by_row(page, browser, embedded_site):
    status, run = embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.parent", "input": {
            "children": 3, "child_agent": "demo.steps",
            "child_input": {"steps": 20, "step_seconds": 0.15}}})
    assert status == 201
    traffic = panel_traffic(page, run["id"])
    page.goto(f"{embedded_site.base}{run['url']}")
    # The children step for three seconds: long enough to change while a loaded machine
    # still connects the page.
    page.wait_for_selector('#live[data-status="live"]')
    wait_until(lambda: embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]["state"]
               == "ended", 30, "the parent to end")
    expected = settled_like_a_fresh_load(page, browser, embedded_site, run["id"])
    assert [state for _, state in expected["children"]] == ["ended"] * 3
    assert len(traffic.whole) <= 1, traffic.whole
    assert len(traffic.urls) <= traffic.pushes + 1, (len(traffic.urls), traffic.pushes)
    # A child's change asks for its row, not for the run's parts.
    assert any("rows=" in url and "parts=" not in url for url in traffic.urls)


@pytest.mark.parametrize("size", [PHONE, {"width": 1280, "height": 800}],
                         ids=["phone", "desktop"])
def test_the_trace_draws_alike_steps_as_one_row_and_a_chat_cancelled_mid_stream(
        page, embedded_site, size):
    """Four prompts with the same short answer, then a long one cancelled while it streams:
    the trace has the four steps as one row that opens, the cancelled call with its time
    and the tokens received, and the cancel with who asked, in light and dark."""
    page.set_viewport_size(size)
    run_id, row = open_run(page, embedded_site, "demo.chat", {
        "prompts": ["hello", "hello", "hello", "hello", "Tell me how a cancel works."],
        "model": "canned+pace=0.05"})
    page.wait_for_function(
        "() => document.querySelectorAll('.activity-log li[data-kind=step]').length >= 4")
    page.wait_for_selector('#live-output:not([hidden]) [data-field="live-output"]:text("stub")')
    click_to_confirm(page, f'{row} [data-action="cancel"]')
    page.wait_for_selector(f'{row}[data-end-cause="cancelled"]')
    cut = '#trace .trace-row[data-kind="model"][data-outcome="cancelled"]'
    page.wait_for_selector(cut)
    text = page.text_content(cut)
    assert re.search(r"starts at \+\d.* · lasts \d.* · \d+ tokens? received · cancelled",
                     text), text
    assert "Nothing yet" not in page.text_content("#activity")
    alike = "#trace details.trace-steps > summary"
    assert "Step 1–4" in page.text_content(alike) and "4 steps" in page.text_content(alike)
    assert not page.is_visible("#trace .trace-members")
    page.click(alike)
    assert page.locator("#trace .trace-members > li").count() == 4
    cancel = page.text_content('#trace .trace-row[data-kind="control"]')
    assert "Cancel requested" in cancel and "by admin" in cancel and "via Browser" in cancel
    # Every bar has its words: the durations are text next to it, not only a length.
    for figures in page.locator("#trace .trace-figures").all_text_contents():
        assert re.search(r"\+\d", figures), figures
    assert page.evaluate("document.documentElement.scrollWidth") <= size["width"]
    bar = box_of(page, '#trace .trace-row[data-kind="run"] .trace-bar')
    assert bar["width"] > size["width"] / 3 and bar["x"] + bar["width"] <= size["width"]
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        assert serious_violations(page) == [], scheme
    assert embedded_site.call("GET", f"/api/runs/{run_id}/")[1]["usage"]["steps"] == 4
