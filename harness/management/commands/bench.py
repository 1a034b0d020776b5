"""Benchmarks that print figures: ``manage.py bench cancel``.

It starts its own web (daphne) and worker processes against the configured database and
broker (PostgreSQL and Redis for meaningful figures), drives them over HTTP like a script
would, and prints p50/p95/p99. Nothing here asserts a time: it measures.
"""

import asyncio
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from importlib import import_module
from operator import itemgetter
from pathlib import Path

import redis
import websockets
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from awaken_site.celery import app
from harness import celery_db, hostile
from harness.baseline import bench_hang
from harness.dbos_baseline import DbosSystem
from harness.instructions import instructions_bench
from harness.processes import (
    Busy,
    EmbeddedSite,
    PrivatePgBouncer,
    PrivateRedis,
    Process,
    Processes,
    ProcessFailed,
    Web,
    Worker,
    alone_on_the_database,
    cpu_ns,
    database_url,
    environment,
    issued_key,
    scratch_folder,
    wait_until,
)
from harness.writes import writes_bench
from runs import domain
from runs.domain import keys, selectors, sql
from runs.domain.attempts import renewal_chunks
from runs.domain.core import Ending
from runs.domain.overview import time_to_stop
from runs.models import (
    Attempt,
    AttemptState,
    CloseReason,
    ControlIntent,
    EndCause,
    Event,
    EventKind,
    OnExhausted,
    Run,
    RunState,
    WorkerProcess,
)
from runs.providers.stub import StubServer


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) < 2:
        value = samples[0] if samples else float("nan")
        return value, value, value
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[94], cuts[98]


def database_floors(samples: int) -> tuple[list, list]:
    """What the database costs before any of our code, on this process's connection: a
    round trip, and a durable commit of one row (the write-ahead log flushed to disk; a
    cancel's path commits twice)."""
    trips, commits = [], []
    with connection.cursor() as cursor:
        for _ in range(samples):
            sent = time.monotonic()
            cursor.execute("SELECT 1")
            cursor.fetchone()
            trips.append((time.monotonic() - sent) * 1000)
        cursor.execute("CREATE TABLE IF NOT EXISTS awaken_bench_commit (at bigint)")
        try:
            for _ in range(samples):
                sent = time.monotonic()
                with transaction.atomic():
                    cursor.execute("INSERT INTO awaken_bench_commit VALUES (%s)", [time.time_ns()])
                commits.append((time.monotonic() - sent) * 1000)
        finally:
            cursor.execute("DROP TABLE awaken_bench_commit")
    return trips, commits


def autovacuum_on() -> bool:
    """Whether the PostgreSQL server vacuums its tables by itself (its ``autovacuum``
    setting); True on SQLite, which has no such setting."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum')::boolean")
        return cursor.fetchone()[0]


def _threshold(name: str) -> str:
    """Autovacuum's threshold ``name`` of a table: a base, plus a share of the rows it last
    held (none before its first vacuum or analyze)."""
    return (f"current_setting('autovacuum_{name}_threshold')::float8 + "
            f"current_setting('autovacuum_{name}_scale_factor')::float8 "
            "* greatest(pg_class.reltuples, 0)")


# Which tables a server whose autovacuum is on would vacuum or analyze now, by its own
# rule and settings ("The Autovacuum Daemon" in PostgreSQL's manual): dead rows past the
# vacuum threshold, or rows inserted since the last vacuum past the insert threshold (-1
# turns that one off), vacuum; rows changed since the last analyze past the analyze
# threshold, analyze.
AUTOVACUUM_DUE = f"""
    SELECT stat.relname,
           stat.n_dead_tup > {_threshold("vacuum")}
           OR (current_setting('autovacuum_vacuum_insert_threshold')::float8 >= 0
               AND stat.n_ins_since_vacuum > {_threshold("vacuum_insert")}),
           stat.n_mod_since_analyze > {_threshold("analyze")}
    FROM pg_stat_user_tables AS stat JOIN pg_class ON pg_class.oid = stat.relid
    WHERE stat.schemaname = current_schema()
"""


def vacuum_tables() -> None:
    """The tables vacuumed and analyzed that a server whose autovacuum is on would have
    (``AUTOVACUUM_DUE``), as that server keeps them.

    Without statistics the planner guesses the rows of each condition, and may choose plans
    for the statements of a transition that no such server would; and the dead versions of
    rows updated over and over (the totals' deltas that /metrics reads, a million after a
    day of benchmarks) are read past by every scan until a VACUUM. Tables below the
    thresholds are left as they are, as that server leaves them: an empty table analyzed
    tells the planner it holds nothing, and the plans a connection keeps for its life (the
    foreign keys' checks among them) would then read the whole table as it grows."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(AUTOVACUUM_DUE)
        for table, vacuum, analyze in cursor.fetchall():
            if vacuum or analyze:
                what = ("VACUUM (ANALYZE)" if vacuum and analyze
                        else "VACUUM" if vacuum else "ANALYZE")
                cursor.execute(f"{what} {sql.quoted(table)}")


@dataclass
class Cancels:
    """Cancels measured one by one over HTTP (``Command.cancel_samples``), in ms."""

    cpu: dict  # name of a group of processes -> CPU ns they spent, request to response
    committed: list = field(default_factory=list)  # request sent -> end committed
    answered: list = field(default_factory=list)  # request sent -> response read
    codes: dict = field(default_factory=dict)  # HTTP status -> count
    runs: list = field(default_factory=list)  # the runs cancelled
    unstarted: int = 0  # runs to cancel that were not running 30 s after their creation

    def rows(self, key: str, note: str = "") -> list:
        codes = ", ".join(f"{code}: {count}" for code, count in sorted(self.codes.items()))
        if self.unstarted:
            codes += f"; {self.unstarted} not started in 30 s, not measured"
        return [(key, "REST cancel -> ended/cancelled committed", self.committed,
                 "; ".join(filter(None, (codes, note)))),
                (key, "REST cancel -> 200 response", self.answered, ""),
                *((key, f"CPU of the {name} per cancel", spent / 1e6 / max(len(self.answered), 1),
                   "ms, all threads, request to response") for name, spent in self.cpu.items())]


def committed_ms(run_id, sent_wall: float) -> float | None:
    """ms from ``sent_wall`` (``time.time()``, when a request was sent) to the committed end
    of the run ``run_id``; None if it has not ended."""
    ended_at = Run.objects.values_list("ended_at", flat=True).get(pk=run_id)
    return None if ended_at is None else (ended_at.timestamp() - sent_wall) * 1000


def create_in_batches(client, spec: dict, count: int, size: int) -> list[str]:
    """Create ``count`` runs of ``spec`` over ``POST /api/runs/batch/``, ``size`` at a time;
    their ids."""
    made: list[str] = []
    while len(made) < count:
        status, body = client.call("POST", "/api/runs/batch/",
                                   {"runs": [spec] * min(size, count - len(made))})
        if status != 201:
            raise CommandError(f"batch create failed: {status} {body}")
        made += [run["id"] for run in body["results"]]
    return made


class KeptConnection:
    """The lifecycle benchmark's HTTP client, as cheap as a client can be, so that what it
    costs stays small next to what it measures: one kept socket, requests encoded once and
    sent as bytes, and of each response only the status read (the body is read to its
    ``Content-Length`` and not parsed). Django's CommonMiddleware gives every response of
    the API a length."""

    def __init__(self, port: int, token: str):
        self.address = ("127.0.0.1", port)
        self.token = token
        self.socket: socket.socket | None = None
        self.buffer = b""

    def request(self, method: str, path: str, body: bytes = b"") -> bytes:
        """The bytes of one request, to send any number of times."""
        return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Token {self.token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    def send(self, request: bytes) -> int:
        """Send a request made by ``request`` and read its response; its status."""
        if self.socket is None:
            self.socket = socket.create_connection(self.address, timeout=60)
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.socket.sendall(request)
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self.buffer += self.receive()
        head, self.buffer = self.buffer[:end], self.buffer[end + 4:]
        length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
        if length is None:
            raise CommandError(f"a response without Content-Length: {head[:200]!r}")
        while len(self.buffer) < int(length.group(1)):
            self.buffer += self.receive()
        self.buffer = self.buffer[int(length.group(1)):]
        return int(head[9:12])

    def receive(self) -> bytes:
        data = self.socket.recv(65536)
        if not data:
            raise CommandError("the web process closed the connection")
        return data

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()


def load_average() -> float:
    """The machine's load average over the last minute."""
    return os.getloadavg()[0]


def pace() -> float:
    """Milliseconds of CPU that a fixed loop of pure Python takes now: the machine's pace.
    A busy neighbour on the same host can change it by half with no load visible here, and
    every figure of CPU per unit of work moves with it."""
    started = time.thread_time()
    total = 0
    for number in range(1_000_000):
        total += number * number
    return (time.thread_time() - started) * 1000


def load_span(before: float) -> str:
    """The load average at a measurement's start and now, and the CPUs that share it."""
    return f"load {before:.2f} -> {load_average():.2f} on {os.cpu_count()} CPUs"


def with_load(measure) -> list:
    """The rows ``measure()`` makes, each with the load average at its start and end."""
    before = load_average()
    rows = measure()
    return [(*row, f"{before:.2f}-{load_average():.2f}") for row in rows]


class Client:
    def __init__(self, port: int, token: str):
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}

    def call(self, method, path, body=None):
        self.connection.request(method, path, body=json.dumps(body) if body is not None else None,
                                headers=self.headers)
        response = self.connection.getresponse()
        return response.status, json.loads(response.read() or b"null")


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def process_environment(pairs: list[str], option: str = "--web-env") -> dict:
    """``option``'s ``NAME=VALUE`` pairs (``--web-env``, ``--worker-env``) as a dict (the
    last of a name wins); anything without a variable's name before its ``=`` is refused."""
    env = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or ENV_NAME.fullmatch(name) is None:
            raise CommandError(f"{option} takes NAME=VALUE, not {pair!r}.")
        env[name] = value
    return env


# The folder whose sitecustomize times a process's full collector passes (bench gc).
GC_PROBE = Path(__file__).resolve().parents[2] / "gcprobe"


class Command(BaseCommand):
    help = ("Benchmarks: live cancel latency (with Celery's revoke as a baseline), cancel of a "
            "streaming model call as the provider sees it, socket push latency, lifecycle "
            "throughput, run-list latency at 100k runs, memory per live attempt and what a "
            "worker's first run of each chat agent costs its other runs. With no "
            "argument, all of them in one table. On demand only: 'hostile', the hostile-input "
            "suite against a real daphne, with its memory and CPU before, during and after; "
            "'spread', 10,000 live attempts on 4 worker processes: cancels among them, their "
            "memory and what a lease interval costs the database; 'flood', a viewer's read "
            "flood against the database pool while an operator cancels; 'instructions', "
            "what a create, a read and a cancel cost the web, counted by valgrind's callgrind.")

    def add_arguments(self, parser):
        parser.add_argument("what", nargs="?", default="all",
                            choices=["all", "cancel", "provider", "push", "lifecycle", "list",
                                     "memory", "sql", "metrics", "leases", "spread",
                                     "hostile", "flood", "watch", "writes", "first",
                                     "gc", "instructions"])
        parser.add_argument("--watchers", type=int, default=3,
                            help="watch: browser pages on the busy run's page.")
        parser.add_argument("--watch-kind", default="steps,parent",
                            help="watch: the busy runs, steps (its own) and/or parent (its "
                                 "children's), comma-separated.")
        parser.add_argument("--root", default=None,
                            help="watch: the checkout whose embedded site is served (another "
                                 "one's, to compare; this one by default).")
        parser.add_argument("--live", default="1,100,500",
                            help="cancel: numbers of other live attempts on the worker.")
        parser.add_argument("--cancels", type=int, default=300,
                            help="cancel: samples per level; spread: samples.")
        parser.add_argument("--batch", type=int, default=25,
                            help="cancel, spread: runs started together, then cancelled one "
                                 "by one.")
        parser.add_argument("--no-baseline", action="store_true")
        parser.add_argument("--no-dbos", action="store_true",
                            help="cancel, lifecycle: leave out the DBOS baseline.")
        parser.add_argument("--dbos-poll", type=float, default=0.05,
                            help="cancel, lifecycle: seconds between the DBOS workers' polls "
                                 "of their queue (DBOS's default is 1).")
        parser.add_argument("--dbos-steps", default="10",
                            help="cancel: lengths in ms of the DBOS workflow's steps, one "
                                 "measurement each (DBOS stops a workflow between steps).")
        parser.add_argument("--provider-cancels", type=int, default=200,
                            help="provider: cancels of streaming model calls measured.")
        parser.add_argument("--clients", default="1,1000",
                            help="push: numbers of connected socket clients.")
        parser.add_argument("--commits", type=int, default=200,
                            help="push: committed transitions measured per client count.")
        parser.add_argument("--lifecycles", type=int, default=5000,
                            help="lifecycle: runs created and completed.")
        parser.add_argument("--workers", type=int, default=4,
                            help="lifecycle, spread: worker processes.")
        parser.add_argument("--rounds", type=int, default=1,
                            help="lifecycle: rounds, each ours then the Celery baseline; "
                                 "hostile: times the whole attack is repeated.")
        parser.add_argument("--count-every", type=float, default=0.25,
                            help="lifecycle: seconds between counts of the completed, on "
                                 "both sides.")
        parser.add_argument("--webs", type=int, default=1,
                            help="lifecycle, spread: web processes, the callers (lifecycle) "
                                 "or the cancels (spread) spread over them in turn.")
        parser.add_argument("--web-env", action="append", default=[], metavar="NAME=VALUE",
                            help="a variable of the environment of the web processes the "
                                 "benchmark starts, on top of the Procfile's (say "
                                 "PYTHONMALLOC=pymalloc, to weigh the allocator); repeatable.")
        parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                            help="the same for the worker processes the benchmark starts (not "
                                 "the baselines'); repeatable.")
        parser.add_argument("--private-redis", action="store_true",
                            help="lifecycle: ours and Celery's on a Redis server of the "
                                 "benchmark's own, its CPU counted with the system's.")
        parser.add_argument("--pooler", action="store_true",
                            help="our web processes and workers reach PostgreSQL through a "
                                 "PgBouncer of the benchmark's own in transaction mode "
                                 f"({POOLER_SESSIONS} server sessions, DB_POOLER=transaction); "
                                 "lifecycle and cancel count its CPU with the system's.")
        parser.add_argument("--list-runs", type=int, default=100_000,
                            help="list: runs in the database (imported in bulk if fewer).")
        parser.add_argument("--attempts", type=int, default=500,
                            help="memory: live attempts held by one worker process.")
        parser.add_argument("--answer-runs", type=int, default=96,
                            help="memory: runs of large model answers by each chat agent, on "
                                 "one worker process (0: none).")
        parser.add_argument("--answer-bytes", type=int, default=400_000,
                            help="memory: the size of each of those answers.")
        parser.add_argument("--first-rounds", type=int, default=3,
                            help="first: fresh workers started for each chat agent.")
        parser.add_argument("--requests", type=int, default=50,
                            help="instructions: requests of each kind counted.")
        parser.add_argument("--transitions", type=int, default=2000,
                            help="sql: transitions measured each way.")
        parser.add_argument("--writes", type=int, default=3000,
                            help="writes: updates, and inserts, of a run measured on each "
                                 "copy of the runs table, in blocks of 100; and runs created, "
                                 "claimed and ended each way, alone and 50 together.")
        parser.add_argument("--embedded", action="store_true",
                            help="hostile: attack the embedded site (manage.py serve, on "
                                 "SQLite) instead of daphne on the configured database.")
        parser.add_argument("--scale", type=float, default=1.0,
                            help="hostile: size of every phase, 1 being the full attack.")
        parser.add_argument("--units", type=int, default=hostile.Sizes.units,
                            help="hostile: units of normal work timed before the attack and "
                                 "after it, the memory and threads printed after each.")
        parser.add_argument("--seed", type=int, default=None,
                            help="hostile: the socket fuzzer's seed (random by default).")
        parser.add_argument("--metrics-runs", type=int, default=1_000_000,
                            help="metrics: runs in the database (inserted in bulk if fewer).")
        parser.add_argument("--leased", type=int, default=2000,
                            help="leases: live attempts of the one worker that renews them.")
        parser.add_argument("--scrapes", type=int, default=300,
                            help="metrics: scrapes of /metrics measured.")
        parser.add_argument("--spread", type=int, default=10_000,
                            help="spread: live attempts, shared evenly by the worker processes.")
        parser.add_argument("--ended", type=int, default=0,
                            help="spread: ended runs in the database (inserted in bulk, as for "
                                 "metrics, if fewer).")

    web_env: dict = {}  # the web processes' variables on top of the Procfile's (--web-env)
    worker_env: dict = {}  # the workers' variables on top of the Procfile's (--worker-env)
    pooler = False  # our processes reach PostgreSQL through a PgBouncer of ours (--pooler)
    pgbouncer: PrivatePgBouncer | None = None  # that PgBouncer, while our processes run

    def handle(self, what, **options):
        self.web_env = process_environment(options["web_env"])
        self.worker_env = process_environment(options["worker_env"], "--worker-env")
        self.pooler = options["pooler"]
        # Some parts create demo runs in this process through the domain; the processes the
        # benchmark starts register the demo agents themselves (harness.processes).
        import_module("runs.agents.demo")
        # A SIGTERM unwinds like Ctrl-C, so the processes the benchmark started are stopped
        # by the blocks that started them rather than left running.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        self.load, self.pace, self.autovacuum = load_average(), pace(), autovacuum_on()
        if self.load > 1.0:
            self.stderr.write(f"warning: the machine is loaded before the benchmark starts "
                              f"(load average {self.load:.2f} over the last minute, "
                              f"{os.cpu_count()} CPUs): its figures are no verdict; rerun on "
                              "a quiet machine")
        if what == "sql":  # in this process alone: the database is all it needs
            self.print_table(with_load(lambda: self.statements(options["transitions"])))
            return
        if what == "leases":  # in this process alone too
            self.print_table(with_load(lambda: leases_bench(options["leased"])))
            return
        if what == "writes":  # in this process and the database alone
            if connection.vendor != "postgresql":
                raise CommandError("writes measures PostgreSQL's own work: set DATABASE_URL "
                                   "(PostgreSQL)")
            try:
                with alone_on_the_database():  # the runs it imports are the newest
                    self.tidy()
                    self.print_table(with_load(lambda: writes_bench(options["writes"])))
            except Busy as error:
                raise CommandError(str(error)) from None
            return
        if what == "watch":  # an embedded site of its own, on SQLite
            self.watch(options["watchers"], options["watch_kind"].split(","), options["root"])
            return
        if what == "hostile" and options["embedded"]:  # a site of its own, on SQLite
            self.hostile_embedded(hostile_sizes(options), options["rounds"], options["seed"])
            return
        if not settings.REDIS_URL or "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
            raise CommandError("Set DATABASE_URL (PostgreSQL) and REDIS_URL: the benchmark "
                               "runs separate processes, which need a shared database and layer.")
        try:
            with alone_on_the_database():
                self.tidy()
                self.measure(what, options)
        except Busy as error:
            raise CommandError(str(error)) from None

    def tidy(self) -> None:
        """The tables vacuumed and analyzed where the server's autovacuum is off, once this
        benchmark has the database to itself (``vacuum_tables``)."""
        if not self.autovacuum:
            vacuum_tables()

    def measure(self, what, options):
        """The parts that start processes of their own on the shared database."""
        # The web processes serve on these settings, as a deployment does: their pages (the
        # error page among them) name the collected static files by their hashed names.
        call_command("collectstatic", interactive=False, verbosity=0)
        self.token = issued_key("bench", "operator")
        parts = {
            "cancel": lambda: self.cancel([int(n) for n in options["live"].split(",")],
                                          options["cancels"], options["batch"],
                                          options["no_baseline"],
                                          dbos_steps=None if options["no_dbos"] else [
                                              float(n) for n in
                                              options["dbos_steps"].split(",")],
                                          dbos_poll=options["dbos_poll"]),
            "provider": lambda: self.provider(options["provider_cancels"]),
            "push": lambda: self.push([int(n) for n in options["clients"].split(",")],
                                      options["commits"]),
            "lifecycle": lambda: self.lifecycle(options["lifecycles"], options["workers"],
                                                options["rounds"], options["no_baseline"],
                                                options["count_every"], options["webs"],
                                                not options["no_dbos"], options["dbos_poll"],
                                                options["private_redis"]),
            "list": lambda: self.list_latency(options["list_runs"]),
            "memory": lambda: (self.memory(options["attempts"])
                               + self.answers(options["answer_runs"], options["answer_bytes"])),
            "sql": lambda: self.statements(options["transitions"]),
            "first": lambda: self.first_runs(options["first_rounds"]),
            "gc": lambda: self.collector(options["answer_runs"], options["answer_bytes"]),
            "metrics": lambda: self.metrics(options["metrics_runs"], options["scrapes"]),
            "instructions": lambda: counted_instructions(options["requests"]),
            "spread": lambda: self.spread(options["spread"], options["workers"],
                                          options["cancels"], options["batch"],
                                          options["ended"], options["webs"]),
        }
        if what == "hostile":
            self.hostile(hostile_sizes(options), options["rounds"], options["seed"])
            return
        if what == "flood":
            self.flood(options["rounds"])
            return
        rows = []
        try:
            on_demand = ("spread", "gc", "instructions")
            for name in ([p for p in parts if p not in on_demand] if what == "all"
                         else [what]):
                rows += with_load(parts[name])
        except (TimeoutError, ProcessFailed) as error:
            raise CommandError(str(error)) from error
        self.print_table(rows)

    @contextmanager
    def system(self, workers: int = 1, extra_env: dict | None = None, *, warm: bool = True):
        """A web process and ``workers`` worker processes of the benchmark's own, on a queue
        of its own, with their logs in a temporary directory; yields the web process and
        the workers once they are ready, and, if ``warm``, once each has prepared every
        agent as it starts (``harness.processes.Worker``): no figure holds that work."""
        with self.system_of(1, workers, extra_env, warm=warm) as ([web], started):
            yield web, started

    @contextmanager
    def system_of(self, webs: int, workers: int, extra_env: dict | None = None, *,
                  warm: bool = True):
        """As ``system``, with ``webs`` web processes; yields them and the workers."""
        queue = f"awaken-bench-{uuid.uuid4().hex[:8]}"
        env = {"AWAKEN_QUEUE": queue, **(extra_env or {})}
        with scratch_folder("awaken-bench-") as logs, ExitStack() as stack:
            if self.pooler:
                self.pgbouncer = stack.enter_context(PrivatePgBouncer(
                    database_url(), sessions=POOLER_SESSIONS, log_dir=logs)).wait_ready(30)
                stack.callback(setattr, self, "pgbouncer", None)
                env.update(DATABASE_URL=self.pgbouncer.url, DB_POOLER="transaction")
            processes = stack.enter_context(Processes())
            served = [processes.add(Web(name=f"web{index}" if index else "web",
                                        extra_env={**env, **self.web_env}, log_dir=logs))
                      for index in range(webs)]
            started = [processes.add(Worker(f"bench{index}-{queue}", queue=queue, concurrency=8,
                                            extra_env={**env, **self.worker_env},
                                            loglevel="WARNING", log_dir=logs, warm=warm,
                                            broker=env.get("CELERY_BROKER_URL")))
                       for index in range(workers)]
            processes.wait_ready(90)
            try:
                yield served, started
            finally:
                self.cleanup()  # while the workers still take live commands

    def cancel(self, levels, cancels, batch, no_baseline, dbos_steps=None,
               dbos_poll: float = 0.05) -> list:
        rows = []
        # Room on the worker for the live attempts and the runs cancelled among them.
        room = {"AWAKEN_WORKER_CAPACITY": str(max(levels) + batch)}
        with self.system(extra_env=room) as (web, workers):
            client = Client(web.port, self.token)
            rows += self.floors(client, workers[0], cancels)
            for level in levels:
                rows += self.measure_level(client, level, cancels, batch, cpu_of={
                    "web": [web], "worker": workers[:1],
                    **({"PgBouncer": [self.pgbouncer]} if self.pgbouncer else {})})
            if not no_baseline:
                try:
                    rows.append(self.baseline(cancels))
                except (TimeoutError, ProcessFailed) as failure:  # a row, and the rest goes on
                    rows.append(("", REVOKE, Failed(f"{type(failure).__name__}: {failure}"),
                                 "prefork -c 2"))
        if not no_baseline and dbos_steps:
            rows += dbos_cancels(cancels, dbos_steps, dbos_poll)
        return rows

    # --- set-up -------------------------------------------------------------------------

    def cleanup(self):
        """End whatever the benchmark left live, so no run of it stays running (called
        while its workers still run, so they take the stops and commit them)."""
        left = list(Run.objects.filter(created_by__username="bench").exclude(
            state=RunState.ENDED).values_list("id", flat=True))

        def stop(run_ids):
            try:
                for run_id in run_ids:
                    domain.run_stop(run_id=run_id, actor="bench", source="cli",
                                    reason="benchmark finished")
            finally:
                connection.close()  # this thread's own

        if len(left) > 100:  # thousands of live attempts: stopped by 8 threads
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(stop, [left[start::8] for start in range(8)]))
        else:
            for run_id in left:
                domain.run_stop(run_id=run_id, actor="bench", source="cli",
                                reason="benchmark finished")

        def ended() -> bool:
            if not Run.objects.filter(pk__in=left).exclude(state=RunState.ENDED).exists():
                return True
            domain.sweep()  # a run whose worker is gone (an earlier, killed benchmark)
            return False

        wait_until(ended, 4 * settings.AWAKEN_LEASE_SECONDS + len(left) / 100,
                   "the runs of the benchmark to end", every=0.5)

    # --- measurements ---------------------------------------------------------------------

    def create(self, client, agent, input=None) -> str:
        status, body = client.call("POST", "/api/runs/", {"agent": agent, "input": input or {}})
        if status != 201:
            raise CommandError(f"create failed: {status} {body}")
        return body["id"]

    def floors(self, client, worker, samples: int) -> list:
        """What the parts of a cancel cost on this machine with nothing of ours in them:
        an authenticated read of one run through the same web process (the HTTP, Django,
        DRF and key check every request pays), and a remote-control round trip to the
        same worker through the broker (the hop a live signal takes, and back)."""
        run_id = self.create(client, "demo.steps", {"steps": 1, "step_seconds": 0})
        reads, pings = [], []
        for _ in range(samples):
            sent = time.monotonic()
            client.call("GET", f"/api/runs/{run_id}/")
            reads.append((time.monotonic() - sent) * 1000)
        for _ in range(samples):
            sent = time.monotonic()
            if not app.control.ping(destination=[worker.node], timeout=1.0, limit=1):
                raise CommandError(f"{worker.node} did not answer a ping")
            pings.append((time.monotonic() - sent) * 1000)
        trips, commits = database_floors(samples)
        return [("floor", "GET one run -> 200 (HTTP, Django, DRF, key check)", reads, ""),
                ("floor", "broker round trip to the worker (control ping)", pings,
                 "one way is about half"),
                ("floor", "database round trip (SELECT 1)", trips, "psycopg, no ORM"),
                ("floor", "database durable commit (one-row INSERT, COMMIT)", commits,
                 "a cancel commits twice")]

    def measure_level(self, client, level: int, cancels: int, batch: int, cpu_of: dict) -> list:
        background = [self.create(client, "demo.steps", {"steps": 1, "step_seconds": 86400})
                      for _ in range(level)]
        wait_until(lambda: Run.objects.filter(pk__in=background, state=RunState.RUNNING).count()
                   == len(background), 120, f"{level} live attempts")
        measured = self.cancel_samples([client], cancels, batch, cpu_of)
        for run_id in background:
            client.call("POST", f"/api/runs/{run_id}/cancel/?wait=0", {})
        return measured.rows(f"{level} live")

    def cancel_samples(self, clients: list, cancels: int, batch: int,
                       cpu_of: dict) -> "Cancels":
        """Start hung runs ``batch`` at a time and cancel them one by one over HTTP, each
        through the next of ``clients`` (one per web process) in turn: the time from each
        request to the committed end and to the response, and the CPU that the processes
        of ``cpu_of`` (name -> processes) and this database's PostgreSQL backends (but the
        benchmark's own) spent from request to response."""
        client = clients[0]
        measured = Cancels(cpu=dict.fromkeys([*cpu_of, "PostgreSQL backends"], 0))
        while len(measured.answered) < cancels and measured.unstarted < cancels:
            runs = [self.create(client, "demo.hang")
                    for _ in range(min(batch, cancels - len(measured.answered)))]
            try:
                wait_until(lambda runs=runs: Run.objects.filter(
                    pk__in=runs, state=RunState.RUNNING).count() == len(runs), 30,
                    "the runs to cancel to start")
            except TimeoutError:
                pass
            started = set(map(str, Run.objects.filter(pk__in=runs, state=RunState.RUNNING)
                              .values_list("pk", flat=True)))
            measured.unstarted += len(runs) - len(started)
            for run_id in runs:
                if run_id not in started:  # ended unmeasured: a cancel of a queued run
                    client.call("POST", f"/api/runs/{run_id}/cancel/?wait=0", {})
                    continue
                cpu_before = {name: sum(cpu_ns(p.popen.pid) for p in group)
                              for name, group in cpu_of.items()}
                backends_before = backends_cpu_ns()
                sent_wall, sent = time.time(), time.monotonic()
                status, body = clients[len(measured.answered) % len(clients)].call(
                    "POST", f"/api/runs/{run_id}/cancel/", {})
                measured.answered.append((time.monotonic() - sent) * 1000)
                for name, group in cpu_of.items():
                    measured.cpu[name] += (sum(cpu_ns(p.popen.pid) for p in group)
                                           - cpu_before[name])
                backends_after = backends_cpu_ns(list(backends_before))
                measured.cpu["PostgreSQL backends"] += sum(
                    spent - backends_before[pid] for pid, spent in backends_after.items())
                measured.codes[status] = measured.codes.get(status, 0) + 1
                measured.runs.append(run_id)
                committed = committed_ms(run_id, sent_wall)
                if committed is not None:
                    measured.committed.append(committed)
        return measured

    def baseline(self, cancels) -> tuple:
        """Celery's own revoke(terminate=True) of a plain hanging task on a prefork worker
        of its own queue."""
        with Worker(f"bench-prefork-{uuid.uuid4().hex[:8]}", private=True, pool="prefork",
                    concurrency=2, include=("harness.baseline",), loglevel="WARNING") as prefork:
            prefork.wait_ready(60)
            return ("", REVOKE, self.revoke_samples(prefork.queue, cancels), "prefork -c 2")

    def revoke_samples(self, queue, cancels) -> list:
        client = redis.Redis.from_url(settings.REDIS_URL)
        samples = []
        for _ in range(cancels):
            key = f"awaken-bench:{uuid.uuid4().hex}"
            result = bench_hang.apply_async(args=[key], queue=queue)
            wait_until(lambda key=key: client.exists(f"{key}:started"), 30,
                       "the plain task to start")
            sent = time.time()
            app.control.revoke(result.id, terminate=True, signal="SIGUSR1")
            wait_until(lambda key=key: client.exists(f"{key}:stopped"), 30,
                       "the plain task to stop")
            samples.append((float(client.get(f"{key}:stopped")) - sent) * 1000)
            client.delete(f"{key}:started", f"{key}:stopped")
        return samples

    def print_table(self, rows) -> None:
        """One table of (first column, measurement, samples or a single value, note[, the
        load average at the start and end of its part]) rows, with the machine's load
        average at the benchmark's start and end, and a warning when it was above 1.0 at
        the start."""
        database = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        broker = settings.CELERY_BROKER_URL.split(":", 1)[0]
        start = self.load
        self.stdout.write(f"\nawaken-site benchmarks: {os.cpu_count()} CPUs, {database}, "
                          f"broker {broker}, Redis pub/sub channel layer; times in ms")
        self.stdout.write(f"load average (1 min): {start:.2f} at the start, "
                          f"{load_average():.2f} at the end, on {os.cpu_count()} CPUs")
        self.stdout.write(f"pace: a fixed loop took {self.pace:.0f} ms of CPU at the start, "
                          f"{pace():.0f} at the end (a slower machine spends more on "
                          "everything, whatever the load)")
        for line in self.env_lines():
            self.stdout.write(line)
        if not self.autovacuum:
            self.stdout.write("note: autovacuum is off on this PostgreSQL server: at its start "
                              "the benchmark vacuumed and analyzed the tables past autovacuum's "
                              "thresholds, as autovacuum would have, but the dead rows it "
                              "makes stay in them until the next benchmark")
        if start > 1.0:
            self.stdout.write("warning: the machine was loaded when the benchmark started: "
                              "these figures are no verdict; rerun on a quiet machine")
        self.stdout.write("")
        rows = [row if len(row) == 5 else (*row, "") for row in rows]
        width = max(len(name) for _, name, _, _, _ in rows) + 2
        header = (f"{'':>7}  {'measurement':<{width}}{'n':>6}{'p50':>10}{'p95':>9}{'p99':>9}"
                  f"  {'load':<11}  note")
        self.stdout.write(header)
        self.stdout.write("-" * len(header))
        for key, name, samples, note, load in rows:
            if isinstance(samples, list):
                p50, p95, p99 = percentiles(samples)
                figures = f"{len(samples):>6}{p50:>10.2f}{p95:>9.2f}{p99:>9.2f}"
            elif isinstance(samples, Failed):
                figures = f"{'':>6}{'failed':>10}{'':>18}"
                note = f"failed: {samples}" + (f"; {note}" if note else "")
            elif isinstance(samples, Ratio):
                figures = f"{'':>6}{samples:>9.2f}x{'':>18}"
            else:
                figures = f"{'':>6}{samples:>10.1f}{'':>18}"
            self.stdout.write(f"{key!s:>7}  {name:<{width}}{figures}  {load:<11}  {note}")

    # --- a streaming model call ------------------------------------------------------------

    def provider(self, cancels: int) -> list:
        """Cancel runs whose model call hangs mid-stream, one at a time, and time at the
        provider's side when each connection closes: the provider stub is served by this
        process, so the cancel request and the stub's clock are the same clock. Our own
        interface (``demo.chat``), then each installed framework's shipped chat agent, each
        streaming, held after its first chunk."""
        agents = [(name, "our interface" if name == "demo.chat" else name.split(".")[0], {})
                  for name in self.chat_agents()]
        rows = []
        with StubServer() as server:
            stub = server.stub
            env = {"AWAKEN_PROVIDER_BASE_URL": server.url, "AWAKEN_PROVIDER_MODEL": "echo+hang"}
            with self.system(extra_env=env) as (web, _):
                client = Client(web.port, self.token)
                for agent, label, extra in agents:
                    closed, committed = self._provider_cancels(client, stub, agent, extra,
                                                               cancels)
                    rows += [("1 live", f"REST cancel -> provider connection closed "
                              f"({label})", closed, "at the provider stub"),
                             ("1 live", f"REST cancel -> committed, model call hanging "
                              f"({label})", committed, "")]
        return rows

    def _provider_cancels(self, client, stub, agent: str, extra: dict, cancels: int):
        closed, committed = [], []
        for _ in range(cancels):
            last = max((call.number for call in stub.calls), default=0)
            run_id = self.create(client, agent, {"prompt": "stream, then hang",
                                                 **extra})
            call = stub.wait(lambda calls, last=last: next(
                (c for c in calls if c.number > last and c.holding), None), 60,
                "a streaming model call")
            sent_wall, sent = time.time(), time.monotonic()
            client.call("POST", f"/api/runs/{run_id}/cancel/", {})
            stub.wait(lambda calls, call=call: call.disconnected, 30,
                      "the provider's connection to close")
            closed.append((call.disconnected - sent) * 1000)
            committed.append(committed_ms(run_id, sent_wall))
        return closed, committed

    def first_runs(self, rounds: int) -> list:
        """A worker's first run of each chat agent, on a fresh worker process each round:
        from its create to its first model call (a framework's agent imports its framework
        at its first run); a cancel of another live run of the same worker, sent as soon as
        the first run is seen running, to its committed end; and the same once the first
        run is in its model call, the worker warm. Also how long each worker's start took
        to prepare every agent, from its executor's start to the freeze."""
        rows, prepared = [], []
        with StubServer() as server:
            stub = server.stub
            env = {"AWAKEN_PROVIDER_BASE_URL": server.url, "AWAKEN_PROVIDER_MODEL": "echo+hang"}
            for agent in self.chat_agents():
                called, committed, warm = [], [], []
                for _ in range(rounds):
                    with self.system(extra_env=env, warm=False) as (web, [worker]):
                        client = Client(web.port, self.token)
                        other = self.live_run(client)
                        last = max((call.number for call in stub.calls), default=0)
                        created = time.monotonic()
                        first = self.create(client, agent, {"prompt": "stream, then hang"})
                        wait_until(lambda first=first: Run.objects.filter(
                            pk=first, state=RunState.RUNNING).exists(), 30,
                            f"the first run of {agent}", every=0.002)
                        committed.append(self.cancel_committed(client, other))
                        call = stub.wait(lambda calls, last=last: next(
                            (c for c in calls if c.number > last and c.holding), None), 60,
                            f"the first model call of {agent}")
                        called.append((call.started - created) * 1000)
                        warm.append(self.cancel_committed(client, self.live_run(client)))
                        prepared.append(1000 * wait_until(
                            worker.prepared_seconds, 120, "the worker's preparations"))
                rows += [("first run", f"{agent}: create -> its first model call", called,
                          "a fresh worker"),
                         ("first run", f"cancel of another live run -> committed, as "
                          f"{agent}'s first run starts", committed, ""),
                         ("first run", "the same once that run is in its model call",
                          warm, "")]
        return rows + [("first run", "a fresh worker: its start's preparations, from its "
                        "executor's start to the freeze", prepared,
                        "the demo catalogue")]

    def live_run(self, client) -> str:
        run_id = self.create(client, "demo.hang")
        wait_until(lambda: Run.objects.filter(pk=run_id, state=RunState.RUNNING).exists(),
                   30, "a live run")
        return run_id

    def cancel_committed(self, client, run_id: str) -> float:
        """Cancel the live run ``run_id`` without waiting for its end; ms from the request
        to its end's commit."""
        sent_wall = time.time()
        client.call("POST", f"/api/runs/{run_id}/cancel/?wait=0", {})
        wait_until(lambda: Run.objects.filter(pk=run_id, state=RunState.ENDED).exists(), 30,
                   "the cancelled run to end", every=0.002)
        return committed_ms(run_id, sent_wall)

    # --- socket push ------------------------------------------------------------------------

    def push(self, levels: list[int], commits: int) -> list:
        """Commit a transition, and time its arrival at every connected socket client.

        The clients run in this process on one event loop in a thread of their own (their own
        parsing is part of the figure, as a browser's would be); the commits are made by this
        process too, through the domain, so commit -> push -> receipt is measured end to end.
        """
        rows = []
        with self.system(workers=0) as (web, _):
            for count in levels:
                swarm = Swarm(web.port, self.token, count)
                made = []
                try:
                    first, last = [], []
                    for _ in range(commits):
                        swarm.arm()
                        committed = time.monotonic()
                        made.append(domain.run_create(agent="demo.steps", dispatch=False,
                                                      source="cli")[0].pk)
                        arrivals = swarm.collect(timeout=10)
                        first.append((min(arrivals) - committed) * 1000)
                        last.append((max(arrivals) - committed) * 1000)
                        time.sleep(max(0.01, count / 5000))  # let the fan-out drain fully
                finally:
                    swarm.close()
                    for run_id in made:  # never dispatched: no queued run is left behind
                        domain.run_cancel(run_id=run_id, actor="bench", source="cli")
                rows.append((f"{count} ws", "commit -> first socket client receives", first, ""))
                rows.append((f"{count} ws", f"commit -> last of {count} clients receives", last,
                             ""))
        return rows

    # --- throughput, list latency, memory ----------------------------------------------------

    def lifecycle(self, total: int, workers: int, rounds: int = 1, no_baseline: bool = False,
                  every: float = 0.25, webs: int = 1, dbos: bool = True,
                  dbos_poll: float = 0.05, private_redis: bool = False) -> list:
        """Lifecycles per second, by one protocol for every side: 8 callers send ``total``
        creates without waiting for any (``KeptConnection``, spread over ``webs`` web
        processes), ``workers`` worker processes complete them (create -> claim -> one step
        -> completed), and this process counts the completed in the runs table every
        ``every`` seconds, from the first request to the count of the last. Measured one
        run per request, then in batches of 50 (POST /api/runs/batch/); then the Celery +
        database baseline (``BaselineSystem``) and the DBOS baseline
        (``harness.dbos_baseline``), driven the same way; and the ratios of ours to them.
        ``rounds`` repeats them, interleaved. Only one side's processes run at a time (and
        hold their connections to PostgreSQL). Each row has the CPU per lifecycle of the
        system (web, workers, the PostgreSQL backends of its database) apart from the
        benchmark's own (its callers and its count), and the load average at the start and
        the end of its measurement. A baseline that cannot be measured is a row saying why.
        ``private_redis``: ours and Celery's run on a Redis server of the benchmark's own,
        whose CPU is then counted with the system's, as a PgBouncer's is (``--pooler``)."""
        spec = {"agent": "demo.steps", "input": {"steps": 1, "step_seconds": 0}}
        bench_user = get_user_model().objects.get(username="bench").pk
        rows = []
        sides = ("singles", "batches", "baseline", "dbos")
        rates = {name: [] for name in sides}
        system_cpu = {name: [] for name in sides}
        where = ((f"{webs} web processes, " if webs > 1 else "") + f"{workers} workers"
                 + (f" through PgBouncer ({POOLER_SESSIONS} server sessions)"
                    if self.pooler else ""))
        for round_ in range(1, rounds + 1):
            key = f"{workers} wkr" if rounds == 1 else f"r{round_}"
            with ExitStack() as stack:
                redis_server = (stack.enter_context(PrivateRedis()).wait_ready(30)
                                if private_redis else None)
                on_redis = ({"REDIS_URL": redis_server.url, "CELERY_BROKER_URL": redis_server.url}
                            if redis_server else None)
                started_webs, started_workers = stack.enter_context(
                    self.system_of(webs, workers, on_redis))
                groups = {"web": [web.pid for web in started_webs],
                          "workers": [w.pid for w in started_workers],
                          **({"Redis": [redis_server.pid]} if redis_server else {}),
                          **({"PgBouncer": [self.pgbouncer.pid]} if self.pgbouncer else {})}
                ports = [started_webs[caller % webs].port for caller in range(CALLERS)]
                rows += self.request_floor(key, ports, groups, total // 2)
                for how, size, name in (("one run per request", 1, "singles"),
                                        ("batches of 50", 50, "batches")):
                    load, cpu = load_average(), CpuMeter(groups)
                    since, started = timezone.now(), time.monotonic()
                    with ThreadPoolExecutor(CALLERS) as pool:
                        sent = sum(pool.map(lambda port, size=size: send_creates(
                            port, self.token, spec, total // CALLERS, size), ports))
                    wait_until(lambda since=since, sent=sent: runs_ended_since(
                        bench_user, since)[0] >= sent, 600, "every run to end", every=every)
                    elapsed = time.monotonic() - started
                    spent = cpu.per(sent)
                    completed = runs_ended_since(bench_user, since)[1]
                    rates[name].append(sent / elapsed)
                    rows.append((key, f"lifecycles per second, {how}", rates[name][-1],
                                 f"{completed} of {sent} completed in {elapsed:.1f} s, "
                                 f"{where}; {load_span(load)}"))
                    rows += cpu_rows(key, "lifecycle", how, spent, cpu.kernel)
                    system_cpu[name].append(rows[-2][2])
            if no_baseline:
                continue
            with ExitStack() as stack:
                redis_server = (stack.enter_context(PrivateRedis()).wait_ready(30)
                                if private_redis else None)
                baseline = stack.enter_context(BaselineSystem(
                    workers, every, redis_server.url if redis_server else None))
                load = load_average()
                cpu = CpuMeter({"workers": [baseline.worker.pid],
                                **({"Redis": [redis_server.pid]} if redis_server else {})})
                done, elapsed = baseline.run(total)
                spent = cpu.per(done)
                rates["baseline"].append(done / elapsed)
                rows.append((key, "baseline: Celery + database, tasks per second",
                             rates["baseline"][-1],
                             f"{done} in {elapsed:.1f} s; {baseline.note}; {load_span(load)}"))
                rows += cpu_rows(key, "task", "baseline", spent, cpu.kernel)
                system_cpu["baseline"].append(rows[-2][2])
            if dbos:
                made = dbos_lifecycle(key, total, workers, every, dbos_poll)
                rows += made
                measured = not isinstance(made[0][2], Failed)
                rates["dbos"].append(made[0][2] if measured else None)
                system_cpu["dbos"].append(made[1][2] if measured else None)
        protocol = (f"protocol: {CALLERS} callers each side send without waiting, the "
                    f"completed counted in each side's table every {every * 1000:g} ms "
                    f"(ours runs, Celery's celery_taskmeta, DBOS's dbos.workflow_status); "
                    f"{where} (threads) against prefork -c {workers} and {workers} DBOS "
                    "worker processes")
        for side, label, owner, goals in (("baseline", "the baseline", "the baseline's",
                                           (0.5, 1.0)),
                                          ("dbos", "DBOS's queue", "DBOS's", (1.0, 1.0))):
            theirs_all = [rate for rate in rates[side] if rate is not None]
            if not theirs_all:
                continue
            base = statistics.median(theirs_all)
            for name, how, goal in (("singles", "one run per request", goals[0]),
                                    ("batches", "batches of 50", goals[1])):
                ratio = statistics.median(rates[name]) / base
                spread = ("" if rounds == 1 else " (rounds: " + ", ".join(
                    f"{ours / theirs:.2f}" if theirs else "failed" for ours, theirs
                    in zip(rates[name], rates[side], strict=True)) + ")")
                rows.append((f"{workers} wkr", f"ratio to {label}, {how}", Ratio(ratio),
                             f"goal >= {goal:.1f}x{spread}; {protocol}"))
                # What a loaded machine disturbs least: the system's CPU for the same work.
                cpu_ratio = (statistics.median([c for c in system_cpu[side] if c is not None])
                             / statistics.median(system_cpu[name]))
                rows.append((f"{workers} wkr", f"{owner} system CPU / ours, {how}",
                             Ratio(cpu_ratio), "above 1.0x ours costs less CPU per lifecycle "
                                               f"than {label} per unit of work"))
        return rows

    def request_floor(self, key: str, ports: list[int], groups: dict, total: int) -> list:
        """What a request costs the system with next to nothing of ours in it: the same
        callers read one run ``total`` times (``GET /api/runs/{id}/``: the HTTP, Django, DRF
        and key check every request pays, and one indexed read). The web's share of a create
        beyond this is what creating a run costs it."""
        run_id = self.create(Client(ports[0], self.token), "demo.steps",
                             {"steps": 1, "step_seconds": 0})
        load, cpu = load_average(), CpuMeter(groups)
        with ThreadPoolExecutor(CALLERS) as pool:
            sent = sum(pool.map(lambda port: send_reads(
                port, self.token, f"/api/runs/{run_id}/", total // CALLERS), ports))
        spent = cpu.per(sent)
        return [(key, "floor: web CPU ms per request, GET one run", spent["web"],
                 f"{sent} reads by the same callers; PostgreSQL {spent['PostgreSQL']:.2f} ms "
                 f"a read; {load_span(load)}")]

    def list_latency(self, target: int, requests: int = 300) -> list:
        """GET /api/runs/ with ``target`` runs in the database: the newest page, filtered
        pages, pages of other orders and pages half-way down (keyset cursor)."""
        missing = target - Run.objects.count()
        if missing > 0:
            self.stdout.write(f"importing {missing} runs for the list benchmark...")
            domain.runs_import(agent="demo.steps", count=missing)
        middle = Run.objects.order_by("-created_at", "-id")[Run.objects.count() // 2]
        paths = {"newest page": "/api/runs/?limit=50",
                 "state=ended page": "/api/runs/?state=ended&limit=50",
                 "page half-way down": f"/api/runs/?limit=50&cursor="
                                       f"{selectors.encode_cursor(middle)}",
                 "sort=-ended page": "/api/runs/?sort=-ended&limit=50",
                 "sort=duration, half-way down": f"/api/runs/?sort=duration&limit=50&cursor="
                                                 f"{selectors.encode_cursor(middle, 'duration')}",
                 "status=running,failed page": "/api/runs/?status=running,failed&limit=50",
                 "search by short id": f"/api/runs/?q={str(middle.id)[:8]}&limit=50"}
        rows = []
        with self.system(workers=0) as (web, _):
            client = Client(web.port, self.token)
            for name, path in paths.items():
                samples = []
                for _ in range(requests):
                    started = time.monotonic()
                    status, _ = client.call("GET", path)
                    samples.append((time.monotonic() - started) * 1000)
                    assert status == 200, status
                rows.append((f"{Run.objects.count() // 1000}k", f"run list API, {name}",
                             samples, "50 runs a page"))
        return rows

    def metrics(self, target: int, scrapes: int) -> list:
        """GET /metrics with ``target`` runs in the database (each with an attempt, one in
        twelve lost, and a cancel or stop request applied for those cancelled or stopped),
        then the same whole-system figures counted from the whole tables, as /metrics did
        before the database kept them (a few samples: each reads every row)."""
        missing = target - Run.objects.count()
        if missing > 0:
            self.stdout.write(f"inserting {missing} runs for the metrics benchmark...")
            started = time.monotonic()
            bulk_history(missing)
            self.stdout.write(f"... in {time.monotonic() - started:.0f} s")
        size = f"{Run.objects.count() / 1e6:.1f}M" if target >= 100_000 else f"{target}"
        rows = []
        with self.system(workers=0) as (web, _):
            client = Client(web.port, self.token)
            samples = {"/metrics": [], "/healthz": []}
            for _ in range(scrapes + 5):  # the two in turn, so both meet the same load
                for path, taken in samples.items():
                    started = time.monotonic()
                    client.connection.request("GET", path)
                    response = client.connection.getresponse()
                    response.read()
                    taken.append((time.monotonic() - started) * 1000)
                    if response.status != 200:
                        raise CommandError(f"{path} answered {response.status}")
            rows.append((size, "GET /metrics", samples["/metrics"][5:],
                         "totals kept by the database's triggers"))
            rows.append((size, "GET /healthz, in turn with it", samples["/healthz"][5:],
                         "the floor: the HTTP stack and one query"))
        whole = []
        for _ in range(5):
            started = time.monotonic()
            whole_table_figures()
            whole.append((time.monotonic() - started) * 1000)
        rows.append((size, "the same totals counted from the whole tables", whole,
                     "what each scrape did before; in this process"))
        return rows

    def statements(self, transitions: int) -> list:
        return statements_bench(transitions) + parameters_bench(transitions)

    def memory(self, attempts: int) -> list:
        """Resident memory of one worker process with ``attempts`` live attempts, minus its
        memory with one, divided by the difference."""
        with self.system(workers=1) as (web, [worker]):
            client = Client(web.port, self.token)

            def start(count):
                ids = [self.create(client, "demo.steps", {"steps": 1, "step_seconds": 86400})
                       for _ in range(count)]
                wait_until(lambda: Run.objects.filter(pk__in=ids, state=RunState.RUNNING)
                           .count() == count, 300, f"{count} live attempts")
                time.sleep(1)  # let the loop settle its buffers
                return rss_kib(worker.pid)

            base = start(1)
            loaded = start(attempts - 1)
        per_attempt = (loaded - base) / (attempts - 1)
        return [(f"{attempts} at", "memory per live attempt (KiB)", per_attempt,
                 f"worker RSS {base / 1024:.0f} -> {loaded / 1024:.0f} MiB")]

    ANSWER_WAVE = 24  # runs at once: three times what one worker process runs together

    def chat_agents(self) -> list[str]:
        """Our interface's chat agent, then each installed framework's."""
        from runs.domain.catalogue import CATALOGUE

        return ["demo.chat"] + [name for name in (
            "pydantic_ai.chat", "openai_agents.chat", "langgraph.chat") if name in CATALOGUE]

    def answer_waves(self, runs: int, size: int, extra_env: dict | None = None):
        """For each chat agent, on a worker of its own whose model answers ``size`` bytes
        (the provider stub, served here): a first wave of 8 runs, then ``runs`` runs
        ``ANSWER_WAVE`` at a time. Yields the agent, its worker, the worker's resident
        memory after each wave, the first included, and when the first wave began (seconds
        since the epoch), while the system still runs."""
        with StubServer() as server:
            env = {"AWAKEN_PROVIDER_BASE_URL": server.url,
                   "AWAKEN_PROVIDER_MODEL": f"echo+bytes={size}", **(extra_env or {})}
            for agent in self.chat_agents():
                with self.system(workers=1, extra_env=env) as (web, [worker]):
                    client = Client(web.port, self.token)

                    def wave(count, agent=agent, client=client, worker=worker):
                        ids = [self.create(client, agent, {"prompt": "a large answer"})
                               for _ in range(count)]
                        wait_until(lambda: Run.objects.filter(
                            pk__in=ids, state=RunState.ENDED).count() == count, 300,
                            f"{count} runs of {agent}")
                        failed = Run.objects.filter(pk__in=ids).exclude(
                            end_cause=EndCause.COMPLETED).count()
                        if failed:
                            raise CommandError(f"{failed} runs of {agent} did not complete")
                        return rss_kib(worker.pid)

                    began = time.time()
                    yield agent, worker, [wave(8)] + [
                        wave(min(self.ANSWER_WAVE, runs - done))
                        for done in range(0, runs, self.ANSWER_WAVE)], began

    def answers(self, runs: int, size: int) -> list:
        """Resident memory of one worker process across ``runs`` runs whose model answers
        ``size`` bytes each (``answer_waves``): our interface's chat agent, then each
        installed framework's. What an ended run leaves behind shows here: the largest
        figure after a wave, and the figure once the worker has been idle 5 s."""
        if runs <= 0:
            return []
        rows = []
        for agent, worker, [warm, *waves], _ in self.answer_waves(runs, size):
            time.sleep(5)  # idle: what the allocator gives back, it has given
            idle = rss_kib(worker.pid)
            rows.append((f"{runs} runs", f"worker RSS after {size // 1000} kB answers, "
                         f"{agent} (MiB)", idle / 1024,
                         f"after a first 8 {warm / 1024:.0f}; largest after a wave of "
                         f"{self.ANSWER_WAVE} {max(waves) / 1024:.0f}; idle 5 s "
                         f"{idle / 1024:.0f}"))
        return rows

    def collector(self, runs: int, size: int) -> list:
        """The full passes of the cyclic collector in one worker process across ``runs``
        runs of large answers (``answer_waves``), by each chat agent: each pass's wall
        time, which every attempt of the process waits on, as the worker's
        ``harness/gcprobe`` records them."""
        rows = []
        with scratch_folder("awaken-gc-") as folder:
            probe = Path(folder) / "passes"
            env = {"PYTHONPATH": os.pathsep.join(filter(None, (
                       str(GC_PROBE), os.environ.get("PYTHONPATH")))),
                   "AWAKEN_GC_PROBE": str(probe)}
            for agent, worker, _, began in self.answer_waves(runs, size, env):
                written = Path(f"{probe}.{worker.pid}")  # none if no full pass came
                passes = [line.split() for line in (
                    written.read_text().splitlines() if written.exists() else [])]
                during = [(float(spent), tracked) for at, spent, _, tracked in passes
                          if float(at) > began]  # not those of the worker's start
                rows.append((f"{runs} runs", f"full collector passes of the worker, {agent}",
                             [spent for spent, _ in during] or 0.0,
                             f"{len(during)} passes during the runs, ms each, "
                             f"{len(passes) - len(during)} before; objects tracked after "
                             f"the last {during[-1][1] if during else '-'}"))
        return rows

    def spread(self, live: int, workers: int, cancels: int, batch: int, ended: int,
               webs: int = 1) -> list:
        """``live`` hung attempts shared by ``workers`` worker processes (created in batches of
        500 over HTTP; each process takes up to a fifth more than its share), then, while they
        stay live and their leases are renewed: the database's cost of a lease interval (the
        real renewals, then the same calls and the sweeper in this process), each worker's
        resident memory, and REST cancels of hung runs, which land on any of them, sent to
        each of ``webs`` web processes in turn. ``ended``: ended runs in the database,
        inserted in bulk if fewer."""
        missing = ended - Run.objects.filter(state=RunState.ENDED).count()
        if missing > 0:
            self.stdout.write(f"inserting {missing} ended runs for the spread benchmark...")
            bulk_history(missing)
        history = f"{Run.objects.filter(state=RunState.ENDED).count() / 1e6:.1f}M runs ended"
        key = f"{live / 1000:g}k" if live >= 1000 else str(live)
        share = -(-live // workers)
        spec = {"agent": "demo.steps", "input": {"steps": 1, "step_seconds": 86400}}
        env = {"AWAKEN_WORKER_CAPACITY": str(share + max(batch, share // 5))}
        with self.system_of(webs, workers, extra_env=env) as (served, started):
            web = served[0]
            client = Client(web.port, self.token)
            background: list[str] = []
            begun = time.monotonic()
            background += create_in_batches(client, spec, live - len(background), 500)
            wait_until(lambda: Attempt.objects.filter(
                run_id__in=background, state=AttemptState.LIVE).count() == live, 900,
                f"{live} live attempts", every=1)
            self.stdout.write(f"{live} attempts live in {time.monotonic() - begun:.0f} s")
            held = dict(Attempt.objects.filter(run_id__in=background, state=AttemptState.LIVE)
                        .values_list("owner").annotate(n=Count("pk")))
            pids = {worker.pid: worker for worker in started}
            owner_of = {pids[int(owner.rsplit(":", 1)[1])]: owner for owner in held}
            time.sleep(settings.AWAKEN_LEASE_SECONDS / 3)  # a renewal of them all first
            rss = [rss_kib(worker.pid) / 1024 for worker in started]
            rows = [(key, "worker RSS (MiB), mean of the processes", statistics.mean(rss),
                     "live/RSS: " + ", ".join(
                         f"{held.get(owner_of.get(worker), 0)}/{mib:.0f}"
                         for worker, mib in zip(started, rss, strict=True)))]
            rows.append(self.renewal_cost(key, workers, history))
            rows += lease_passes(key, list(held), history)
            # New connections: the first one's idle connection is closed.
            clients = [Client(each.port, self.token) for each in served]
            measured = self.cancel_samples(clients, cancels, batch, cpu_of={
                "web process" if webs == 1 else f"{webs} web processes": served,
                f"{workers} worker processes": started})
            took = dict(Attempt.objects.filter(run_id__in=measured.runs)
                        .values_list("owner").annotate(n=Count("pk")))
            rows += measured.rows(key, note=f"{webs} web, {workers} workers; cancelled on each: "
                                  + "/".join(str(took.get(owner_of.get(worker), 0))
                                             for worker in started))
        return rows

    def renewal_cost(self, key: str, workers: int, history: str,
                     intervals: int = 12) -> tuple:
        """What the workers' own lease renewals cost the database per interval, measured
        over ``intervals`` of them while nothing else runs: this database's statement time
        (``pg_stat_database.active_time``), its backends' CPU, and the rows read and written
        in the project's tables (``pg_stat_user_tables``). Each renewal ends with the
        worker's report, one update of its row: those updates count the renewals made."""
        report = WorkerProcess._meta.db_table

        def snapshot() -> dict:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(
                    "SELECT coalesce(sum(seq_tup_read + idx_tup_fetch), 0), "
                    "coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0), "
                    "coalesce(sum(n_tup_upd) FILTER (WHERE relname = %s), 0) "
                    "FROM pg_stat_user_tables WHERE relname LIKE 'runs%%'", [report])
                read, written, reports = cursor.fetchone()
                cursor.execute("SELECT active_time, xact_commit FROM pg_stat_database "
                               "WHERE datname = current_database()")
                active, commits = cursor.fetchone()
                cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = "
                               "current_database() AND pid <> pg_backend_pid()")
                cpu = {pid: cpu_ns(pid) for (pid,) in cursor.fetchall()}
            return {"read": int(read), "written": int(written), "reports": int(reports),
                    "active": float(active), "commits": int(commits), "cpu": cpu,
                    "at": time.monotonic()}

        before = snapshot()
        time.sleep(intervals * settings.AWAKEN_LEASE_SECONDS / 3)
        after = snapshot()
        cpu = sum(spent - before["cpu"].get(pid, 0) for pid, spent in after["cpu"].items())
        per = max(after["reports"] - before["reports"], 1) / workers  # intervals seen

        def each(name):
            return (after[name] - before[name]) / per

        return (key, f"lease renewals of {workers} workers, database time per interval, "
                     f"{history}", each("active"),
                f"backend CPU {cpu / 1e6 / per:.1f} ms; rows read {each('read'):.0f}, written "
                f"{each('written'):.0f}; {each('commits'):.0f} commits; {per:.1f} intervals "
                f"in {after['at'] - before['at']:.0f} s")

    # --- hostile input -------------------------------------------------------------------------

    def hostile(self, sizes, rounds, seed) -> None:
        """The hostile-input attack against daphne on the configured database and Redis,
        with a worker of its own completing the runs."""
        viewer = issued_key("bench-viewer", "viewer")
        with self.system(workers=1) as (web, _):
            target = hostile.Target(port=web.port, pid=web.pid, operator=self.token,
                                    viewer=viewer, log=web.log)
            self.print_hostile("daphne, " + self.layout(), hostile.attack(
                target, sizes, rounds=rounds, seed=seed, say=self.stdout.write))

    def watch(self, watchers: int, kinds: list[str], root: str | None) -> None:
        """``watchers`` browsers on a busy run's page (``harness.watching``), on the embedded
        site of this checkout or of ``root``; prints the requests and bytes per push and a
        list user's latency alone and meanwhile."""
        from harness import watching

        options = {} if root is None else {"root": Path(root)}
        self.stdout.write(f"load average (1 min) at the start: {self.load:.2f} on "
                          f"{os.cpu_count()} CPUs")
        for kind in kinds:
            with scratch_folder("awaken-watch-") as var, EmbeddedSite(var, **options) as site:
                site.wait_ready()
                figures = watching.watch(site, watchers=watchers, kind=kind,
                                         say=lambda text: None)
            self.stdout.write(
                f"{kind}: {watchers} pages, {figures['pushes']} pushes received, "
                f"{figures['requests']} panel requests ({figures['requests_per_push']:.2f} "
                f"per push), {figures['bytes'] / 1024:.0f} KiB "
                f"({figures['bytes_per_push'] / 1024:.1f} KiB per push); list page p50 / p95 "
                f"alone {figures['list_alone_p50']:.1f} / {figures['list_alone_p95']:.1f} ms, "
                f"meanwhile {figures['list_watched_p50']:.1f} / "
                f"{figures['list_watched_p95']:.1f} ms ({figures['list_loads']} loads)")
        self.stdout.write(f"load average (1 min) at the end: {load_average():.2f}")

    def hostile_embedded(self, sizes, rounds, seed) -> None:
        """The hostile-input attack against the embedded site (``manage.py serve``: web,
        worker and sweeper in one process, on SQLite), in a temporary directory."""
        with (scratch_folder("awaken-hostile-") as var,
              EmbeddedSite(var, extra_env=self.web_env) as site):
            site.wait_ready()
            viewer = site.manage("operator_token", "hostile-viewer", "--role", "viewer",
                                 "--create").strip()
            target = hostile.Target(port=site.port, pid=site.pid, operator=site.token,
                                    viewer=viewer, log=site.log)
            self.print_hostile("the embedded site (manage.py serve: web, worker and sweeper "
                               "in one process), sqlite3, in-memory broker and layer",
                               hostile.attack(target, sizes, rounds=rounds, seed=seed,
                                              say=self.stdout.write))

    def flood(self, rounds: int, runs: int = 2000, parallel: int = 120,
              cancels: int = 50) -> None:
        """The read flood of a hostile viewer, full size: ``parallel`` requests at once of
        ``GET /api/runs/?limit=500`` (over ``runs`` runs), ``rounds`` times, from one viewer
        key, against a web process on the default pool (20 connections), while an operator
        cancels ``cancels`` queued runs one after another. Prints the answers by status,
        the cancels' latency and the web process's memory after."""
        from collections import Counter

        viewer = issued_key("bench-viewer", "viewer")
        created = [domain.run_create(agent="demo.steps", dispatch=False, source="cli")[0].id
                   for _ in range(runs)]
        targets = [str(run_id) for run_id in created[:cancels]]
        with self.system(workers=1) as (web, _):
            rss_before = rss_kib(web.pid)
            reads: Counter = Counter()
            answers: Counter = Counter()
            took: list[float] = []
            started = time.monotonic()

            def read(_):
                return web.call("GET", "/api/runs/?limit=500", token=viewer, timeout=60)[0]

            def cancel_all():
                for run_id in targets:
                    begun = time.monotonic()
                    answers[web.call("POST", f"/api/runs/{run_id}/cancel/?wait=0", {},
                                     token=self.token, timeout=60)[0]] += 1
                    took.append(time.monotonic() - begun)

            with ThreadPoolExecutor(parallel + 1) as pool:
                operator = pool.submit(cancel_all)
                for _ in range(rounds):
                    reads.update(pool.map(read, range(parallel)))
                operator.result()
            elapsed = time.monotonic() - started
            rss_after = rss_kib(web.pid)
        for run_id in created[cancels:]:
            domain.run_cancel(run_id=run_id, actor="bench", source="cli")
        p50, p95, worst = percentiles(took)
        worst = max(took)
        self.stdout.write(
            f"\nRead flood: {parallel} parallel GET /api/runs/?limit=500 over {runs} runs, "
            f"{rounds} round(s), one viewer key, DB_POOL_MAX "
            f"{os.getenv('DB_POOL_MAX', '20')}; {elapsed:.1f} s; {os.cpu_count()} cores\n"
            f"  reads by status: {dict(sorted(reads.items()))}\n"
            f"  operator's cancels by status: {dict(sorted(answers.items()))}, "
            f"p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {worst * 1000:.0f} ms\n"
            f"  web RSS: {rss_before / 1024:.0f} MiB before, {rss_after / 1024:.0f} MiB after\n")

    def layout(self) -> str:
        database = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        return f"{database}, broker {settings.CELERY_BROKER_URL.split(':', 1)[0]}"

    def env_lines(self) -> list[str]:
        """The variables asked for with ``--web-env`` and ``--worker-env``, one line each,
        and the pooler, if asked for."""
        def named(env):
            return " ".join(f"{name}={value}" for name, value in env.items())
        return [line for env, line in (
            (self.web_env, f"the web processes' environment, on top of the Procfile's: "
                           f"{named(self.web_env)}"),
            (self.worker_env, f"the workers' environment, on top of the Procfile's: "
                              f"{named(self.worker_env)}"),
            (self.pooler, f"our web processes and workers reach PostgreSQL through a PgBouncer "
                          f"of the benchmark's own in transaction mode ({POOLER_SESSIONS} "
                          "server sessions, DB_POOLER=transaction)")) if env]

    def print_hostile(self, what: str, report) -> None:
        self.stdout.write(f"\nawaken-site under hostile input: {what}; {os.cpu_count()} CPUs, "
                          f"load average (1 min) {self.load:.2f} at the start, "
                          f"{load_average():.2f} at the end\n")
        for line in self.env_lines():
            self.stdout.write(line + "\n")
        for line in hostile.table(report):
            self.stdout.write(line)


def hostile_sizes(options) -> hostile.Sizes:
    return replace(hostile.Sizes.scaled(options["scale"]), units=options["units"])


def statements_bench(transitions: int) -> list:
    """Each statement runs/domain/sql.py (and ``keys.key_lookup``) writes by hand, against
    the same work through the ORM, alternately, in this process: what each saves on the
    path of a cancel or a lifecycle. Wall time per call (p50/p95/p99) and this process's
    CPU per call (a ratio below 1.0 is the share of the ORM's CPU the hand-written form
    costs)."""
    run, _ = domain.run_create(agent="demo.steps", dispatch=False, source="cli")
    user = get_user_model().objects.get_or_create(username="bench-sql")[0]
    key = keys.api_key_issue(user=user)
    lookup = {"digest": keys.key_digest(key)}

    def lock_by_sql():
        with transaction.atomic():
            sql.lock(Run, run.pk)

    def lock_by_orm():
        with transaction.atomic():
            Run.objects.select_for_update(no_key=True).get(pk=run.pk)

    def step_by_sql():
        with transaction.atomic():
            locked = sql.lock(Run, run.pk)
            locked.steps, locked.version = locked.steps + 1, locked.version + 1
            sql.write(sql.Update(locked, ("steps", "version", "updated_at")),
                      sql.Insert((sql.new(Event, run=locked, version=locked.version,
                                          kind=EventKind.STEP, state=locked.state,
                                          generation=0, data={"step": locked.steps}),)))

    def step_by_orm():
        with transaction.atomic():
            locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
            locked.steps, locked.version = locked.steps + 1, locked.version + 1
            locked.save(update_fields=["steps", "version", "updated_at"])
            Event.objects.create(run=locked, version=locked.version, kind=EventKind.STEP,
                                 state=locked.state, generation=0, data={"step": locked.steps})

    def finish_writes_by_sql():  # the five parts of a live cancel's finish, as finish has them
        with transaction.atomic():
            locked = sql.lock(Run, run.pk)
            locked.version += 1
            intent = sql.new(ControlIntent, run=locked, action="cancel", requested_by="bench",
                             source="cli", applied_at=timezone.now(), applied_via="live")
            sql.write(sql.Insert((intent,)),
                      sql.UpdateWhere(Attempt, {"state": AttemptState.CLOSED},
                                      {"run": locked.pk, "state": AttemptState.LIVE}),
                      sql.Update(locked, ("version", "updated_at")),
                      sql.Insert((sql.new(Event, run=locked, version=locked.version,
                                          kind=EventKind.STEP, state=locked.state,
                                          generation=0, data={}),)),
                      sql.Keys(Run, {"parent": locked.pk}, {"state": RunState.ENDED}))
            transaction.set_rollback(True)

    def finish_writes_by_orm():
        with transaction.atomic():
            locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
            locked.version += 1
            ControlIntent.objects.create(run=locked, action="cancel", requested_by="bench",
                                         source="cli", applied_at=timezone.now(),
                                         applied_via="live")
            Attempt.objects.filter(run=locked, state=AttemptState.LIVE).update(
                state=AttemptState.CLOSED)
            locked.save(update_fields=["version", "updated_at"])
            Event.objects.create(run=locked, version=locked.version, kind=EventKind.STEP,
                                 state=locked.state, generation=0, data={})
            list(Run.objects.filter(parent=locked).exclude(state=RunState.ENDED)
                 .order_by("pk").values_list("pk", flat=True))
            transaction.set_rollback(True)

    ways = [
        ("run row lock", lock_by_sql, lock_by_orm),
        ("step transition (lock, update, event)", step_by_sql, step_by_orm),
        ("finish's five writes, one statement", finish_writes_by_sql, finish_writes_by_orm),
        ("run with ticket and intent (run_get)", lambda: selectors.run_get(run.pk),
         lambda: selectors.runs().get(pk=run.pk)),
        ("claim check (claim_holds)", lambda: sql.exists(
            Run, id=run.pk, state=RunState.RUNNING, generation=1, owner="nobody"),
         lambda: Run.objects.filter(pk=run.pk, state=RunState.RUNNING, generation=1,
                                    owner="nobody").exists()),
        ("API key lookup (key_lookup)", lambda: keys.key_lookup(**lookup),
         lambda: keys.key_lookup_queryset(**lookup).first()),
    ]
    rows = []
    for name, by_sql, by_orm in ways:
        walls, cpu = {by_sql: [], by_orm: []}, {by_sql: 0.0, by_orm: 0.0}
        for _ in range(transitions):
            for way in (by_sql, by_orm):
                started, started_cpu = time.perf_counter(), time.process_time()
                way()
                walls[way].append((time.perf_counter() - started) * 1000)
                cpu[way] += time.process_time() - started_cpu
        rows.append(("sql", f"{name}, wall", walls[by_sql], "hand-written"))
        rows.append(("ORM", f"{name}, wall", walls[by_orm], "through the ORM"))
        rows.append(("sql/ORM", f"{name}, CPU", Ratio(cpu[by_sql] / cpu[by_orm]),
                     f"{cpu[by_sql] / transitions * 1000:.3f} vs "
                     f"{cpu[by_orm] / transitions * 1000:.3f} ms per call"))
    return rows


def parameters_bench(calls: int) -> list:
    """What the driver costs for the parameters of one statement, the figures behind the
    shape of ``sql.write``'s statements: one prepared ``SELECT`` of a run's values and its
    event's, run ``calls`` times each way in turn through Django's cursor, with this
    process's CPU per call. The ways: the values a one-row insert of a run and its event
    names (``sql._given``: NULLs left to the columns), all 54 of their columns, and the
    values named as arrays of one element each (the columns of an ``UNNEST``), then as one
    array per type of column."""
    run = sql.new(Run, agent="demo.steps", input={"steps": 1}, request_fingerprint="f",
                  traceparent="t")
    event = sql.new(Event, run=run, version=1, kind=EventKind.CREATED, state=run.state,
                    generation=0, source="api", data={"agent": run.agent})
    named, given = [], []
    for instance in (run, event):  # as ``sql.write`` prepares a one-row insert
        model, values = type(instance), []
        sql._saved_values(values, sql._saving(model, None, True), (instance,), True,
                          connection)
        named += values
        given += [values[i] for i in sql._given(model, values)]
    typed: dict[type, list] = {}
    for value in given:
        typed.setdefault(type(value), []).append(value)

    def select(params):
        text = "SELECT " + ", ".join(["%s"] * len(params))
        return lambda: _execute(text, params)

    ways = [(f"{len(given)} values, NULLs left", select(given)),
            (f"{len(named)} values, every column", select(named)),
            (f"{len(given)} one-element arrays", select([[value] for value in given])),
            (f"{len(typed)} arrays, one per type", select(list(typed.values())))]
    cpu = {name: 0.0 for name, _ in ways}
    for _, way in ways:  # prepared (psycopg prepares on the fifth run) before any is timed
        for _ in range(10):
            way()
    for _ in range(calls):
        for name, way in ways:
            started = time.process_time()
            way()
            cpu[name] += time.process_time() - started
    first = cpu[ways[0][0]]
    return [("driver", f"a run and its event as {name}, CPU", Ratio(spent / first),
             f"{spent / calls * 1e6:.0f} us per call, against the first") for name, spent
            in cpu.items()]


def _execute(text: str, params: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute(text, params)
        cursor.fetchall()


def backends_cpu_ns(pids: list[int] | None = None) -> dict[int, int]:
    """CPU ns so far of this database's PostgreSQL backends but this process's own (or of
    the backends ``pids``), by pid; a backend that has exited is left out."""
    if pids is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = "
                           "current_database() AND pid <> pg_backend_pid()")
            pids = [pid for (pid,) in cursor.fetchall()]
    found = {}
    for pid in pids:
        try:
            found[pid] = cpu_ns(pid)
        except OSError:
            continue
    return found


class CpuMeter:
    """CPU time (user + system) spent from now on by groups of processes, each with its
    descendants (a prefork worker's children), by this database's PostgreSQL backends, and,
    apart, by the benchmark's own process and its database backend (``client``; without
    its descendants, which are the system it measures): a figure that a loaded machine
    disturbs far less than throughput. Processes that exit meanwhile take their CPU with
    them, so it is a floor."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, groups: dict[str, list[int]], database: str | None = None,
                 own_backends: tuple[int, ...] = ()):
        """``database``: the database whose backends are the system's PostgreSQL (this
        process's by default); ``own_backends``: more backends of the benchmark's own
        there (its connection to that database)."""
        self.groups, self.database, self.own_backends = groups, database, list(own_backends)
        self.kernel: dict[str, float] = {}
        self.start = self.read()

    def read(self) -> dict[str, dict[int, tuple[float, float]]]:
        figures = {name: {pid: self.cpu(pid) for root in roots for pid in self.tree(root)}
                   for name, roots in self.groups.items()}
        backends = []
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pid, pid = pg_backend_pid() OR pid = ANY(%s::int[]) "
                               "FROM pg_stat_activity WHERE datname = coalesce(%s, "
                               "current_database()) OR pid = pg_backend_pid()",
                               [self.own_backends, self.database])
                backends = cursor.fetchall()
        figures["PostgreSQL"] = {pid: self.cpu(pid) for pid, own in backends if not own}
        figures["client"] = {pid: self.cpu(pid) for pid, own in backends if own}
        figures["client"][os.getpid()] = self.cpu(os.getpid())
        return figures

    def per(self, count: int) -> dict[str, float]:
        """Milliseconds of CPU per item of ``count`` since made, by group, and ``total``;
        ``kernel`` then holds the share of each group's that was spent in the kernel."""
        end = self.read()
        spent, self.kernel = {}, {}
        for name, pids in end.items():
            user = kernel = 0.0
            for pid, (user_now, kernel_now) in pids.items():
                user_then, kernel_then = self.start[name].get(pid, (0.0, 0.0))
                user, kernel = user + user_now - user_then, kernel + kernel_now - kernel_then
            spent[name] = (user + kernel) * 1000 / max(count, 1)
            self.kernel[name] = kernel / (user + kernel) if user + kernel > 0 else 0.0
        return {"total": sum(spent.values()), **spent}

    @classmethod
    def cpu(cls, pid: int) -> tuple[float, float]:
        """Seconds of CPU ``pid`` has spent: in user mode, and in the kernel."""
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0, 0.0
        return int(fields[11]) / cls.TICK, int(fields[12]) / cls.TICK  # utime, stime

    @classmethod
    def tree(cls, pid: int) -> list[int]:
        found, todo = [], [pid]
        while todo:
            current = todo.pop()
            found.append(current)
            try:
                for task in os.listdir(f"/proc/{current}/task"):
                    with open(f"/proc/{current}/task/{task}/children") as children:
                        todo += [int(child) for child in children.read().split()]
            except OSError:
                continue
        return found


class Ratio(float):
    """A figure printed as a ratio (``1.23x``)."""


class Failed(str):
    """A row's figure that could not be measured: why, printed as ``failed: why``."""


def counted_instructions(requests: int) -> list:
    """``harness.instructions``'s rows, or one that says why they could not be counted."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        return [("count", "instructions a request", Failed(
            "valgrind is not installed (Debian's package valgrind)"), "")]
    try:
        return instructions_bench(requests)
    except RuntimeError as failure:
        return [("count", "instructions a request", Failed(str(failure)), "")]


CALLERS = 8  # the lifecycle benchmark's callers, on each side
POOLER_SESSIONS = 20  # lifecycle --pooler: PgBouncer's server sessions (its default_pool_size)
REVOKE = "baseline: Celery revoke(terminate=True) -> task interrupted"


def send_creates(port: int, token: str, spec: dict, count: int, size: int) -> int:
    """One caller of the lifecycle benchmark: ``count`` runs of ``spec`` created over one
    kept connection, one per request (``size`` 1: POST /api/runs/) or ``size`` a request
    (POST /api/runs/batch/), each sent once the last is answered, none waited for beyond
    its 201; the number created."""
    body = json.dumps(spec).encode()
    return send_requests(port, token, count, size, expected=201, request=lambda client, n: (
        client.request("POST", "/api/runs/", body) if size == 1 else client.request(
            "POST", "/api/runs/batch/", json.dumps({"runs": [spec] * n}).encode())))


def send_reads(port: int, token: str, path: str, count: int) -> int:
    """One caller of the lifecycle benchmark's floor: ``count`` GETs of ``path`` over one
    kept connection, each sent once the last is answered; the number sent."""
    return send_requests(port, token, count, 1, expected=200,
                         request=lambda client, n: client.request("GET", path))


def send_requests(port: int, token: str, count: int, size: int, *, expected: int,
                  request) -> int:
    """``count`` items sent ``size`` a request over one kept connection, each request
    (``request(client, n)``, made once for each ``n``) sent once the last is answered with
    ``expected``; the number sent."""
    client = KeptConnection(port, token)
    made_for = {}
    sent = 0
    try:
        while sent < count:
            n = min(size, count - sent)
            if n not in made_for:
                made_for[n] = request(client, n)
            status = client.send(made_for[n])
            if status != expected:
                raise CommandError(f"a request answered {status}, not {expected}")
            sent += n
    finally:
        client.close()
    return sent


def runs_ended_since(user_id: int, since) -> tuple[int, int]:
    """Runs created by ``user_id`` since ``since`` that have ended, and those of them
    completed: one count of the runs table through its index by creation time."""
    table = connection.ops.quote_name(Run._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*), count(*) FILTER (WHERE end_cause = %s) FROM {table} "
                       "WHERE created_by_id = %s AND created_at >= %s AND state = %s",
                       ["completed", user_id, since, RunState.ENDED])
        return cursor.fetchone()


def cpu_rows(key: str, unit: str, how: str, spent: dict, kernel: dict) -> list:
    """The CPU rows of a throughput measurement: the system's (every group but the
    benchmark's client, and PostgreSQL) and the client's, ms per ``unit``; the system's
    note says what share of each group's was spent in the kernel (``CpuMeter.kernel``)."""
    client = spent.pop("client")
    total = spent.pop("total") - client
    return [(key, f"system CPU ms per {unit}, {how}", total,
             ", ".join(f"{name} {ms:.2f}" for name, ms in spent.items()) + "; in the kernel "
             + ", ".join(f"{name} {kernel[name]:.0%}" for name in spent)),
            (key, f"bench client CPU ms per {unit}, {how}", client,
             f"{CALLERS} callers and the count: this process alone and its database "
             "backend")]


class BaselineSystem:
    """The Celery + database baseline of the lifecycle benchmark (``harness.celery_db``),
    driven as our side is: a prefork worker with as many processes as ours has workers,
    and 8 callers, each sending the trivial task with ``apply_async()`` and waiting for
    nothing; completion counted in Celery's result table (``celery_taskmeta``, tasks in
    SUCCESS) every ``every`` seconds. Broker: the project's own (Redis here), on a queue of
    its own; results: Celery's SQLAlchemy backend on the project's PostgreSQL, in tables of
    its own, emptied before each measurement."""

    def __init__(self, processes: int, every: float, broker: str | None = None):
        """``broker``: another broker than the project's (the benchmark's private Redis)."""
        self.processes, self.every = processes, every
        self.queue = f"awaken-baseline-{uuid.uuid4().hex[:8]}"
        self.backend = celery_db.backend_url(database_url())
        self.broker = broker or settings.CELERY_BROKER_URL
        broker = self.broker.split(":", 1)[0]
        self.note = (f"prefork -c {processes}, {CALLERS} callers sending without waiting, "
                     f"broker {broker} (the same as ours), task_track_started, results in "
                     f"PostgreSQL (SQLAlchemy backend), SUCCESS rows counted")

    def __enter__(self):
        self.app = celery_db.make_app(self.broker, self.backend, self.queue)
        node = f"{self.queue}@{socket.gethostname()}"
        env = environment({"AWAKEN_BASELINE_BROKER": self.broker,
                           "AWAKEN_BASELINE_BACKEND": self.backend,
                           "AWAKEN_BASELINE_QUEUE": self.queue})
        self.worker = Process(
            [sys.executable, "-m", "celery", "-A", "harness.celery_db", "worker",
             "--pool", "prefork", "--concurrency", str(self.processes), "-n", node,
             "-Q", self.queue, "--without-mingle", "--without-gossip", "--loglevel", "WARNING"],
            name=self.queue, env=env)
        try:
            wait_until(lambda: bool(self.app.control.ping(destination=[node], timeout=0.5)),
                       90, "the baseline worker to answer")
            self.run(4 * CALLERS)  # warm-up: the result table, connections, children
        except BaseException:
            self.worker.stop()
            raise
        return self

    def __exit__(self, *exc_info):
        self.worker.stop()

    def counts(self) -> tuple[int, int]:
        """Tasks in the result table in SUCCESS, and in FAILURE."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FILTER (WHERE status = 'SUCCESS'), "
                           "count(*) FILTER (WHERE status = 'FAILURE') FROM celery_taskmeta")
            return cursor.fetchone()

    def run(self, total: int) -> tuple[int, float]:
        """``total`` tasks sent by 8 callers without waiting: (tasks done, seconds from the
        first send to the count of the last success)."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass('celery_taskmeta') IS NOT NULL")
            if cursor.fetchone()[0]:
                cursor.execute("DELETE FROM celery_taskmeta")
        trivial = self.app.tasks["baseline.trivial"]

        def caller(count):
            for number in range(count):
                trivial.apply_async((number,))
            return count

        started = time.monotonic()
        with ThreadPoolExecutor(CALLERS) as pool:
            sent = sum(pool.map(caller, [total // CALLERS] * CALLERS))

        def done():
            succeeded, failed = self.counts()
            if failed:
                raise CommandError(f"{failed} baseline tasks failed")
            return succeeded >= sent

        wait_until(done, 600, "every baseline task to succeed", every=self.every)
        return sent, time.monotonic() - started


def dbos_lifecycle(key: str, total: int, workers: int, every: float, poll: float) -> list:
    """The DBOS baseline of ``bench lifecycle`` (``harness.dbos_baseline``): ``total``
    one-step workflows enqueued by the 8 callers without waiting, consumed by ``workers``
    worker processes, the SUCCESS rows counted every ``every`` seconds. Its rows: workflows
    per second, the system's CPU per workflow (the workers and the PostgreSQL backends of
    DBOS's database) and the client's; or one row saying why it could not be measured."""
    name = "baseline: DBOS queue, workflows per second"
    system = DbosSystem(workers, poll=poll, callers=CALLERS)
    try:
        with system:
            system.run(4 * CALLERS, every, 60)  # warm-up: connections, the queue's first polls
            load = load_average()
            cpu = CpuMeter({"workers": system.pids}, database=system.database,
                           own_backends=(system.counter_pid,))
            done, elapsed = system.run(total, every, 60 + total / 10)
            spent = cpu.per(done)
    except Exception as failure:  # a row that says why, not a hung benchmark
        return [(key, name, Failed(f"{type(failure).__name__}: {failure}"), system.note)]
    client = spent["client"]
    return [(key, name, done / elapsed, f"{done} in {elapsed:.1f} s; {system.note}; "
                                        f"{load_span(load)}"),
            *cpu_rows(key, "workflow", "DBOS baseline", spent, cpu.kernel)[:1],
            (key, "bench client CPU ms per workflow, DBOS baseline", client,
             f"{CALLERS} callers and the count: this process and its backends; the "
             "enqueue's Python (DBOSClient, SQLAlchemy) runs here, with no web process "
             "between")]


def dbos_cancels(cancels: int, steps_ms: list[float], poll: float) -> list:
    """DBOS's cancel of a running workflow (``DBOSClient.cancel_workflow``) beside ours in
    ``bench cancel``: for each step length of ``steps_ms``, ``cancels`` workflows of steps
    that sleep in a loop checking nothing, each cancelled at a random point of a step, from
    the call to its return and to the workflow's code stopping; or rows saying why not."""
    rows = []
    system = DbosSystem(1, poll=poll, callers=1)
    note = ("one worker process; DBOS stops a workflow only at its next step boundary (a "
            "step in progress runs to its end), so this is about half a step plus the check")
    try:
        with system:
            for step in steps_ms:
                system.stopped_by.clear()
                returned, stopped = system.cancels(cancels, step / 1000)
                raised = ", ".join(f"{name} {count}" for name, count
                                   in sorted(system.stopped_by.items()))
                rows += [("", "baseline: DBOS cancel_workflow() returns", returned,
                          f"{system.note.split(',')[0]}, its own database"),
                         ("", f"baseline: DBOS cancel -> workflow code stops, {step:g} ms "
                              "steps", stopped, f"{note}; stopped by {raised}")]
    except Exception as failure:  # a row that says why, not a hung benchmark
        rows.append(("", "baseline: DBOS cancel -> workflow code stops",
                     Failed(f"{type(failure).__name__}: {failure}"), note))
    return rows


def bulk_history(count: int, chunk: int = 100_000) -> None:
    """Insert ``count`` ended runs on PostgreSQL, ``chunk`` per statement, each with one
    closed attempt (one in twelve lost), and, for those cancelled or stopped, the request
    applied (by the live, durable or sweeper path, after 2 to 500 ms). No events: /metrics
    reads none. As ``runs_import``, history for a benchmark."""
    run, attempt, intent = (connection.ops.quote_name(model._meta.db_table)
                            for model in (Run, Attempt, ControlIntent))
    statement = f"""
        WITH made AS (
            INSERT INTO {run} (id, agent, input, thread_id, state, end_cause, stop_code,
                               stop_reason, error, generation, steps, tokens, seconds_used,
                               crash_retries, version, request_fingerprint, created_at,
                               started_at, ended_at, updated_at, dispatched_at, on_exhausted,
                               repeats, traceparent, activity_last, activity_agent,
                               activity_apart)
            SELECT gen_random_uuid(), 'demo.steps', '{{}}'::jsonb, 'bench-metrics', 'ended',
                   cause, CASE WHEN cause = 'stopped' THEN 'operator' END,
                   CASE WHEN cause = 'stopped' THEN 'benchmark' END,
                   CASE WHEN cause = 'failed' THEN 'benchmark' END, 1, 1, 0, 0.5, 0, 3, '',
                   at, at, at + interval '1 second', at + interval '1 second', at, %s,
                   '{{}}'::jsonb, '', 0, 0, 0
            FROM (SELECT (ARRAY['completed', 'completed', 'completed', 'failed', 'cancelled',
                                'stopped'])[1 + mod(n, 6)] AS cause, n,
                         now() - (n * interval '1 second') AS at
                  FROM generate_series(1, %s) AS n) AS source
            RETURNING id, end_cause, created_at, ended_at),
        attempts AS (
            INSERT INTO {attempt} (run_id, generation, state, close_reason, owner,
                                   lease_expires_at, started_at, closed_at)
            SELECT id, 1, 'closed',
                   CASE WHEN random() < 1.0 / 12 THEN 'lost' ELSE end_cause END,
                   'bench', ended_at, created_at, ended_at FROM made)
        INSERT INTO {intent} (run_id, action, reason, stop_code, requested_by, source,
                              requested_at, applied_at, applied_via)
        SELECT id, CASE WHEN end_cause = 'stopped' THEN 'stop' ELSE 'cancel' END,
               CASE WHEN end_cause = 'stopped' THEN 'benchmark' END,
               CASE WHEN end_cause = 'stopped' THEN 'operator' END, 'bench', 'api',
               ended_at - (0.002 + random() * 0.5) * interval '1 second', ended_at,
               (ARRAY['live', 'durable', 'sweeper'])[1 + floor(random() * 3)::int]
        FROM made WHERE end_cause IN ('cancelled', 'stopped')"""
    done = 0
    while done < count:
        size = min(chunk, count - done)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, [OnExhausted.STOP, size])
        done += size
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {run}, {attempt}, {intent}")


def rows_touched(cursor) -> tuple[int, int]:
    """Rows of the project's tables read and written by this backend, as PostgreSQL counts
    them: this transaction's and, for up to a second, those of its last ones not yet
    reported; so read it before and after, in the transaction."""
    cursor.execute("SELECT coalesce(sum(seq_tup_read + idx_tup_fetch), 0), "
                   "coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) "
                   "FROM pg_stat_xact_user_tables WHERE relname LIKE 'runs%'")
    return cursor.fetchone()


def counted(call) -> tuple[float, int, int]:
    """``call()`` in a transaction of its own: (ms, rows read, rows written)."""
    with transaction.atomic(), connection.cursor() as cursor:
        read, written = rows_touched(cursor)
        started = time.perf_counter()
        call()
        taken = (time.perf_counter() - started) * 1000
        read_after, written_after = rows_touched(cursor)
    return taken, int(read_after - read), int(written_after - written)


def counted_row(key: str, name: str, results: list) -> tuple:
    reads = sorted(r for _, r, _ in results)
    writes = sorted(w for _, _, w in results)
    return (key, name, [t for t, _, _ in results],
            f"rows read {reads[len(reads) // 2]}, written {writes[len(writes) // 2]} (median)")


def renew_as_its_worker(owner: str, pairs: list, lease_seconds: float) -> None:
    """Renew ``pairs`` (run id, generation) as their worker's executor does, in chunks."""
    for chunk in renewal_chunks(pairs, run_id=itemgetter(0)):
        domain.attempt_renew(owner=owner, attempts=chunk, lease_seconds=lease_seconds)


def lease_passes(key: str, owners: list[str], history: str, passes: int = 10) -> list:
    """In this process: the lease renewals of one interval, the attempts of each of
    ``owners`` renewed as its worker renews them, and one sweeper pass, ``passes`` times
    each."""
    held = {owner: list(Attempt.objects.filter(owner=owner, state=AttemptState.LIVE)
                        .values_list("run_id", "generation")) for owner in owners}

    def interval():
        made = [counted(lambda owner=owner, pairs=pairs: renew_as_its_worker(
            owner, pairs, settings.AWAKEN_LEASE_SECONDS)) for owner, pairs in held.items()]
        return tuple(sum(figures) for figures in zip(*made, strict=True))

    sizes = "+".join(str(len(pairs)) for pairs in held.values())
    return [counted_row(key, f"renewals of one interval ({sizes}), in this process, "
                             f"{history}", [interval() for _ in range(passes)]),
            counted_row(key, f"one sweeper pass, in this process, {history}",
                        [counted(domain.sweep) for _ in range(3 * passes)])]


def leases_bench(live: int, passes: int = 30) -> list:
    """What one lease renewal of ``live`` attempts (one worker's) and one sweeper pass cost
    the database, with however many ended runs it holds: time in this process per pass,
    and the rows each pass read and wrote (PostgreSQL's own count for the transaction,
    ``pg_stat_xact_user_tables``). The attempts are claimed here and finished at the end;
    nothing expires, so the sweep's cost is that of finding nothing to do."""
    if connection.vendor != "postgresql":
        raise CommandError("leases needs PostgreSQL (its per-transaction row counts)")
    owner = f"bench-leases:{os.getpid()}"
    attempts = []
    for start in range(0, live, 500):
        made = [domain.run_create(agent="demo.steps", dispatch=False, source="cli")[0]
                for _ in range(min(500, live - start))]
        attempts += domain.attempts_start(run_ids=[str(run.id) for run in made], owner=owner,
                                          lease_seconds=3600)
    pairs = [(str(a.run_id), a.generation) for a in attempts]
    ended = Run.objects.filter(state=RunState.ENDED).count()
    rows = []
    try:
        for name, call in (
                ("lease renewal of every attempt", lambda: renew_as_its_worker(
                    owner, pairs, 3600)),
                ("one sweeper pass", domain.sweep)):
            rows.append(counted_row(f"{live} at", f"{name}, with {ended / 1e6:.1f}M runs ended",
                                    [counted(call) for _ in range(passes)]))
    finally:
        for attempt in attempts:
            domain.attempt_finish(run_id=attempt.run_id, generation=attempt.generation,
                                  ending=Ending.completed())
    return rows


def whole_table_figures() -> None:
    """The whole-system figures of /metrics as each scrape read them before the database
    kept them: runs by state and end cause, lost attempts, time to stop by path."""
    list(Run.objects.values("state", "end_cause").annotate(n=Count("pk")).order_by())
    Attempt.objects.filter(close_reason=CloseReason.LOST).count()
    time_to_stop()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise CommandError(f"no VmRSS for process {pid}")


class Swarm:
    """``count`` websocket clients on one event loop in a thread; each records when the
    next message after ``arm()`` reached it."""

    def __init__(self, port: int, token: str, count: int):
        self.count = count
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.arrivals: list[float] = []
        self.armed = False
        self.all_in = threading.Event()
        self.tasks = []
        ready = asyncio.run_coroutine_threadsafe(self._connect_all(port, token), self.loop)
        ready.result(timeout=120)

    async def _connect_all(self, port, token):
        sockets = []
        for start in range(0, self.count, 50):  # handshakes in batches, as browsers arrive
            batch = await asyncio.gather(*(websockets.connect(
                f"ws://127.0.0.1:{port}/ws/runs/",
                additional_headers={"Authorization": f"Token {token}"}, max_size=None)
                for _ in range(start, min(self.count, start + 50))))
            for socket_ in batch:
                await socket_.recv()  # the snapshot
            sockets += batch
        self.sockets = sockets
        self.tasks = [asyncio.get_running_loop().create_task(self._listen(s)) for s in sockets]

    async def _listen(self, socket_):
        async for _ in socket_:
            if self.armed:
                self.arrivals.append(time.monotonic())
                if len(self.arrivals) >= self.count:
                    self.all_in.set()

    def arm(self) -> None:
        self.arrivals = []
        self.all_in.clear()
        self.armed = True

    def collect(self, timeout: float) -> list[float]:
        if not self.all_in.wait(timeout):
            raise CommandError(f"only {len(self.arrivals)} of {self.count} clients received")
        self.armed = False
        return list(self.arrivals)

    def close(self) -> None:
        async def shut():
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*(s.close() for s in self.sockets), return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
