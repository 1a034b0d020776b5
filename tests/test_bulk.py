"""Bulk jobs: one cancel or stop over many runs, carried out on the server, each run handled
and counted once, whatever stops, restarts or duplicates the job."""

import asyncio
import json
import time
import uuid
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from runs import domain
from runs.changes.outbox import Outbox
from runs.changes.stream import stream
from runs.domain import bulk as bulk_domain
from runs.domain.errors import InvalidRequest
from runs.models import BulkItem, BulkJob, ControlIntent, Event, EventKind, Run, RunState
from tests.conftest import db_state
from tests.factories import awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def sent(monkeypatch):
    """The jobs handed to workers: the tests play the worker."""
    jobs = []
    monkeypatch.setattr("runs.workers.dispatch.bulk_queued", lambda job_id: jobs.append(job_id))
    monkeypatch.setattr("runs.workers.dispatch.send_command", lambda **kwargs: None)
    return jobs


def state() -> dict:
    return {**db_state(), "jobs": BulkJob.objects.count(), "items": BulkItem.objects.count()}


def requests_of(run_id) -> list[str]:
    return list(Event.objects.filter(run_id=run_id, kind__in=[
        EventKind.CANCEL_REQUESTED, EventKind.STOP_REQUESTED]).values_list("actor", flat=True))


def check_counts(job: BulkJob) -> None:
    """The job's counts are its items' outcomes, each run once."""
    job.refresh_from_db()
    items = list(BulkItem.objects.filter(job=job))
    outcomes = [item.outcome for item in items]
    assert job.total == len(items) == len({item.run_id for item in items})
    assert job.done == len(items) - outcomes.count("pending")
    assert (job.applied, job.unchanged, job.refused) == (
        outcomes.count("applied"), outcomes.count("unchanged"), outcomes.count("refused"))


def mixed_runs() -> dict:
    queued = [queued_run() for _ in range(3)]
    awaiting = [awaiting_run()[0] for _ in range(2)]
    running = [running_run()[0] for _ in range(2)]
    ended = queued_run()
    domain.run_cancel(run_id=ended.id, actor="someone", source="api")
    return {"queued": queued, "awaiting": awaiting, "running": running, "ended": [ended]}


def test_a_job_over_runs_by_id_cancels_every_one_and_counts_each_once(
        op_client, sent, django_capture_on_commit_callbacks):
    runs = mixed_runs()
    chosen = [run for group in runs.values() for run in group]
    with django_capture_on_commit_callbacks(execute=True):
        response = op_client.post("/api/bulk/", {"action": "cancel", "reason": "clean-up",
                                                 "ids": [str(run.id) for run in chosen]},
                                  format="json")
    assert response.status_code == 201, response.json()
    job = response.json()
    assert (job["state"], job["total"], job["done"], job["requested_by"], job["source"]) == (
        "queued", 8, 0, "olga", "api")
    assert sent == [uuid.UUID(job["id"])]  # handed to a worker once it committed
    assert all(Run.objects.get(pk=run.id).control_id is None
               for group in ("queued", "awaiting", "running") for run in runs[group])

    assert domain.bulk_job_run(job_id=job["id"]) is False
    body = op_client.get(f"/api/bulk/{job['id']}/").json()
    assert (body["state"], body["done"], body["applied"], body["unchanged"], body["refused"]) \
        == ("done", 8, 7, 1, 0)
    assert body["started_at"] and body["finished_at"]
    for run in runs["queued"] + runs["awaiting"]:
        run = Run.objects.select_related("control").get(pk=run.id)
        assert (run.state, run.end_cause) == ("ended", "cancelled")
        assert (run.control.requested_by, run.control.source, run.control.reason) == (
            "olga", "api", "clean-up")
    for run in runs["running"]:  # told; their attempts commit the end
        run = Run.objects.select_related("control").get(pk=run.id)
        assert run.state == "running" and run.control.applied_at is None
        assert run.control.requested_by == "olga"
    assert requests_of(runs["ended"][0].id) == ["someone"]  # nothing asked of an ended run
    check_counts(BulkJob.objects.get(pk=job["id"]))


def test_a_stop_by_filter_takes_the_runs_that_have_not_ended(op_client):
    mine = [queued_run(agent="demo.hang") for _ in range(3)]
    awaiting, _ = awaiting_run(agent="demo.hang")
    ended = queued_run(agent="demo.hang")
    domain.run_cancel(run_id=ended.id, actor="olga", source="api")
    other = queued_run(agent="demo.steps")
    body = {"action": "stop", "reason": "maintenance", "filter": {"agent": "demo.hang"}}
    preview = op_client.post("/api/bulk/preview/", {"filter": body["filter"]}, format="json")
    assert preview.status_code == 200 and preview.json() == {"total": 4, "live": 4}
    job = op_client.post("/api/bulk/", body, format="json").json()
    assert job["total"] == preview.json()["total"]
    assert job["filter"] == {"agent": "demo.hang"}
    domain.bulk_job_run(job_id=job["id"])
    for run in [*mine, awaiting]:
        run = Run.objects.get(pk=run.id)
        assert (run.end_cause, run.stop_code, run.stop_reason) == (
            "stopped", "operator", "maintenance")
    assert Run.objects.get(pk=other.id).state == "queued"
    assert Run.objects.get(pk=ended.id).end_cause == "cancelled"


def test_the_preview_counts_what_the_job_takes(op_client):
    runs = mixed_runs()
    ids = [str(run.id) for group in runs.values() for run in group]
    by_ids = op_client.post("/api/bulk/preview/", {"ids": ids + ids[:2]}, format="json")
    assert by_ids.json() == {"total": 8, "live": 7}
    queued_only = {"filter": {"status": ["queued", "awaiting"]}}
    preview = op_client.post("/api/bulk/preview/", queued_only, format="json").json()
    assert preview == {"total": 5, "live": 5}
    job = op_client.post("/api/bulk/", {"action": "cancel", **queued_only}, format="json")
    assert job.json()["total"] == 5
    assert op_client.post("/api/bulk/", {"action": "cancel", "ids": ids + ids[:2]},
                          format="json").json()["total"] == 8


def test_an_abort_stops_the_job_midway_with_a_consistent_count(op_client):
    runs = [queued_run() for _ in range(10)]
    job = op_client.post("/api/bulk/", {"action": "cancel",
                                        "ids": [str(run.id) for run in runs]},
                         format="json").json()
    assert domain.bulk_job_run(job_id=job["id"], budget=4) is True  # a slice, more left
    aborted = op_client.post(f"/api/bulk/{job['id']}/abort/")
    assert aborted.status_code == 200
    body = aborted.json()
    assert (body["state"], body["done"], body["aborted_by"]) == ("aborted", 4, "olga")
    assert domain.bulk_job_run(job_id=job["id"]) is False  # a message still on its way
    cancelled = Run.objects.filter(pk__in=[run.id for run in runs], state="ended")
    assert cancelled.count() == 4
    assert set(cancelled.values_list("pk", flat=True)) == set(BulkItem.objects.filter(
        job_id=job["id"], outcome="applied").values_list("run_id", flat=True))
    check_counts(BulkJob.objects.get(pk=job["id"]))
    again = op_client.post(f"/api/bulk/{job['id']}/abort/").json()
    assert (again["state"], again["version"]) == ("aborted", body["version"])


def test_a_job_aborted_before_it_starts_touches_nothing(op_client):
    runs = [queued_run() for _ in range(3)]
    job = op_client.post("/api/bulk/", {"action": "cancel",
                                        "ids": [str(run.id) for run in runs]},
                         format="json").json()
    op_client.post(f"/api/bulk/{job['id']}/abort/")
    assert domain.bulk_job_run(job_id=job["id"]) is False
    assert not ControlIntent.objects.exists()
    assert BulkJob.objects.get(pk=job["id"]).done == 0


class WorkerDied(BaseException):
    """The worker process stops in the middle of a run: its transaction never commits."""


def test_a_job_resumed_after_its_worker_died_handles_each_run_once(op_client, monkeypatch,
                                                                   sent):
    runs = [queued_run() for _ in range(6)]
    job = op_client.post("/api/bulk/", {"action": "cancel",
                                        "ids": [str(run.id) for run in runs]},
                         format="json").json()
    real, calls = bulk_domain.run_cancel, []

    def dies_on_the_fourth(**kwargs):
        calls.append(kwargs["run_id"])
        result = real(**kwargs)  # its intent is written, then the process dies
        if len(calls) == 4:
            raise WorkerDied()
        return result

    monkeypatch.setattr(bulk_domain, "run_cancel", dies_on_the_fourth)
    with pytest.raises(WorkerDied):
        domain.bulk_job_run(job_id=job["id"])
    monkeypatch.setattr(bulk_domain, "run_cancel", real)
    stalled = BulkJob.objects.get(pk=job["id"])
    assert (stalled.state, stalled.done) == ("running", 3)
    assert Run.objects.filter(state="ended").count() == 3  # the fourth rolled back

    # The sweeper sends the job again once nobody has moved it on for two leases.
    sent.clear()
    assert domain.sweep()["bulk_resent"] == 0
    BulkJob.objects.filter(pk=job["id"]).update(heartbeat_at=timezone.now() - timedelta(
        minutes=5))
    assert domain.sweep()["bulk_resent"] == 1 and sent == [uuid.UUID(job["id"])]
    assert domain.sweep()["bulk_resent"] == 0  # sent once
    domain.bulk_job_run(job_id=job["id"])
    domain.bulk_job_run(job_id=job["id"])  # and the redelivered first message
    job = BulkJob.objects.get(pk=job["id"])
    assert (job.state, job.done, job.applied) == ("done", 6, 6)
    for run in runs:
        assert requests_of(run.id) == ["olga"]
        assert Event.objects.filter(run_id=run.id, kind="ended").count() == 1
    check_counts(job)


def test_a_refused_run_is_counted_and_the_job_goes_on(op_client, monkeypatch):
    runs = [queued_run() for _ in range(3)]
    real = bulk_domain.run_cancel

    def refuses_the_second(**kwargs):
        if kwargs["run_id"] == runs[1].id:
            raise InvalidRequest("Not this one.")
        return real(**kwargs)

    monkeypatch.setattr(bulk_domain, "run_cancel", refuses_the_second)
    job = op_client.post("/api/bulk/", {"action": "cancel",
                                        "ids": [str(run.id) for run in runs]},
                         format="json").json()
    domain.bulk_job_run(job_id=job["id"])
    body = op_client.get(f"/api/bulk/{job['id']}/").json()
    assert (body["state"], body["applied"], body["refused"]) == ("done", 2, 1)
    item = BulkItem.objects.get(job_id=job["id"], run_id=runs[1].id)
    assert (item.outcome, item.detail) == ("refused", "Not this one.")
    assert Run.objects.get(pk=runs[1].id).state == "queued"


def test_past_jobs_are_listed_newest_first_with_who_and_how(op_client, viewer_client):
    made = []
    for _ in range(3):
        run = queued_run()
        made.append(op_client.post("/api/bulk/", {"action": "cancel", "ids": [str(run.id)]},
                                   format="json").json()["id"])
    domain.bulk_job_run(job_id=made[0])
    first = viewer_client.get("/api/bulk/?limit=2").json()
    rest = viewer_client.get(first["next"]).json()
    assert [job["id"] for job in first["results"] + rest["results"]] == made[::-1]
    assert rest["next"] is None
    oldest = rest["results"][0]
    assert (oldest["requested_by"], oldest["state"], oldest["applied"]) == ("olga", "done", 1)


def test_progress_is_pushed_to_the_run_list(op_client, monkeypatch,
                                            django_capture_on_commit_callbacks):
    pushed = []
    monkeypatch.setattr(stream, "publish", lambda messages: pushed.extend(messages))
    runs = [queued_run() for _ in range(3)]
    with django_capture_on_commit_callbacks(execute=True):
        job = op_client.post("/api/bulk/", {"action": "cancel",
                                            "ids": [str(run.id) for run in runs]},
                             format="json").json()
    with django_capture_on_commit_callbacks(execute=True):
        domain.bulk_job_run(job_id=job["id"])
    jobs = [json.loads(m["text"])["job"] for m in pushed if m["type"] == "bulk.changed"]
    assert [j["state"] for j in jobs][0] == "queued" and jobs[-1]["state"] == "done"
    assert jobs[-1]["done"] == 3 and jobs[-1]["id"] == job["id"]
    # Clients keep the newest version: the last state has the highest.
    assert jobs[-1]["version"] == max(j["version"] for j in jobs)


def test_a_bulk_push_reaches_the_list_sockets_only():
    async def body():
        every, one = [], []

        async def to_every(text):
            every.append(text)

        async def to_one(text):
            one.append(text)

        async def nothing():
            pass

        whole, single = Outbox(to_every, nothing), Outbox(to_one, nothing)
        run_id = str(uuid.uuid4())
        await stream.join(whole)
        await stream.join(single, run_id)
        try:
            text = json.dumps({"type": "bulk.changed", "job": {"id": "j", "version": 2}})
            stream.publish([{"type": "bulk.changed", "text": text}])
            deadline = time.monotonic() + 5
            while not every and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert every == [text] and one == []
        finally:
            for outbox, follows in ((whole, None), (single, run_id)):
                stream.leave(outbox, follows)
                outbox.close()

    async_to_sync(body)()


@pytest.mark.parametrize("who, body, status, field", [
    ("op", {"action": "cancel"}, 400, "either"),
    ("op", {"action": "cancel", "ids": ["{run}"], "filter": {}}, 400, "either"),
    ("op", {"action": "cancel", "ids": []}, 400, "ids"),
    ("op", {"action": "cancel", "ids": ["00000000-0000-0000-0000-000000000000"]}, 400, "No run"),
    ("op", {"action": "cancel", "ids": ["nope"]}, 400, "ids"),
    ("op", {"action": "stop", "ids": ["{run}"]}, 400, "reason"),
    ("op", {"action": "stop", "ids": ["{run}"], "reason": "   "}, 400, "reason"),
    ("op", {"action": "pause", "ids": ["{run}"]}, 400, "action"),
    ("op", {"action": "cancel", "filter": {"agent": "no.such.agent"}}, 400, "filter"),
    ("op", {"action": "cancel", "filter": {"colour": "red"}}, 400, "filter.colour"),
    ("op", {"action": "cancel", "filter": {"status": "running,bogus"}}, 400, "status"),
    ("op", {"action": "cancel", "filter": {"created_after": "2026-01-01T00:00:00"}}, 400,
     "offset"),
    ("op", {"action": "cancel", "ids": ["{run}"], "priority": 1}, 400, "priority"),
    ("op", {"action": "cancel", "filter": {}}, 400, "more than 2"),
    ("viewer", {"action": "cancel", "ids": ["{run}"]}, 403, "role"),
])
def test_bad_jobs_are_refused_and_change_nothing(op_client, viewer_client, settings, who,
                                                 body, status, field):
    settings.AWAKEN_BULK_MAX_RUNS = 2
    runs = [queued_run() for _ in range(3)]
    body = json.loads(json.dumps(body).replace("{run}", str(runs[0].id)))
    client = op_client if who == "op" else viewer_client
    before = state()
    response = client.post("/api/bulk/", body, format="json")
    assert response.status_code == status, response.json()
    assert field in response.json()["detail"], response.json()
    assert state() == before


@pytest.mark.parametrize("body, field", [
    ({}, "either"),
    ({"ids": ["{run}"], "filter": {"agent": "demo.steps"}}, "either"),
    ({"ids": ["00000000-0000-0000-0000-000000000000"]}, "No run"),
    ({"filter": {}}, "more than 2"),
    ({"filter": {"id_prefix": "xyz"}}, "id_prefix"),
])
def test_bad_previews_are_refused(op_client, viewer_client, settings, body, field):
    settings.AWAKEN_BULK_MAX_RUNS = 2
    runs = [queued_run() for _ in range(3)]
    body = json.loads(json.dumps(body).replace("{run}", str(runs[0].id)))
    response = op_client.post("/api/bulk/preview/", body, format="json")
    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert field in response.json()["detail"], response.json()
    refused = viewer_client.post("/api/bulk/preview/", {"ids": [str(runs[0].id)]},
                                 format="json")
    assert refused.status_code == 403


def test_an_unknown_job_is_not_found(op_client, viewer_client):
    for path in ("/api/bulk/00000000-0000-0000-0000-000000000000/", "/api/bulk/nope/",
                 "/api/bulk/preview/"):  # a path of its own, and as a job's id malformed
        response = viewer_client.get(path)
        assert (response.status_code, response.json()["code"]) == (404, "not_found")
        response = op_client.post(path + "abort/")
        assert (response.status_code, response.json()["code"]) == (404, "not_found")


def test_a_viewer_reads_jobs_but_cannot_abort(op_client, viewer_client):
    run = queued_run()
    job = op_client.post("/api/bulk/", {"action": "cancel", "ids": [str(run.id)]},
                         format="json").json()
    assert viewer_client.get(f"/api/bulk/{job['id']}/").status_code == 200
    assert viewer_client.post(f"/api/bulk/{job['id']}/abort/").status_code == 403
    assert BulkJob.objects.get(pk=job["id"]).state == "queued"


# --- real concurrency (PostgreSQL) ---------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_workers_on_one_job_handle_each_run_once(gang):
    runs = [queued_run() for _ in range(40)]
    job = domain.bulk_create(action="cancel", ids=[run.id for run in runs],
                             requested_by="olga", source="api")
    results = gang(3).run([lambda: domain.bulk_job_run(job_id=job.id) for _ in range(3)])
    assert not [r for r in results if isinstance(r, BaseException)], results
    job.refresh_from_db()
    assert (job.state, job.done, job.applied) == ("done", 40, 40)
    for run in runs:
        assert requests_of(run.id) == ["olga"]
    check_counts(job)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_abort_while_the_job_runs_leaves_exactly_the_counted_runs_changed(gang):
    for _ in range(5):
        runs = [queued_run() for _ in range(60)]
        job = domain.bulk_create(action="cancel", ids=[run.id for run in runs],
                                 requested_by="olga", source="api")
        domain.bulk_job_run(job_id=job.id, budget=1)  # running

        def abort_soon(job_id=job.id):
            time.sleep(0.02)
            return domain.bulk_job_abort(job_id=job_id, actor="olga")

        results = gang(2).run([lambda job_id=job.id: domain.bulk_job_run(job_id=job_id),
                               abort_soon])
        assert not [r for r in results if isinstance(r, BaseException)], results
        aborted = results[1]
        job.refresh_from_db()
        # The counts the abort answered with are final, and name exactly the changed runs.
        assert job.state == "aborted" and job.done == aborted.done
        ended = Run.objects.filter(pk__in=[run.id for run in runs], state=RunState.ENDED)
        assert ended.count() == job.done == job.applied
        check_counts(job)
