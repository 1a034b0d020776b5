"""The workers page and API: each worker process, alive or lost, and Drain (SPEC §7)."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from harness.processes import wait_until
from runs import domain
from runs.models import Run, RunState, WorkerProcess
from tests.conftest import client_for, make_user
from tests.factories import OWNER, running_run


@pytest.mark.django_db
def test_workers_are_listed_alive_or_lost_and_an_operator_drains_one(op_client, viewer_client):
    domain.worker_report(owner=OWNER, live_attempts=1, abandoned_tools=0, capacity=8)
    domain.worker_report(owner="node-b:12", live_attempts=0, abandoned_tools=2, capacity=4)
    WorkerProcess.objects.filter(owner="node-b:12").update(
        reported_at=timezone.now() - timedelta(minutes=5))
    run, _ = running_run()
    mine = (OWNER, "node-b:12")  # the workers of other tests' executors may report too
    listed = [worker for worker in viewer_client.get("/api/workers/").json()["results"]
              if worker["name"] in mine]
    assert [(w["name"], w["alive"], w["capacity"], w["live_attempts"], w["draining"])
            for w in listed] == [(OWNER, True, 8, 1, False), ("node-b:12", False, 4, 0, False)]
    assert listed[0]["runs"] == [str(run.id)] and listed[1]["abandoned_tools"] == 2

    refused = viewer_client.post(f"/api/workers/{OWNER}/drain/")
    assert refused.status_code == 403 and not WorkerProcess.objects.get(owner=OWNER).draining
    unknown = op_client.post("/api/workers/nobody:1/drain/")
    assert (unknown.status_code, unknown.json()["code"]) == (404, "not_found")
    drained = op_client.post(f"/api/workers/{OWNER}/drain/").json()
    assert (drained["draining"], drained["drained_by"]) == (True, "olga")
    # A report keeps the operator's drain.
    domain.worker_report(owner=OWNER, live_attempts=1, abandoned_tools=0, capacity=8)
    assert WorkerProcess.objects.get(owner=OWNER).draining

    page = Client()
    page.force_login(make_user("vera2", "viewer"))
    html = page.get("/workers/").content.decode()
    assert OWNER in html and "draining" in html and "lost" in html
    assert f'href="/runs/{run.id}/"' in html and "data-worker-action" not in html  # viewer
    assert op_client.post(f"/api/workers/{OWNER}/undrain/").json()["draining"] is False


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_drained_worker_claims_no_new_run_and_takes_them_again_once_undrained(worker):
    api = client_for(make_user("olga", "operator"))
    first = api.post("/api/runs/", {"agent": "demo.steps", "input": {"steps": 1}},
                     format="json").json()["id"]  # the worker's executor reports from then on
    wait_until(lambda: Run.objects.get(pk=first).state == RunState.ENDED, 15, "a first run")
    name = wait_until(lambda: WorkerProcess.objects.filter(
        owner__startswith=f"{worker.node}:").values_list("owner", flat=True).first(), 15,
        "the worker to report")
    assert api.post(f"/api/workers/{name}/drain/").status_code == 200
    try:
        run_id = api.post("/api/runs/", {"agent": "demo.steps", "input": {"steps": 1}},
                          format="json").json()["id"]
        deadline = timezone.now() + timedelta(seconds=2)  # a few of the message's returns
        while timezone.now() < deadline:
            assert Run.objects.get(pk=run_id).state == RunState.QUEUED
    finally:
        assert api.post(f"/api/workers/{name}/undrain/").status_code == 200
    wait_until(lambda: Run.objects.get(pk=run_id).state == RunState.ENDED, 15,
               "the run to be taken once undrained")
