"""The ``awaken`` console script against the embedded site, run as a user runs it: exit
statuses, ``--json``, the config file of ``awaken login``, and controls recorded as ``cli``."""

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

AWAKEN = shutil.which("awaken", path=str(Path(sys.executable).parent))
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def awaken(embedded_site, tmp_path):
    """``awaken(*args)``: the command's exit status, stdout and stderr, configured by the
    environment (or, with ``env=False``, by the config file alone). It runs the console
    script's ``main`` of this checkout."""
    config = tmp_path / "awaken.json"

    def run(*args, env=True, stdin=None):
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith("AWAKEN_")}
        environment.update(AWAKEN_CONFIG=str(config), COLUMNS="200")
        if env:
            environment.update(AWAKEN_URL=embedded_site.base, AWAKEN_TOKEN=embedded_site.token)
        done = subprocess.run([sys.executable, "-m", "runs.cli", *args], cwd=ROOT,
                              env=environment, input=stdin, capture_output=True, text=True,
                              timeout=60)
        return done.returncode, done.stdout, done.stderr

    run.config = config
    return run


def test_the_console_script_is_installed():
    assert AWAKEN is not None


def test_create_show_tail_and_cancel_with_exit_statuses(awaken, embedded_site):
    code, out, _ = awaken("runs", "create", "demo.steps", "--input",
                          '{"steps": 2, "step_seconds": 0.2}', "--json")
    assert code == 0
    run = json.loads(out)
    code, out, _ = awaken("runs", "tail", run["id"], "--json")
    assert code == 0
    messages = [json.loads(line) for line in out.splitlines()]
    last = messages[-1].get("run") or messages[-1]["runs"][0]  # a snapshot if it had ended
    assert last["state"] == "ended"
    code, out, _ = awaken("runs", "show", run["id"], "--json")
    assert code == 0 and json.loads(out)["end_cause"] == "completed"
    code, out, _ = awaken("runs", "show", run["id"])
    assert code == 0 and "ended/completed" in out

    # Refused by the server: 1, with its code on stderr.
    code, _, err = awaken("runs", "resume", run["id"], "--ticket", str(uuid.uuid4()))
    assert code == 1 and "not_awaiting" in err
    # Usage: 2; unreachable: 3.
    assert awaken("runs", "stop", run["id"])[0] == 2  # no --reason
    assert awaken("runs", "create", "demo.steps", "--input", "{")[0] == 2
    assert awaken("--url", "http://127.0.0.1:9", "runs", "ls")[0] == 3

    hung = json.loads(awaken("runs", "create", "demo.hang", "--json")[1])
    code, out, _ = awaken("runs", "cancel", hung["id"], "--json")
    assert code == 0
    cancelled = json.loads(out)
    assert cancelled["control"]["source"] == "cli"
    events = embedded_site.call("GET", f"/api/runs/{hung['id']}/events/")[1]["results"]
    assert {"cli"} <= {event["source"] for event in events}


def test_ls_filters_and_prints_a_table(awaken):
    run = json.loads(awaken("runs", "create", "demo.steps", "--input",
                            '{"steps": 1, "step_seconds": 0.01}', "--json")[1])
    code, out, _ = awaken("runs", "ls", "--agent", "demo.steps", "--limit", "5", "--json")
    assert code == 0
    listed = json.loads(out)
    assert len(listed) <= 5 and {r["agent"] for r in listed} == {"demo.steps"}
    assert run["id"] in [r["id"] for r in listed]
    code, out, _ = awaken("runs", "ls", "--q", run["id"][:8])
    assert code == 0 and "AGENT" in out and run["id"] in out


def test_bulk_dry_run_starts_nothing_and_the_job_runs(awaken, embedded_site):
    thread = f"cli-bulk-{uuid.uuid4()}"
    ids = [embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.steps", "thread_id": thread,
        "start_after": "2999-01-01T00:00:00+00:00"})[1]["id"] for _ in range(2)]
    code, out, _ = awaken("bulk", "stop", "--filter", f"thread_id={thread}", "--dry-run",
                          "--json")
    assert code == 0 and json.loads(out) == {"total": 2, "live": 2}
    assert {embedded_site.call("GET", f"/api/runs/{i}/")[1]["state"] for i in ids} == {"queued"}
    assert awaken("bulk", "stop", "--filter", f"thread_id={thread}")[0] == 2  # no reason
    assert awaken("bulk", "cancel", "--filter", "thread_id")[0] == 2
    code, _, err = awaken("bulk", "cancel", "--filter", "colour=blue")
    assert code == 1 and "invalid" in err

    code, out, _ = awaken("bulk", "stop", "--filter", f"thread_id={thread}", "--reason",
                          "tidy", "--json")
    assert code == 0
    job = json.loads(out)
    assert (job["state"], job["applied"], job["source"]) == ("done", 2, "cli")


def test_login_writes_a_private_config_file_used_afterwards(awaken, embedded_site):
    code, _, _ = awaken("--url", embedded_site.base, "--token", "wrong", "login", env=False)
    assert code == 1 and not awaken.config.exists()
    code, _, _ = awaken("--url", embedded_site.base, "login", env=False,
                        stdin=embedded_site.token + "\n")
    assert code == 0
    assert stat.S_IMODE(awaken.config.stat().st_mode) == 0o600
    assert json.loads(awaken.config.read_text())["url"] == embedded_site.base
    code, out, _ = awaken("runs", "ls", "--limit", "1", "--json", env=False)
    assert code == 0 and isinstance(json.loads(out), list)


def test_the_global_options_go_before_or_after_the_command(awaken, embedded_site):
    code, out, _ = awaken("--json", "runs", "create", "demo.steps", "--input",
                          '{"steps": 1, "step_seconds": 0.01}')
    assert code == 0
    run = json.loads(out)
    site = ["--url", embedded_site.base, "--token", embedded_site.token]
    for args in ([*site, "--json", "runs", "show", run["id"]],
                 ["runs", "show", run["id"], *site, "--json"],
                 ["--url", embedded_site.base, "runs", "show", "--json", run["id"],
                  "--token", embedded_site.token]):
        code, out, err = awaken(*args, env=False)  # no environment, no config file
        assert code == 0, (args, err)
        assert json.loads(out)["id"] == run["id"]
    code, out, _ = awaken("runs", "show", run["id"], *site, env=False)
    assert code == 0 and out.startswith(run["id"])  # text without --json
    # Given after the command, an option wins over the same one before it and over the
    # environment (AWAKEN_URL and AWAKEN_TOKEN are set here).
    assert awaken("--url", embedded_site.base, "runs", "ls", "--url",
                  "http://127.0.0.1:9")[0] == 3
    assert awaken("runs", "ls", "--url", "http://127.0.0.1:9")[0] == 3
    code, _, err = awaken("workers", "ls", "--token", "wrong")
    assert code == 1 and "authentication_failed" in err
    assert awaken("runs", "ls", "--url")[0] == 2  # an option without its value
