"""Benchmarks that print figures: ``manage.py bench cancel``.

It starts its own web (daphne) and worker processes against the configured database and
broker (PostgreSQL and Redis for meaningful figures), drives them over HTTP like a script
would, and prints p50/p95/p99. Nothing here asserts a time: it measures.
"""

import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from runs.models import Run, RunState


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) < 2:
        value = samples[0] if samples else float("nan")
        return value, value, value
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[94], cuts[98]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Processes:
    """Child processes of the benchmark, stopped however it ends."""

    def __init__(self, env):
        self.env = env
        self.children = []
        self.logs = tempfile.mkdtemp(prefix="awaken-bench-")

    def start(self, name, *argv):
        log = open(os.path.join(self.logs, f"{name}.log"), "w")
        self.children.append(subprocess.Popen(argv, env=self.env, stdout=log,
                                              stderr=subprocess.STDOUT,
                                              cwd=settings.BASE_DIR))
        return self.children[-1]

    def stop(self):
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()


class Client:
    def __init__(self, port: int, token: str):
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}

    def call(self, method, path, body=None):
        self.connection.request(method, path, body=json.dumps(body) if body is not None else None,
                                headers=self.headers)
        response = self.connection.getresponse()
        return response.status, json.loads(response.read() or b"null")


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise CommandError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Command(BaseCommand):
    help = "Measure live cancel latency (REST call -> committed end, -> 200) and a baseline."

    def add_arguments(self, parser):
        parser.add_argument("what", choices=["cancel"])
        parser.add_argument("--live", default="1,100,500",
                            help="Numbers of other live attempts on the worker (comma list).")
        parser.add_argument("--cancels", type=int, default=300, help="Samples per level.")
        parser.add_argument("--batch", type=int, default=25,
                            help="Runs started together before they are cancelled one by one.")
        parser.add_argument("--no-baseline", action="store_true")

    def handle(self, what, live, cancels, batch, no_baseline, **options):
        if not settings.REDIS_URL or "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
            self.stderr.write("Note: for meaningful figures set DATABASE_URL (PostgreSQL) and "
                              "REDIS_URL; measuring on the configured defaults.")
        levels = [int(n) for n in live.split(",")]
        token = self.bench_user_token()
        queue = f"awaken-bench-{uuid.uuid4().hex[:8]}"
        env = {**os.environ, "AWAKEN_QUEUE": queue,
               "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE",
                                                        "awaken_site.settings")}
        processes = Processes(env)
        rows = []
        try:
            port = free_port()
            processes.start("web", sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p",
                            str(port), "awaken_site.asgi:application")
            processes.start("worker", sys.executable, "-m", "celery", "-A", "awaken_site",
                            "worker", "--pool", "threads", "--concurrency", "8", "-n",
                            f"bench-{queue}@%h", "-Q", queue, "--without-mingle",
                            "--without-gossip", "--loglevel", "WARNING")
            wait_until(lambda: self.healthy(port), 60, "the web and worker processes")
            client = Client(port, token)
            for level in levels:
                rows += self.measure_level(client, level, cancels, batch)
            if not no_baseline:
                rows.append(self.baseline(processes, queue, cancels))
        finally:
            processes.stop()
            self.cleanup()
        self.print_table(rows, cancels)

    # --- set-up -------------------------------------------------------------------------

    def bench_user_token(self) -> str:
        from io import StringIO

        out = StringIO()
        call_command("operator_token", "bench", "--role", "operator", "--create", stdout=out)
        return out.getvalue().strip()

    def healthy(self, port) -> bool:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/healthz")
            return json.loads(connection.getresponse().read()).get("workers", 0) >= 1
        except OSError:
            return False

    def cleanup(self):
        """End whatever the benchmark left live, so no run of it stays running."""
        for run_id in Run.objects.filter(created_by__username="bench").exclude(
                state=RunState.ENDED).values_list("id", flat=True):
            from runs import services

            services.run_stop(run_id=run_id, actor="bench", source="cli",
                              reason="benchmark finished")

    # --- measurements ---------------------------------------------------------------------

    def create(self, client, agent, input=None) -> str:
        status, body = client.call("POST", "/api/runs/", {"agent": agent, "input": input or {}})
        if status != 201:
            raise CommandError(f"create failed: {status} {body}")
        return body["id"]

    def measure_level(self, client, level: int, cancels: int, batch: int) -> list:
        background = [self.create(client, "demo.steps", {"steps": 1, "step_seconds": 86400})
                      for _ in range(level)]
        wait_until(lambda: Run.objects.filter(pk__in=background, state=RunState.RUNNING).count()
                   == len(background), 120, f"{level} live attempts")
        committed, answered, codes = [], [], {}
        while len(answered) < cancels:
            runs = [self.create(client, "demo.hang")
                    for _ in range(min(batch, cancels - len(answered)))]
            wait_until(lambda: Run.objects.filter(pk__in=runs, state=RunState.RUNNING).count()
                       == len(runs), 60, "the runs to cancel to start")
            for run_id in runs:
                sent_wall, sent = time.time(), time.monotonic()
                status, body = client.call("POST", f"/api/runs/{run_id}/cancel/", {})
                answered.append((time.monotonic() - sent) * 1000)
                codes[status] = codes.get(status, 0) + 1
                ended_at = Run.objects.values_list("ended_at", flat=True).get(pk=run_id)
                if ended_at is not None:
                    committed.append((ended_at.timestamp() - sent_wall) * 1000)
        for run_id in background:
            client.call("POST", f"/api/runs/{run_id}/cancel/?wait=0", {})
        note = ", ".join(f"{code}: {count}" for code, count in sorted(codes.items()))
        return [(level, "REST cancel -> ended/cancelled committed", committed, note),
                (level, "REST cancel -> 200 response", answered, "")]

    def baseline(self, processes, queue, cancels) -> tuple:
        """Celery's own revoke(terminate=True) of a plain hanging task on a prefork worker."""
        import redis

        from awaken_site.celery import app
        from runs.bench_tasks import bench_hang

        node = f"bench-prefork-{queue}@{socket.gethostname()}"
        processes.start("prefork", sys.executable, "-m", "celery", "-A", "awaken_site",
                        "worker", "--pool", "prefork", "--concurrency", "2", "-n", node, "-Q",
                        f"{queue}-prefork", "-I", "runs.bench_tasks", "--without-mingle",
                        "--without-gossip", "--loglevel", "WARNING")
        wait_until(lambda: bool(app.control.ping(destination=[node], timeout=0.5)), 60,
                   "the prefork worker")
        client = redis.Redis.from_url(settings.REDIS_URL)
        samples = []
        for _ in range(cancels):
            key = f"awaken-bench:{uuid.uuid4().hex}"
            result = bench_hang.apply_async(args=[key], queue=f"{queue}-prefork")
            wait_until(lambda: client.exists(f"{key}:started"), 30, "the plain task to start")
            sent = time.time()
            app.control.revoke(result.id, terminate=True, signal="SIGUSR1")
            wait_until(lambda: client.exists(f"{key}:stopped"), 30, "the plain task to stop")
            samples.append((float(client.get(f"{key}:stopped")) - sent) * 1000)
            client.delete(f"{key}:started", f"{key}:stopped")
        return ("-", "baseline: revoke(terminate=True) -> plain task interrupted", samples,
                "prefork -c 2")

    def print_table(self, rows, cancels):
        self.stdout.write(f"\nLive cancel latency, {os.cpu_count()} cores, "
                          f"{settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}, "
                          f"broker {settings.CELERY_BROKER_URL.split(':', 1)[0]}; "
                          f"{cancels} cancels per level; ms\n")
        header = f"{'live':>5}  {'measurement':<58}{'n':>5}{'p50':>9}{'p95':>9}{'p99':>9}  note"
        self.stdout.write(header)
        self.stdout.write("-" * len(header))
        for level, name, samples, note in rows:
            p50, p95, p99 = percentiles(samples)
            self.stdout.write(f"{level!s:>5}  {name:<58}{len(samples):>5}{p50:>9.2f}{p95:>9.2f}"
                              f"{p99:>9.2f}  {note}")
