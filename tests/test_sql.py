"""The hand-written statements of runs/domain/sql.py write and read what the ORM would."""

import uuid
from contextlib import nullcontext
from datetime import date, datetime, timedelta
from functools import partial
from zoneinfo import ZoneInfo

import pytest
from django.apps import apps
from django.db import connection, models, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.translation import gettext_lazy

from runs.domain import sql
from runs.models import (
    Attempt,
    AttemptState,
    CloseReason,
    ControlAction,
    ControlIntent,
    Event,
    EventKind,
    Run,
    RunState,
    WebhookEndpoint,
    WorkerProcess,
)
from tests.conftest import make_user
from tests.factories import queued_run, running_run

pytestmark = pytest.mark.django_db


def columns(instance) -> dict:
    """Every column of ``instance`` as the ORM reads it back from the database."""
    fresh = type(instance).objects.get(pk=instance.pk)
    return {f.attname: getattr(fresh, f.attname) for f in type(instance)._meta.concrete_fields}


def test_insert_writes_the_rows_the_orm_writes():
    now = timezone.now()
    made_here = Run(agent="demo.steps", input={"deep": [1, {"x": "ü"}], "n": None},
                    thread_id="t", max_seconds=2.5, max_tokens=2**40, start_after=now,
                    dispatched_at=now, version=1)
    made_by_orm = Run.objects.create(agent="demo.steps", input={"deep": [1, {"x": "ü"}],
                                     "n": None}, thread_id="t", max_seconds=2.5,
                                     max_tokens=2**40, start_after=now, dispatched_at=now,
                                     version=1)
    made_here = sql.new(Run, **{f.attname: getattr(made_here, f.attname)
                                for f in Run._meta.concrete_fields if f.attname != "created_at"})
    with transaction.atomic():
        sql.write(sql.Insert((made_here,)))
    mine, theirs = columns(made_here), columns(made_by_orm)
    for differs in ("id", "created_at", "updated_at"):  # new per row, or stamped at save
        mine.pop(differs), theirs.pop(differs)
    assert mine == theirs


@pytest.mark.postgres
def test_a_one_row_insert_names_only_the_columns_given_a_value():
    # A NULL is left to the column (none has a default of the database's own): a run and
    # its event are 32 parameters, not 54. The row is the same (the test above).
    run = queued_run()
    event = sql.new(Event, run=run, version=run.version + 1, kind=EventKind.STEP,
                    state=run.state, generation=0, actor=None, source="api", data={})
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        sql.write(sql.Insert((event,)))
    [insert] = [q["sql"] for q in queries.captured_queries if "INSERT" in q["sql"]]
    named = insert[insert.index("(") + 1:insert.index(")")]
    assert '"source"' in named and '"kind"' in named
    assert '"actor"' not in named and '"end_cause"' not in named
    assert columns(event)["actor"] is None and columns(event)["source"] == "api"


def test_a_new_row_is_saved_as_the_orm_saves_it_and_keeps_its_related_rows():
    run = queued_run()
    event = sql.new(Event, run=run, version=run.version + 1, kind=EventKind.STEP,
                    state=run.state, generation=0, data={"n": 1})
    with transaction.atomic():
        sql.write(sql.Insert((event,)))
    with CaptureQueriesContext(connection) as queries:
        assert event.run is run
    assert not queries.captured_queries
    # Saved as the ORM leaves a row: a save of some fields updates it, it inserts nothing.
    event.data = {"n": 2}
    event.save(update_fields=["data"])
    assert Event.objects.filter(run=run, kind=EventKind.STEP).count() == 1
    assert columns(event)["data"] == {"n": 2}
    made = sql.new(Run, agent="demo.steps", input={}, dispatched_at=timezone.now(), version=1)
    with transaction.atomic():
        sql.write(sql.Insert((made,)))
    made.thread_id = "again"
    made.save(update_fields=["thread_id"])
    assert Run.objects.get(pk=made.pk).thread_id == "again"


def test_insert_of_many_reads_back_each_automatic_key_in_order():
    run = queued_run()
    events = [sql.new(Event, run=run, version=run.version + n, kind=EventKind.STEP,
                      state=run.state, generation=0, data={"n": n}) for n in range(1, 4)]
    with transaction.atomic():
        sql.write(sql.Insert(tuple(events)))
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    for event in events:
        assert columns(event)["data"] == event.data
        assert columns(event)["version"] == event.version


def test_update_writes_the_named_columns_and_stamps_auto_now():
    run = sql.get(Run, queued_run().pk)
    before = columns(run)
    run.steps, run.agent_state, run.version = 4, {"cursor": [1, "ü"]}, run.version + 1
    run.stop_reason = "not written: not named"
    with transaction.atomic():
        sql.write(sql.Update(run, ("steps", "agent_state", "version", "updated_at")))
    after = columns(run)
    assert (after["steps"], after["agent_state"], after["version"]) == (
        4, {"cursor": [1, "ü"]}, before["version"] + 1)
    assert after["stop_reason"] is None
    assert after["updated_at"] > before["updated_at"]


def test_update_where_changes_only_the_matching_rows_and_counts_them():
    run, generation = running_run()
    other, _ = running_run()
    now = timezone.now()
    with transaction.atomic():
        sql.write(sql.UpdateWhere(Attempt, {"state": AttemptState.CLOSED,
                                            "close_reason": CloseReason.PAUSED,
                                            "closed_at": now},
                                  {"run": run.pk, "state": AttemptState.LIVE}))
    closed = Attempt.objects.get(run=run, generation=generation)
    assert (closed.state, closed.close_reason, closed.closed_at) == ("closed", "paused", now)
    assert Attempt.objects.get(run=other).state == "live"
    assert Attempt.objects.filter(run=run, state=AttemptState.LIVE).count() == 0


def test_lock_reads_the_row_the_orm_reads_or_none():
    run, _ = running_run(budget={"max_seconds": 2.5},
                         start_after=timezone.now() - timedelta(seconds=1))
    with transaction.atomic():
        locked = sql.lock(Run, run.pk)
        assert {f.attname: getattr(locked, f.attname) for f in Run._meta.concrete_fields} == \
            columns(run)
        assert locked.state == RunState.RUNNING
        assert sql.lock(Run, uuid.uuid4()) is None


def test_every_identifier_is_quoted():
    quote = sql.quoted
    assert quote('a"b') == '"a""b"'
    statement = sql._write_sql((("insert", Event, (0, 1)),
                                ("update", Run, ("state", "version"), ())))
    assert f"INSERT INTO {quote('runs_event')} (" in statement
    assert f"RETURNING {quote('seq')}" in statement
    assert (f"UPDATE {quote('runs_run')} SET {quote('state')} = %s, "
            f"{quote('version')} = %s WHERE {quote('id')} = %s") in statement
    select = sql._select_sql(Run, connection.vendor, "one", True)
    assert f"FROM {quote('runs_run')} WHERE {quote('id')} = %s" in select


def test_write_makes_every_part_and_reads_back_keys_as_the_single_statements_would():
    run, generation = running_run()
    child, ended = queued_run(parent_id=run.pk), queued_run(parent_id=run.pk)
    now = timezone.now()
    Run.objects.filter(pk=ended.pk).update(state=RunState.ENDED, end_cause="cancelled",
                                           ended_at=now)
    run.steps, run.version = run.steps + 1, run.version + 1
    events = (sql.new(Event, run=run, version=run.version, kind=EventKind.STEP,
                      state=run.state, generation=generation, data={"step": run.steps}),)
    with transaction.atomic():
        [keys] = sql.write(
            sql.UpdateWhere(Attempt, {"state": AttemptState.CLOSED,
                                      "close_reason": CloseReason.PAUSED, "closed_at": now},
                            {"run": run.pk, "state": AttemptState.LIVE}),
            sql.Update(run, ("steps", "version", "updated_at")),
            sql.Insert(events),
            sql.Keys(Run, {"parent": run.pk}, {"state": RunState.ENDED}))
    assert keys == [child.pk]
    assert columns(run)["steps"] == run.steps and columns(run)["version"] == run.version
    assert Attempt.objects.get(run=run, generation=generation).state == AttemptState.CLOSED
    assert events[0].seq is not None
    assert columns(events[0])["data"] == {"step": run.steps}


def test_write_of_inserts_that_refer_to_each_other_in_one_statement():
    now = timezone.now()
    runs = tuple(sql.new(Run, agent="demo.steps", input={"n": n}, dispatched_at=now,
                         version=1) for n in range(3))
    events = tuple(sql.new(Event, run=run, version=1, kind=EventKind.CREATED,
                           state=run.state, generation=0, data={"n": n})
                   for n, run in enumerate(runs))
    with transaction.atomic():
        assert sql.write(sql.Insert(runs), sql.Insert(events)) == []
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    for run, event in zip(runs, events, strict=True):
        assert Event.objects.get(seq=event.seq).run_id == run.pk
        assert columns(run)["input"] == run.input


def test_an_update_takes_the_key_of_the_new_row_it_names_from_the_insert_before_it():
    """A run's update naming its new control intent, in one statement on PostgreSQL: the
    run gets the key the insert made, in the database and on the instance, as two saves
    one after the other would give it."""
    run, _ = running_run()
    intent = sql.new(ControlIntent, run=run, action=ControlAction.CANCEL, reason="why",
                     requested_by="olga", source="api")
    run.control, run.version = intent, run.version + 1
    with transaction.atomic(), CaptureQueriesContext(connection) as written:
        sql.write(sql.Insert((intent,)), sql.Update(run, ("control", "version")))
    assert intent.pk is not None and run.control_id == intent.pk
    assert run.control is intent  # the instance set, not a row read again
    assert columns(run)["control_id"] == intent.pk
    assert ControlIntent.objects.get(pk=intent.pk).run_id == run.pk
    if connection.vendor == "postgresql":
        assert len([q for q in written.captured_queries if "runs_run" in q["sql"]]) == 1


def test_an_update_naming_a_new_row_that_the_write_does_not_make_is_refused():
    run, _ = running_run()
    before = columns(run)
    orphan = sql.new(ControlIntent, run=run, action=ControlAction.CANCEL,
                     requested_by="olga", source="api")
    run.control = orphan
    with pytest.raises(ValueError), transaction.atomic():
        sql.write(sql.Update(run, ("control",)))
    if connection.vendor == "postgresql":  # one statement: which of the keys made is it?
        two = sql.new(ControlIntent, run=run, action=ControlAction.STOP,
                      requested_by="olga", source="api")
        run.control = orphan
        with pytest.raises(ValueError), transaction.atomic():
            sql.write(sql.Insert((orphan, two)), sql.Update(run, ("control",)))
    assert columns(run) == before and not ControlIntent.objects.filter(run=run).exists()


AWKWARD = ['a,"b"}{', "NULL", "back\\slash", "", "ü\n"]  # hard for an array literal


def test_many_rows_are_written_as_the_orm_writes_each_whatever_their_number():
    now = timezone.now()
    for count in (2, 5):
        values = [{"agent": "demo.steps", "input": [{"n": n}, [None], "s", 1.5][n % 4],
                   "thread_id": AWKWARD[n % len(AWKWARD)], "max_tokens": [None, 2**40][n % 2],
                   "max_seconds": [2.5, None][n % 2], "dispatched_at": now, "version": 1}
                  for n in range(count)]
        made = tuple(sql.new(Run, **v) for v in values)
        by_orm = [Run.objects.create(**v) for v in values]
        with CaptureQueriesContext(connection) as queries, transaction.atomic():
            sql.write(sql.Insert(made))
        for mine, theirs in zip(made, by_orm, strict=True):
            mine, theirs = columns(mine), columns(theirs)
            for differs in ("id", "created_at", "updated_at"):
                mine.pop(differs), theirs.pop(differs)
            assert mine == theirs
        # The same fields of each row, each its own values: one part of the statement.
        for n, run in enumerate(made):
            run.steps, run.agent_state = n + 1, [{"at": AWKWARD[n % len(AWKWARD)]}, None][n % 2]
            run.version += 1
        with transaction.atomic():
            sql.write(*(sql.Update(run, ("steps", "agent_state", "version", "updated_at"))
                        for run in made))
        for n, run in enumerate(made):
            assert (columns(run)["steps"], columns(run)["agent_state"],
                    columns(run)["version"]) == (n + 1, run.agent_state, 2)
        if connection.vendor == "postgresql":
            [statement] = [q["sql"] for q in queries.captured_queries if "INSERT" in q["sql"]]
            assert "UNNEST" in statement


@pytest.mark.postgres
def test_a_write_of_many_rows_is_one_statement_whatever_their_number():
    """Its text is the same for 2 rows or 50, so the driver and the server parse it once;
    and it has one parameter per column, not one per value."""
    sent = []

    def wrapper(execute, statement, params, many, context):
        if statement.startswith("WITH "):
            sent.append((statement, len(params)))
        return execute(statement, params, many, context)

    now = timezone.now()
    for count in (2, 50):
        runs = tuple(sql.new(Run, agent="demo.steps", input={"n": n}, dispatched_at=now,
                             version=1) for n in range(count))
        events = tuple(sql.new(Event, run=run, version=1, kind=EventKind.CREATED,
                               state=run.state, generation=0) for run in runs)
        with connection.execute_wrapper(wrapper), transaction.atomic():
            sql.write(sql.Insert(runs), sql.Insert(events))
            for run in runs:
                run.version = 2
            sql.write(*(sql.Update(run, ("version", "updated_at")) for run in runs))
    (insert_2, insert_params), (update_2, update_params), (insert_50, _), (update_50, _) = sent
    assert insert_2 == insert_50 and update_2 == update_50
    assert insert_params == len(sql._inserted_fields(Run)) + len(sql._inserted_fields(Event))
    assert update_params == 3  # version, updated_at and the keys
    assert Run.objects.filter(version=2).count() == 52


def test_lock_many_at_reads_the_database_clock_with_the_rows():
    run = queued_run()
    with transaction.atomic():
        rows, clock = sql.lock_many_at(Run, [run.pk])
        assert [r.pk for r in rows] == [run.pk]
        if connection.vendor == "postgresql":
            assert abs((clock - timezone.now()).total_seconds()) < 60
        else:
            assert clock is None
        assert sql.lock_many_at(Run, [uuid.uuid4()]) == ([], None)


def test_lock_many_asking_reads_the_answer_the_orm_reads_with_the_rows():
    run, other = queued_run(), queued_run()
    WorkerProcess.objects.create(owner="node-a:1", reported_at=timezone.now(), draining=True)
    WorkerProcess.objects.create(owner="node-b:2", reported_at=timezone.now())
    for owner in ("node-a:1", "node-b:2", "node-c:3"):
        asked = {"owner": owner, "draining": True}
        with transaction.atomic():
            rows, clock, answer = sql.lock_many_asking(Run, sorted([run.pk, other.pk]),
                                                       sql.Exists(WorkerProcess, asked))
            assert answer is WorkerProcess.objects.filter(**asked).exists()
            assert [r.pk for r in rows] == sorted([run.pk, other.pk])
            assert [columns(r) for r in rows] == [
                {f.attname: getattr(r, f.attname) for f in Run._meta.concrete_fields}
                for r in rows]
            assert not hasattr(rows[0], "answer") and not hasattr(rows[0], "database_clock")
            assert (clock is not None) == (connection.vendor == "postgresql")
            # No row locked: nothing to answer for.
            assert sql.lock_many_asking(Run, [uuid.uuid4()], sql.Exists(
                WorkerProcess, asked)) == ([], None, None)


@pytest.mark.postgres
def test_lock_many_asking_is_one_statement_that_locks_the_runs_only():
    run = queued_run()
    WorkerProcess.objects.create(owner="node-a:1", reported_at=timezone.now(), draining=True)
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        sql.lock_many_asking(Run, [run.pk], sql.Exists(WorkerProcess, {"owner": "node-a:1"}))
    [statement] = [q["sql"] for q in queries.captured_queries]
    assert statement.endswith(f"FOR NO KEY UPDATE OF {sql.quoted('runs_run')}")
    assert f"EXISTS (SELECT 1 FROM {sql.quoted('runs_workerprocess')} WHERE" in statement


def test_write_reads_exists_parts_as_the_orm_does_after_its_writes():
    run, generation = running_run()
    run.steps, run.version = run.steps + 1, run.version + 1
    endpoint = WebhookEndpoint.objects.create(url="https://hooks.example.com/a",
                                              events=["run.ended"], secret="s", active=False,
                                              created_by=make_user("olga", "operator"))
    with transaction.atomic():
        assert sql.write(sql.Update(run, ("steps", "version", "updated_at")),
                         sql.Exists(WebhookEndpoint, {"active": True}),
                         sql.Keys(Run, {"id": run.pk}, {}),
                         sql.Exists(WebhookEndpoint, {"active": False})) == \
            [False, [run.pk], True]
    assert columns(run)["steps"] == run.steps
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(active=True)
    with transaction.atomic():
        assert sql.write(sql.Exists(WebhookEndpoint, {"active": True})) == \
            [WebhookEndpoint.objects.filter(active=True).exists()] == [True]
    with pytest.raises(ValueError, match="come after"):
        sql.write(sql.Exists(WebhookEndpoint, {"active": True}),
                  sql.Update(run, ("steps",)))


def test_the_statement_of_write_quotes_every_identifier():
    quote = sql.quoted
    statement = sql._write_sql((("update", Run, ("state",), ()),
                                ("keys", Run, ("parent",), ("state",))))
    assert f"UPDATE {quote('runs_run')} SET {quote('state')} = %s" in statement
    assert (f"SELECT {quote('id')} FROM {quote('runs_run')} WHERE {quote('parent_id')} = %s "
            f"AND {quote('state')} <> %s") in statement


def _outcome(prepare, value):
    """What preparing ``value`` gives, comparable: the type and the value (a JSON wrapper's
    object), or the exception's type."""
    try:
        prepared = prepare(value)
    except Exception as error:  # noqa: BLE001 - the same failure is the same outcome
        return ("raised", type(error))
    return (type(prepared), getattr(prepared, "obj", prepared))


@pytest.mark.postgres
def test_write_prepares_every_value_as_the_field_itself_prepares_it():
    now = timezone.now()
    values = [None, "", "text", "7", gettext_lazy("lazy"), 0, 7, 2**40, True, False, 2.5,
              now, now.astimezone(ZoneInfo("Asia/Kolkata")), now.replace(tzinfo=None),
              now.date(), uuid.uuid4(), str(uuid.uuid4()), {"a": [1, "ü"]}, [1, 2]]
    checked = 0
    for model in apps.get_app_config("runs").get_models():
        for field in model._meta.concrete_fields:
            prepare = sql._preparer(field)
            for value in values:
                with pytest.warns(RuntimeWarning) if _naive_for(field, value) else nullcontext():
                    mine = _outcome(partial(prepare, db=connection), value)
                with pytest.warns(RuntimeWarning) if _naive_for(field, value) else nullcontext():
                    theirs = _outcome(partial(field.get_db_prep_save, connection=connection),
                                      value)
                assert mine == theirs, (model.__name__, field.name, value)
                checked += 1
    assert checked > 1000


def _naive_for(field, value) -> bool:
    """Whether preparing ``value`` for ``field`` warns of a naive datetime (or a date)."""
    target = field.target_field if field.is_relation else field
    return (isinstance(target, models.DateTimeField) and isinstance(value, date)
            and (not isinstance(value, datetime) or timezone.is_naive(value)))


def test_write_reads_a_field_as_its_pre_save_does_unless_it_stamps_it():
    run = queued_run()
    for model, instance in ((Run, run), (Event, Event.objects.filter(run=run).first())):
        for field in model._meta.concrete_fields:
            for add in (True, False):
                stamps = getattr(field, "auto_now", False) or (
                    add and getattr(field, "auto_now_add", False))
                assert sql._reads_attribute(field, add) is not stamps, (field.name, add)
                if not stamps:
                    assert field.pre_save(instance, add) is getattr(instance, field.attname)


def test_a_new_row_takes_each_value_and_default_as_the_constructor_does():
    run = queued_run()
    other = queued_run()
    shapes = [
        (Event, {"run": run, "version": 2, "kind": EventKind.STEP, "state": run.state,
                 "generation": 0, "data": {"n": 1}}),
        (Event, {"run_id": run.pk, "version": 2, "kind": EventKind.STEP, "state": run.state}),
        (Attempt, {"run": run, "generation": 1, "owner": "w:1"}),
        (Run, {"agent": "demo.steps", "input": {}, "parent": other, "version": 1}),
        (Run, {"agent": "demo.steps", "parent": None, "rerun_of_id": other.pk}),
    ]
    for model, values in shapes:
        mine, theirs = sql.new(model, **values), model(**values)
        for field in model._meta.concrete_fields:
            a, b = getattr(mine, field.attname), getattr(theirs, field.attname)
            if callable(field.default) and field.attname not in values and (
                    field.name not in values):
                assert type(a) is type(b), (model.__name__, field.name)  # made per row
            else:
                assert a == b and type(a) is type(b), (model.__name__, field.name, a, b)
    with pytest.raises(ValueError):  # a related row of another model is refused as before
        sql.new(Event, run=Attempt(run=run), version=2, kind=EventKind.STEP)
    with pytest.raises(TypeError):  # and what is no field
        sql.new(Event, run=run, nothing=1)


@pytest.mark.postgres
def test_gathered_holds_the_writes_to_its_end_and_refuses_a_row_inserted_then_updated():
    run = queued_run()
    event = sql.new(Event, run=run, version=run.version + 1, kind=EventKind.STEP,
                    state=run.state, generation=0, data={"n": 1})
    answered = []
    with transaction.atomic():
        with sql.gathered():
            assert sql.write(sql.Insert((event,))) is None  # held: nothing written yet
            assert not Event.objects.filter(run=run, kind=EventKind.STEP).exists()
            run.version += 1
            sql.write(sql.Update(run, ("version", "updated_at")),
                      sql.Keys(Run, {"id": run.pk}, {}), then=answered.append)
            assert answered == [] and columns(run)["version"] == run.version - 1
            with pytest.raises(ValueError, match="then"):  # a read needs somewhere to go
                sql.write(sql.Exists(WebhookEndpoint, {"active": True}))
        assert answered == [[[run.pk]]]
    assert columns(run)["version"] == run.version and columns(event)["data"] == {"n": 1}

    made = sql.new(Run, agent="demo.steps", input={}, dispatched_at=timezone.now(), version=1)
    with pytest.raises(ValueError, match="inserted is updated"), transaction.atomic():
        with sql.gathered():
            sql.write(sql.Insert((made,)))
            sql.write(sql.Update(made, ("version", "updated_at")))
    assert not Run.objects.filter(pk=made.pk).exists()


@pytest.mark.postgres
def test_gathered_drops_what_it_holds_when_its_block_fails():
    run = queued_run()
    run.version += 1
    answered = []
    with pytest.raises(RuntimeError), transaction.atomic():
        with sql.gathered():
            sql.write(sql.Update(run, ("version", "updated_at")),
                      sql.Keys(Run, {"id": run.pk}, {}), then=answered.append)
            raise RuntimeError
    assert answered == [] and columns(run)["version"] == run.version - 1
    with transaction.atomic():  # the block is closed: the next write is made at once
        assert sql.write(sql.Keys(Run, {"id": run.pk}, {})) == [[run.pk]]


@pytest.mark.postgres
def test_gathered_writes_of_one_shape_are_one_part_and_each_gets_its_own_answers():
    parents = [running_run() for _ in range(3)]
    children = {run.pk: [queued_run(parent_id=run.pk).pk for _ in range(n)]
                for n, (run, _) in enumerate(parents)}
    WebhookEndpoint.objects.create(url="https://hooks.example.com/a", events=["run.ended"],
                                   secret="s", active=True,
                                   created_by=make_user("olga", "operator"))
    now = timezone.now()
    answered = []
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        with sql.gathered():
            for run, generation in parents:
                run.steps += 1
                sql.write(sql.UpdateWhere(Attempt, {"state": AttemptState.CLOSED,
                                                    "close_reason": CloseReason.COMPLETED,
                                                    "closed_at": now},
                                          {"run": run.pk, "generation": generation,
                                           "state": AttemptState.LIVE}),
                          sql.Update(run, ("steps",)),
                          sql.Keys(Run, {"parent": run.pk}, {"state": RunState.ENDED}),
                          sql.Exists(WebhookEndpoint, {"active": True}),
                          then=answered.append)
    [statement] = [q["sql"] for q in queries.captured_queries]
    # The attempts, the runs, their children and whether an endpoint is active: 4 parts.
    assert "part3 AS" in statement and "part4" not in statement
    assert statement.count("UPDATE") == 2 and statement.count("LIMIT 1") == 1
    assert answered == [[sorted(children[run.pk]), True] for run, _ in parents]
    for run, generation in parents:
        assert columns(run)["steps"] == run.steps
        attempt = Attempt.objects.get(run=run, generation=generation)
        assert (attempt.state, attempt.close_reason, attempt.closed_at) == (
            AttemptState.CLOSED, CloseReason.COMPLETED, now)


@pytest.mark.postgres
def test_the_statement_of_gathered_writes_is_the_same_for_two_rows_or_fifty():
    def statement(n):
        parts = []
        for _ in range(n):
            key = uuid.uuid4()
            parts += [sql.UpdateWhere(Attempt, {"state": "closed"},
                                      {"run": key, "generation": 1}),
                      sql.Keys(Run, {"parent": key}, {"state": RunState.ENDED})]
        sent = []

        def kept(execute, text, params, many, context):
            sent.append(text)
            return execute(text, params, many, context)

        with transaction.atomic(), connection.execute_wrapper(kept), sql.gathered():
            for write, read in zip(parts[::2], parts[1::2], strict=True):
                sql.write(write, read, then=lambda answers: None)
        [made] = sent
        return made

    assert statement(2) == statement(50) != statement(1)
