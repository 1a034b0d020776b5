"""The Procfile's ``beat`` starts from a bare checkout (no ``var/``, nothing made first) and
sweeps in its own process (tests/test_faults.py shows it sweeping with every worker frozen)."""

import os
import sys

import pytest

from harness.processes import Process, wait_until

# Beat runs on settings of its own, with an unreachable database and the in-memory broker.
pytestmark = pytest.mark.ignores_database_url


def test_beat_starts_without_a_var_directory_and_sweeps_itself(tmp_path):
    var = tmp_path / "var"  # does not exist, as in a fresh checkout on a beat-only machine
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env.update(
        DJANGO_SETTINGS_MODULE="awaken_site.settings", SECRET_KEY="beat-test", DEBUG="0",
        AWAKEN_VAR_DIR=str(var), AWAKEN_LEASE_SECONDS="3",  # a sweep every second
        # A PostgreSQL URL keeps the settings from making var/ for a SQLite file, as on a
        # production machine; nothing answers there, so each sweep fails and beat goes on.
        DATABASE_URL="postgres://awaken@127.0.0.1:9/unused", CELERY_BROKER_URL="memory://")
    argv = [sys.executable, "-m", "celery", "-A", "awaken_site", "beat", "--loglevel", "INFO"]
    with Process(argv, name="beat", env=env) as beat:
        wait_until(lambda: not beat.running() or beat.log().count("sweep failed") >= 2,
                   timeout=60, what="beat to sweep twice", every=0.1)
        assert beat.running(), beat.output()
        assert "sweeping every 1 s in beat's process" in beat.log()
        assert "runs.sweep" not in beat.log()  # no sweep task for a worker to run
    assert not var.exists()  # it wrote nothing there either
