"""The instruments of ``manage.py bench``: its lean HTTP client against a real site, its CPU
meter, which counts the benchmark's own process apart from the processes it starts, the
load average every table prints, the DBOS baseline (its workers, its own database, its
cancel, and a row saying why when it cannot be measured), and one benchmark at a time on a
database."""

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from harness import dbos_baseline
from harness.dbos_baseline import DbosSystem
from harness.instructions import PHASES, counted_phases, line_within, tail
from harness.management.commands.bench import (
    GC_PROBE,
    Command,
    CpuMeter,
    Failed,
    KeptConnection,
    bulk_history,
    dbos_cancels,
    dbos_lifecycle,
    parameters_bench,
    process_environment,
    vacuum_tables,
)
from harness.processes import ROOT, WORKER_ENV, Busy, alone_on_the_database, environment
from harness.writes import LIFECYCLES, TOGETHER, writes_bench
from runs import domain
from runs.domain import outside, sql
from runs.domain.totals import totals
from runs.models import Attempt, Event, Run
from tests.conftest import HAS_SERVICES, ON_POSTGRES, make_user

SPEC = {"agent": "demo.steps", "input": {"steps": 1, "step_seconds": 0}}


def test_the_kept_connection_sends_creates_on_one_socket_and_reads_only_their_status(
        embedded_site):
    client = KeptConnection(embedded_site.port, embedded_site.token)
    single = client.request("POST", "/api/runs/", json.dumps(SPEC).encode())
    batch = client.request("POST", "/api/runs/batch/", json.dumps({"runs": [SPEC] * 3}).encode())
    try:
        assert client.send(single) == 201
        kept = client.socket
        assert client.send(batch) == 201
        assert client.send(single) == 201
        assert client.send(client.request("GET", "/api/runs/?limit=1")) == 200
        assert client.socket is kept  # every response read to its end, the socket kept
    finally:
        client.close()
    stranger = KeptConnection(embedded_site.port, "not-a-key")
    try:
        assert stranger.send(stranger.request("POST", "/api/runs/", json.dumps(SPEC).encode())) \
            == 401
    finally:
        stranger.close()


# A process that waits for a line, then burns 0.4 s of CPU, in user mode
# (BURN % "sum(range(20_000))") or in the kernel (BURN % "os.read(zero, 1 << 20)", copying
# zeros), then says so and waits. What it spends starting is spent before the line.
BURN = """
import os, sys, time
zero = os.open("/dev/zero", os.O_RDONLY)
print("ready", flush=True)
sys.stdin.readline()
end = time.process_time() + 0.4
while time.process_time() < end:
    %s
print("burnt", flush=True)
sys.stdin.read()
"""


@pytest.mark.django_db  # on PostgreSQL the meter reads the server's processes too
def test_the_cpu_meter_counts_the_benchmark_apart_from_the_processes_it_started():
    children = {name: subprocess.Popen([sys.executable, "-c", BURN % work],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for name, work in (("summing", "sum(range(20_000))"),
                                   ("copying", "os.read(zero, 1 << 20)"))}
    try:
        for child in children.values():
            assert child.stdout.readline().strip() == "ready"
        meter = CpuMeter({name: [child.pid] for name, child in children.items()})
        for child in children.values():
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children.values():
            assert child.stdout.readline().strip() == "burnt"  # it has burnt 0.4 s of CPU
        spent = meter.per(1)
    finally:
        for child in children.values():
            child.stdin.close()
            child.wait(30)
    assert spent["summing"] >= 300 and spent["copying"] >= 300  # ms
    assert spent["client"] < 100  # this process waited; the children's CPU is not its own
    assert spent["total"] == sum(spent[name] for name in (*children, "client", "PostgreSQL"))
    assert meter.kernel["summing"] < 0.25 < 0.75 < meter.kernel["copying"]


def printed(load: float, autovacuum: bool = True) -> str:
    out = StringIO()
    command = Command(stdout=out)
    command.load, command.pace, command.autovacuum = load, 81.0, autovacuum
    command.print_table([("1 live", "something measured", [1.0, 2.0, 3.0], "a note",
                          f"{load:.2f}-0.10")])
    return out.getvalue()


def test_every_table_prints_the_load_and_warns_when_the_machine_was_loaded():
    quiet, loaded = printed(0.4), printed(3.5)
    assert "load average (1 min): 0.40 at the start" in quiet
    assert "pace: a fixed loop took 81 ms of CPU at the start" in quiet
    assert "warning" not in quiet
    assert "load average (1 min): 3.50 at the start" in loaded
    assert "warning: the machine was loaded when the benchmark started" in loaded
    assert "3.50-0.10" in loaded  # the row's own load, at its part's start and end
    assert "autovacuum" not in quiet
    assert "note: autovacuum is off on this PostgreSQL server" in printed(0.4, autovacuum=False)


def test_a_row_that_could_not_be_measured_says_why():
    out = StringIO()
    command = Command(stdout=out)
    command.load, command.pace, command.autovacuum = 0.2, 81.0, True
    command.print_table([("", "baseline: DBOS queue, workflows per second",
                          Failed("TimeoutError: timed out after 60 s"), "DBOS 3.4.0")])
    assert "failed: TimeoutError: timed out after 60 s; DBOS 3.4.0" in out.getvalue()


def test_without_dbos_its_rows_say_so_at_once(monkeypatch):
    monkeypatch.setattr(dbos_baseline, "installed", lambda: False)
    [row] = dbos_lifecycle("4 wkr", 16, 4, 0.25, 0.05)
    assert isinstance(row[2], Failed) and "dbos is not installed" in row[2]
    [row] = dbos_cancels(3, [10], 0.05)
    assert isinstance(row[2], Failed) and "dbos is not installed" in row[2]


def dbos_databases() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE 'awaken_bench_dbos_%'")
        return [name for (name,) in cursor.fetchall()]


needs_dbos = pytest.mark.skipif(not dbos_baseline.installed(),
                                reason="dbos is not installed (the dev extra)")


@needs_dbos
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # no test transaction left idle while DBOS works
def test_the_dbos_baseline_runs_workflows_on_its_workers_and_stops_a_cancelled_one_between_steps():
    before = dbos_databases()
    with DbosSystem(2, poll=0.02, callers=2) as system:
        assert system.database in dbos_databases()  # a database of its own
        meter = CpuMeter({"workers": system.pids}, database=system.database,
                         own_backends=(system.counter_pid,))
        # Enough workflows that its backends' CPU, counted in clock ticks of 10 ms, is more
        # than none: 16 took some 25 ms over several backends, and read 0.0 once.
        done, elapsed = system.run(96, 0.05, 60)
        spent = meter.per(done)
        assert done == 96 and elapsed > 0
        assert system.counts(0) == (96, 0)  # counted in DBOS's own status table
        assert spent["workers"] > 0 and spent["PostgreSQL"] > 0
        returned, stopped = system.cancels(3, 0.01)
        assert len(returned) == len(stopped) == 3
        assert all(0 < ms < 5000 for ms in stopped)  # after the call, within a few steps
        cancelled = system.marks.execute(
            "SELECT count(*) FROM dbos.workflow_status WHERE name = %s AND status = "
            "'CANCELLED'", (dbos_baseline.NAPS,)).fetchone()[0]
        assert cancelled == 3
        workers = list(system.processes.members)
    assert not any(worker.running() for worker in workers)
    assert dbos_databases() == before  # dropped


@needs_dbos
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # no test transaction left idle while DBOS works
def test_a_dbos_measurement_that_cannot_finish_fails_by_its_deadline():
    with DbosSystem(0, callers=2) as system:  # no worker: nothing is ever completed
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="every DBOS workflow to succeed"):
            system.run(4, 0.05, 1.0)
        assert time.monotonic() - started < 10


@needs_dbos
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # no test transaction left idle while DBOS works
def test_the_dbos_rows_of_lifecycle_and_cancel():
    rate, system_cpu, client_cpu = dbos_lifecycle("2 wkr", 16, 2, 0.05, 0.02)
    assert rate[1] == "baseline: DBOS queue, workflows per second"
    assert not isinstance(rate[2], Failed) and rate[2] > 0, rate
    assert rate[3].startswith("16 in ")
    assert system_cpu[2] > 0 and "workers" in system_cpu[3] and "PostgreSQL" in system_cpu[3]
    assert client_cpu[1] == "bench client CPU ms per workflow, DBOS baseline"
    returned, stopped = dbos_cancels(3, [10], 0.02)
    assert returned[1] == "baseline: DBOS cancel_workflow() returns" and len(returned[2]) == 3
    assert stopped[1] == "baseline: DBOS cancel -> workflow code stops, 10 ms steps"
    assert len(stopped[2]) == 3 and "stopped by DBOSWorkflow" in stopped[3]
    assert dbos_databases() == []  # each part dropped its database


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_parameters_rows_name_what_a_run_and_its_event_send_each_way():
    rows = parameters_bench(2)
    every = len(sql._inserted_fields(Run)) + len(sql._inserted_fields(Event))
    names = [measurement for _, measurement, _, _ in rows]
    assert f"a run and its event as {every} values, every column, CPU" in names
    given = int(names[0].split(" as ")[1].split()[0])
    assert 0 < given < every  # the NULLs left to the columns
    assert rows[0][2] == 1.0  # each against the first


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_history_of_ended_runs_is_inserted_whole():
    """``bench metrics`` and ``bench spread --ended`` insert their history by hand: every
    column the runs table requires is given, and the rows read back as the models hold
    them."""
    bulk_history(12, chunk=5)
    runs = list(Run.objects.filter(thread_id="bench-metrics"))
    assert len(runs) == 12
    for run in runs:
        run.full_clean(exclude=["created_by", "parent", "rerun_of", "ticket", "control"])
    assert Attempt.objects.filter(run__in=runs).count() == 12


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_second_benchmark_on_the_same_database_is_refused_at_once(settings):
    settings.REDIS_URL = settings.REDIS_URL or "redis://127.0.0.1:6379/0"  # never reached
    with alone_on_the_database():
        with pytest.raises(Busy), alone_on_the_database():
            pass
        with pytest.raises(CommandError, match="another benchmark is running"):
            call_command("bench", "push", stdout=StringIO(), stderr=StringIO())
    with alone_on_the_database():  # released by the first, and by the refused ones
        pass


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_benchmark_vacuums_and_analyzes_a_table_only_as_autovacuum_would():
    table = Run._meta.db_table

    def done() -> tuple[int, int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT vacuum_count, analyze_count FROM pg_stat_user_tables "
                           "WHERE relname = %s", [table])
            return cursor.fetchone()

    def changed(statement: str, params=()) -> None:
        """``statement`` run, and this connection's counts of the rows it changed made
        visible to the statistics views (they are sent as the connection goes idle)."""
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            cursor.execute("SELECT pg_stat_force_next_flush()")

    def tidied(autovacuum: bool) -> tuple[int, int]:
        before = done()
        command.autovacuum = autovacuum
        command.tidy()
        return tuple(after - first for after, first in zip(done(), before, strict=True))

    command = Command(stdout=StringIO(), stderr=StringIO())
    domain.runs_import(agent="demo.steps", count=1000)  # ended runs, no worker told
    changed("SELECT 1")
    vacuum_tables()  # what the import and earlier tests left past the thresholds
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE relname = %s", [table])
        [rows] = cursor.fetchone()
    assert tidied(autovacuum=True) == (0, 0)
    assert tidied(autovacuum=False) == (0, 0)  # nothing past a threshold
    # Autovacuum's defaults: past 50 rows and 10 % of the table changed, an analyze; past
    # 50 and 20 % dead, a vacuum. Between the two, an analyze alone.
    some = int(50 + 0.15 * rows)
    changed(f"UPDATE {sql.quoted(table)} SET version = version + 1 WHERE id IN "
            f"(SELECT id FROM {sql.quoted(table)} LIMIT %s)", [some])
    assert tidied(autovacuum=False) == (0, 1)
    changed(f"UPDATE {sql.quoted(table)} SET version = version + 1")  # a dead row each
    assert tidied(autovacuum=False) == (1, 1)


@pytest.mark.parametrize("option", ["--web-env", "--worker-env"])
@pytest.mark.parametrize("pair", ["PYTHONMALLOC", "=pymalloc", "1X=y", "A B=c"])
def test_a_variable_without_a_name_is_refused_before_anything_runs(option, pair):
    with pytest.raises(CommandError, match=f"{option} takes NAME=VALUE"):
        call_command("bench", "push", option, pair, stdout=StringIO(), stderr=StringIO())


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_processes_start_with_the_variables_asked_for_and_the_table_names_them():
    command = Command(stdout=StringIO(), stderr=StringIO())
    command.web_env = process_environment(["PYTHONMALLOC=malloc", "PYTHONMALLOC=pymalloc",
                                           "AWAKEN_BENCH_MARK=a=b"])
    command.worker_env = process_environment(["AWAKEN_BENCH_WORKER=w"], "--worker-env")
    with command.system_of(1, 1) as ([web], [worker]):
        environ = Path(f"/proc/{web.pid}/environ").read_bytes().split(b"\0")
        worker_environ = Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0")
        # Handed over warm: every agent prepared as the worker started, as the command
        # line an operator would use says.
        asked = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "awaken_site", "inspect", "awaken_prepared",
             "-d", worker.node, "--json"], cwd=ROOT, env=worker.env, capture_output=True,
            text=True, timeout=60)
        assert asked.returncode == 0, asked.stderr[-2000:]
        reply = json.loads(asked.stdout.strip().splitlines()[-1])[worker.node]
        assert reply["prepared"] and reply["seconds"] > 0
    # The last value of a name wins over the first and over the Procfile's malloc.
    assert b"PYTHONMALLOC=pymalloc" in environ
    assert b"AWAKEN_BENCH_MARK=a=b" in environ
    assert b"AWAKEN_BENCH_WORKER=w" in worker_environ
    # The Procfile's worker variables, as the worker was started (glibc rewrites its own
    # tunables in the copy /proc shows).
    assert worker.env["GLIBC_TUNABLES"] == WORKER_ENV["GLIBC_TUNABLES"]
    assert b"AWAKEN_BENCH_WORKER=w" not in environ
    assert b"AWAKEN_BENCH_MARK=a=b" not in worker_environ
    command.load, command.pace, command.autovacuum = 0.0, 1.0, True
    command.print_table([("", "a row", 1.0, "")])
    assert ("the web processes' environment, on top of the Procfile's: "
            "PYTHONMALLOC=pymalloc AWAKEN_BENCH_MARK=a=b") in command.stdout.getvalue()
    assert ("the workers' environment, on top of the Procfile's: AWAKEN_BENCH_WORKER=w"
            in command.stdout.getvalue())


@pytest.mark.skipif(ON_POSTGRES, reason="what is refused is another database")
def test_the_writes_part_refuses_a_database_other_than_postgresql():
    with pytest.raises(CommandError, match="writes measures PostgreSQL's own work"):
        call_command("bench", "writes", stdout=StringIO(), stderr=StringIO())


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_writes_part_times_each_copy_of_the_runs_table_and_leaves_nothing_behind(
        monkeypatch):
    """``bench writes`` imports its runs, copies, updates and inserts them in one transaction
    that it rolls back: afterwards only the runs whose locks it counted, and those whose
    transitions it timed, are left, ended, none of them handed to a worker, and the totals
    of /metrics still count what the table holds."""
    handed = []
    plugged = outside.workers
    monkeypatch.setattr(plugged, "runs_queued", lambda *, runs: handed.extend(runs))
    rows = writes_bench(200)
    writes, locks, transitions = rows[:12], rows[12:15], rows[15:]
    assert [name.split(": ", 1)[0] for _, name, _, _ in writes] == (
        ["100 updates of a run"] * 6 + ["100 inserts of a run"] * 6)
    assert [name.split(": ", 1)[1].split()[1] for _, name, _, _ in writes] == [
        "bare", "copy", "copy", "copy", "copy", "itself"] * 2
    for _, _, samples, _ in writes:
        assert len(samples) == 2 and all(sample > 0 for sample in samples)
    assert [name for _, name, _, _ in locks] == [
        "relation locks of a run's create", "relation locks of a run's claim",
        "relation locks of a run's end"]
    for _, _, total, note in locks:
        shared = int(note.split()[0])
        first = int(note.split("the first time on the connection ")[1].split()[0])
        assert 0 < total <= first and 0 <= shared <= total
    # A plan made afresh locks every index of the runs table, a generic one those it uses.
    assert locks[2][2] < int(locks[2][3].split("connection ")[1].split()[0])
    assert [name for _, name, _, _ in transitions] == [
        "PostgreSQL CPU µs a statement: SELECT 1",
        *(f"PostgreSQL CPU µs a run: its {name}, {way}" for way in ("alone", f"{TOGETHER} together")
          for name in ("create", "claim", "end"))]
    assert all(cost > 0 for _, _, cost, _ in transitions)
    # 200 runs measured each way after 200 unmeasured, each created, claimed and ended here.
    assert set(Run.objects.values_list("state", "end_cause")) == {("ended", "completed")}
    assert totals()["runs"] == {("ended", "completed"): LIFECYCLES + 2 * 400}
    assert Attempt.objects.count() == Attempt.objects.filter(
        close_reason="completed").count() == LIFECYCLES + 2 * 400
    assert handed == [] and outside.workers is plugged
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('pg_temp.awaken_writes_whole')")
        assert cursor.fetchone() == (None,)


def test_the_collector_probe_records_each_full_pass_of_a_process_that_loads_it(tmp_path):
    """bench gc's probe: a process started with its folder on PYTHONPATH writes a line per
    full pass (when, ms, collected, tracked after), to a file of its own process id."""
    probe = tmp_path / "passes"
    program = subprocess.run(  # its file as it is before the process exits (and collects)
        [sys.executable, "-c", "import gc, os; gc.collect(); gc.collect(1); "
         "print(open(f'{os.environ[\"AWAKEN_GC_PROBE\"]}.{os.getpid()}').read())"],
        env={"PYTHONPATH": str(GC_PROBE), "AWAKEN_GC_PROBE": str(probe), "PATH": "/usr/bin"},
        capture_output=True, text=True, timeout=30, check=True)
    lines = program.stdout.strip().splitlines()
    assert len(lines) == 1  # the full pass, not the younger one
    at, spent, collected, tracked = lines[0].split()
    assert abs(float(at) - time.time()) < 60 and float(spent) >= 0
    assert int(collected) >= 0 and int(tracked) > 0


# A program of three phases, each saying so and waiting for a line: its start, then a sum of
# 10**5 numbers, then one of 10**6 while a thread of its own sums 10**5.
PHASED = """
import sys, threading
for name, size in (("start", 0), ("small", 10**5), ("large", 10**6)):
    if name == "large":
        other = threading.Thread(target=sum, args=(range(10**5),))
        other.start()
    sum(range(size))
    if name == "large":
        other.join()
    print("done", name, flush=True)
    sys.stdin.readline()
"""


@pytest.mark.one_backend  # no database
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_callgrind_counts_each_phase_apart_under_its_name(tmp_path):
    counted = counted_phases([sys.executable, "-c", PHASED], ("start", "small", "large"),
                             env=dict(os.environ), cwd=tmp_path, folder=tmp_path)
    assert set(counted) == {"start", "small", "large"}
    small, large = sum(counted["small"]), sum(counted["large"])
    assert 5 < large / small < 20  # each phase's count began at zero
    # Each thread is counted apart: the main thread's sum ten times the other's.
    busiest, second = sorted(counted["large"], reverse=True)[:2]
    assert 5 < busiest / second < 20
    with pytest.raises(RuntimeError, match="'hello', not 'done start'"):
        counted_phases([sys.executable, "-c", "print('hello')"], ("start",),
                       env=dict(os.environ), cwd=tmp_path, folder=tmp_path)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_counted_program_makes_its_requests_then_ends_its_runs_and_empties_its_queue(
        tmp_path):
    if not HAS_SERVICES:
        pytest.skip("needs PostgreSQL and Redis (DATABASE_URL, REDIS_URL)")
    from awaken_site.celery import app

    # The program issues a key to this user; a transactional test before this one may have
    # flushed the role groups the migrations made.
    make_user("bench-instructions", "operator")
    queue = f"awaken-test-instructions-{uuid.uuid4().hex[:8]}"
    with open(tmp_path / "stderr", "w+") as errors:
        program = subprocess.Popen(
            [sys.executable, "-m", "harness.instructions", "3", "2"], cwd=ROOT,
            env=environment({"AWAKEN_QUEUE": queue}), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=errors, text=True)
        try:
            for phase in PHASES:
                said = line_within(program, 60)
                assert said == f"done {phase}", (said, tail(errors))
                program.stdin.write("\n")
                program.stdin.flush()
            assert program.wait(60) == 0, tail(errors)
        finally:
            if program.poll() is None:
                program.kill()
                program.wait()
    made = Run.objects.filter(created_by__username="bench-instructions")
    # The warm-up's creates (read, and cancelled running), then the counted ones, which the
    # counted cancels then cancel running.
    assert made.count() == 2 * 2 + 3
    assert set(made.values_list("end_cause", flat=True)) == {"cancelled"}
    asked = made.filter(generation=1, control__requested_by="bench-instructions",
                        control__source="api")
    assert asked.count() == 2 + 3
    with app.connection_for_write() as broker:  # what its dispatches sent was taken away
        assert broker.default_channel.queue_purge(queue) == 0
