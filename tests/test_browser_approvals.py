"""An approval bound to one tool call in a real browser, on the run page and on a review
link's page, at a desktop's size and a phone's: the call shown readably, Approve, Edit
and Reject (a reason first, then a confirmation)."""

import json
import os

import pytest

from tests import test_browser_run
from tests.accessibility import serious_violations
from tests.conftest import CHROMIUM
from tests.test_browser_run import PHONE, open_run

page = test_browser_run.page  # the logged-in page fixture, checked for script errors

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium")

DESKTOP = {"width": 1280, "height": 800}
SIZES = [pytest.param(DESKTOP, id="1280x800"), pytest.param(PHONE, id="390x844")]
SHOTS = os.environ.get("APPROVAL_SHOTS")  # a folder to keep the screenshots in, if set


def shot(page, name):
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"), full_page=False)


def fits(page, size):
    assert page.evaluate("document.documentElement.scrollWidth") <= size["width"]


def output_of(site, run_id) -> dict:
    return site.call("GET", f"/api/runs/{run_id}/")[1]["output"]


@pytest.mark.parametrize("size", SIZES)
def test_the_run_page_shows_the_call_and_approves_it_edited_or_rejects_it(
        page, embedded_site, size):
    page.set_viewport_size(size)
    tag = f"{size['width']}x{size['height']}"
    run_id, row = open_run(page, embedded_site, "demo.email", {
        "steps_before": 0, "to": "team@example.com", "body": "The weekly report is ready."})
    page.wait_for_selector(f'{row}[data-state="awaiting"]')
    action = page.locator('.ask [data-field="action"]')
    action.wait_for()
    assert "send_email" in action.locator(".action-tool").text_content()
    pairs = dict(zip(action.locator("dt").all_text_contents(),
                     action.locator("dd").all_text_contents(), strict=True))
    assert pairs == {"to": "team@example.com", "body": "The weekly report is ready."}
    assert "the team asked to be told" in action.locator(".rationale").text_content()
    assert "{" not in action.text_content()  # read as names and values, not JSON
    fits(page, size)
    shot(page, f"run-approval-{tag}")

    if size is DESKTOP:  # Edit, then approve the edited call
        page.click('[data-run-action="edit"]')
        page.wait_for_selector('#resume-dialog[open] [data-field="action-edit"]:not([hidden])')
        page.fill('#resume-dialog textarea[name="argument:to"]', "boss@example.com")
        shot(page, f"run-approval-edit-{tag}")
        assert serious_violations(page) == []
        page.click('#resume-dialog [data-action="confirm-resume"]:has-text("Approve edited")')
        page.wait_for_selector(f'{row}[data-end-cause="completed"]')
        assert output_of(embedded_site, run_id)["sent"] == [
            {"to": "boss@example.com", "body": "The weekly report is ready."}]
        page.wait_for_selector('.timeline li[data-kind="resumed"]:has-text("by admin")')
    else:  # Reject: a reason first, then the confirmation
        page.click('[data-run-action="reject"]')
        page.wait_for_selector('#resume-dialog[open] [data-field="action-reason"]:not([hidden])')
        confirm = '#resume-dialog [data-action="reject-resume"]:has-text("Confirm rejection")'
        page.click(confirm)  # no reason yet: refused here, nothing sent
        page.wait_for_selector('#resume-dialog [data-field="dialog-error"]:has-text("reason")')
        assert embedded_site.call("GET", f"/api/runs/{run_id}/")[1]["state"] == "awaiting"
        page.fill('#resume-dialog textarea[name="reject_reason"]', "Not before Monday.")
        fits(page, size)
        shot(page, f"run-approval-reject-{tag}")
        page.click(confirm)
        page.wait_for_selector(f'{row}[data-end-cause="completed"]')
        assert output_of(embedded_site, run_id)["refused"] == "Not before Monday."


@pytest.mark.parametrize("size", SIZES)
def test_the_review_page_shows_what_will_run_and_decides_it(page, browser, embedded_site,
                                                            size):
    tag = f"{size['width']}x{size['height']}"
    run_id, row = open_run(page, embedded_site, "demo.email", {"steps_before": 0})
    page.wait_for_selector(f'{row}[data-state="awaiting"]')
    status, link = embedded_site.call("POST", f"/api/runs/{run_id}/review-links/", {})
    assert status == 201
    reviewer = browser.new_context(viewport=size)
    review = reviewer.new_page()
    errors = []
    review.on("pageerror", lambda error: errors.append(str(error)))
    review.goto(link["url"])
    action = review.locator('[data-field="review-action"] [data-field="action"]')
    assert action.locator("dt").all_text_contents() == ["to", "body"]
    assert action.locator("dd").all_text_contents()[0] == "team@example.com"
    assert "the team asked to be told" in action.text_content()
    fits(review, size)
    assert serious_violations(review) == []
    shot(review, f"review-approval-{tag}")
    review.fill('[name="name"]', "Rita Reviewer")
    if size is DESKTOP:
        review.click('button[value="reject"]')
        review.wait_for_selector('[data-field="action-reason"]:not([hidden])')
        review.click('[data-review="back"]')  # changed their mind: the call as shown again
        review.wait_for_selector('[data-field="action-reason"]', state="hidden")
        review.click('button[value="reject"]')
        review.fill('textarea[name="reject_reason"]', "Wrong list.")
        shot(review, f"review-approval-reject-{tag}")
        review.click('button[value="reject"]:has-text("Confirm rejection")')
        review.wait_for_selector("#review-done:not([hidden])")
        page.wait_for_selector(f'{row}[data-end-cause="completed"]')
        assert output_of(embedded_site, run_id)["refused"] == "Wrong list."
    else:
        review.click('button[value="edit"]')
        review.fill('textarea[name="argument:body"]', "Report attached.")
        fits(review, size)
        shot(review, f"review-approval-edit-{tag}")
        review.click('button[value="approve"]:has-text("Approve edited")')
        review.wait_for_selector("#review-done:not([hidden])")
        page.wait_for_selector(f'{row}[data-end-cause="completed"]')
        sent = output_of(embedded_site, run_id)["sent"]
        assert sent == [{"to": "team@example.com", "body": "Report attached."}], json.dumps(sent)
    page.wait_for_selector('.timeline li[data-kind="resumed"]'
                           ':has-text("by Rita Reviewer via Review link")')
    assert errors == []
    reviewer.close()


@pytest.mark.parametrize("size", SIZES)
def test_a_run_paused_at_its_budget_says_which_limit_and_goes_on_once_it_is_raised(
        page, embedded_site, size):
    page.set_viewport_size(size)
    tag = f"{size['width']}x{size['height']}"
    status, run = embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.steps", "input": {"steps": 4, "step_seconds": 0.05},
        "budget": {"max_steps": 2, "on_exhausted": "pause"}})
    assert status == 201, run
    row = f'tr.run[data-run-id="{run["id"]}"]'
    page.goto(f"{embedded_site.base}{run['url']}")
    page.wait_for_selector('#live[data-status="live"]')
    page.wait_for_selector(f'{row}[data-state="awaiting"]')
    ask = page.locator(".ask")
    ask.locator('[data-field="pause-why"]').wait_for()
    assert ask.locator("h2").text_content() == "Paused: budget reached"
    assert "Step budget of 2 reached" in ask.locator('[data-field="pause-why"]').text_content()
    assert "Usage so far: 2 steps" in ask.text_content()
    assert "(now 2)" in ask.locator("label.raise").text_content()
    field = ask.locator('input[data-raise="max_steps"]')
    fits(page, size)
    assert serious_violations(page) == []
    shot(page, f"run-budget-{tag}")

    field.fill("2")  # not raised: refused, said so, nothing changed
    page.click('[data-run-action="raise-budget"]')
    toast = page.locator("#toast")
    toast.wait_for()
    assert "max_steps" in toast.text_content() and "raise" in toast.text_content()
    shot(page, f"run-budget-refused-{tag}")
    paused = embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]
    assert (paused["state"], paused["budget"]["max_steps"]) == ("awaiting", 2)
    page.errors[:] = [e for e in page.errors if "400 (Bad Request)" not in e]  # the refusal's

    field.fill("10")
    page.click('[data-run-action="raise-budget"]')
    page.wait_for_selector(f'{row}[data-end-cause="completed"]')
    done = embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]
    assert (done["usage"]["steps"], done["budget"]["max_steps"]) == (4, 10)
    page.wait_for_selector('.timeline li[data-kind="resumed"]:has-text("by admin")')
