"""Browsers watching one busy run (``manage.py bench watch``): what a run's page asks the
server for on each push, and what that costs another user loading the run list.

Headless chromium pages (Playwright) open the page of a run that changes many times a
second (a run of short steps, or a parent whose children step), on an embedded site; a
thread loads the list page over and over meanwhile, as another user would. Counted per
page: the requests for the panel (``/runs/{id}/panel/``), the bytes of their answers and
the pushes of the run's tree its socket received.
"""

import json
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import httpx

CHROMIUM = "/usr/bin/chromium"  # Debian's, as the browser tests use
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


@dataclass
class Watcher:
    """One page's panel requests, and the pushes of the run's tree it received."""

    run_id: str
    requests: list = field(default_factory=list)
    pushes: int = 0
    tree: set = field(default_factory=set)

    def requested(self, request) -> None:
        if "/panel/" in request.url:
            self.requests.append(request)

    def socket(self, socket) -> None:
        if socket.url.endswith("/ws/runs/"):
            socket.on("framereceived", self.frame)

    def frame(self, payload) -> None:
        message = json.loads(payload)
        if message.get("type") == "run.changed":
            run = message["run"]
            if run["id"] in self.tree or run.get("parent_id") in self.tree:
                self.tree.add(run["id"])
                self.pushes += 1

    def bytes(self) -> int:
        return sum(request.sizes()["responseBodySize"] for request in self.requests)

    @property
    def urls(self) -> list[str]:
        return [request.url for request in self.requests]

    @property
    def whole(self) -> list[str]:
        """The requests of the whole panel (no part named)."""
        return [url for url in self.urls if "?" not in url]

    def watch(self, page) -> "Watcher":
        page.on("request", self.requested)
        page.on("websocket", self.socket)
        return self


class ListUser:
    """A logged-in user who loads the run list page again and again, on a thread."""

    def __init__(self, base: str, username: str, password: str):
        self.client = httpx.Client(base_url=base, timeout=30, follow_redirects=True)
        form = self.client.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        answer = self.client.post("/accounts/login/", data={
            "username": username, "password": password, "csrfmiddlewaretoken": token})
        assert "/accounts/login/" not in str(answer.url), "the list user could not log in"
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> "ListUser":
        self.latencies = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._load, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join(30)
        return self.latencies

    def _load(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self.client.get("/")
            self.latencies.append((time.perf_counter() - started) * 1000)
            self._stop.wait(0.05)


def until(condition, timeout: float, what: str, pump) -> None:
    """``wait_until``, with Playwright's ``wait_for_timeout`` between the checks: the sync
    API hands a page's events (requests, socket frames) over only inside its own calls."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        pump(100)


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20)[-1] if len(samples) >= 2 else float("nan")


BUSY = {  # what makes a run busy: its own short steps, or its children's
    "steps": {"agent": "demo.steps", "input": {"steps": 150, "step_seconds": 0.05}},
    "parent": {"agent": "demo.parent", "input": {
        "children": 4, "child_agent": "demo.steps",
        "child_input": {"steps": 40, "step_seconds": 0.05}}},
}


def watch(site, *, watchers: int = 3, kind: str = "steps", quiet_seconds: float = 5.0,
          say=print) -> dict:
    """``watchers`` pages on a busy run of ``kind`` on ``site`` (an embedded site, ready):
    the panel requests and bytes per push, and the list user's p50 / p95 (ms) alone and
    while the pages watch."""
    from playwright.sync_api import sync_playwright

    user = ListUser(site.base, "admin", site.admin_password)
    user.start()
    time.sleep(quiet_seconds)  # the list alone, for its own figures
    alone = user.stop()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                             headless=True, args=CHROMIUM_ARGS)
        pages = []
        for _ in range(watchers):
            page = browser.new_page()
            page.goto(f"{site.base}/accounts/login/")
            page.fill('input[name="username"]', "admin")
            page.fill('input[name="password"]', site.admin_password)
            page.click('button[type="submit"]')
            page.wait_for_selector('#live[data-status="live"]')
            pages.append(page)
        # The run starts once every page shows it: what a page loads first is not counted.
        later = datetime.now(UTC) + timedelta(seconds=5 + 3 * watchers)
        status, run = site.call("POST", "/api/runs/", {**BUSY[kind],
                                                        "start_after": later.isoformat()})
        assert status == 201, run
        seen = []
        for page in pages:
            watcher = Watcher(run["id"], tree={run["id"]}).watch(page)
            page.goto(f"{site.base}{run['url']}")
            page.wait_for_selector('#live[data-status="live"]')
            seen.append(watcher)
        pump = pages[0].wait_for_timeout  # Playwright hands the pages' events over meanwhile
        until(lambda: all(w.requests for w in seen), 30, "each page's first panel", pump)
        pump(1000)  # the first fetches end
        for watcher in seen:
            watcher.requests.clear()
            watcher.pushes = 0
        assert site.call("GET", f"/api/runs/{run['id']}/")[1]["state"] == "queued", (
            "the busy run started before the pages were ready: raise its start_after")
        user.start()
        until(lambda: site.call("GET", f"/api/runs/{run['id']}/")[1]["state"] == "ended",
              180, "the busy run to end", pump)
        watched = user.stop()
        pump(1000)  # the last fetches
        pushes = sum(w.pushes for w in seen)
        requests = sum(len(w.requests) for w in seen)
        sent = sum(w.bytes() for w in seen)
        browser.close()
    figures = {"kind": kind, "watchers": watchers, "pushes": pushes, "requests": requests,
               "bytes": sent, "requests_per_push": requests / max(1, pushes),
               "bytes_per_push": sent / max(1, pushes),
               "list_alone_p50": statistics.median(alone), "list_alone_p95": p95(alone),
               "list_watched_p50": statistics.median(watched), "list_watched_p95": p95(watched),
               "list_loads": len(watched)}
    say(json.dumps(figures))
    return figures
