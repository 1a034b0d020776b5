"""Columns of values sent to PostgreSQL as arrays of a type named in advance.

``sql.write`` sends the rows of one model written alike as one array per column (the
columns of an ``UNNEST``). psycopg works out the type of a plain list from its elements
each time it is sent: it looks at every element, and again at each one of another class
(a choice is a ``str`` subclass), because the dumpers it chooses are kept by the cursor,
and Django opens a cursor for each statement. A ``Column`` names its PostgreSQL type, so
its dumper, ``ColumnDumper``, is chosen once per cursor by its class alone, and writes
the array in PostgreSQL's binary form with psycopg's own binary dumper of that type for
each element. Through psycopg's public adaptation API only (``psycopg.adapt.Dumper``,
``AdaptersMap.register_dumper``, ``get_dumper_by_oid`` and ``types``).
"""

import struct
from functools import cache

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

# A one-dimensional array in PostgreSQL's binary form (array_recv): the number of
# dimensions, whether any element is NULL, the elements' type, then the length and lower
# bound of the one dimension, then each element as its length and its bytes (-1: NULL).
_HEAD = struct.Struct("!iiIii")
_EMPTY = struct.Struct("!iiI")
_LENGTH = struct.Struct("!i").pack
_NULL = _LENGTH(-1)


class Column(list):
    """The values of one column, of the PostgreSQL type ``type_name`` (as
    ``psycopg``'s registry of types names it: ``uuid``, ``integer``, ``varchar``, ``jsonb``,
    ``timestamp with time zone``...), sent as an array of that type."""

    type_name = ""


@cache
def column_of(type_name: str) -> type[Column]:
    """The ``Column`` class of the values of ``type_name``."""
    return type(f"Column[{type_name}]", (Column,), {"type_name": type_name})


class ColumnDumper(Dumper):
    """A ``Column`` as a binary array of its type; made once per cursor and class."""

    format = Format.BINARY

    def __init__(self, cls, context=None):
        super().__init__(cls, context)
        adapters = context.adapters if context is not None else psycopg.adapters
        info = adapters.types[cls.type_name]
        self.oid = info.array_oid
        self.element_oid = info.oid
        self.element = adapters.get_dumper_by_oid(info.oid, Format.BINARY)(object, context)

    def dump(self, column):
        if not column:
            return _EMPTY.pack(0, 0, self.element_oid)
        dump, parts, nulls = self.element.dump, [], 0
        for value in column:
            data = None if value is None else dump(value)
            if data is None:
                parts.append(_NULL)
                nulls = 1
            else:
                parts.append(_LENGTH(len(data)))
                parts.append(data)
        return _HEAD.pack(1, nulls, self.element_oid, len(column), 1) + b"".join(parts)


# Django makes its connections' adapters from a copy of psycopg's global map, taken at the
# first connection. ``runs.domain.sql`` imports this module, and the app's ``ready`` imports
# the domain, so the dumper is in the global map before any connection is made
# (tests/test_arrays.py holds a new connection to choosing it).
psycopg.adapters.register_dumper(Column, ColumnDumper)
