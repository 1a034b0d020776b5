"""A worker process of the benchmark's DBOS baseline (``python -m harness.dbos_worker``):
DBOS Transact consuming one queue of its system database, as a DBOS deployment with
separate worker processes runs. Started and configured by ``harness.dbos_baseline`` through
the environment; it knows nothing of Django or of the project.

Its workflows:

- ``awaken_bench.one_step``: one trivial step, the lifecycle benchmark's unit of work;
- ``awaken_bench.naps``: steps that each sleep in a loop for a given time, checking nothing,
  for the cancel benchmark. It marks when its code starts and when it stops on a cancel
  (DBOS raises at the next step boundary), with what DBOS raised, in a table of the
  benchmark's own in the same database, on this machine's clock.

DBOS is a development dependency only (the ``dev`` extras): the product never imports it.
"""

import os
import signal
import threading
import time

import psycopg
from dbos import DBOS

APP = "awaken_bench"
MARKS = "awaken_bench_marks"  # key, what ('started', 'stopped'), how, at (epoch seconds)


def mark(key: str, what: str, how: str = "") -> None:
    """Record that the workflow of ``key`` reached ``what`` now (``how``: by what)."""
    at = time.time()
    with psycopg.connect(os.environ["AWAKEN_DBOS_URL"], autocommit=True,
                         connect_timeout=10) as connection:
        connection.execute(f"INSERT INTO {MARKS} (key, what, how, at) VALUES (%s, %s, %s, %s)",
                           (key, what, how, at))


@DBOS.step(name="awaken_bench.trivial")
def trivial(number: int) -> int:
    """It does nothing, so that what is measured is the machinery."""
    return number + 1


@DBOS.workflow(name="awaken_bench.one_step")
def one_step(number: int) -> int:
    return trivial(number)


@DBOS.step(name="awaken_bench.nap")
def nap(seconds: float) -> None:
    """Sleep ``seconds`` in a loop that checks nothing: a step DBOS cannot interrupt."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.001)


@DBOS.workflow(name="awaken_bench.naps")
def naps(key: str, seconds: float, steps: int) -> None:
    mark(key, "started")
    try:
        for _ in range(steps):
            nap(seconds)
    except BaseException as stop:
        # What DBOS raises here once the workflow is cancelled: its cancellation at the next
        # step's start, or, when the step in progress records its result, the loss of the
        # workflow's ownership (the cancel clears it).
        mark(key, "stopped", type(stop).__name__)
        raise


def main() -> None:
    env = os.environ
    concurrency = int(env.get("AWAKEN_DBOS_CONCURRENCY", "8"))
    DBOS(config={
        "name": APP,
        "system_database_url": env["AWAKEN_DBOS_URL"],
        "executor_id": env["AWAKEN_DBOS_EXECUTOR"],
        "sys_db_pool_size": int(env.get("AWAKEN_DBOS_POOL", str(concurrency + 2))),
        "run_migrations": False,  # the benchmark migrated the database before any worker
        "log_level": "WARNING",
    })
    DBOS.listen_queues([env["AWAKEN_DBOS_QUEUE"]])
    DBOS.launch()
    DBOS.register_queue(env["AWAKEN_DBOS_QUEUE"], worker_concurrency=concurrency,
                        polling_interval_sec=float(env.get("AWAKEN_DBOS_POLL", "0.05")))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    print("awaken-dbos-worker ready", flush=True)
    stopping.wait()
    DBOS.destroy()


if __name__ == "__main__":
    main()
