"""What awaken_site/django_postgresql.py relies on in Django's PostgreSQL backend, checked on
every upgrade, and what it gives: every ``timestamptz`` read as Django's own loader reads
it, by the driver's loader, with no loader of Django's made on any cursor."""

import datetime

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import BaseTzLoader
from psycopg import pq
from psycopg.types.datetime import TimestamptzLoader

from awaken_site.django_postgresql import (
    DRIVERS_LOADER,
    TIMESTAMPTZ,
    UtcTimestamptzLoader,
)

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

TEXTS = [
    "2026-12-07 19:28:35.123456+00", "2026-12-07 21:28:35.5+02", "2026-03-29 01:30:00-07:30",
    "1999-12-31 23:59:59.999999+14", "0001-01-01 00:00:00+00", "9999-12-31 23:59:59+00",
    "2024-02-29 12:00:00+05:45:30",
]


def loader_of(adapters):
    return adapters.get_loader(TIMESTAMPTZ, pq.Format.TEXT)


def test_djangos_own_loader_is_the_pure_python_one_and_carries_its_zone():
    # If this fails, Django reads timestamptz otherwise: the module may no longer be needed.
    assert issubclass(BaseTzLoader, TimestamptzLoader)
    assert BaseTzLoader.load is not TimestamptzLoader.load  # it replaces the zone itself
    assert "timezone" in vars(BaseTzLoader)


def test_the_connection_reads_timestamptz_with_the_drivers_loader():
    connection.ensure_connection()
    assert loader_of(connection.connection.adapters) is UtcTimestamptzLoader
    assert connection.timezone is datetime.UTC
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
        # Django's create_cursor compared the loader's zone with its own and made no
        # loader of its own for the cursor: the cursor uses the connection's.
        assert loader_of(cursor.cursor.adapters) is UtcTimestamptzLoader
    assert now.tzinfo is datetime.UTC


def test_a_loader_without_the_zone_djangos_cursor_looks_for_is_replaced_on_the_cursor():
    """The other side of the comparison: a loader whose zone differs from Django's gets a
    loader of Django's on each cursor, so the attribute is what keeps ours in use."""

    class Elsewhere(UtcTimestamptzLoader):
        timezone = datetime.timezone(datetime.timedelta(hours=3))

    connection.ensure_connection()
    adapters = connection.connection.adapters
    adapters.register_loader(TIMESTAMPTZ, Elsewhere)
    try:
        with connection.cursor() as cursor:
            assert issubclass(loader_of(cursor.cursor.adapters), BaseTzLoader)
    finally:
        adapters.register_loader(TIMESTAMPTZ, UtcTimestamptzLoader)


def test_every_value_is_read_as_djangos_own_loader_reads_it():
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT unnest(%s::timestamptz[])::text", [TEXTS])
        texts = [text for (text,) in cursor.fetchall()]  # as the session gives them back
        cursor.execute("SELECT unnest(%s::timestamptz[])", [TEXTS])
        ours = [value for (value,) in cursor.fetchall()]
        djangos = type("DjangosLoader", (BaseTzLoader,), {"timezone": datetime.UTC})
        theirs = [djangos(TIMESTAMPTZ, cursor.cursor).load(text.encode()) for text in texts]
    assert ours == theirs
    assert [value.tzinfo for value in ours] == [datetime.UTC] * len(TEXTS)
    assert [value.isoformat() for value in ours] == [value.isoformat() for value in theirs]
    assert DRIVERS_LOADER is not TimestamptzLoader  # the compiled loader is installed
