"""The statements every transition runs, written once as SQL.

A transition locks its run (``lock``; ``lock_many`` for the runs a worker claims together),
updates some of its columns (``update``), inserts its events, new runs or attempts
(``insert``) and closes an attempt (``update_where``). ``write`` sends several of these
writes as one statement on PostgreSQL (each a data-modifying ``WITH`` part), so that a
transition costs one round trip for all its writes, not one for each; elsewhere it runs
them one after the other. Nothing else is written here: cold
paths (tickets, intents, reads for pages) use the ORM. Through the query compiler each of
these statements cost about three times the CPU of the statement itself, which was most of
a worker's time per run (``manage.py bench sql`` measures both ways). The SQL is built once
per model, set of columns and database vendor from the models' own field definitions,
identifiers quoted; values go through the fields' own preparation and conversion, so the
rows read and written are exactly what the ORM would read and write, on PostgreSQL and
SQLite alike (tests/test_sql.py holds each statement to the ORM's result).
"""

import weakref
from dataclasses import dataclass
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connection, connections


def lock(model, pk):
    """The row of ``model`` with primary key ``pk``, locked until the transaction ends;
    None if there is none.

    On PostgreSQL the lock is ``FOR NO KEY UPDATE``: it serializes the transitions of the
    row, as ``FOR UPDATE`` would, but not the inserts of rows that refer to it (a child's
    intent naming its parent, say), whose foreign key check only needs the key to stay.
    A transition never changes a primary key."""
    reader = _reader(model)
    with connection.cursor() as cursor:
        cursor.execute(reader.sql, [model._meta.pk.get_db_prep_value(pk, connection)])
        row = cursor.fetchone()
    return None if row is None else reader.instance(row)


def lock_many(model, pks: list) -> list:
    """The rows of ``model`` among primary keys ``pks``, locked in primary key order."""
    return lock_many_at(model, pks)[0]


def lock_many_at(model, pks: list) -> tuple[list, object]:
    """``lock_many``, and the database's clock (``statement_timestamp()``) read by the same
    statement on PostgreSQL (None when no row is locked, or on another database)."""
    if not pks:
        return [], None
    reader = _reader(model)
    marks = ", ".join(["%s"] * len(pks))
    prepare = model._meta.pk.get_db_prep_value
    with connection.cursor() as cursor:
        cursor.execute(reader.sql_many_at.format(marks=marks),
                       [prepare(pk, connection) for pk in pks])
        rows = cursor.fetchall()
    if reader.clock:
        return [reader.instance(row[:-1]) for row in rows], rows[0][-1] if rows else None
    return [reader.instance(row) for row in rows], None


def insert(*instances) -> None:
    """Insert ``instances`` (all of one model) in one statement, defaults and
    ``auto_now_add`` applied as by ``save``; an automatic primary key is read back into
    each."""
    if not instances:
        return
    sql, fields, auto = _insert_sql(type(instances[0]), connection.vendor)
    row = f"({', '.join(['%s'] * len(fields))})"
    values = [f.get_db_prep_save(f.pre_save(instance, True), connection)
              for instance in instances for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql.format(rows=", ".join([row] * len(instances))), values)
        if auto is not None:
            # PostgreSQL and SQLite return the rows in the order of VALUES (bulk_create
            # relies on the same).
            for instance, (pk,) in zip(instances, cursor.fetchall(), strict=True):
                setattr(instance, auto.attname, pk)
    for instance in instances:
        instance._state.adding, instance._state.db = False, connection.alias


def update(instance, names: tuple[str, ...]) -> None:
    """Write the fields ``names`` of ``instance`` to its row (``auto_now`` applied)."""
    model = type(instance)
    sql, fields = _update_sql(model, tuple(names), (model._meta.pk.name,), connection.vendor)
    values = [f.get_db_prep_save(f.pre_save(instance, False), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, _value(model, model._meta.pk.name, instance.pk)])


def update_where(model, values: dict, **where) -> int:
    """``UPDATE model SET values WHERE`` each ``where`` field equals its value; row count."""
    sql, fields = _update_sql(model, tuple(values), tuple(where), connection.vendor)
    params = [f.get_db_prep_save(values[f.name], connection) for f in fields]
    params += [_value(model, name, value) for name, value in where.items()]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


# --- several writes, one statement ------------------------------------------------------------

@dataclass(frozen=True)
class Update:
    """``update(instance, names)`` as a part of ``write``."""
    instance: object
    names: tuple


@dataclass(frozen=True)
class UpdateWhere:
    """``update_where(model, values, **where)`` as a part of ``write``."""
    model: type
    values: dict
    where: dict


@dataclass(frozen=True)
class Insert:
    """``insert(*instances)`` as a part of ``write``."""
    instances: tuple


@dataclass(frozen=True)
class Keys:
    """The primary keys of the rows of ``model`` whose ``where`` columns equal the values
    given and whose ``unless`` columns do not, in primary key order: what ``write``
    returns. Read in the same statement as the writes, so it does not see them."""
    model: type
    where: dict
    unless: dict


def write(*parts) -> list:
    """Make the writes ``parts`` (``Update``, ``UpdateWhere``, ``Insert``), in one statement
    on PostgreSQL, one after the other elsewhere, and read the ``Keys`` part if there is one
    (it must be the last). Automatic primary keys of inserted rows are read back as by
    ``insert``. The parts must not write the same rows: in one statement, PostgreSQL makes
    them all against the same snapshot, in no set order."""
    keys = parts[-1] if parts and isinstance(parts[-1], Keys) else None
    writes = parts[:-1] if keys is not None else parts
    if connection.vendor != "postgresql":
        for part in writes:
            if isinstance(part, Update):
                update(part.instance, part.names)
            elif isinstance(part, UpdateWhere):
                update_where(part.model, part.values, **part.where)
            else:
                insert(*part.instances)
        if keys is None:
            return []
        rows = keys.model._default_manager.filter(**keys.where)
        for name, value in keys.unless.items():
            rows = rows.exclude(**{name: value})
        return list(rows.order_by("pk").values_list("pk", flat=True))

    shape, params = [], []
    for part in parts:
        if isinstance(part, Update):
            model = type(part.instance)
            shape.append(("update", model, tuple(part.names)))
            _, fields = _update_sql(model, tuple(part.names), (model._meta.pk.name,),
                                    connection.vendor)
            params += [f.get_db_prep_save(f.pre_save(part.instance, False), connection)
                       for f in fields]
            params.append(_value(model, model._meta.pk.name, part.instance.pk))
        elif isinstance(part, UpdateWhere):
            shape.append(("update_where", part.model, tuple(part.values), tuple(part.where)))
            _, fields = _update_sql(part.model, tuple(part.values), tuple(part.where),
                                    connection.vendor)
            params += [f.get_db_prep_save(part.values[f.name], connection) for f in fields]
            params += [_value(part.model, name, value) for name, value in part.where.items()]
        elif isinstance(part, Insert):
            model = type(part.instances[0])
            shape.append(("insert", model, len(part.instances)))
            _, fields, _ = _insert_sql(model, connection.vendor)
            params += [f.get_db_prep_save(f.pre_save(instance, True), connection)
                       for instance in part.instances for f in fields]
        else:
            shape.append(("keys", part.model, tuple(part.where), tuple(part.unless)))
            params += [_value(part.model, name, value) for name, value in part.where.items()]
            params += [_value(part.model, name, value) for name, value in part.unless.items()]
    with connection.cursor() as cursor:
        cursor.execute(_write_sql(tuple(shape)), params)
        returned = cursor.fetchall()
    by_part: dict[int, list] = {}
    for index, key in returned:
        by_part.setdefault(index, []).append(key)
    for index, part in enumerate(writes):
        if isinstance(part, Insert):
            auto = _insert_sql(type(part.instances[0]), connection.vendor)[2]
            if auto is not None:
                for instance, key in zip(part.instances, by_part[index], strict=True):
                    setattr(instance, auto.attname, auto.to_python(key))
            for instance in part.instances:
                instance._state.adding, instance._state.db = False, connection.alias
    if keys is None:
        return []
    pk = keys.model._meta.pk
    return sorted(pk.to_python(key) for key in by_part.get(len(parts) - 1, []))


@cache
def _write_sql(shape: tuple) -> str:
    """The one statement of ``write`` for parts of this ``shape`` (PostgreSQL): each part a
    ``WITH`` query; the keys that inserts read back and the ``Keys`` part, as
    ``(part index, key as text)`` rows."""
    queries, outputs = [], []
    for index, (kind, model, *rest) in enumerate(shape):
        name = f"part{index}"
        pk = _quote(model._meta.pk.column)
        if kind == "update":
            query = _update_sql(model, rest[0], (model._meta.pk.name,), "postgresql")[0]
        elif kind == "update_where":
            query = _update_sql(model, rest[0], rest[1], "postgresql")[0]
        elif kind == "insert":
            text, fields, auto = _insert_sql(model, "postgresql")
            row = f"({', '.join(['%s'] * len(fields))})"
            query = text.format(rows=", ".join([row] * rest[0]))
            if auto is not None:
                outputs.append(f"SELECT {index}, {_quote(auto.column)}::text FROM {name}")
        else:
            where, unless = rest
            columns = {n: _quote(model._meta.get_field(n).column) for n in (*where, *unless)}
            condition = " AND ".join([*(f"{columns[n]} = %s" for n in where),
                                      *(f"{columns[n]} <> %s" for n in unless)])
            query = (f"SELECT {pk} FROM {_quote(model._meta.db_table)} WHERE {condition} "
                     f"ORDER BY {pk}")
            outputs.append(f"SELECT {index}, {pk}::text FROM {name}")
        queries.append(f"{name} AS ({query})")
    final = " UNION ALL ".join(outputs) or "SELECT 0, NULL::text WHERE false"
    return f"WITH {', '.join(queries)} {final}"


def _value(model, name, value):
    return model._meta.get_field(name).get_db_prep_value(value, connection)


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


@cache
def _insert_sql(model, vendor: str):
    auto = model._meta.pk if model._meta.pk.db_returning else None
    fields = [f for f in model._meta.concrete_fields if f is not auto]
    columns = ", ".join(_quote(f.column) for f in fields)
    returning = f" RETURNING {_quote(auto.column)}" if auto is not None else ""
    return (f"INSERT INTO {_quote(model._meta.db_table)} ({columns}) VALUES {{rows}}"
            f"{returning}", fields, auto)


@cache
def _update_sql(model, names: tuple[str, ...], where: tuple[str, ...], vendor: str):
    fields = [model._meta.get_field(name) for name in names]
    assignments = ", ".join(f"{_quote(f.column)} = %s" for f in fields)
    condition = " AND ".join(f"{_quote(model._meta.get_field(n).column)} = %s" for n in where)
    return (f"UPDATE {_quote(model._meta.db_table)} SET {assignments} WHERE {condition}",
            fields)


class _Reader:
    """Reads rows of one model on one connection: the SQL, and the converters the
    connection applies to each column (a UUID stored as text on SQLite, say)."""

    def __init__(self, model, db):
        self.model = model
        fields = model._meta.concrete_fields
        self.attnames = [f.attname for f in fields]
        lock = (" FOR NO KEY UPDATE" if db.vendor == "postgresql"
                else " FOR UPDATE" if db.features.has_select_for_update else "")
        quote = db.ops.quote_name
        select = (f"SELECT {', '.join(quote(f.column) for f in fields)} "
                  f"FROM {quote(model._meta.db_table)}")
        pk = quote(model._meta.pk.column)
        self.sql = f"{select} WHERE {pk} = %s{lock}"
        self.sql_many = f"{select} WHERE {pk} IN ({{marks}}) ORDER BY {pk}{lock}"
        self.clock = db.vendor == "postgresql"
        self.sql_many_at = (self.sql_many.replace(" FROM ", ", statement_timestamp() FROM ", 1)
                            if self.clock else self.sql_many)
        self.compiler = model.objects.none().query.get_compiler(connection=db)
        self.converters = self.compiler.get_converters(
            [f.get_col(model._meta.db_table) for f in fields])
        self.alias = db.alias

    def instance(self, row):
        if self.converters:
            row = next(self.compiler.apply_converters([row], self.converters))
        return self.model.from_db(self.alias, self.attnames, row)


# One reader per model per connection object (each thread has its own connection).
_readers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _reader(model) -> _Reader:
    db = connections[DEFAULT_DB_ALIAS]
    by_model = _readers.setdefault(db, {})
    if model not in by_model:
        by_model[model] = _Reader(model, db)
    return by_model[model]
