"""The README's picture of the operator page, redrawn on demand: ``manage.py screenshot``.

It starts an embedded site of its own (``manage.py serve``, SQLite in a temporary
directory, nothing of ``var/`` touched), starts runs over the API until the list shows each
state and end cause, logs in as the site's operator and has Debian's chromium draw the page.
The tests run it with ``--output`` into a temporary file: no test rewrites the picture.
"""

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

CHROMIUM = "/usr/bin/chromium"

# Variables that would point the site at shared services or files outside its directory;
# the picture needs none of them.
SHARED = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "AWAKEN_QUEUE", "STATIC_ROOT",
          "DJANGO_SETTINGS_MODULE")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise CommandError(f"timed out waiting for {what}")
        time.sleep(0.1)
    return value


class Site:
    """An embedded site in a directory of its own, started as ``make run`` starts one."""

    def __init__(self, var_dir: Path):
        self.env = {key: value for key, value in os.environ.items() if key not in SHARED}
        self.env.update(AWAKEN_VAR_DIR=str(var_dir), SECRET_KEY=secrets.token_urlsafe(50),
                        DEBUG="0")
        self.manage("migrate", "--no-input")
        self.manage("collectstatic", "--no-input")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = var_dir / "serve.log"
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "serve", "--port", str(self.port)],
                cwd=settings.BASE_DIR, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(self.healthy, 60, "the embedded site to start")
            found = re.search(r"Created operator 'admin' with password: (\S+)",
                              self.log_path.read_text())
            if not found:
                raise CommandError(f"the site created no operator:\n{self.log_path.read_text()}")
            self.password = found.group(1)
            self.token = self.manage("operator_token", "admin").strip()
        except BaseException:
            self.stop()
            raise

    def manage(self, *args) -> str:
        result = subprocess.run([sys.executable, "manage.py", *args], cwd=settings.BASE_DIR,
                                env=self.env, capture_output=True, text=True)
        if result.returncode:
            raise CommandError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            raise CommandError(f"the site exited:\n{self.log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{self.base}/healthz", timeout=2) as response:
                return json.load(response)["workers"] >= 1
        except OSError:
            return False

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            f"{self.base}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Token {self.token}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=15) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            raise CommandError(f"{method} {path}: {error.code} {error.read()!r}") from None

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Command(BaseCommand):
    help = ("Draw the operator page, with runs in each state, into docs/operator-page.png "
            "(Debian's chromium, on an embedded site of the command's own).")

    def add_arguments(self, parser):
        parser.add_argument("--output", type=Path,
                            default=Path(settings.BASE_DIR) / "docs" / "operator-page.png")
        parser.add_argument("--size", default="1280x800", help="Viewport, WIDTHxHEIGHT.")
        parser.add_argument("--chromium", default=CHROMIUM)

    def handle(self, output, size, chromium, **options):
        try:
            width, height = (int(n) for n in size.lower().split("x"))
        except ValueError:
            raise CommandError(f"--size must be WIDTHxHEIGHT, not {size!r}") from None
        if not os.path.exists(chromium):
            raise CommandError(f"no chromium at {chromium} (apt-get install chromium)")
        with tempfile.TemporaryDirectory(prefix="awaken-screenshot-") as var_dir:
            site = Site(Path(var_dir))
            try:
                count = self.start_runs(site)
                self.draw(site, count, output, width, height, chromium)
            finally:
                site.stop()
        self.stdout.write(f"Wrote {output} ({width}x{height})", self.style.SUCCESS)

    def start_runs(self, site: Site) -> int:
        """Runs in every state and end cause, the running one newest; their number."""

        def start(agent: str, input: dict, **extra) -> str:
            return site.call("POST", "/api/runs/", {"agent": agent, "input": input,
                                                     **extra})["id"]

        def reaches(run_id: str, status: str) -> None:
            def there():
                run = site.call("GET", f"/api/runs/{run_id}/")
                return status in (run["state"], run["end_cause"])

            wait_until(there, 30, f"run {run_id} to be {status}")

        later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        stopped, cancelled = start("demo.hang_tool", {}), start("demo.hang", {})
        expected = {
            start("demo.steps", {"steps": 2, "step_seconds": 0.1}): "completed",
            start("demo.fail", {"steps": 1}): "failed",
            stopped: "stopped",
            cancelled: "cancelled",
            start("demo.approval", {"steps_before": 1, "step_seconds": 0.1}): "awaiting",
            start("demo.steps", {"steps": 5}, start_after=later): "queued",
            start("demo.steps", {"steps": 600, "step_seconds": 1}): "running",
        }
        for run_id in (stopped, cancelled):
            reaches(run_id, "running")
        site.call("POST", f"/api/runs/{stopped}/stop/?wait=2", {"reason": "over the time box"})
        site.call("POST", f"/api/runs/{cancelled}/cancel/?wait=2", {})
        for run_id, status in expected.items():
            reaches(run_id, status)
        return len(expected)

    def draw(self, site: Site, count: int, output: Path, width: int, height: int,
             chromium: str) -> None:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise CommandError("needs Playwright: pip install -e '.[dev]'") from None

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium, headless=True,
                args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                      "--disable-background-networking", "--disable-component-update",
                      "--disable-sync"])
            try:
                page = browser.new_page(viewport={"width": width, "height": height})
                page.set_default_timeout(15_000)
                page.goto(f"{site.base}/")
                page.fill('input[name="username"]', "admin")
                page.fill('input[name="password"]', site.password)
                page.click('button[type="submit"]')
                page.wait_for_selector('#live[data-status="live"]')
                page.wait_for_function(
                    "n => document.querySelectorAll('#run-rows tr.run').length >= n", arg=count)
                output.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(output))
            finally:
                browser.close()
