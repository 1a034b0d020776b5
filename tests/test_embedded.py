"""The embedded default of ``make run``: one process serving web, worker and sweeper on
SQLite, the in-memory broker and the in-memory channel layer. Started as a user would."""

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import wait_for
from tests.workers import ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    var = tmp_path_factory.mktemp("var")
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "AWAKEN_QUEUE",
                          "DJANGO_SETTINGS_MODULE")}
    env.update(AWAKEN_VAR_DIR=str(var), SECRET_KEY="embedded-test", DEBUG="0")

    def manage(*args):
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                              check=True, capture_output=True, text=True).stdout

    manage("migrate", "--no-input")
    port = free_port()
    log = open(var / "serve.log", "w")
    server = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port)],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def healthy():
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
                return json.load(response)["workers"] >= 1
        except OSError:
            return server.poll() is not None and pytest.fail((var / "serve.log").read_text())

    wait_for(healthy, 30, "the embedded site to start")
    token = manage("operator_token", "admin").strip()
    yield base, token, var
    server.terminate()
    server.wait(10)


def call(site, method, path, body=None):
    base, token, _ = site
    request = urllib.request.Request(
        f"{base}{path}", method=method, data=json.dumps(body).encode() if body else None,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_first_start_creates_an_admin_operator(site):
    _, _, var = site
    assert "Created operator 'admin' with password:" in (var / "serve.log").read_text()


def test_a_run_completes(site):
    status, run = call(site, "POST", "/api/runs/",
                       {"agent": "demo.steps", "input": {"steps": 2, "step_seconds": 0.05}})
    assert status == 201
    done = wait_for(lambda: (lambda r: r if r["state"] == "ended" else None)(
        call(site, "GET", f"/api/runs/{run['id']}/")[1]), 10, "completion")
    assert done["end_cause"] == "completed" and done["usage"]["steps"] == 2


def test_cancel_reaches_the_live_attempt(site):
    _, run = call(site, "POST", "/api/runs/", {"agent": "demo.hang"})
    wait_for(lambda: call(site, "GET", f"/api/runs/{run['id']}/")[1]["state"] == "running",
             10, "the attempt to start")
    status, body = call(site, "POST", f"/api/runs/{run['id']}/cancel/")
    assert status == 200
    assert body["end_cause"] == "cancelled" and body["control"]["delivered_at"]
