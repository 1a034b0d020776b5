"""Real ``celery worker`` processes for the execution tests, on the test database."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

from django.conf import settings
from django.db import connection

from awaken_site.celery import app

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def database_url() -> str:
    db = connection.settings_dict
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return (f"postgres://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:"
            f"{db['PORT'] or 5432}/{db['NAME']}")


class Worker:
    """One worker process; ``node`` is its Celery node name (owner of its attempts)."""

    def __init__(self, name: str | None = None, *, lease_seconds: float = 1.5,
                 concurrency: int = 4, private: bool = False, extra_env: dict | None = None,
                 broker: str | None = None):
        """``private``: consume only the worker's own queue (``self.queue``), so a test
        decides exactly which runs it takes. ``broker``: another broker than the tests'."""
        self.name = name or f"t{uuid.uuid4().hex[:8]}"
        self.node = f"{self.name}@{socket.gethostname()}"
        self.queue = self.name if private else settings.CELERY_TASK_DEFAULT_QUEUE
        self.log = tempfile.NamedTemporaryFile(prefix=f"worker-{self.name}-", suffix=".log",
                                               delete=False)
        env = {**os.environ, "DATABASE_URL": database_url(),
               "DJANGO_SETTINGS_MODULE": "tests.settings",
               "AWAKEN_LEASE_SECONDS": str(lease_seconds), **(extra_env or {})}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "awaken_site", "worker", "--pool", "threads",
             "--concurrency", str(concurrency), "-n", self.node, "--without-mingle",
             "--without-gossip", "-Q", self.queue, "--loglevel", "INFO"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.control = app.control
        if broker is not None:
            from celery import Celery

            self.control = Celery(broker=broker).control
        self.wait_ready()

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker {self.node} exited: {self.output()}")
            if self.control.ping(destination=[self.node], timeout=0.5):
                return
        raise RuntimeError(f"worker {self.node} did not answer a ping: {self.output()}")

    def output(self) -> str:
        with open(self.log.name) as log:
            return log.read()[-4000:]

    def take(self, run_id) -> None:
        """Send this worker the task of a run created with ``dispatch=False``."""
        from runs.tasks import execute

        execute.apply_async(args=[[str(run_id)]], queue=self.queue)

    def signal(self, signum) -> None:
        self.process.send_signal(signum)

    def kill(self) -> None:
        """kill -9: no cleanup of any kind."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
