"""Runs executed by real ``celery worker`` processes on PostgreSQL and Redis (SPEC §4-6).

Each test drives the system from outside, as a script would: the REST API and the sweeper,
with workers started, killed or frozen as separate processes.
"""

import random
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from harness.processes import wait_until
from runs import domain
from runs.models import Activity, Event, EventKind, Run, RunState
from tests.conftest import client_for, make_user

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def api(db):
    return client_for(make_user("olga", "operator"))


def create(api, agent, input=None, **extra):
    response = api.post("/api/runs/", {"agent": agent, "input": input or {}, **extra},
                        format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def run_of(run_id) -> Run:
    return Run.objects.select_related("control").get(pk=run_id)


def wait_state(run_id, state, timeout=10.0) -> Run:
    return wait_until(lambda: (lambda r: r if r.state == state else None)(run_of(run_id)),
                      timeout, f"run {run_id} to be {state}")


def ended_events(run_id) -> list:
    return list(Event.objects.filter(run_id=run_id, kind=EventKind.ENDED))


def assert_one_clean_end(run_id):
    events = list(Event.objects.filter(run_id=run_id).order_by("seq"))
    assert [e.kind for e in events].count("ended") == 1
    assert events[-1].kind == "ended", [e.kind for e in events]
    assert [e.version for e in events] == list(range(1, len(events) + 1))


def test_a_run_executes_to_completion(worker, api):
    run_id = create(api, "demo.steps", {"steps": 3, "step_seconds": 0.05, "output": {"ok": 1}})
    run = wait_state(run_id, RunState.ENDED)
    assert (run.end_cause, run.output, run.steps, run.tokens, run.generation) == (
        "completed", {"ok": 1}, 3, 300, 1)
    assert run.attempts.get().owner.startswith(worker.node + ":")
    assert_one_clean_end(run_id)


def test_a_batch_goes_to_the_worker_in_chunks_and_every_run_completes(worker, api, settings):
    settings.AWAKEN_DISPATCH_CHUNK = 4  # 10 runs: messages of 4, 4 and 2
    spec = {"agent": "demo.steps", "input": {"steps": 1, "step_seconds": 0}}
    response = api.post("/api/runs/batch/", {"runs": [spec] * 10}, format="json")
    assert response.status_code == 201, response.json()
    for run in response.json()["results"]:
        assert wait_state(run["id"], RunState.ENDED).end_cause == "completed"
        assert_one_clean_end(run["id"])


@pytest.mark.parametrize("agent", ["demo.hang", "demo.hang_tool"])
def test_live_cancel_ends_a_hung_attempt_at_once(worker, api, agent):
    run_id = create(api, agent)
    wait_state(run_id, RunState.RUNNING)
    response = api.post(f"/api/runs/{run_id}/cancel/", {"reason": "stuck"}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["state"], body["end_cause"]) == ("ended", "cancelled")
    assert body["control"]["delivered_at"] is not None
    assert body["control"]["applied_at"] is not None
    assert run_of(run_id).control.applied_via == "live"
    assert_one_clean_end(run_id)


def test_stop_of_a_running_run_keeps_its_reason(worker, api):
    run_id = create(api, "demo.hang_tool")
    wait_state(run_id, RunState.RUNNING)
    body = api.post(f"/api/runs/{run_id}/stop/", {"reason": "operator halt"},
                    format="json").json()
    assert (body["end_cause"], body["stop_code"], body["stop_reason"]) == (
        "stopped", "operator", "operator halt")


def test_a_late_result_is_never_committed(worker, api):
    # The answer comes 2 s into the model call: the cancel lands long before, on a loaded
    # machine too.
    late = 2.0
    claimed_at = wait_state(run_id := create(api, "demo.late", {"late_seconds": late}),
                            RunState.RUNNING).claimed_at
    assert api.post(f"/api/runs/{run_id}/cancel/", {}, format="json").json()["end_cause"] == (
        "cancelled")
    # Wait until the abandoned provider has certainly answered (the model call begins after
    # the claim, by the database's clock), then the event log shows nothing committed after
    # the end. Nothing in the database tells of an answer discarded, so this is a wait.
    answered = claimed_at + timedelta(seconds=late + 0.5)
    time.sleep(max(0.0, (answered - timezone.now()).total_seconds()))
    run = run_of(run_id)
    assert run.output is None and run.end_cause == "cancelled"
    assert_one_clean_end(run_id)


def test_pause_then_resume_continues_from_the_checkpoint(worker, api):
    run_id = create(api, "demo.steps", {"steps": 6, "step_seconds": 0.1})
    wait_until(lambda: run_of(run_id).steps >= 1, what="a first step")
    paused = api.post(f"/api/runs/{run_id}/pause/?wait=10", format="json")
    assert paused.status_code == 200, paused.json()
    body = paused.json()
    assert body["state"] == "awaiting" and body["ticket"]["reason"] == "manual_pause"
    steps_at_pause = body["usage"]["steps"]
    resumed = api.post(f"/api/runs/{run_id}/resume/", {"ticket": body["ticket"]["id"]},
                       format="json")
    assert resumed.status_code == 200
    run = wait_state(run_id, RunState.ENDED)
    assert (run.end_cause, run.generation, run.steps) == ("completed", 2, 6)
    # The second attempt continued: it committed only the steps the first one had not.
    second = Event.objects.filter(run_id=run_id, kind=EventKind.STEP, generation=2).count()
    assert second == 6 - steps_at_pause
    assert_one_clean_end(run_id)


def test_approval_waits_for_its_answer(worker, api):
    run_id = create(api, "demo.approval", {"step_seconds": 0.05})
    run = wait_state(run_id, RunState.AWAITING)
    ticket = run.ticket_id
    api.post(f"/api/runs/{run_id}/resume/", {"ticket": str(ticket), "input": {"approved": False}},
             format="json")
    run = wait_state(run_id, RunState.ENDED)
    assert run.end_cause == "failed" and "not approved" in run.error


def test_cancel_racing_natural_completion_ends_exactly_once(worker, api):
    rng = random.Random(3)
    for _ in range(15):
        run_id = create(api, "demo.steps", {"steps": 2, "step_seconds": 0.03})
        wait_until(lambda run_id=run_id: run_of(run_id).state != RunState.QUEUED, what="a start")
        time.sleep(rng.uniform(0, 0.08))  # a random moment within the run's life
        api.post(f"/api/runs/{run_id}/cancel/?wait=10", {}, format="json")
        run = wait_state(run_id, RunState.ENDED)
        assert run.end_cause in ("completed", "cancelled")
        # A cancel that came after the end wrote nothing; one that came before was applied.
        assert run.control is None or run.control.applied_at is not None
        assert_one_clean_end(run_id)


@pytest.mark.parametrize("budget, input, code", [
    pytest.param({"max_steps": 2}, {"steps": 5, "step_seconds": 0.01}, "max_steps",
                 id="max_steps"),
    pytest.param({"max_tokens": 150}, {"steps": 5, "step_seconds": 0.01}, "max_tokens",
                 id="max_tokens"),
    pytest.param({"max_seconds": 0.3}, {"steps": 100, "step_seconds": 0.05}, "max_seconds",
                 id="max_seconds"),
])
def test_each_budget_stops_the_run_with_its_code(worker, api, budget, input, code):
    run_id = create(api, "demo.steps", input, budget=budget)
    run = wait_state(run_id, RunState.ENDED)
    assert (run.end_cause, run.stop_code) == ("stopped", code)
    assert run.stop_reason and run.control.source == "policy"
    if code == "max_steps":
        assert run.steps == 2
    if code == "max_tokens":
        assert run.steps == 2 and run.tokens == 200


def test_max_seconds_interrupts_a_hung_await(worker, api):
    run_id = create(api, "demo.hang", budget={"max_seconds": 0.2})
    run = wait_state(run_id, RunState.ENDED)
    assert (run.end_cause, run.stop_code) == ("stopped", "max_seconds")


def parent_with_running_children(api, count: int = 2):
    parent = create(api, "demo.parent", {"children": count, "child_agent": "demo.hang"})

    def running_children():
        ids = list(Run.objects.filter(parent_id=parent, state=RunState.RUNNING)
                   .values_list("id", flat=True))
        return ids if len(ids) == count else None

    return parent, wait_until(running_children, what=f"{count} running children")


def test_cancelling_a_parent_cancels_its_children(worker, api):
    parent, children = parent_with_running_children(api)
    answer = api.post(f"/api/runs/{parent}/cancel/", {}, format="json")
    assert answer.json().get("end_cause") == "cancelled", (answer.status_code, answer.json())
    for child in children:
        assert wait_state(child, RunState.ENDED).end_cause == "cancelled"


def test_cancelling_a_child_leaves_its_parent_running(worker, api):
    parent, children = parent_with_running_children(api)
    answer = api.post(f"/api/runs/{children[0]}/cancel/", {}, format="json")
    assert answer.json().get("end_cause") == "cancelled", (answer.status_code, answer.json())
    assert run_of(parent).state == RunState.RUNNING
    assert run_of(children[1]).state == RunState.RUNNING
    api.post(f"/api/runs/{parent}/cancel/", {}, format="json")
    wait_state(children[1], RunState.ENDED)


def test_deliver_reaches_only_a_live_attempt(worker, api):
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    queued = create(api, "demo.steps", start_after=later)
    response = api.post(f"/api/runs/{queued}/deliver/", {"command": "cancel"}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "not_active"
    assert run_of(queued).state == RunState.QUEUED and run_of(queued).control is None

    running = create(api, "demo.hang")
    wait_state(running, RunState.RUNNING)
    response = api.post(f"/api/runs/{running}/deliver/", {"command": "cancel"}, format="json")
    assert response.json() == {"delivered": True, "generation": 1}
    run = wait_state(running, RunState.ENDED)
    assert run.end_cause == "cancelled" and run.control is None  # live only: no intent
    assert ended_events(running)[0].actor == "olga"


def test_pause_of_a_run_that_is_not_running_is_not_active(worker, api):
    run_id = create(api, "demo.steps")
    api.post(f"/api/runs/{run_id}/cancel/", {}, format="json")
    response = api.post(f"/api/runs/{run_id}/pause/", format="json")
    assert response.status_code == 409 and response.json()["code"] == "not_active"


# --- workers that die --------------------------------------------------------------------


def sweep_until(predicate, timeout: float, what: str):
    return wait_until(lambda: (domain.sweep(), predicate())[1], timeout, what)


def start_on(process, agent, input=None) -> str:
    run, _ = domain.run_create(agent=agent, input=input or {}, dispatch=False)
    process.take(run.id)
    return str(run.id)


def test_a_killed_workers_run_is_requeued_and_completed_elsewhere(worker, spare_worker,
                                                                  settings):
    settings.AWAKEN_LEASE_SECONDS = 1.5
    doomed = spare_worker(lease_seconds=1.5, private=True)
    run_id = start_on(doomed, "demo.steps", {"steps": 40, "step_seconds": 0.05})
    wait_until(lambda: run_of(run_id).steps >= 2, what="the doomed worker's steps")
    assert run_of(run_id).attempts.get().owner.startswith(doomed.node + ":")
    doomed.kill()
    sweep_until(lambda: run_of(run_id).generation == 2, 8, "a second attempt")
    run = wait_state(run_id, RunState.ENDED, timeout=15)
    assert (run.end_cause, run.generation, run.crash_retries, run.steps) == (
        "completed", 2, 1, 40)
    assert run.attempts.get(generation=2).owner.startswith(worker.node + ":")
    kinds = list(Event.objects.filter(run_id=run_id).values_list("kind", flat=True))
    assert "requeued" in kinds
    assert_one_clean_end(run_id)


def test_an_approved_call_whose_worker_dies_before_its_step_is_not_asked_again(
        worker, spare_worker, settings):
    """SPEC §7.11, §7.15: the worker that took the decision is killed while it sends; the
    next attempt, elsewhere, gets the same decision and sends without a new ticket."""
    from runs.domain import outside
    from tests.test_review_links import KeptQueued

    settings.AWAKEN_LEASE_SECONDS = 1.5
    doomed = spare_worker(lease_seconds=1.5, private=True)
    run_id = start_on(doomed, "demo.email", {"steps_before": 0, "send_seconds": 6})
    run = wait_state(run_id, RunState.AWAITING)
    real = outside.workers
    outside.connect(workers=KeptQueued(real))  # the resumed attempt goes to the doomed one
    try:
        domain.run_resume(run_id=run_id, ticket_id=run.ticket_id, input={
            "approved": True, "arguments": {"to": "boss@example.com", "body": "Done."}},
            actor="olga", source="api")
    finally:
        outside.connect(workers=real)
    doomed.take(run_id)
    wait_until(lambda: Activity.objects.filter(run_id=run_id, text="sending the email",
                                               generation=2).exists(),
               what="the doomed worker to send")
    doomed.kill()
    sweep_until(lambda: run_of(run_id).generation == 3, 8, "a third attempt")
    run = wait_state(run_id, RunState.ENDED, timeout=20)
    assert run.end_cause == "completed", run.error
    assert run.output["sent"] == [{"to": "boss@example.com", "body": "Done."}]
    assert Event.objects.filter(run_id=run_id, kind=EventKind.PAUSED).count() == 1
    assert run.tickets.count() == 1  # not asked again
    # The doomed attempt died before its step committed: the decision outlived it.
    assert not Event.objects.filter(run_id=run_id, kind=EventKind.STEP, generation=2).exists()
    assert_one_clean_end(run_id)


def test_a_cancel_accepted_while_the_worker_is_dead_is_applied(spare_worker, api, settings):
    settings.AWAKEN_LEASE_SECONDS = 1.5
    doomed = spare_worker(lease_seconds=1.5, private=True)
    run_id = start_on(doomed, "demo.hang")
    wait_state(run_id, RunState.RUNNING)
    doomed.kill()
    response = api.post(f"/api/runs/{run_id}/cancel/?wait=0", {}, format="json")
    assert response.status_code == 202
    assert response.json()["control"]["delivered_at"] is None
    sweep_until(lambda: run_of(run_id).state == RunState.ENDED, 8, "the lease to expire")
    run = run_of(run_id)
    assert run.end_cause == "cancelled" and run.control.applied_at is not None
    assert run.control.applied_via == "sweeper"
    assert run.attempts.get().close_reason == "lost"
    assert_one_clean_end(run_id)


def test_a_frozen_attempt_is_fenced_after_a_reclaim(worker, spare_worker, settings):
    settings.AWAKEN_LEASE_SECONDS = 1.5
    frozen = spare_worker(lease_seconds=1.5, private=True)
    run_id = start_on(frozen, "demo.steps", {"steps": 30, "step_seconds": 0.05})
    wait_until(lambda: run_of(run_id).steps >= 1, what="a first step")
    frozen.signal(signal.SIGSTOP)
    try:
        # Frozen inside a transaction, it holds a row lock until the server ends its
        # session (DB_IDLE_IN_TRANSACTION_SECONDS); the reclaim follows.
        sweep_until(lambda: run_of(run_id).generation == 2, 25, "a reclaim")
    finally:
        frozen.signal(signal.SIGCONT)  # generation 1 wakes up holding nothing
    run = wait_state(run_id, RunState.ENDED, timeout=15)
    assert (run.end_cause, run.generation) == ("completed", 2)
    requeued = Event.objects.get(run_id=run_id, kind=EventKind.REQUEUED)
    # Nothing of generation 1 was committed after the reclaim.
    assert not Event.objects.filter(run_id=run_id, generation=1, seq__gt=requeued.seq).exists()
    assert_one_clean_end(run_id)


def test_a_lost_dispatch_is_sent_again(worker, api, settings):
    settings.AWAKEN_LEASE_SECONDS = 0.5
    run, _ = domain.run_create(agent="demo.steps", input={"steps": 1, "step_seconds": 0.01},
                                 dispatch=False)
    Run.objects.filter(pk=run.id).update(dispatched_at=run.created_at)  # "sent", then lost
    sweep_until(lambda: run_of(run.id).state == RunState.ENDED, 10, "the re-dispatch")
    assert run_of(run.id).end_cause == "completed"


def test_the_live_inbox_takes_messages_and_wakes_in_order(worker, api):
    run_id = create(api, "demo.inbox", {"until": {"done": True}})
    wait_state(run_id, RunState.RUNNING)

    def deliver(body):
        response = api.post(f"/api/runs/{run_id}/deliver/", body, format="json")
        assert response.status_code == 200, response.json()
        assert response.json() == {"delivered": True, "generation": 1}

    deliver({"command": "message", "message": {"n": 1}})
    deliver({"command": "wake"})
    deliver({"command": "message", "message": ["two", 2]})
    deliver({"command": "message", "message": {"done": True}})
    run = wait_state(run_id, RunState.ENDED)
    assert run.end_cause == "completed"
    assert run.output == {"messages": [{"n": 1}, ["two", 2], {"done": True}]}
    assert run.steps == 4  # the wake is a step with no message
    steps = Event.objects.filter(run_id=run_id, kind=EventKind.STEP).order_by("seq")
    assert [(e.actor, e.source) for e in steps] == [("olga", "api")] * 4  # the caller's
    assert_one_clean_end(run_id)


def test_a_pause_reaches_an_attempt_waiting_on_its_inbox(worker, api):
    run_id = create(api, "demo.inbox")
    wait_state(run_id, RunState.RUNNING)
    paused = api.post(f"/api/runs/{run_id}/pause/?wait=10", format="json")
    assert paused.status_code == 200, paused.json()
    assert paused.json()["state"] == "awaiting"


def test_a_parent_awaiting_input_leaves_its_children_running_until_it_is_cancelled(worker, api):
    parent = create(api, "demo.parent", {"children": 2, "then_wait_for_input": True})
    wait_state(parent, RunState.AWAITING)
    children = list(Run.objects.filter(parent_id=parent).values_list("id", flat=True))
    assert len(children) == 2
    for child in children:
        wait_state(child, RunState.RUNNING)
    assert api.post(f"/api/runs/{parent}/cancel/", {}, format="json").json()["end_cause"] == (
        "cancelled")
    for child in children:
        run = wait_state(child, RunState.ENDED)
        assert run.end_cause == "cancelled" and str(run.control.caused_by_id) == parent
