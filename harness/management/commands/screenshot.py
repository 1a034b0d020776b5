"""The README's pictures of the console, redrawn on demand: ``manage.py screenshot``.

It starts an embedded site of its own (``manage.py serve``, SQLite in a temporary
directory, nothing of ``var/`` touched), starts runs over the API until the list shows each
state and end cause, logs in as the site's operator and has Debian's chromium draw each page
of ``PAGES`` at each size of ``SIZES`` into ``docs/<page>-<width>x<height>.png``. A page is
one entry of ``PAGES``: its path, what shows it is ready, and what to set up first.
The tests draw into a temporary directory: no test rewrites the pictures.
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
from collections.abc import Callable
from dataclasses import dataclass
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
        # The demo agents, as `make run` has them: the pictures start runs of them.
        self.env.update(AWAKEN_VAR_DIR=str(var_dir), SECRET_KEY=secrets.token_urlsafe(50),
                        DEBUG="0", AWAKEN_DEMO_AGENTS="1")
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


@dataclass(frozen=True)
class Page:
    """One picture: ``path`` on the site, drawn once ``ready`` holds (a CSS selector, or
    after ``js:`` a JavaScript function: the page's CSP evaluates no expression string).
    ``prepare(site, runs)`` runs once before (on the site, over the API), ``show(page)``
    in the browser once the page is ready."""

    name: str
    path: str  # formatted with the ids of the runs started (``{running}``, ``{failed}``...)
    ready: str
    prepare: Callable | None = None
    show: Callable | None = None
    live: bool = True  # the page has the live indicator (a review page has none)
    full: bool = False  # the whole page, not the first screen of it


SIZES = ((1280, 800), (390, 844))


def start_stuck_runs(site: Site, runs: dict) -> None:
    """Three runs stuck in a step, for the bulk pictures (once)."""
    if "stuck" in runs:
        return
    runs["stuck"] = [site.call("POST", "/api/runs/", {"agent": "demo.hang", "input": {}})["id"]
                     for _ in range(3)]
    for run_id in runs["stuck"]:
        wait_until(lambda run_id=run_id: site.call("GET", f"/api/runs/{run_id}/")["state"]
                   == "running", 30, f"run {run_id} to run")


def open_bulk_dialog(tab) -> None:
    """Tick the runs shown and ask to cancel them: the dialog with the job's preview."""
    tab.check("[data-select-page]")
    tab.click('#bulk-bar [data-bulk="cancel"]')
    tab.wait_for_function(
        "() => document.querySelector('[data-field=bulk-preview]').textContent"
        ".includes('will be')")


def stop_the_stuck_runs(site: Site, runs: dict) -> None:
    """Bulk jobs for the picture of the jobs page (once): one stops the stuck runs, one
    finds nothing left to cancel; ``job`` is the stop's, for the picture of one job."""
    if "job" in runs:
        return
    start_stuck_runs(site, runs)
    for action, extra in (("cancel", {"ids": [runs["completed"], runs["failed"]]}),
                          ("stop", {"ids": [*runs["stuck"], runs["cancelled"]],
                                    "reason": "stuck in a tool"})):
        job = site.call("POST", "/api/bulk/", {"action": action, **extra})
        wait_until(lambda job=job: site.call("GET", f"/api/bulk/{job['id']}/")["state"]
                   == "done", 60, "the bulk job to finish")
        runs["job"] = job["id"]


def chat_cancelled_mid_stream(site: Site, runs: dict) -> None:
    """For the picture of a trace (once): a chat whose first four prompts get the same
    short answer (alike steps, drawn as one row), cancelled while the fifth streams."""
    if "chat" in runs:
        return
    run_id = site.call("POST", "/api/runs/", {"agent": "demo.chat", "input": {
        "prompts": ["hello", "hello", "hello", "hello", "Tell me how a cancel works."],
        "model": "canned+pace=0.08"}})["id"]

    def steps() -> int:
        entries = site.call("GET", f"/api/runs/{run_id}/activity/")["results"]
        return sum(entry["kind"] == "step" for entry in entries)

    wait_until(lambda: steps() >= 4, 60, "the chat's fourth step")
    streaming = time.monotonic() + 1.5  # the fifth answer has streamed for a while
    wait_until(lambda: time.monotonic() > streaming, 5, "the fifth answer to stream")
    site.call("POST", f"/api/runs/{run_id}/cancel/?wait=2", {})
    wait_until(lambda: site.call("GET", f"/api/runs/{run_id}/")["state"] == "ended", 30,
               "the chat to end")
    runs["chat"] = run_id


def show_trace(tab) -> None:
    """The trace in view, its alike steps opened."""
    tab.click("#trace details.trace-steps > summary")
    tab.evaluate("() => document.querySelector('#trace').scrollIntoView({block: 'start'})")


def make_review_link(site: Site, runs: dict) -> None:
    """A review link for the awaiting run's ticket, opened by a reviewer with no account."""
    if "review" not in runs:
        link = site.call("POST", f"/api/runs/{runs['awaiting']}/review-links/", {})
        runs["review"] = link["url"].rstrip("/").rsplit("/", 1)[-1]


def pick_an_agent(tab) -> None:
    """The new-run form open, with an agent picked that says what it needs."""
    tab.evaluate("() => { document.querySelector('#new-run-box').open = true; }")
    tab.select_option('#new-run [name="agent"]', "demo.email")
    tab.wait_for_selector('[data-agent-help="demo.email"]:not([hidden])')


def open_resume_dialog(tab) -> None:
    tab.click('#panel [data-action="resume"]')
    tab.wait_for_selector('#resume-dialog[open] [data-field="resume-action"]:not([hidden])')


PAGES = [
    Page("list", "/", "js:() => document.querySelectorAll('#run-rows tr.run').length >= 7"),
    Page("new-run", "/", "js:() => document.querySelectorAll('#run-rows tr.run').length >= 7",
         show=pick_an_agent),
    Page("overview", "/overview/?window=86400",
         "js:() => document.querySelectorAll('.uplot canvas').length === 4 && "
         "document.querySelector('[data-figure=running]').textContent !== '–' && "
         "document.querySelector('tr[data-agent]') !== null", full=True),
    Page("bulk", "/?by_agent=demo.hang&status=running",
         "js:() => document.querySelectorAll('#run-rows tr.run').length >= 3",
         prepare=start_stuck_runs, show=open_bulk_dialog),
    Page("bulk-jobs", "/bulk/", "js:() => document.querySelectorAll('tr.job').length >= 2",
         prepare=stop_the_stuck_runs),
    Page("workers", "/workers/", "tr.worker", live=False),
    Page("run", "/runs/{running}/",
         "js:() => document.querySelectorAll('.activity-log li:not(.empty)').length >= 2"),
    Page("run-trace", "/runs/{chat}/", "#trace .trace-row[data-outcome=cancelled]",
         prepare=chat_cancelled_mid_stream, show=show_trace),
    Page("bulk-job", "/bulk/{job}/", "js:() => document.querySelectorAll('tr.item').length >= 4",
         prepare=stop_the_stuck_runs),
    Page("run-failed", "/runs/{failed}/", "pre.traceback"),
    Page("run-resume", "/runs/{awaiting}/", '#panel [data-action="resume"]',
         show=open_resume_dialog),
    Page("review", "/review/{review}/", "#review-form", prepare=make_review_link,
         live=False),
]


class Command(BaseCommand):
    help = ("Draw the console's pages (run list, the new-run form, overview, a bulk job's "
            "dialog, bulk jobs, one bulk job, a run, a run's trace, a failed run, a resume "
            "dialog, a review link), with runs "
            "in each state, at 1280x800 and 390x844 into docs/ (Debian's chromium, on an "
            "embedded site of the command's own).")

    def add_arguments(self, parser):
        parser.add_argument("--output-dir", type=Path, default=Path(settings.BASE_DIR) / "docs",
                            help="Where <page>-<width>x<height>.png go (default docs/).")
        parser.add_argument("--page", action="append", choices=[page.name for page in PAGES],
                            help="Only this page (repeat for several); all by default.")
        parser.add_argument("--size", action="append",
                            help="Only this viewport, WIDTHxHEIGHT (repeat for several).")
        parser.add_argument("--output", type=Path,
                            help="One picture of the run list into this file, at the first "
                                 "--size (1280x800 by default).")
        parser.add_argument("--chromium", default=CHROMIUM)
        parser.add_argument("--scheme", choices=["light", "dark"], default="light",
                            help="The colour scheme the browser asks for; dark pictures are "
                                 "named <page>-<width>x<height>-dark.png.")

    def handle(self, output_dir, page, size, output, chromium, scheme, **options):
        sizes = [self.parse_size(text) for text in size] if size else list(SIZES)
        chosen = [entry for entry in PAGES if not page or entry.name in page]
        if output is not None:
            chosen, sizes = [PAGES[0]], sizes[:1]
        if not os.path.exists(chromium):
            raise CommandError(f"no chromium at {chromium} (apt-get install chromium)")
        with tempfile.TemporaryDirectory(prefix="awaken-screenshot-") as var_dir:
            site = Site(Path(var_dir))
            try:
                runs = self.start_runs(site)
                written = self.draw(site, runs, chosen, sizes, chromium, output_dir, output,
                                    scheme)
            finally:
                site.stop()
        for path in written:
            self.stdout.write(f"Wrote {path}", self.style.SUCCESS)

    @staticmethod
    def parse_size(text: str) -> tuple[int, int]:
        try:
            width, height = (int(n) for n in text.lower().split("x"))
        except ValueError:
            raise CommandError(f"--size must be WIDTHxHEIGHT, not {text!r}") from None
        return width, height

    def start_runs(self, site: Site) -> dict:
        """Runs in every state and end cause, the running one newest: their ids by status."""

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
            start("demo.email", {"steps_before": 1, "step_seconds": 0.1}): "awaiting",
            start("demo.steps", {"steps": 5}, start_after=later): "queued",
            start("demo.steps", {"steps": 600, "step_seconds": 1}): "running",
        }
        pausing = start("demo.hang", {})  # a pause waiting for a step that never ends
        for run_id in (stopped, cancelled, pausing):
            reaches(run_id, "running")
        site.call("POST", f"/api/runs/{pausing}/pause/?wait=0")
        site.call("POST", f"/api/runs/{stopped}/stop/?wait=2", {"reason": "over the time box"})
        site.call("POST", f"/api/runs/{cancelled}/cancel/?wait=2", {})
        for run_id, status in expected.items():
            reaches(run_id, status)
        return {status: run_id for run_id, status in expected.items()}

    def draw(self, site: Site, runs: dict, pages: list, sizes: list, chromium: str,
             output_dir: Path, output: Path | None, scheme: str = "light") -> list[Path]:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise CommandError("needs Playwright: pip install -e '.[dev]'") from None

        written = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium, headless=True,
                args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                      "--disable-background-networking", "--disable-component-update",
                      "--disable-sync"])
            try:
                tabs = {size: self.logged_in(browser, site, *size, scheme=scheme)
                        for size in sizes}
                suffix = "" if scheme == "light" else f"-{scheme}"
                for entry in pages:
                    if entry.prepare is not None:
                        entry.prepare(site, runs)
                    for (width, height), tab in tabs.items():
                        tab.goto(f"{site.base}{entry.path.format(**runs)}")
                        if entry.live:
                            tab.wait_for_selector('#live[data-status="live"]')
                        if entry.ready.startswith("js:"):
                            tab.wait_for_function(entry.ready.removeprefix("js:"))
                        else:
                            tab.wait_for_selector(entry.ready)
                        if entry.show is not None:
                            entry.show(tab)
                        path = output or output_dir / f"{entry.name}-{width}x{height}{suffix}.png"
                        path.parent.mkdir(parents=True, exist_ok=True)
                        tab.screenshot(path=str(path), full_page=entry.full)
                        written.append(path)
            finally:
                browser.close()
        return written

    @staticmethod
    def logged_in(browser, site: Site, width: int, height: int, scheme: str = "light"):
        phone = width < 600
        context = browser.new_context(viewport={"width": width, "height": height},
                                      has_touch=phone, is_mobile=phone,
                                      device_scale_factor=1, color_scheme=scheme)
        tab = context.new_page()
        tab.set_default_timeout(20_000)
        tab.goto(f"{site.base}/")
        tab.fill('input[name="username"]', "admin")
        tab.fill('input[name="password"]', site.password)
        tab.click('button[type="submit"]')
        tab.wait_for_selector('#live[data-status="live"]')
        return tab
