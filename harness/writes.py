"""``manage.py bench writes``: what PostgreSQL spends on one write of a run, part by part.

A lifecycle writes the runs table three times (the create, the claim, the end), each in a
statement of its own, and each such statement pays for the table's integrity before its
row: PostgreSQL reads, plans and compiles every check constraint of a table once per
statement that writes it, enters the new version of a row in every index of the table
(unless no indexed column changed and the page had room), and calls the triggers that
keep /metrics' totals. This measures those parts apart, on copies of the runs table made
in the benchmark's transaction, which is rolled back at the end.

Each copy holds the same ended runs. A block is ``BLOCK`` single-row updates, each of a
different row, that flip its end cause between completed and failed (a change every check
allows, of an indexed column, which the totals' trigger counts), or ``BLOCK`` inserts,
each a copy of one of those rows under a new id, run by a function in the database, so
that the figure is the server's, with no round trip in it. (The foreign keys of an
insert are checked at the commit, which never comes: their checks are queued, not run.)
The function's statements are planned once and kept, as psycopg's prepared statements
are. The blocks of the copies alternate, so a change of the machine's speed falls on all
of them alike. All of it runs in one transaction: the relation locks are taken once,
where a lifecycle's transactions each take their own. Those are counted apart: the
relation locks that a create, a claim and an end take, and how many of them fall outside
the backend's fast-path slots.

Last, what the transitions themselves cost the server, each in its own transaction as the
API and the workers make them: the CPU of the benchmark's own backend (the scheduler's
count in /proc, so the server must be on this machine) for a create, a claim and an end of
a run, one run at a time and ``TOGETHER`` at once (one create statement and one claim for
them all, as a batch's request and a shared task message make them; their ends in one
transaction, as a worker gathers the ends that come together), beside a
``SELECT 1``, the protocol's own floor.
"""

import re
from contextlib import contextmanager

from django.db import connection, transaction
from django.utils import timezone

from harness.processes import cpu_ns
from runs import domain
from runs.domain import outside
from runs.domain.core import Ending
from runs.domain.sql import quoted
from runs.models import EndCause, Run

BLOCK = 100  # writes per sample

# The copies of the runs table: (name, what its LIKE clause copies, with the totals'
# triggers, what its rows call it). Each has a primary key, as the table has.
COPIES = (
    ("bare", "", False, "a bare copy of {table} (its primary key alone)"),
    ("checked", "INCLUDING CONSTRAINTS", False, "the copy with its {checks} check constraints"),
    ("indexed", "INCLUDING INDEXES", False, "the copy with its {indexes} indexes"),
    ("both", "INCLUDING CONSTRAINTS INCLUDING INDEXES", False, "the copy with both"),
    ("whole", "INCLUDING CONSTRAINTS INCLUDING INDEXES", True,
     "the copy with both and the totals' triggers"),
)
# The totals' triggers of a run's update and of an insert (migration 0017_metric_totals).
TRIGGERS = ("runs_metric_run_moved", "runs_metric_runs_added")
WRITES = ("update", "insert")
# Lifecycles whose locks are counted: by the last, psycopg has prepared their statements
# (at the fifth use) and PostgreSQL plans them generically (after five custom plans).
LIFECYCLES = 15
TOGETHER = 50  # runs created and claimed together: a batch's request, a shared message
SPEC = {"agent": "demo.steps", "input": {"steps": 1, "step_seconds": 0}}


def writes_bench(writes: int) -> list:
    """Rows of ``Command.print_table``: ms per ``BLOCK`` updates, and per ``BLOCK`` inserts,
    of a run on each copy of the runs table and on the table itself, ``writes`` of each in
    all, then the relation locks of a create, a claim and an end."""
    blocks = max(1, writes // BLOCK)
    table = Run._meta.db_table
    with transaction.atomic():
        started = timezone.now()
        # One block more than measured: the first of each copy plans its statements.
        domain.runs_import(agent="demo.steps", count=(blocks + 1) * BLOCK, ended=True)
        ids = [str(pk) for pk in Run.objects.filter(created_at__gte=started).order_by(
            "id").values_list("id", flat=True)]
        with connection.cursor() as cursor:
            checks, indexes = _counts(cursor, table)
            labels = {f"awaken_writes_{name}": label.format(
                table=table, checks=checks, indexes=indexes) for name, _, _, label in COPIES}
            labels[table] = f"{table} itself (its foreign keys and every trigger too)"
            for name, like, triggered, _ in COPIES:
                _copy(cursor, table, f"awaken_writes_{name}", like, triggered, ids)
            targets = list(labels)
            for target in targets:
                _timers(cursor, target)
                for write in WRITES:
                    _block(cursor, write, target, ids[:BLOCK])
            samples = {(write, target): [] for write in WRITES for target in targets}
            for block in range(1, blocks + 1):
                chunk = ids[block * BLOCK:(block + 1) * BLOCK]
                turn = block % len(targets)  # each copy first in turn
                for target in targets[turn:] + targets[:turn]:
                    for write in WRITES:
                        samples[write, target].append(_block(cursor, write, target, chunk))
        transaction.set_rollback(True)
    rows = [("writes", f"{BLOCK} {write}s of a run: {labels[target]}", samples[write, target],
             "one statement each, timed in the database")
            for write in WRITES for target in targets]
    return rows + _lock_rows() + _transition_rows(writes)


def _counts(cursor, table: str) -> tuple[int, int]:
    cursor.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass "
                   "AND contype = 'c'", [table])
    checks = cursor.fetchone()[0]
    cursor.execute("SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass", [table])
    return checks, cursor.fetchone()[0]


def _copy(cursor, table: str, copy: str, like: str, triggered: bool, ids: list) -> None:
    key = quoted(Run._meta.pk.column)
    cursor.execute(f"CREATE TEMPORARY TABLE {copy} (LIKE {quoted(table)} {like}) "
                   f"ON COMMIT DROP")
    if "INDEXES" not in like:
        cursor.execute(f"ALTER TABLE {copy} ADD PRIMARY KEY ({key})")
    cursor.execute(f"INSERT INTO {copy} SELECT * FROM {quoted(table)} WHERE {key} = ANY(%s)",
                   [ids])
    if triggered:
        cursor.execute("SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = ANY(%s) "
                       "AND tgrelid = %s::regclass", [list(TRIGGERS), table])
        for (definition,) in cursor.fetchall():
            # The same trigger, on the copy: its ON clause names the copy instead.
            cursor.execute(re.sub(r" ON \S+ ", f" ON pg_temp.{copy} ", definition, count=1))
    cursor.execute(f"ANALYZE {copy}")


def _timers(cursor, target: str) -> None:
    """Functions that write ``target``'s rows of an array of ids one statement at a time,
    and return the ms it took: one updates each row (its end cause flipped between
    completed and failed), the other inserts a copy of each under a new id."""
    meta = Run._meta
    key, cause = quoted(meta.pk.column), quoted(meta.get_field("end_cause").column)
    columns = [quoted(field.column) for field in meta.concrete_fields]
    copied = ", ".join("gen_random_uuid()" if column == key else column for column in columns)
    statements = {
        "update": f"""UPDATE {quoted(target)} SET {cause} = CASE {cause}
                      WHEN '{EndCause.FAILED}' THEN '{EndCause.COMPLETED}'
                      ELSE '{EndCause.FAILED}' END WHERE {key} = one""",
        "insert": f"INSERT INTO {quoted(target)} ({', '.join(columns)}) SELECT {copied} "
                  f"FROM {quoted(target)} WHERE {key} = one",
    }
    for write, statement in statements.items():
        cursor.execute(f"""
            CREATE FUNCTION pg_temp.awaken_{write}s_{target}(ids uuid[])
            RETURNS double precision LANGUAGE plpgsql AS $$
            DECLARE started timestamptz := clock_timestamp(); one uuid;
            BEGIN
                FOREACH one IN ARRAY ids LOOP
                    {statement};
                END LOOP;
                RETURN extract(epoch FROM clock_timestamp() - started) * 1000;
            END $$""")


def _block(cursor, write: str, target: str, ids: list) -> float:
    cursor.execute(f"SELECT pg_temp.awaken_{write}s_{target}(%s::uuid[])", [ids])
    return cursor.fetchone()[0]


def _lock_rows() -> list:
    """The relation locks a create, a claim and an end each take in a transaction of their
    own, and how many of them PostgreSQL keeps in its shared lock table, past the
    backend's fast-path slots: on a connection that has made ``LIFECYCLES`` of them
    (psycopg has prepared their statements and PostgreSQL's plans of them are generic, as
    on a worker's connection by then), beside the first time. A statement planned afresh
    locks every index of the tables it reads or writes; a generic plan only those it uses.
    The runs are left ended, as the other parts leave theirs."""
    counted = {}

    def locks(name, call):
        with transaction.atomic():
            made = call()
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*), count(*) FILTER (WHERE NOT fastpath) "
                               "FROM pg_locks WHERE pid = pg_backend_pid() "
                               "AND locktype = 'relation' AND relation <> 'pg_locks'::regclass")
                counted.setdefault(name, []).append(cursor.fetchone())
        return made

    for _ in range(LIFECYCLES):
        run, _ = locks("create", lambda: domain.run_create(
            agent="demo.steps", dispatch=False, source="cli"))
        (attempt,) = locks("claim", lambda run=run: domain.attempts_start(
            run_ids=[str(run.id)], owner="bench-writes", lease_seconds=60))
        locks("end", lambda attempt=attempt: domain.attempt_finish(
            run_id=attempt.run_id, generation=attempt.generation, ending=Ending.completed()))
    return [("writes", f"relation locks of a run's {name}", float(last[0]),
             f"{last[1]} of them past the fast-path slots; the first time on the connection "
             f"{first[0]} ({first[1]})")
            for name, (first, *_, last) in counted.items()]


def _transition_rows(runs: int) -> list:
    """The backend's CPU, µs a run, for the create, the claim and the end of ``runs`` runs
    (rounded down to a multiple of ``TOGETHER``, and at least that), first one run at a
    time, then ``TOGETHER`` at once (their ends in one transaction); each phase after as
    many again unmeasured, so that
    psycopg has prepared its statements and PostgreSQL's plans are generic, as on a
    long-lived connection. No worker is asked to take the runs: this process claims and
    ends them all itself."""
    runs = max(TOGETHER, runs // TOGETHER * TOGETHER)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()

    def spent(each, items, per: int = 1):
        """Backend µs per run of ``each(item)`` for the second half of ``items``."""
        half = len(items) // 2
        done = [each(item) for item in items[:half]]
        before = cpu_ns(backend)
        done += [each(item) for item in items[half:]]
        return (cpu_ns(backend) - before) / 1e3 / ((len(items) - half) * per), done

    def select_one(_):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    def claim(ids):
        return domain.attempts_start(run_ids=ids, owner="bench-writes", lease_seconds=60)

    def end(attempts):
        for attempt in attempts:
            domain.attempt_finish(run_id=attempt.run_id, generation=attempt.generation,
                                  ending=Ending.completed())

    def end_together(attempts):
        """The attempts' ends in one transaction, as a worker gathers those that come
        together."""
        domain.attempts_finish(ends=[
            {"run_id": attempt.run_id, "generation": attempt.generation,
             "ending": Ending.completed()} for attempt in attempts])

    def alone(_):
        return [domain.run_create(**SPEC, source="cli")[0]]

    def together(_):
        return domain.runs_create(runs=[SPEC] * TOGETHER, source="cli")

    costs = {}
    with _handed_to_nobody():
        costs["SELECT 1"], _ = spent(select_one, range(2 * runs))
        for way, size, create, ending in (
                ("alone", 1, alone, end), (f"{TOGETHER} together", TOGETHER, together,
                                           end_together)):
            costs["create", way], made = spent(create, range(2 * runs // size), size)
            ids = [[str(run.id) for run in group] for group in made]
            costs["claim", way], claimed = spent(claim, ids, size)
            costs["end", way], _ = spent(ending, claimed, size)
    note = f"the benchmark's backend, {runs} runs a way after as many unmeasured"
    shared = {"alone": "a transaction of its own", f"{TOGETHER} together": (
        f"one transaction for the {TOGETHER}, as a batch's create, a shared message's claim "
        "and a worker's gathered ends make it")}
    return [("writes", "PostgreSQL CPU µs a statement: SELECT 1", costs.pop("SELECT 1"),
             "the protocol's own floor; " + note)] + [
        ("writes", f"PostgreSQL CPU µs a run: its {name}, {way}", cost,
         f"{shared[way]}; {note}") for (name, way), cost in costs.items()]


class _Nobody:
    """Workers that take nothing: the runs created here are claimed by this process."""

    def runs_queued(self, *, runs):
        pass


@contextmanager
def _handed_to_nobody():
    """The domain's workers interface plugged to ``_Nobody`` meanwhile, so that a batch's
    create (which hands its runs on after its commit) leaves no task message behind."""
    plugged = outside.workers
    outside.connect(workers=_Nobody())
    try:
        yield
    finally:
        outside.connect(workers=plugged)
