"""Approvals on a running site: its worker runs the agents, the provider stub answers."""

from harness.processes import wait_until
from tests.test_agents_live import create, ended, events, run_of


def awaiting(site, run_id) -> dict:
    return wait_until(lambda: (lambda run: run if run["state"] == "awaiting" else None)(
        run_of(site, run_id)), 20, f"run {run_id} to await")


def test_an_edited_call_is_the_one_the_models_tool_runs(agent_site):
    run = create(agent_site, "demo.assistant", {"prompt": "Tell the team"})
    action = awaiting(agent_site, run["id"])["ticket"]["action"]
    assert action["tool"] == "send_email" and len(action["digest"]) == 64
    ticket = run_of(agent_site, run["id"])["ticket"]["id"]
    edited = {"to": "team@example.com", "body": "The report is ready."}
    status, body = agent_site.call("POST", f"/api/runs/{run['id']}/resume/", {
        "ticket": ticket, "input": {"approved": True, "arguments": edited,
                                    "digest": action["digest"]}})
    assert status == 200, body
    done = ended(agent_site, run["id"])
    assert done["end_cause"] == "completed", done
    assert done["output"]["sent"] == [edited]
    assert "sent to team@example.com" in done["output"]["text"]
    replies = [e for e in events(agent_site, run["id"]) if e["kind"] == "step"]
    assert len(replies) == 2  # one model call per round: the paused one was not asked again


def test_a_refused_email_is_not_sent_and_the_run_goes_on(agent_site):
    run = create(agent_site, "demo.email", {"steps_before": 0})
    ticket = awaiting(agent_site, run["id"])["ticket"]
    status, _ = agent_site.call("POST", f"/api/runs/{run['id']}/resume/", {
        "ticket": ticket["id"], "input": {"approved": False, "reason": "Not today."}})
    assert status == 200
    done = ended(agent_site, run["id"])
    assert (done["end_cause"], done["output"]["sent"], done["output"]["refused"]) == (
        "completed", [], "Not today.")
    resumed = next(e for e in events(agent_site, run["id"]) if e["kind"] == "resumed")
    assert (resumed["data"]["decision"], resumed["source"]) == ("refused", "api")
