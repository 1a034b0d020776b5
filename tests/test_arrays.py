"""Columns (runs/domain/arrays.py) reach PostgreSQL as arrays of their named type, every
value as it was given."""

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from psycopg.adapt import PyFormat
from psycopg.types.json import Jsonb

from runs.domain import sql
from runs.domain.arrays import Column, ColumnDumper, column_of
from runs.models import Event, EventKind, Run, RunState

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

AWKWARD = ['a,"b"', "back\\slash", "{braces}", "NULL", "", " spaced ", "ü ✓ 𝄞", "new\nline",
           None]


def sent(column: Column):
    """What PostgreSQL received: the parameter's type and its elements, each as text."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_typeof(%s)::text", [column])
        [(type_name,)] = cursor.fetchall()
        cursor.execute("SELECT value::text FROM UNNEST(%s) WITH ORDINALITY AS t(value, at) "
                       "ORDER BY at", [column])
        return type_name, [value for (value,) in cursor.fetchall()]


def test_a_column_is_an_array_of_its_type_whatever_its_elements():
    run_id = uuid.uuid4()
    assert sent(column_of("uuid")([run_id, None])) == ("uuid[]", [str(run_id), None])
    assert sent(column_of("integer")([1, -2, 2**31 - 1])) == (
        "integer[]", ["1", "-2", str(2**31 - 1)])
    assert sent(column_of("bigint")([2**40])) == ("bigint[]", [str(2**40)])
    assert sent(column_of("boolean")([True, False, None])) == ("boolean[]", ["true", "false", None])
    # A str subclass (a choice) beside a str: psycopg's own lists refuse no such mix, but
    # look at each element's class again every time.
    assert sent(column_of("varchar")(["running", RunState.ENDED])) == (
        "character varying[]", ["running", "ended"])


def test_text_comes_through_whole_however_awkward():
    assert sent(column_of("varchar")(AWKWARD)) == ("character varying[]", AWKWARD)
    assert sent(column_of("text")(AWKWARD)) == ("text[]", AWKWARD)


def test_times_and_json_keep_their_values():
    moments = [datetime(2026, 12, 3, 8, 15, 6, 890, tzinfo=UTC)]
    moments.append(moments[0] + timedelta(days=1))
    with connection.cursor() as cursor:
        cursor.execute("SELECT value FROM UNNEST(%s) AS t(value)",
                       [column_of("timestamp with time zone")(moments)])
        assert [value for (value,) in cursor.fetchall()] == moments
        data = {"quote": '"', "nested": [1, {"x": None}], "text": "ü\\"}
        cursor.execute("SELECT value FROM UNNEST(%s) AS t(value)",
                       [column_of("jsonb")([Jsonb(data), None])])
        # Django's connections leave jsonb as text, for the fields' from_db_value.
        assert [value and json.loads(value) for (value,) in cursor.fetchall()] == [data, None]


def test_an_empty_column_is_an_empty_array():
    assert sent(column_of("uuid")([])) == ("uuid[]", [])


def test_every_new_connection_dumps_a_column_so():
    """The dumper is registered on psycopg's global map, which every connection starts
    from: a connection made now, after the registration, chooses it by the class alone."""
    fresh = connection.get_new_connection(connection.get_connection_params())
    try:
        assert fresh.adapters.get_dumper(column_of("uuid"), PyFormat.AUTO) is ColumnDumper
        run_id = uuid.uuid4()
        with fresh.cursor() as cursor:
            cursor.execute("SELECT pg_typeof(%s)::text, (%s)[1]",
                           [column_of("uuid")([run_id])] * 2)
            assert cursor.fetchone() == ("uuid[]", run_id)
    finally:
        fresh.close()


def test_an_insert_of_many_rows_sends_columns_and_writes_what_was_given():
    """``sql.write``'s arrays are Columns, of each field's column type, and the rows it
    writes hold the values, awkward text included."""
    runs = [sql.new(Run, agent="demo.steps", input={"text": text}, thread_id=text,
                    request_fingerprint="f") for text in AWKWARD[:-1]]
    sent_params = []

    def capture(execute, text, params, many, context):
        sent_params.extend(params)
        return execute(text, params, many, context)

    with connection.execute_wrapper(capture):
        sql.write(sql.Insert(tuple(runs)))
    arrays = [param for param in sent_params if isinstance(param, list)]
    assert arrays and all(isinstance(param, Column) for param in arrays)
    assert sorted(Run.objects.filter(pk__in=[r.pk for r in runs])
                  .values_list("thread_id", flat=True)) == sorted(AWKWARD[:-1])
    events = [sql.new(Event, run=run, version=1, kind=EventKind.CREATED, state=run.state,
                      generation=0, source="api", data={"text": run.thread_id})
              for run in runs]
    sql.write(sql.Insert(tuple(events)))
    assert sorted(Event.objects.filter(run__in=runs).values_list("data__text", flat=True)) == \
        sorted(AWKWARD[:-1])
