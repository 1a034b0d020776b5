"""The hand-written statements of runs/domain/sql.py write and read what the ORM would."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from runs.domain import sql
from runs.models import Attempt, AttemptState, CloseReason, Event, EventKind, Run, RunState
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
    sql.insert(made_here)
    assert made_here._state.adding is False
    mine, theirs = columns(made_here), columns(made_by_orm)
    for differs in ("id", "created_at", "updated_at"):  # new per row, or stamped at save
        mine.pop(differs), theirs.pop(differs)
    assert mine == theirs


def test_insert_of_many_reads_back_each_automatic_key_in_order():
    run = queued_run()
    events = [Event(run=run, version=run.version + n, kind=EventKind.STEP, state=run.state,
                    generation=0, data={"n": n}) for n in range(1, 4)]
    sql.insert(*events)
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    for event in events:
        assert columns(event)["data"] == event.data
        assert columns(event)["version"] == event.version


def test_update_writes_the_named_columns_and_stamps_auto_now():
    run = queued_run()
    before = columns(run)
    run.steps, run.agent_state, run.version = 4, {"cursor": [1, "ü"]}, run.version + 1
    run.stop_reason = "not written: not named"
    sql.update(run, ("steps", "agent_state", "version", "updated_at"))
    after = columns(run)
    assert (after["steps"], after["agent_state"], after["version"]) == (
        4, {"cursor": [1, "ü"]}, before["version"] + 1)
    assert after["stop_reason"] is None
    assert after["updated_at"] > before["updated_at"]


def test_update_where_changes_only_the_matching_rows_and_counts_them():
    run, generation = running_run()
    other, _ = running_run()
    now = timezone.now()
    changed = sql.update_where(Attempt, {"state": AttemptState.CLOSED,
                                         "close_reason": CloseReason.PAUSED, "closed_at": now},
                               run=run.pk, state=AttemptState.LIVE)
    assert changed == 1
    closed = Attempt.objects.get(run=run, generation=generation)
    assert (closed.state, closed.close_reason, closed.closed_at) == ("closed", "paused", now)
    assert Attempt.objects.get(run=other).state == "live"
    assert sql.update_where(Attempt, {"closed_at": now}, run=run.pk,
                            state=AttemptState.LIVE) == 0


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
    quote = connection.ops.quote_name
    insert, _, _ = sql._insert_sql(Event, connection.vendor)
    update, _ = sql._update_sql(Run, ("state", "version"), ("id",), connection.vendor)
    assert insert.startswith(f"INSERT INTO {quote('runs_event')} (")
    assert f"RETURNING {quote('seq')}" in insert
    assert update == (f"UPDATE {quote('runs_run')} SET {quote('state')} = %s, "
                      f"{quote('version')} = %s WHERE {quote('id')} = %s")
    reader = sql._reader(Run)
    assert f"FROM {quote('runs_run')} WHERE {quote('id')} = %s" in reader.sql
