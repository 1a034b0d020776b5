"""A framework agent's model call on its run page in a real browser: the text shows in the
Live output box while the model answers, and gives way to the committed output."""

import os

import pytest

from tests import test_browser_run
from tests.accessibility import serious_violations
from tests.conftest import CHROMIUM
from tests.test_browser_approvals import SIZES, fits, shot
from tests.test_browser_run import open_run

page = test_browser_run.page  # the logged-in page fixture, checked for script errors

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("agent", ["pydantic_ai.chat", "openai_agents.chat"])
def test_a_framework_agents_answer_shows_live_while_the_model_streams_it(
        page, embedded_site, agent, size):
    page.set_viewport_size(size)
    run_id, row = open_run(page, embedded_site, agent, {
        "prompt": "tell me", "model": "echo+words=80+pace=0.05"})
    live = page.locator('#live-output [data-field="live-output"]')
    page.wait_for_selector('#live-output:not([hidden])')
    page.wait_for_function("() => document.querySelector("
                           "'#live-output [data-field=\"live-output\"]').textContent"
                           ".split(' ').length > 10")
    assert "tell me" in live.text_content()
    assert embedded_site.call("GET", f"/api/runs/{run_id}/")[1]["state"] == "running"
    fits(page, size)
    assert serious_violations(page) == []
    shot(page, f"run-live-{agent.split('.')[0]}-{size['width']}x{size['height']}")
    page.wait_for_selector(f'{row}[data-end-cause="completed"]')
    page.wait_for_selector("#live-output", state="hidden")
    output = embedded_site.call("GET", f"/api/runs/{run_id}/")[1]["output"]
    assert len(output["text"].split()) == 80
