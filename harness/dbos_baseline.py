"""The benchmark's second baseline: DBOS Transact, durable Python workflows on PostgreSQL,
in the shape closest to ours: workflows enqueued on a DBOS queue by callers that wait for
none, consumed by separate worker processes (``harness.dbos_worker``).

``DbosSystem`` gives DBOS a PostgreSQL database of its own on the configured server,
created for the benchmark and dropped after it, migrated before any worker starts; it
starts the workers and enqueues and cancels through a ``DBOSClient``. Every wait has a
deadline: a part that cannot finish raises (``TimeoutError``, ``ProcessFailed``, or the
error met), and the benchmark prints its row as failed, with why.

DBOS is a development dependency only (the ``dev`` extras), imported here when a
``DbosSystem`` starts: the product never imports it, and the benchmark runs without it
(its DBOS rows then say it is not installed).
"""

import importlib.util
import logging
import random
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from harness.processes import Process, Processes, database_url, environment, wait_until

APP = "awaken_bench"  # as harness.dbos_worker names it
MARKS = "awaken_bench_marks"
ONE_STEP, NAPS = "awaken_bench.one_step", "awaken_bench.naps"
READY = "awaken-dbos-worker ready"


class DbosUnavailable(RuntimeError):
    """DBOS is not installed here."""


def installed() -> bool:
    return importlib.util.find_spec("dbos") is not None


def database_url_of(name: str) -> str:
    """The configured database's URL with another database's name, as DBOS takes it."""
    parts = urlsplit(database_url())
    return urlunsplit(("postgresql", parts.netloc, f"/{name}", "", ""))


def administer(statement: str) -> None:
    """Run ``statement`` (CREATE or DROP DATABASE) on the server's maintenance database,
    outside any transaction of this process's."""
    import psycopg

    with psycopg.connect(database_url_of("postgres"), autocommit=True, connect_timeout=10,
                         options="-c statement_timeout=60000") as maintenance:
        maintenance.execute(statement)


class DbosWorker(Process):
    """One ``python -m harness.dbos_worker`` process; ready once DBOS has launched in it and
    its queue is registered."""

    def __init__(self, name: str, env: dict, log_dir: Path | None = None):
        super().__init__([sys.executable, "-m", "harness.dbos_worker"], name=name,
                         env=environment(env), log_dir=log_dir)

    def ready(self) -> bool:
        return READY in self.log()


class DbosSystem:
    """DBOS on a database of its own: ``workers`` worker processes consuming one queue,
    each running up to ``concurrency`` workflows at once (ours: 8 threads a worker) and
    polling the queue every ``poll`` seconds; a ``DBOSClient`` with a pool of ``callers``
    connections to enqueue and cancel. Used as a context manager; everything it made is
    stopped and dropped however the block ends."""

    def __init__(self, workers: int, *, concurrency: int = 8, poll: float = 0.05,
                 callers: int = 8, log_dir: Path | None = None):
        self.workers, self.concurrency, self.poll, self.callers = (workers, concurrency, poll,
                                                                   callers)
        self.database = f"awaken_bench_dbos_{uuid.uuid4().hex[:8]}"
        self.queue = f"awaken-bench-{uuid.uuid4().hex[:8]}"
        self.url = ""
        self.log_dir = log_dir
        self.created = False
        self.processes: Processes | None = None
        self.client = None
        self.engine = None
        self.marks = None
        self.stopped_by: dict[str, int] = {}
        self.note = (f"DBOS {version()}, {workers} worker processes, worker_concurrency "
                     f"{concurrency}, queue polled every {poll * 1000:g} ms, {callers} "
                     "callers enqueueing through DBOSClient without waiting, its own database "
                     "on the same PostgreSQL, SUCCESS rows of dbos.workflow_status counted")

    def __enter__(self):
        if not installed():
            raise DbosUnavailable("dbos is not installed (pip install -e '.[dev]')")
        import psycopg
        import sqlalchemy
        from dbos import DBOS, DBOSClient

        try:
            self.url = database_url_of(self.database)
            administer(f'CREATE DATABASE "{self.database}"')
            self.created = True
            # DBOS logs each of its migrations at INFO: the benchmark's output is its table.
            logging.getLogger("dbos").setLevel(logging.WARNING)
            DBOS.migrate(self.url)
            self.marks = psycopg.connect(self.url, autocommit=True, connect_timeout=10,
                                         options="-c statement_timeout=30000")
            self.marks.execute(f"CREATE TABLE {MARKS} (key text, what text, how text, "
                               "at double precision)")
            env = {"AWAKEN_DBOS_URL": self.url, "AWAKEN_DBOS_QUEUE": self.queue,
                   "AWAKEN_DBOS_CONCURRENCY": str(self.concurrency),
                   "AWAKEN_DBOS_POLL": str(self.poll)}
            self.processes = Processes()
            for index in range(self.workers):
                self.processes.add(DbosWorker(
                    f"dbos{index}-{self.queue}",
                    {**env, "AWAKEN_DBOS_EXECUTOR": f"{self.queue}-{index}"},
                    log_dir=self.log_dir))
            self.processes.wait_ready(90)
            self.engine = sqlalchemy.create_engine(
                self.url.replace("postgresql://", "postgresql+psycopg://", 1),
                pool_size=self.callers, max_overflow=0, pool_timeout=30,
                connect_args={"connect_timeout": 10,
                              "options": "-c statement_timeout=30000"})
            self.client = DBOSClient(system_database_engine=self.engine, application_name=APP,
                                     retry_connection_errors=False)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self) -> None:
        for closing in (lambda: self.client and self.client.destroy(),
                        lambda: self.engine and self.engine.dispose(),
                        lambda: self.marks and self.marks.close(),
                        lambda: self.processes and self.processes.stop()):
            try:
                closing()
            except Exception:  # the rest must be closed all the same
                pass
        if self.created:
            administer(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            self.created = False

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes.members]

    @property
    def counter_pid(self) -> int:
        """The backend of the benchmark's own connection to this database (its counts and
        marks): the client's, not the system's."""
        return self.marks.info.backend_pid

    def counts(self, since_ms: int) -> tuple[int, int]:
        """Workflows of the lifecycle created since ``since_ms`` (epoch ms) in SUCCESS, and
        ended otherwise (ERROR, CANCELLED, MAX_RECOVERY_ATTEMPTS_EXCEEDED)."""
        return self.marks.execute(
            "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), count(*) FILTER (WHERE status "
            "IN ('ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED')) "
            "FROM dbos.workflow_status WHERE name = %s AND created_at >= %s",
            (ONE_STEP, since_ms)).fetchone()

    def enqueue(self, workflow: str, *args, workflow_id: str | None = None) -> None:
        options = {"queue_name": self.queue, "workflow_name": workflow}
        if workflow_id is not None:
            options["workflow_id"] = workflow_id
        self.client.enqueue(options, *args)

    def run(self, total: int, every: float, timeout: float) -> tuple[int, float]:
        """``total`` one-step workflows enqueued by ``callers`` threads without waiting:
        (workflows done, seconds from the first enqueue to the count that found the last).
        Raises TimeoutError when the sends or the completions take more than ``timeout``
        seconds, RuntimeError when a workflow ended otherwise than in SUCCESS."""
        since_ms = int(time.time() * 1000) - 1
        started = time.monotonic()

        def caller(count: int) -> int:
            for number in range(count):
                self.enqueue(ONE_STEP, number)
            return count

        pool = ThreadPoolExecutor(self.callers)
        futures = [pool.submit(caller, total // self.callers) for _ in range(self.callers)]
        done, pending = wait_for_futures(futures, timeout)
        pool.shutdown(wait=not pending, cancel_futures=True)
        if pending:
            raise TimeoutError(f"the DBOS enqueues took more than {timeout:g} s")
        sent = sum(future.result() for future in done)

        def all_done() -> bool:
            succeeded, failed = self.counts(since_ms)
            if failed:
                raise RuntimeError(f"{failed} DBOS workflows did not succeed")
            return succeeded >= sent

        wait_until(all_done, max(1.0, timeout - (time.monotonic() - started)),
                   "every DBOS workflow to succeed", every=every)
        return sent, time.monotonic() - started

    def marked(self, key: str, what: str) -> float | None:
        row = self.marks.execute(f"SELECT at FROM {MARKS} WHERE key = %s AND what = %s",
                                 (key, what)).fetchone()
        return row[0] if row else None

    def cancels(self, count: int, step_seconds: float,
                timeout: float = 30) -> tuple[list[float], list[float]]:
        """``count`` workflows of steps that each sleep ``step_seconds`` checking nothing,
        cancelled one at a time at a random point of a step (``DBOSClient.cancel_workflow``):
        ms from the cancel call to its return, and to the workflow's code stopping (its own
        mark, on the same clock). Each wait is bounded by ``timeout`` (and three steps).
        ``stopped_by`` counts what DBOS raised in the workflows' code to stop them."""
        returned, stopped = [], []
        bound = max(timeout, 3 * step_seconds)
        steps = int(4 * bound / step_seconds) + 1  # ends by itself long after any deadline
        for _ in range(count):
            key = uuid.uuid4().hex
            self.enqueue(NAPS, key, step_seconds, steps, workflow_id=key)
            wait_until(lambda key=key: self.marked(key, "started"), bound,
                       "a DBOS workflow to start")
            time.sleep(random.uniform(0, step_seconds))  # the cancel lands anywhere in a step
            sent = time.time()
            self.client.cancel_workflow(key)
            returned.append((time.time() - sent) * 1000)
            at = wait_until(lambda key=key: self.marked(key, "stopped"), bound,
                            "a cancelled DBOS workflow's code to stop")
            stopped.append((at - sent) * 1000)
            how = self.marks.execute(f"SELECT how FROM {MARKS} WHERE key = %s AND what = "
                                     "'stopped'", (key,)).fetchone()[0]
            self.stopped_by[how] = self.stopped_by.get(how, 0) + 1
        return returned, stopped


def version() -> str:
    if not installed():
        return "(not installed)"
    from importlib.metadata import version as installed_version

    return installed_version("dbos")
