"""The embedded default of ``make run``: one process serving web, worker and sweeper on
SQLite, the in-memory broker and the in-memory channel layer. Started as a user would."""

import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from harness.processes import wait_until

# No test here uses the test database: its verdict is the same on either backend.
pytestmark = pytest.mark.one_backend


def test_first_start_creates_an_admin_operator(embedded_site):
    assert embedded_site.admin_password
    assert "Created operator 'admin' with password:" in embedded_site.log()


def test_the_start_warns_of_no_broker_host_it_does_not_use(embedded_site):
    """The in-memory broker names its host: kombu says nothing of "No hostname"."""
    assert "No hostname was supplied" not in embedded_site.log()


def test_a_run_completes(embedded_site):
    status, run = embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.steps", "input": {"steps": 2, "step_seconds": 0.05}})
    assert status == 201
    done = wait_until(lambda: (lambda r: r if r["state"] == "ended" else None)(
        embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]), 10, "completion")
    assert done["end_cause"] == "completed" and done["usage"]["steps"] == 2


def test_cancel_reaches_the_live_attempt(embedded_site):
    _, run = embedded_site.call("POST", "/api/runs/", {"agent": "demo.hang"})
    wait_until(lambda: embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]["state"] ==
               "running", 10, "the attempt to start")
    status, body = embedded_site.call("POST", f"/api/runs/{run['id']}/cancel/")
    assert status == 200
    assert body["end_cause"] == "cancelled" and body["control"]["delivered_at"]


def test_a_bulk_job_runs_on_the_in_process_worker(embedded_site):
    later = "2999-01-01T00:00:00+00:00"  # queued until then: the job finds them queued
    ids = [embedded_site.call("POST", "/api/runs/", {"agent": "demo.steps",
                                                     "start_after": later})[1]["id"]
           for _ in range(3)]
    status, job = embedded_site.call("POST", "/api/bulk/", {"action": "stop", "ids": ids,
                                                            "reason": "not needed"})
    assert status == 201, job
    done = wait_until(lambda: (lambda j: j if j["state"] == "done" else None)(
        embedded_site.call("GET", f"/api/bulk/{job['id']}/")[1]), 15, "the bulk job")
    assert (done["total"], done["done"], done["applied"]) == (3, 3, 3)
    for run_id in ids:
        run = embedded_site.call("GET", f"/api/runs/{run_id}/")[1]
        assert (run["end_cause"], run["stop_reason"]) == ("stopped", "not needed")


def test_the_demo_agents_answer_offline_from_the_provider_stub(embedded_site):
    assert "No model provider configured: the provider stub answers at" in embedded_site.log()
    _, chat = embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.chat", "input": {"prompts": ["Hello!"]}})
    _, research = embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.research", "input": {"question": "budget tokens"}})
    ends = [wait_until(lambda run=run: (lambda r: r if r["state"] == "ended" else None)(
        embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]), 30, "the end")
        for run in (chat, research)]
    assert [end["end_cause"] for end in ends] == ["completed", "completed"]
    assert ends[0]["output"]["replies"] == [
        "Hello! I am the provider stub of awaken-site, answering offline."]
    assert "provider's own usage figures" in ends[1]["output"]["answer"]
    assert ends[0]["usage"]["tokens"] > 0 and ends[1]["usage"]["steps"] == 2


def test_no_log_line_holds_a_review_token(embedded_site):
    _, run = embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.approval", "input": {"steps_before": 0, "step_seconds": 0}})
    wait_until(lambda: embedded_site.call("GET", f"/api/runs/{run['id']}/")[1]["state"] ==
               "awaiting", 10, "the run to await its approval")
    status, link = embedded_site.call("POST", f"/api/runs/{run['id']}/review-links/", {})
    assert status == 201
    path = urlsplit(link["url"]).path
    token = path.rstrip("/").rsplit("/", 1)[-1]
    assert embedded_site.call("GET", path)[0] == 200
    answer = {"name": "rita", "decision": "approve"}
    assert embedded_site.call("POST", path, answer)[0] == 200
    assert embedded_site.call("POST", path, answer)[0] == 410  # Django logs it too
    wait_until(lambda: embedded_site.log().count('"POST /review/…/" 410') == 1, 5,
               "the access log's line")
    assert token not in embedded_site.log()
    assert '"GET /review/…/" 200' in embedded_site.log()


def test_the_procfiles_web_sets_daphnes_timeouts_and_leaves_its_access_log_off():
    from harness.processes import ROOT

    web = next(line for line in (ROOT / "Procfile").read_text().splitlines()
               if line.startswith("web:"))
    assert " daphne -v 0 " in web  # daphne writes paths whole; awaken_site.logs redacts
    from harness.processes import DAPHNE_OPTIONS
    from runs.sockets.daphne import TIMEOUTS

    assert f" daphne {' '.join(DAPHNE_OPTIONS)} -b " in web  # the harness starts it alike
    for option, value in TIMEOUTS.items():  # and so does the embedded server
        flag = "--" + (option if "connect" in option else option.replace("_", "-"))
        assert f" {flag} {value} " in web, option


def test_make_run_starts_the_site_with_the_procfiles_memory_settings():
    """The Makefile's settings are the Procfile's web process's, jemalloc's left out where
    it is not installed (CI installs it), and so are the harness's."""
    import subprocess

    from harness.processes import ROOT, WEB_ENV, web_process_environment

    shown = subprocess.run(["make", "-s", "--no-print-directory", "--eval",
                            "show-memory:\n\t@echo $(WEB_MEMORY)", "show-memory"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    assert dict(word.split("=", 1) for word in shown) == web_process_environment() == WEB_ENV
    assert {"PYTHONMALLOC", "GLIBC_TUNABLES"} <= set(WEB_ENV)


def test_the_workers_fix_glibcs_thresholds_as_the_web_process_does():
    """The Procfile's worker process fixes glibc's thresholds as its web process does where
    jemalloc is not installed (a large model answer mapped alone and unmapped when freed),
    and the harness starts its workers with them (tests/test_bench.py sees them there)."""
    from harness.processes import WORKER_ENV, procfile_environment

    web = procfile_environment("web")
    assert WORKER_ENV == {"GLIBC_TUNABLES": web["GLIBC_TUNABLES"]}


def test_the_site_runs_on_jemalloc_where_it_is_installed(embedded_site):
    """The allocator that gives back what a burst took (docs/operations.md, "Hostile input,
    measured") is the one the process mapped."""
    from harness.processes import installed_library

    if not installed_library("libjemalloc.so.2"):
        pytest.skip("libjemalloc2 is not installed here (.ci/run installs it)")
    maps = Path(f"/proc/{embedded_site.pid}/maps").read_text()
    assert "libjemalloc.so.2" in maps


def test_var_and_the_sqlite_files_are_private(embedded_site):
    embedded_site.call("POST", "/api/runs/", {"agent": "demo.steps", "input": {"steps": 1}})
    assert stat.S_IMODE(os.stat(embedded_site.var).st_mode) == 0o700
    files = ["awaken.sqlite3", "awaken.sqlite3-wal", "awaken.sqlite3-shm"]
    for name in files:  # WAL mode: the companions exist while the site runs
        assert stat.S_IMODE(os.stat(embedded_site.var / name).st_mode) == 0o600, name
