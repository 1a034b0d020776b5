"""The system's processes, started as a user would start them: daphne, Celery workers, the
Celery beat sweeper, a private Redis server, a private PgBouncer and the embedded site
(``manage.py serve``), for the tests and ``manage.py bench``.

Each is a child process with its output in a log file (a temporary one, removed with the
process object, unless a folder for the logs is given). Its constructor starts it;
``wait_ready()`` polls until it serves, and fails with the tail of its output if it exits
first. ``start()`` starts it again once it has exited, with the same command line (the
same port, the same node name), as a supervisor would. Used as a context manager, it is
stopped however the block ends. Web, workers and beat run on this process's settings and
database, so a test's processes share the test database.
"""

import atexit
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import weakref
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Self, TypeVar
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import psycopg
from celery import Celery
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from awaken_site.celery import app
from runs.tasks import execute

ROOT = Path(__file__).resolve().parent.parent


class ProcessFailed(RuntimeError):
    """A process exited, or did not get ready in time."""


def cpu_ns(pid: int) -> int:
    """CPU time of all the threads of a process so far, in ns (the scheduler's own count,
    finer than the clock ticks of /proc/PID/stat; a thread that ended meanwhile is missed)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def wait_until(condition, timeout: float = 10.0, what: str = "the condition",
               every: float = 0.02):
    """Poll ``condition`` every ``every`` seconds until it returns something truthy, and
    return that; raise TimeoutError once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def issued_key(username: str, role: str) -> str:
    """A new API key for ``username`` (made with ``role`` if missing), as ``manage.py
    operator_token --create`` issues one; the key it replaces stops working."""
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("operator_token", username, "--role", role, "--create", stdout=out)
    return out.getvalue().strip()


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url() -> str:
    """The URL of the database this process uses (during tests, the test database).

    Only PostgreSQL: the tests' SQLite database lives in this process's memory.
    """
    db = connection.settings_dict
    if db["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("another process can share only a PostgreSQL database")
    password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
    return (f"postgres://{quote(db['USER'] or '', safe='')}{password}@"
            f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}")


BENCHMARK_LOCK = 0x617761_6B656E  # the advisory lock key a benchmark holds on its database


class Busy(RuntimeError):
    """Another benchmark holds the database."""


@contextmanager
def alone_on_the_database():
    """Hold the database's benchmark lock while the block runs, or raise ``Busy`` at once.

    Two benchmarks on one database would each take the other's CPU, and the second would
    issue a new key to the benchmark's user, so that the first one's requests answer 401
    halfway through. The lock is a session's advisory lock on a connection of its own,
    whatever Django does with its connections meanwhile. It is released when the block
    ends, before the connection closes: the server ends a closed connection's session in
    its own time, and a benchmark started right after would find the lock still held.
    Should the process die, the closed connection releases it all the same."""
    with psycopg.connect(database_url(), autocommit=True, connect_timeout=10) as holder:
        taken, = holder.execute("SELECT pg_try_advisory_lock(%s)", (BENCHMARK_LOCK,)).fetchone()
        if not taken:
            raise Busy(f"another benchmark is running against the database "
                       f"{connection.settings_dict['NAME']!r}; wait for it to end")
        try:
            yield
        finally:
            with suppress(psycopg.Error):  # a broken connection has released it already
                holder.execute("SELECT pg_advisory_unlock(%s)", (BENCHMARK_LOCK,))


def environment(extra: dict | None = None) -> dict:
    """This process's environment for a child on the same database, with ``extra`` on top;
    a ``None`` in ``extra`` removes that variable.

    The settings module is this process's too: Django read its name from
    DJANGO_SETTINGS_MODULE, which the child inherits (the tests' settings in a test run).
    """
    # The channels of this process, whatever the database's name: pytest renames it for the
    # test database after the settings have derived the prefix from it.
    env = {"AWAKEN_DEMO_AGENTS": "1", **os.environ, "DATABASE_URL": database_url(),
           "AWAKEN_CHANNEL_PREFIX": settings.AWAKEN_CHANNEL_PREFIX}
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@contextmanager
def scratch_folder(prefix: str):
    """A temporary folder for what processes that run together write (their logs, a
    site's files): removed when the block ends, kept when it fails (their logs tell why),
    and then named on stderr."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    except BaseException:
        print(f"kept for its logs: {folder}", file=sys.stderr)
        raise
    shutil.rmtree(folder, ignore_errors=True)


class Process:
    """One child process, run from the repository's root with its output in a log file:
    ``log_dir/<name>.log``, or a temporary file when no ``log_dir`` is given."""

    def __init__(self, argv: list[str], *, name: str, env: dict, log_dir: Path | None = None,
                 root: Path = ROOT):
        self.name = name
        self.root = root
        self.argv = argv
        self.env = env
        if log_dir is None:
            handle, path = tempfile.mkstemp(prefix=f"awaken-{name}-", suffix=".log")
            os.close(handle)
            self.log_path = Path(path)
            # A temporary log goes with its process object (or at exit): nothing reads it
            # once nothing holds the process.
            weakref.finalize(self, self.log_path.unlink, missing_ok=True)
        else:
            self.log_path = Path(log_dir) / f"{name}.log"
            self.log_path.write_text("")
        self.popen: subprocess.Popen | None = None
        self.start()

    def start(self) -> Self:
        """Start the command; again, once the process has exited (its log goes on)."""
        if self.popen is not None and self.running():
            raise ProcessFailed(f"{self.name} is running already")
        with open(self.log_path, "a") as log:
            self.popen = subprocess.Popen(self.argv, cwd=self.root, env=self.env, stdout=log,
                                          stderr=subprocess.STDOUT)
        return self

    def restart(self, *, kill: bool = False) -> Self:
        """Stop it (``kill``: with SIGKILL, no cleanup) and start it again; not waited for."""
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} pid={self.pid}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def ready(self) -> bool:
        """Whether it serves yet; a process that serves nothing is ready once started."""
        return True

    def wait_ready(self, timeout: float = 30) -> Self:
        """Poll ``ready()`` until it holds. If the process exits first, or ``timeout``
        seconds pass, stop it and fail with the tail of its output."""
        try:
            wait_until(lambda: not self.running() or self.ready(), timeout,
                       f"{self.name} to be ready", every=0.05)
        except TimeoutError as error:
            failure = str(error)
        else:
            if self.running():
                return self
            failure = f"{self.name} exited with code {self.popen.returncode}"
        self.stop()
        raise ProcessFailed(f"{failure}; its output ends with:\n{self.output()}")

    def log(self) -> str:
        return self.log_path.read_text()

    def log_size(self) -> int:
        """Where its log ends now: ``output(since=...)`` shows only what came after."""
        return self.log_path.stat().st_size

    def output(self, chars: int = 4000, *, since: int = 0) -> str:
        """The end of its log (of what it wrote after ``since``), for error messages."""
        with open(self.log_path, "rb") as log:
            log.seek(since)
            return log.read().decode(errors="replace")[-chars:]

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def kill(self) -> None:
        """kill -9: no cleanup of any kind."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: it holds everything it holds and does nothing until ``thaw()``."""
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT: it goes on where it stopped."""
        self.signal(signal.SIGCONT)

    def terminate(self) -> None:
        """SIGTERM, if it still runs: the shutdown a supervisor asks for (a frozen process
        is thawed to take it)."""
        if self.running():
            self.popen.send_signal(signal.SIGTERM)
            self.popen.send_signal(signal.SIGCONT)

    def wait_exit(self, timeout: float) -> None:
        """Wait for it to exit; kill it if it has not within ``timeout`` seconds."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM, then SIGKILL if it has not exited ``timeout`` seconds later."""
        self.terminate()
        self.wait_exit(timeout)


P = TypeVar("P", bound=Process)


class Processes:
    """Processes that get ready together and stop together, however the block that holds
    them ends."""

    def __init__(self):
        self.members: list[Process] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def add(self, process: P) -> P:
        self.members.append(process)
        return process

    def wait_ready(self, timeout: float = 30) -> None:
        """Wait for every member, all within one ``timeout``: they start side by side."""
        deadline = time.monotonic() + timeout
        for process in self.members:
            process.wait_ready(max(0.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM to every member at once, then SIGKILL to those still running after
        ``timeout`` seconds."""
        for process in self.members:
            process.terminate()
        deadline = time.monotonic() + timeout
        for process in self.members:
            process.wait_exit(max(0.0, deadline - time.monotonic()))


class Worker(Process):
    """A ``celery worker`` process; ``node`` is its Celery node name, the owner of the
    attempts it runs."""

    def __init__(self, name: str | None = None, *, queue: str | None = None,
                 private: bool = False, concurrency: int = 4, pool: str = "threads",
                 include: tuple[str, ...] = (), lease_seconds: float | None = None,
                 extra_env: dict | None = None, broker: str | None = None,
                 loglevel: str = "INFO", log_dir: Path | None = None, warm: bool = False):
        """``queue``: the queue it consumes, the configured one by default. ``private``:
        only a queue named after the worker, so that a test decides which runs it takes.
        ``include``: modules of tasks to load besides the project's. ``broker``: the broker
        to ping it through, when ``extra_env`` gives it another than this process's.
        ``warm``: ready only once it has prepared every agent as it starts (a benchmark's
        figures then hold none of that work)."""
        self.warm = warm
        name = name or f"w{uuid.uuid4().hex[:8]}"
        self.node = f"{name}@{socket.gethostname()}"
        self.queue = name if private else queue or settings.CELERY_TASK_DEFAULT_QUEUE
        # Not made the current app: the tests' own calls must keep using the project's.
        self.control = (Celery(broker=broker, set_as_current=False).control if broker
                        else app.control)
        argv = [sys.executable, "-m", "celery", "-A", "awaken_site", "worker", "--pool", pool,
                "--concurrency", str(concurrency), "-n", self.node, "-Q", self.queue,
                "--without-mingle", "--without-gossip", "--loglevel", loglevel]
        if include:
            argv += ["-I", ",".join(include)]
        lease = {} if lease_seconds is None else {"AWAKEN_LEASE_SECONDS": str(lease_seconds)}
        super().__init__(argv, name=name,
                         env=environment({**WORKER_ENV, **lease, **(extra_env or {})}),
                         log_dir=log_dir)

    def ready(self) -> bool:
        """It answers a control ping (not while the broker is unreachable), and if
        ``warm``, says it has prepared (``prepared_seconds``)."""
        if self.warm:
            return self.prepared_seconds() is not None
        try:
            return bool(self.control.ping(destination=[self.node], timeout=0.5))
        except self.control.app.connection_for_write().connection_errors:
            return False

    def prepared_seconds(self) -> float | None:
        """How long its start took to prepare every agent, as it answers
        ``runs.workers.readiness.awaken_prepared``; None until then (or unreachable)."""
        try:
            replies = self.control.broadcast("awaken_prepared", destination=[self.node],
                                             reply=True, timeout=0.5)
        except self.control.app.connection_for_write().connection_errors:
            return None
        return next((reply[self.node].get("seconds") for reply in replies if self.node in reply),
                    None)

    def take(self, run_id) -> None:
        """Send this worker the task of a run created with ``dispatch=False``."""
        execute.apply_async(args=[[str(run_id)]], queue=self.queue)


class Beat(Process):
    """``celery beat``: it sweeps every third of a lease in its own process
    (``runs.workers.sweeper``). Its schedule file is a temporary one of its own, removed
    with the process object."""

    def __init__(self, *, lease_seconds: float | None = None, extra_env: dict | None = None,
                 log_dir: Path | None = None):
        schedule = Path(tempfile.mkdtemp(prefix="awaken-beat-")) / "schedule"
        lease = {} if lease_seconds is None else {"AWAKEN_LEASE_SECONDS": str(lease_seconds)}
        super().__init__([sys.executable, "-m", "celery", "-A", "awaken_site", "beat",
                          "--schedule", str(schedule), "--loglevel", "INFO"], name="beat",
                         env=environment({**lease, **(extra_env or {})}), log_dir=log_dir)
        weakref.finalize(self, shutil.rmtree, schedule.parent, ignore_errors=True)


class PrivateRedis(Process):
    """A redis-server of one test's own on a free port of 127.0.0.1, keeping nothing on
    disk: a broker and channel layer to stop, kill and start again without touching any
    other Redis. ``url`` is the one to give the other processes."""

    def __init__(self, *, log_dir: Path | None = None):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        super().__init__(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no", "--dir", tempfile.gettempdir()],
                         name="redis", env=dict(os.environ), log_dir=log_dir)

    def ready(self) -> bool:
        return self.up()

    def up(self) -> bool:
        """It answers PING."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False


PGBOUNCER = "/usr/sbin/pgbouncer"  # Debian's package (.ci/run installs it)


class PrivatePgBouncer(Process):
    """Debian's PgBouncer of one test's or benchmark's own on a free port of 127.0.0.1, in
    transaction mode (``pool_mode = transaction``), in front of the server of
    ``server_url`` with ``sessions`` server sessions for each database and user. ``url``
    is ``server_url`` through it, for processes started with ``DB_POOLER=transaction``."""

    def __init__(self, server_url: str, *, sessions: int, log_dir: Path | None = None):
        if not Path(PGBOUNCER).exists():
            raise ProcessFailed(f"{PGBOUNCER} is missing: apt-get install pgbouncer")
        server = urlsplit(server_url)
        user, password = unquote(server.username or "postgres"), unquote(server.password or "")
        self.port = free_port()
        credentials = server.netloc.rpartition("@")[0] or quote(user, safe="")
        self.url = urlunsplit((server.scheme, f"{credentials}@127.0.0.1:{self.port}",
                               server.path, "", ""))
        folder = Path(tempfile.mkdtemp(prefix="awaken-pgbouncer-"))
        weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)
        (folder / "users.txt").write_text(f'"{user}" "{password}"\n')
        (folder / "pgbouncer.ini").write_text(
            f"[databases]\n* = host={server.hostname} port={server.port or 5432}\n"
            f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"unix_socket_dir =\nauth_type = trust\nauth_file = {folder / 'users.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {sessions}\n"
            "max_client_conn = 1000\n")
        # PgBouncer refuses to run as root: as root it is started as postgres, which must
        # read its files.
        folder.chmod(0o755)
        for path in folder.iterdir():
            path.chmod(0o644)
        super().__init__([PGBOUNCER, *(["-u", "postgres"] if os.geteuid() == 0 else []),
                          str(folder / "pgbouncer.ini")], name="pgbouncer",
                         env=dict(os.environ), log_dir=log_dir)

    def ready(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True


class Site(Process):
    """A process that serves HTTP on a port of 127.0.0.1; ``call`` speaks its JSON API."""

    def __init__(self, argv: list[str], *, port: int, **options):
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.token: str | None = None
        super().__init__(argv, **options)

    def call(self, method: str, path: str, body=None, *, token: str | None = None,
             timeout: float = 30) -> tuple[int, object]:
        """One request with ``token`` (else ``self.token``), if any: its status and JSON
        (the text of a body that is not JSON, such as a server error's page)."""
        headers = {"Content-Type": "application/json"}
        if token or self.token:
            headers["Authorization"] = f"Token {token or self.token}"
        request = urllib.request.Request(
            f"{self.base}{path}", method=method, headers=headers,
            data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, _decoded(response.read())
        except urllib.error.HTTPError as error:
            return error.code, _decoded(error.read())

    def health(self) -> dict:
        """Its /healthz answer, or {} while it does not answer."""
        try:
            answer = self.call("GET", "/healthz", timeout=2)[1]
        except (OSError, http.client.HTTPException):
            return {}
        return answer if isinstance(answer, dict) else {}


def _decoded(body: bytes):
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


def procfile_environment(process: str = "web", root: Path = ROOT) -> dict:
    """The variables the ``Procfile`` sets before the command of ``process``."""
    line = next(line for line in (root / "Procfile").read_text().splitlines()
                if line.startswith(f"{process}:"))
    variables = {}
    for word in line.split(":", 1)[1].split():
        name, equals, value = word.partition("=")
        if not equals or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
            break
        variables[name] = value
    return variables


def installed_library(name: str) -> bool:
    """Whether the dynamic loader finds the shared library ``name`` in a directory of the
    system's (as the Makefile looks for jemalloc)."""
    return any(Path(folder).glob(name) for folder in (
        *Path("/usr/lib").glob("*-linux-gnu"), "/usr/lib", "/usr/local/lib"))


def web_process_environment() -> dict:
    """The Procfile's variables of the web process, jemalloc's left out where it is not
    installed (the loader would name it in an error at every start), as the Makefile does."""
    variables = procfile_environment()
    if not installed_library(variables["LD_PRELOAD"]):
        del variables["LD_PRELOAD"], variables["MALLOC_CONF"]
    return variables


# What the Procfile's web process (and make run) start with, so that the memory a burst of
# large requests took goes back to the system (docs/operations.md, "Hostile input,
# measured"). jemalloc (``LD_PRELOAD``) returns the pages it has not used for some seconds,
# in a thread of its own (``background_thread``), wherever they are in its arenas; Python's
# objects come from it too (``PYTHONMALLOC=malloc``), not from Python's own arenas, which go
# back only once empty. Without jemalloc installed, glibc's documented tunables fix its
# thresholds instead: a block from 256 KiB up is mapped on its own and unmapped when freed,
# and free memory at the top of an arena over 128 KiB is returned at once; what is freed
# further down stays with the process.
WEB_ENV = web_process_environment()

# What the Procfile's worker process starts with: glibc's thresholds fixed as the web's are
# without jemalloc, so that a large model answer is a block mapped on its own and unmapped
# when freed, not a piece of an arena that stays with the process ("The seventeenth round"
# in docs/performance.md). jemalloc gave the workers nothing more.
WORKER_ENV = procfile_environment("worker")


# The daphne options of the Procfile's web line (tests/test_embedded.py holds them equal).
DAPHNE_OPTIONS = ["-v", "0", "--http-timeout", "60", "--websocket_connect_timeout", "5",
                  "--ping-interval", "20", "--ping-timeout", "30"]


class Web(Site):
    """daphne serving the ASGI application (HTTP and sockets) on ``port``, a free one by
    default; ``restart()`` serves on the same port again."""

    def __init__(self, *, name: str = "web", port: int | None = None,
                 extra_env: dict | None = None, log_dir: Path | None = None):
        port = port or free_port()
        super().__init__([sys.executable, "-m", "daphne", *DAPHNE_OPTIONS, "-b",
                          "127.0.0.1", "-p", str(port),
                          "awaken_site.asgi:application"], port=port, name=name,
                         env=environment({**WEB_ENV, **(extra_env or {})}), log_dir=log_dir)

    def ready(self) -> bool:
        """/healthz answers, with the database reachable."""
        return self.health().get("db") == "ok"


# What the embedded site must not inherit from this process: it runs on its defaults.
UNCONFIGURED = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "AWAKEN_QUEUE",
                "DJANGO_SETTINGS_MODULE", "AWAKEN_AGENTS", "AWAKEN_PROVIDER_BASE_URL",
                "AWAKEN_PROVIDER_API_KEY", "AWAKEN_PROVIDER_MODEL", "OPENAI_BASE_URL",
                "OPENAI_API_KEY")


DATABASE_FILE = "awaken.sqlite3"  # the embedded site's database, in its var directory


def _link_or_copy(source: str, target: str) -> None:
    """A hard link where the file system allows one (static files are only read)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _copy_prepared(source: Path, target: Path) -> None:
    """An embedded site's migrated database and collected static files, from one var
    directory into another."""
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copy2(source / DATABASE_FILE, target / DATABASE_FILE)
    shutil.copytree(source / "static", target / "static", copy_function=_link_or_copy,
                    dirs_exist_ok=True)


class EmbeddedSite(Site):
    """``manage.py serve`` as ``make run`` starts it, under ``var_dir``: web, worker and
    sweeper in one process, on SQLite, the in-memory broker and the in-memory layer.

    It ignores the configuration of this process (database, broker, queue, settings, agents,
    model provider). Ready, it knows the password of the operator its first start created,
    and a token.
    """

    def __init__(self, var_dir: Path, extra_env: dict | None = None, root: Path = ROOT):
        """``extra_env``: variables on top (a model provider, the agents to load...);
        ``root``: the checkout to serve (another one's, to compare its figures)."""
        self.var = Path(var_dir)
        self.root = Path(root)
        self.env = {key: value for key, value in os.environ.items()
                    if key not in UNCONFIGURED}
        self.env.update(AWAKEN_VAR_DIR=str(self.var), SECRET_KEY="embedded-test", DEBUG="0",
                        AWAKEN_DEMO_AGENTS="1", **WEB_ENV, **(extra_env or {}))
        self.prepare()
        self.admin_password: str | None = None
        port = free_port()
        super().__init__([sys.executable, "manage.py", "serve", "--port", str(port)],
                         port=port, name="serve", env=self.env, log_dir=self.var,
                         root=self.root)

    # What ``migrate`` and ``collectstatic`` made under the first new var directory of each
    # checkout: later sites of this process start from a copy, as if they had run both.
    _prepared: dict[Path, Path] = {}

    @property
    def database(self) -> Path:
        """The site's SQLite database file."""
        return self.var / DATABASE_FILE

    def prepare(self) -> None:
        """Migrate the site's database and collect its static files, as ``make run`` does.
        A var directory that holds no database yet gets a copy of what the first one of the
        checkout made: the migrations hold no state of their own, so the copy is what they
        would make again, in a fraction of the time."""
        made = self._prepared.get(self.root)
        fresh = not self.database.exists()
        if fresh and made is not None:
            _copy_prepared(made, self.var)
            return
        self.manage("migrate", "--no-input")
        self.manage("collectstatic", "--no-input")
        if fresh:
            kept = Path(tempfile.mkdtemp(prefix="awaken-prepared-"))
            atexit.register(shutil.rmtree, kept, ignore_errors=True)
            _copy_prepared(self.var, kept)
            self._prepared[self.root] = kept

    def ready(self) -> bool:
        """/healthz answers, and counts the embedded worker."""
        return self.health().get("workers", 0) >= 1

    def wait_ready(self, timeout: float = 40) -> Self:
        super().wait_ready(timeout)
        found = re.search(r"Created operator 'admin' with password: (\S+)", self.log())
        self.admin_password = found.group(1) if found else None
        self.token = self.manage("operator_token", "admin").strip()
        return self

    def manage(self, *args: str) -> str:
        """Run a management command on the site's own settings and database."""
        return subprocess.run([sys.executable, "manage.py", *args], cwd=self.root, env=self.env,
                              check=True, capture_output=True, text=True).stdout

    def add_user(self, username: str, password: str, role: str) -> None:
        self.manage("shell", "-c", (
            "from django.contrib.auth.models import User, Group; "
            f"u = User.objects.create_user({username!r}, password={password!r}); "
            f"u.groups.add(Group.objects.get_or_create(name={role!r})[0])"))
