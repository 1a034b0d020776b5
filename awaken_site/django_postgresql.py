"""Where the site relies on how Django's PostgreSQL backend reads ``timestamptz`` columns.

Django registers, on every psycopg connection, a loader of its own for ``timestamptz``
(``BaseTzLoader`` in ``django.db.backends.postgresql.psycopg_any``): a Python subclass of
psycopg's pure-Python loader, which parses each value with a regular expression and then
replaces its zone with the connection's. psycopg's compiled loader, which its binary
package registers, is never used, and each query's result makes a Python loader of its
own: a read of one run over the API takes 3–5 % more instructions that way ("The
thirtieth round" in docs/performance.md).

Where Django's zone for the connection is UTC (the site's, whatever the server's), the
driver's own loader gives the same value: Django sets the session's ``TimeZone`` to its
zone as it connects, and psycopg's loaders give times in the session's zone, UTC as
``datetime.timezone.utc``. So each new connection's ``timestamptz`` goes to a loader that
calls the driver's (``UtcTimestamptzLoader``), registered with psycopg's public adapters
API. What is relied on beyond Django's documented API: Django's ``create_cursor`` compares
its zone with the ``timezone`` attribute of the connection's ``timestamptz`` loader, and
registers its own on the cursor where they differ, so the loader carries that attribute.
``tests/test_django_postgresql_contract.py`` holds both sides to it on every upgrade.
"""

import datetime

import psycopg
from psycopg import pq
from psycopg.adapt import Loader

TIMESTAMPTZ = psycopg.adapters.types["timestamptz"].oid
DRIVERS_LOADER = psycopg.adapters.get_loader(TIMESTAMPTZ, pq.Format.TEXT)  # compiled if installed


class UtcTimestamptzLoader(Loader):
    """``timestamptz`` as the driver's own loader reads it, on a connection in UTC."""

    timezone = datetime.UTC  # what Django's create_cursor compares with its zone

    def __init__(self, oid, context=None):
        super().__init__(oid, context)
        self._load = DRIVERS_LOADER(oid, context).load

    def load(self, data):
        return self._load(data)


def load_times_with_the_driver(sender, connection, **kwargs) -> None:
    """``connection_created``: on a PostgreSQL connection whose zone is UTC, read
    ``timestamptz`` with ``UtcTimestamptzLoader`` (once: a pooled connection keeps it)."""
    if connection.vendor != "postgresql" or connection.timezone is not datetime.UTC:
        return
    adapters = connection.connection.adapters
    if adapters.get_loader(TIMESTAMPTZ, pq.Format.TEXT) is not UtcTimestamptzLoader:
        adapters.register_loader(TIMESTAMPTZ, UtcTimestamptzLoader)
