"""Money budgets and the policies that pause a run instead of ending it, over the API of
``manage.py serve`` whose agents call the session's provider stub (``agent_site``: the model
``PRICED`` has a price of its own there, and a provider failing past its retries pauses the
run). The stub's usage figures are the provider's; the costs are checked against them."""

import pytest

from harness.processes import wait_until
from runs.domain.actions import action_digest
from tests.conftest import PRICE_IN, PRICE_OUT, PRICED
from tests.test_agents_live import calls_of, create, ended, events, run_of

pytestmark = pytest.mark.timeout(120)


def in_state(site, run_id, state, timeout=30) -> dict:
    return wait_until(lambda: (lambda run: run if run["state"] == state else None)(
        run_of(site, run_id)), timeout, f"run {run_id} to be {state}")


def steps_of(site, run_id) -> list[dict]:
    return [e for e in events(site, run_id) if e["kind"] == "step"]


def priced(step: dict) -> float:
    """What the step's model calls cost at the site's price of ``PRICED``, from the usage
    the provider reported."""
    return sum((r["usage"]["prompt"] * PRICE_IN + r["usage"]["completion"] * PRICE_OUT)
               / 1_000_000 for r in step["data"]["replies"])


PROMPTS = ["one two three", "four five", "six seven"]


def test_a_cost_budget_stops_the_run_at_the_price_of_what_it_used(agent_site):
    run = create(agent_site, "demo.chat", {"prompts": PROMPTS, "system": "Be brief.",
                                           "model": PRICED}, budget={"max_cost_usd": 0.02})
    done = ended(agent_site, run["id"])
    assert (done["end_cause"], done["stop_code"]) == ("stopped", "max_cost")
    assert "Cost budget of $0.02 reached" in done["stop_reason"]
    steps = steps_of(agent_site, run["id"])
    assert [step["data"]["cost_usd"] for step in steps] == pytest.approx(
        [priced(step) for step in steps])
    assert done["usage"]["cost_usd"] == pytest.approx(sum(map(priced, steps)))
    assert sum(map(priced, steps[:-1])) < 0.02 <= done["usage"]["cost_usd"]
    assert len(steps) == 2 and done["budget"]["max_cost_usd"] == 0.02


def test_a_model_with_no_price_makes_the_cost_unknown_and_says_so(agent_site):
    model = "echo+no-price"  # an unknown flag: a model no table prices
    run = create(agent_site, "demo.chat", {"prompt": "what does it cost?", "model": model})
    done = ended(agent_site, run["id"])
    assert done["end_cause"] == "completed"
    assert done["usage"]["cost_usd"] is None  # unknown, never a silent 0
    (step,) = steps_of(agent_site, run["id"])
    assert step["data"]["cost_usd"] is None and step["data"]["unpriced_models"] == [model]
    # The warning in the activity log and the run page: tests/test_budgets.py.


def test_a_cost_pause_is_raised_and_the_run_goes_on_from_its_last_committed_step(
        agent_site, provider_stub):
    prompts = ["alpha beta", "gamma delta", "epsilon zeta"]
    before = len(calls_of(provider_stub, PRICED))
    run = create(agent_site, "demo.chat", {"prompts": prompts, "system": "Be brief.",
                                           "model": PRICED},
                 budget={"max_cost_usd": 0.02, "on_exhausted": "pause"})
    paused = in_state(agent_site, run["id"], "awaiting")
    ticket = paused["ticket"]
    assert ticket["reason"] == "budget" and paused["end_cause"] is None
    assert ticket["prompt"]["limit"] == "max_cost_usd"
    assert ticket["prompt"]["stop_code"] == "max_cost"
    assert ticket["prompt"]["usage"]["steps"] == 2
    assert ticket["prompt"]["usage"]["cost_usd"] == pytest.approx(paused["usage"]["cost_usd"])
    assert ticket["prompt"]["budget"]["max_cost_usd"] == 0.02

    # A resume that raises nothing (or lowers the limit) is refused and changes nothing.
    for refused in (None, {}, {"budget": {}}, {"budget": {"max_cost_usd": 0.01}},
                    {"budget": {"max_steps": 50}}, {"budget": {"on_exhausted": "stop"}}):
        status, body = agent_site.call("POST", f"/api/runs/{run['id']}/resume/", {
            "ticket": ticket["id"], **({"input": refused} if refused is not None else {})})
        assert (status, body["code"]) == (400, "invalid"), (refused, body)
    assert run_of(agent_site, run["id"])["version"] == paused["version"]

    status, body = agent_site.call("POST", f"/api/runs/{run['id']}/resume/", {
        "ticket": ticket["id"], "input": {"budget": {"max_cost_usd": 1}}})
    assert status == 200, body
    done = ended(agent_site, run["id"])
    assert done["end_cause"] == "completed" and done["budget"]["max_cost_usd"] == 1
    assert done["output"]["replies"] == [f"You said: {prompt}" for prompt in prompts]
    # Each prompt went to the model once: the committed steps were not asked again.
    assert len(calls_of(provider_stub, PRICED)) - before == len(prompts)
    resumed = [e for e in events(agent_site, run["id"]) if e["kind"] == "resumed"]
    assert resumed[0]["data"]["budget"] == {"max_cost_usd": 1}
    steps = steps_of(agent_site, run["id"])
    assert done["usage"]["cost_usd"] == pytest.approx(sum(map(priced, steps)))


def test_runs_paused_for_their_provider_are_found_and_resumed_by_one_bulk_job(
        agent_site, provider_stub):
    model = "echo+500+fail=4+retry-after=0"  # the first try and all 3 retries fail
    runs = [create(agent_site, "demo.chat", {"prompts": [f"failing {n}"],
                                             "model": model}) for n in range(2)]
    paused = [in_state(agent_site, run["id"], "awaiting") for run in runs]
    for run in paused:
        assert run["ticket"]["reason"] == "provider" and run["usage"]["steps"] == 0
        assert "500" in run["ticket"]["prompt"]["error"]
        (pause,) = [e for e in events(agent_site, run["id"]) if e["kind"] == "paused"]
        assert (pause["actor"], pause["source"]) == ("policy", "policy")
    ids = {run["id"] for run in runs}
    status, page = agent_site.call("GET", "/api/runs/?ticket_reason=provider&limit=500")
    assert status == 200 and ids <= {run["id"] for run in page["results"]}
    assert all(run["ticket"]["reason"] == "provider" for run in page["results"])
    status, body = agent_site.call("GET", "/api/runs/?ticket_reason=tired")
    assert (status, body["code"]) == (400, "invalid")

    # The provider answers again (the stub fails each request 4 times only).
    status, job = agent_site.call("POST", "/api/bulk/", {
        "action": "resume", "filter": {"ticket_reason": "provider", "agent": "demo.chat"}})
    assert status == 201, job
    job = wait_until(lambda: (lambda j: j if j["state"] == "done" else None)(
        agent_site.call("GET", f"/api/bulk/{job['id']}/")[1]), 30, "the bulk job")
    assert job["applied"] >= 2 and job["refused"] == 0
    for run in runs:
        done = ended(agent_site, run["id"])
        assert done["end_cause"] == "completed"
        assert done["output"]["replies"][0].startswith("You said: failing")


def test_the_loop_guard_pauses_a_repeated_call_and_resuming_lets_it_go_on(agent_site):
    run = create(agent_site, "demo.research", {"question": "round and round",
                                               "model": "echo+loop"},
                 budget={"max_repeats": 2})
    paused = in_state(agent_site, run["id"], "awaiting")
    ticket = paused["ticket"]
    assert ticket["reason"] == "loop" and paused["usage"]["steps"] == 2
    assert ticket["prompt"]["limit"] == "max_repeats"
    assert ticket["prompt"]["digest"] == action_digest("search_notes",
                                                       {"query": "round and round"})
    steps = steps_of(agent_site, run["id"])
    assert all(ticket["prompt"]["digest"] in {t["digest"] for t in step["data"]["tools"]}
               for step in steps)

    # Not raised: refused. Without a budget: the counts start again and the run goes on.
    status, body = agent_site.call("POST", f"/api/runs/{run['id']}/resume/", {
        "ticket": ticket["id"], "input": {"budget": {"max_repeats": 2}}})
    assert (status, body["code"]) == (400, "invalid")
    status, body = agent_site.call("POST", f"/api/runs/{run['id']}/resume/",
                                   {"ticket": ticket["id"]})
    assert status == 200, body
    again = wait_until(lambda: (lambda r: r if r["state"] == "awaiting" and r["ticket"]["id"]
                                != ticket["id"] else None)(run_of(agent_site, run["id"])),
                       30, "the second pause")
    assert again["ticket"]["reason"] == "loop" and again["usage"]["steps"] == 4

    # Raised: the guard lets one more round through, then pauses again.
    status, body = agent_site.call("POST", f"/api/runs/{run['id']}/resume/", {
        "ticket": again["ticket"]["id"], "input": {"budget": {"max_repeats": 3}}})
    assert status == 200, body
    third = wait_until(lambda: (lambda r: r if r["state"] == "awaiting" and r["ticket"]["id"]
                                != again["ticket"]["id"] else None)(
        run_of(agent_site, run["id"])), 30, "the third pause")
    assert third["usage"]["steps"] == 5 and third["budget"]["max_repeats"] == 3
    agent_site.call("POST", f"/api/runs/{run['id']}/stop/", {"reason": "a loop"})
