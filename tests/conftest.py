import json
import os
import shutil
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
import time_machine
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connections
from django.test import Client
from rest_framework.test import APIClient

from harness.processes import ROOT, EmbeddedSite, Processes, Worker
from runs.domain.keys import api_key_issue, key_digest
from runs.models import ApiKey, Attempt, ControlIntent, Event, ResumeTicket, Run
from runs.providers.stub import StubServer

ON_POSTGRES = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


# Fixtures of a site or browser of the test's own: ``manage.py serve`` on SQLite with the
# in-memory broker and layer, whatever DATABASE_URL and REDIS_URL say.
OWN_SITE_FIXTURES = {"embedded_site", "agent_site", "browser"}


def pytest_collection_modifyitems(config, items):
    """Skip the PostgreSQL tests on SQLite, and mark ``ignores_database_url`` every test
    that runs on a site or browser of its own, so that the PostgreSQL stream of ``make
    test`` leaves it to the others, which run it once. A test so marked must not
    use the test database: on PostgreSQL it would be a test of the backend, left out by
    mistake."""
    skip = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL=postgres://...)")
    for item in items:
        if "postgres" in item.keywords and not ON_POSTGRES:
            item.add_marker(skip)
        if OWN_SITE_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.ignores_database_url)
        if item.get_closest_marker("ignores_database_url") and (
                "django_db_setup" in item.fixturenames or item.get_closest_marker("django_db")):
            raise pytest.UsageError(
                f"{item.nodeid} is marked ignores_database_url but uses the test database")


def make_user(username: str, role: str | None = None, **extra) -> User:
    user = User.objects.create_user(username=username, password="pw-" + username, **extra)
    if role:
        # get_or_create: a transactional test flushes the groups the migration made.
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


def browser_for(user: User | None = None, **options) -> Client:
    """A browser-like client, logged in with a session when ``user`` is given."""
    client = Client(**options)
    if user is not None:
        client.force_login(user)
    return client


_keys: dict[int, str] = {}


def api_key_for(user: User) -> str:
    """A working API key of ``user``: the one made for it before, while it is still stored
    (keys are shown once, and making a new one would revoke the old)."""
    key = _keys.get(user.pk)
    if key is None or not ApiKey.objects.filter(user=user, digest=key_digest(key)).exists():
        key = _keys[user.pk] = api_key_issue(user=user)
    return key


def client_for(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {api_key_for(user)}")
    return client


def site_command(*args: str, var_dir: Path, **env: str) -> subprocess.CompletedProcess:
    """``manage.py *args`` in a process of its own on the site's settings, configured by
    ``env`` alone (none of this process's variables but ``PATH``), its ``var/`` in
    ``var_dir``: what a deployment's process makes of what it is given."""
    environment = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "awaken_site.settings",
                   "AWAKEN_VAR_DIR": str(var_dir), **env}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=120)


# The throttle of logins and API keys with small limits (test_logins, test_keys), and a clock
# that stands still until a test moves it on.
AUTH_LIMIT = 3
AUTH_PERIOD = 60


@pytest.fixture
def small_auth_limits(settings):
    settings.AWAKEN_AUTH_FAILURES = AUTH_LIMIT
    settings.AWAKEN_AUTH_LOCKOUT_SECONDS = AUTH_PERIOD


@pytest.fixture
def clock():
    with time_machine.travel(datetime(2026, 5, 1, 12, 0, tzinfo=UTC), tick=False) as traveller:
        yield traveller


@pytest.fixture
def operator(db):
    return make_user("olga", "operator")


@pytest.fixture
def viewer(db):
    return make_user("victor", "viewer")


@pytest.fixture
def stranger(db):
    return make_user("sam")


@pytest.fixture
def op_client(operator):
    return client_for(operator)


@pytest.fixture
def viewer_client(viewer):
    return client_for(viewer)


@pytest.fixture
def anon_client(db):
    return APIClient()


def db_state() -> dict:
    """Everything a refused request must leave as it was."""
    return {
        "runs": sorted(Run.objects.values_list("id", "state", "version")),
        "attempts": Attempt.objects.count(),
        "tickets": sorted(ResumeTicket.objects.values_list("id", "state")),
        "intents": ControlIntent.objects.count(),
        "events": Event.objects.count(),
    }


class Gang:
    """N long-lived threads, each with its own database connection, released together.

    ``run(fns)`` starts every function at the same instant (a barrier) and returns each
    one's result or raised exception, in order.
    """

    def __init__(self, size: int):
        self.size = size
        self._jobs = [None] * size
        self._results = [None] * size
        self._go = threading.Barrier(size + 1)
        self._done = threading.Barrier(size + 1)
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True)
                         for i in range(size)]
        for thread in self._threads:
            thread.start()

    def _work(self, index: int):
        while True:
            self._go.wait()
            job = self._jobs[index]
            if job is None:
                connections.close_all()
                self._done.wait()
                return
            try:
                self._results[index] = job()
            except Exception as error:  # reported to the caller, not swallowed
                self._results[index] = error
            self._done.wait()

    def run(self, fns: list):
        assert len(fns) == self.size
        self._jobs = list(fns)
        self._go.wait(timeout=60)
        self._done.wait(timeout=60)
        return list(self._results)

    def close(self):
        self._jobs = [None] * self.size
        self._go.wait(timeout=60)
        self._done.wait(timeout=60)


@pytest.fixture
def gang():
    gangs = []

    def make(size: int) -> Gang:
        gangs.append(Gang(size))
        return gangs[-1]

    yield make
    for g in gangs:
        g.close()


HAS_SERVICES = ON_POSTGRES and bool(settings.REDIS_URL)
# The lease of the tests' workers: a lost worker's runs come back within seconds.
LEASE_SECONDS = 1.5


@pytest.fixture(scope="session")
def shared_worker(django_db_setup, django_db_blocker):
    """A worker process shared by the execution tests (PostgreSQL and Redis only)."""
    if not HAS_SERVICES:
        pytest.skip("needs PostgreSQL and Redis (DATABASE_URL, REDIS_URL)")
    with django_db_blocker.unblock():
        process = Worker("shared", lease_seconds=LEASE_SECONDS).wait_ready()
    with process:
        yield process


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used the shared worker shows what the worker logged meanwhile."""
    report = yield
    since = getattr(item, "shared_worker_log_from", None)
    if report.failed and since is not None:
        logged = item.funcargs["shared_worker"].output(6000, since=since)
        if logged:
            report.sections.append((f"shared worker log ({report.when})", logged))
    return report


@pytest.fixture
def worker(request, shared_worker, transactional_db):
    """The shared worker, for one test. Once the test is over, the runs it left unended are
    cancelled and the worker has let go of them before the test's tables are emptied: a
    TRUNCATE while the worker still writes one of them can deadlock with it. A failed test
    shows the worker's log of its time."""
    from harness.processes import wait_until
    from runs import domain
    request.node.shared_worker_log_from = shared_worker.log_size()
    yield shared_worker
    for run_id in Run.objects.exclude(state="ended").values_list("pk", flat=True):
        domain.run_cancel(run_id=run_id, actor="tests", source="api")
    try:
        wait_until(lambda: not Run.objects.exclude(state="ended").exists()
                   and not Attempt.objects.filter(state="live").exists(),
                   timeout=15, what="the shared worker to let go of the test's runs")
    except TimeoutError:  # a run of a worker the test killed, say: the TRUNCATE may wait
        pass


@pytest.fixture
def spare_worker(django_db_blocker):
    """Workers of one test's own, to kill or freeze: ``spare_worker(**Worker options)``."""
    if not HAS_SERVICES:
        pytest.skip("needs PostgreSQL and Redis (DATABASE_URL, REDIS_URL)")

    with Processes() as started:
        def start(**options) -> Worker:
            with django_db_blocker.unblock():
                process = started.add(Worker(**{"lease_seconds": LEASE_SECONDS, **options}))
                return process.wait_ready()

        yield start


@pytest.fixture(scope="session")
def embedded_site(tmp_path_factory):
    """One ``manage.py serve`` for the session: SQLite, in-memory broker and layer."""
    with EmbeddedSite(tmp_path_factory.mktemp("embedded")) as site:
        yield site.wait_ready(40)


@pytest.fixture
def stub_server():
    """A provider stub of the test's own, served on a free local port."""
    with StubServer() as server:
        yield server


# The API key of the tests' provider: it must never show in a log, an event or an error.
PROVIDER_KEY = "sk-tests-a1b2c3d4e5f6g7h8"


@pytest.fixture(scope="session")
def provider_stub():
    """The provider stub of the session's agent site."""
    with StubServer() as server:
        yield server


@pytest.fixture(scope="session")
def example_package(tmp_path_factory) -> Path:
    """The example agent package of ``examples/``, installed by pip into a folder of its
    own, as a user installs a package: with its ``awaken.agents`` entry point."""
    source = tmp_path_factory.mktemp("example-source") / "package"
    shutil.copytree(ROOT / "examples" / "awaken-example-agents", source)
    target = tmp_path_factory.mktemp("example-installed")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(target), str(source)],
                   check=True, capture_output=True, timeout=300)
    return target


# A model of the stub with a price of its own on the agent site: dollars per million tokens.
PRICED, PRICE_IN, PRICE_OUT = "echo+priced", 1000, 2000


@pytest.fixture(scope="session")
def agent_site(tmp_path_factory, provider_stub, example_package):
    """``manage.py serve`` whose agents call this session's provider stub with an API key,
    and which finds the example package by its entry point (nothing names it)."""
    env = {"AWAKEN_PROVIDER_BASE_URL": provider_stub.url, "AWAKEN_PROVIDER_MODEL": "echo",
           "AWAKEN_PROVIDER_API_KEY": PROVIDER_KEY, "PYTHONPATH": str(example_package),
           # A provider failing past its retries pauses the run (reason provider), and the
           # stub's model PRICED has a price of its own (tests/test_budgets_live.py).
           "AWAKEN_ON_PROVIDER_ERROR": "pause",
           "AWAKEN_MODEL_PRICES": json.dumps({PRICED: {"input": PRICE_IN, "output": PRICE_OUT}})}
    with EmbeddedSite(tmp_path_factory.mktemp("agents"), extra_env=env) as site:
        yield site.wait_ready(40)


# Debian's chromium, for the browser tests (tests/test_browser*.py); never a downloaded build.
CHROMIUM = "/usr/bin/chromium"
# How long a browser test waits for what it expects before it fails: a bound on a failure,
# never a measure (a wait ends as soon as the page shows it). CI runs three streams on two
# cores, and a busy machine can take seconds to open a page and its socket.
BROWSER_DEADLINE_MS = 30_000


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium, headless, driven by Playwright: one per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"])
        yield browser
        browser.close()


def box_of(page, selector: str) -> dict:
    """The box of the first element of ``selector``, measured in one call in the page. The
    live pages redraw their parts from each push, so a box asked for in two steps (find
    the element, then measure it) can find it replaced, and come back empty."""
    box = page.evaluate("""(selector) => {
        const found = document.querySelector(selector);
        if (!found) return null;
        const box = found.getBoundingClientRect();
        return {x: box.x, y: box.y, width: box.width, height: box.height};
    }""", selector)
    assert box is not None, f"nothing in the page matches {selector}"
    return box


def click_to(page, selector: str, arrived: str, tries: int = 3) -> None:
    """Click ``selector`` until ``arrived`` shows. The live pages redraw a row from each
    push, so on a busy machine a click can land on a row as it is replaced, and be lost;
    it is made again then (a click that did land is never repeated)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    for attempt in range(tries):
        page.click(selector)
        try:
            page.wait_for_selector(arrived, timeout=5000)
            return
        except PlaywrightTimeout:
            if attempt == tries - 1 or page.locator(selector).count() == 0:
                # Last try, or the click landed and what it opens is still on its way.
                page.wait_for_selector(arrived, timeout=15000)
                return


def click_to_confirm(page, selector: str, tries: int = 3) -> None:
    """Click ``selector``, a control that asks a native confirm before anything else, until
    the confirm is asked (the page's dialog handler answers it, ``answer_dialogs``). As in
    ``click_to``, a click lost to a row redrawn under it is made again; a click that landed
    asks at once, in its own handler, so it is never repeated."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    for attempt in range(tries):
        try:
            with page.expect_event("dialog", timeout=10_000):
                page.click(selector)
            return
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise
