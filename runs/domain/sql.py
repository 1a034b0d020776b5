"""The statements the transitions and the control path's reads send written by hand, through
Django's public API only.

Every transition is written in the domain, and almost every statement through the ORM.
These are not, because ``manage.py bench sql`` shows each of them paying for itself on
the path of every cancel and every lifecycle (the ORM builds and compiles a queryset for
each call, which costs several times the CPU of the statement):

* ``lock``, ``lock_many_at`` and ``lock_many_asking``: a run's row lock (``FOR NO KEY
  UPDATE`` on PostgreSQL), read by ``rows``; ``get`` reads one row the same way, without a lock, and
  ``exists`` asks whether a row matches (through ``connection.cursor()``).
* ``write``: the writes of one transition (``Update``, ``UpdateWhere``, ``Insert``, and
  the ``Keys`` and ``Exists`` it reads), as one statement on PostgreSQL (each a
  data-modifying ``WITH`` part) through ``connection.cursor()``. Elsewhere the same writes
  go through the ORM one after the other (``save(update_fields=)``, ``QuerySet.update``,
  ``bulk_create``). Rows of one model written alike (a batch's runs and events, a claim's
  runs) are one part whose values come as one array per column (``UNNEST``, as Django's
  own ``bulk_create`` inserts on PostgreSQL): the statement is the same for 2 rows or 50,
  so the driver and the server each parse it once, and it has a parameter per column
  rather than per value. Each array is a ``runs.domain.arrays.Column`` of its column's
  type, which the driver sends without looking at its elements to learn it.
  ``gathered`` makes the writes of a block one statement (a run's last step and its
  end; the ends a worker gathers).

The SQL is plain text built once per model and shape from the models' ``_meta``, every
identifier quoted. Values go through the fields' own ``pre_save``, ``get_db_prep_save``
and ``get_db_prep_value``, except the steps known once per model and shape to give a value
back as it is (``_saving``: an attribute read, a str of a text field, an aware datetime);
rows come back as model instances through ``Model.from_db``
(``rows``: the fields' ``from_db_value`` on PostgreSQL, ``QuerySet.raw`` elsewhere),
converted as the ORM converts them. tests/test_sql.py holds each statement to the ORM's result.
"""

import datetime
import threading
import uuid
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connection, connections, models, router

from runs.domain.arrays import column_of


def quoted(name: str) -> str:
    """``name`` as an SQL identifier, in the standard's double quotes (PostgreSQL and
    SQLite both read them so)."""
    return '"' + name.replace('"', '""') + '"'


def new(model, **values):
    """A new row of ``model`` made as its constructor makes it (defaults applied), in the
    state the ORM leaves an instance in once it is saved (``Model.from_db``): the row is
    written by ``write``'s ``Insert`` in the same transaction. Related objects given in
    ``values`` stay cached on it (set through the field's descriptor, which checks them).
    Values given by fields' names are taken as the constructor takes them, without making
    an instance first; anything else is given to the constructor."""
    names, fields, known = _making(model)
    if known.issuperset(values) and not any(
            f.attname in values and f.name in values for f in fields if f.is_relation):
        columns = [_initial(f, values) for f in fields]
    else:  # anything else the constructor takes (or refuses)
        made = model(**values)
        columns = [getattr(made, n) for n in names]
    row = model.from_db(router.db_for_write(model), names, columns)
    for name, value in values.items():
        field = model._meta.get_field(name)
        if field.is_relation and name == field.name:
            setattr(row, name, value)
    return row


@cache
def _making(model) -> tuple[list, list, frozenset]:
    """The attribute names of ``model``'s concrete fields, the fields, and the names a value
    may be given by: each field's name and its attribute name (``run`` and ``run_id``)."""
    fields = list(model._meta.concrete_fields)
    return ([f.attname for f in fields], fields,
            frozenset(n for f in fields for n in (f.name, f.attname)))


def _initial(field, values: dict):
    """The value the constructor gives ``field`` from ``values``: the value given by its
    attribute name, or the key of the related row given by its name, or its default."""
    if field.attname in values:
        return values[field.attname]
    if field.name in values:  # a related row (its key is read as the descriptor reads it)
        related = values[field.name]
        return None if related is None else getattr(related, field.target_field.attname)
    return field.get_default()


# --- reads ------------------------------------------------------------------------------------

def lock(model, pk):
    """The row of ``model`` with primary key ``pk``, locked until the transaction ends;
    None if there is none.

    On PostgreSQL the lock is ``FOR NO KEY UPDATE``: it serializes the transitions of the
    row, as ``FOR UPDATE`` would, but not the inserts of rows that refer to it (a child's
    intent naming its parent, say), whose foreign key check only needs the key to stay.
    A transition never changes a primary key. (SQLite has one writer at a time.)"""
    found = rows(model, _select_sql(model, connection.vendor, "one", True),
                 [_prepared(model, model._meta.pk.name, pk)])
    return found[0] if found else None


def get(model, pk):
    """The row of ``model`` with primary key ``pk``, or None; not locked."""
    found = rows(model, _select_sql(model, connection.vendor, "one", False),
                 [_prepared(model, model._meta.pk.name, pk)])
    return found[0] if found else None


def lock_many_at(model, pks: list) -> tuple[list, object]:
    """The rows of ``model`` among primary keys ``pks``, locked in primary key order, and
    the database's clock (``statement_timestamp()``) read by the same statement on
    PostgreSQL (None when no row is locked, or on another database)."""
    found, clock, _ = _lock_many(model, pks, None)
    return found, clock


def lock_many_asking(model, pks: list, question: "Exists") -> tuple[list, object, bool | None]:
    """``lock_many_at``, and whether a row matches ``question``, read by the same
    statement (a column of each row: None when no row is locked)."""
    return _lock_many(model, pks, question)


def _lock_many(model, pks: list, question) -> tuple[list, object, bool | None]:
    if not pks:
        return [], None, None
    marks = ", ".join(["%s"] * len(pks))
    text = _select_sql(model, connection.vendor, "many", True,
                       _question_sql(question)).format(marks=marks)
    clocked = connection.vendor == "postgresql"
    extra = (*(("database_clock",) if clocked else ()),
             *(("answer",) if question is not None else ()))
    params = [] if question is None else _question_params(question)
    found = rows(model, text, [*params, *(_prepared(model, model._meta.pk.name, pk)
                                          for pk in pks)], extra=extra)
    if not found:
        return found, None, None
    clock = found[0].database_clock if clocked else None
    answer = bool(found[0].answer) if question is not None else None
    for row in found:  # the clock and the answer are the statement's, not the model's
        for name in extra:
            delattr(row, name)
    return found, clock, answer


def rows(model, text: str, params: list, extra: tuple = ()) -> list:
    """The rows of ``model`` that the statement ``text`` reads: every concrete column of
    the model, in ``_meta`` order, then the ``extra`` columns, each set on its row as an
    attribute of that name (as given by the database).

    On PostgreSQL the driver gives each column as the model's field holds it, except what a
    field's own ``from_db_value`` hook converts (JSON): the rows are made with
    ``Model.from_db`` from the cursor's rows. ``QuerySet.raw`` does the same, and more work
    per call for what it must find out about an arbitrary statement (about 0.5 ms of CPU a
    read on this machine, ``manage.py bench sql``). Elsewhere (SQLite stores UUIDs and
    times as text) ``QuerySet.raw`` converts them. tests/test_sql.py holds every model read
    here to the ORM's result on both."""
    if connection.vendor != "postgresql":
        return list(model.objects.raw(text, params))
    names, hooks = _reading(model)
    with connection.cursor() as cursor:
        cursor.execute(text, params)
        fetched = cursor.fetchall()
    found = []
    width = len(names)
    for values in fetched:
        columns = list(values[:width])
        for index, hook in hooks:
            columns[index] = hook(columns[index], None, connection)
        row = model.from_db(router.db_for_read(model), names, columns)
        for name, value in zip(extra, values[width:], strict=True):
            setattr(row, name, value)
        found.append(row)
    return found


@cache
def _reading(model) -> tuple[list, list]:
    """The attribute names of ``model``'s concrete fields and the ``from_db_value`` hooks
    of those that have one, by position."""
    fields = model._meta.concrete_fields
    return ([f.attname for f in fields],
            [(i, f.from_db_value) for i, f in enumerate(fields) if hasattr(f, "from_db_value")])


def exists(model, **where) -> bool:
    """Whether a row of ``model`` has each field of ``where`` equal to its value."""
    text = _exists_sql(model, tuple(where))
    with connection.cursor() as cursor:
        cursor.execute(text, [_prepared(model, n, v) for n, v in where.items()])
        return cursor.fetchone() is not None


@dataclass(frozen=True)
class Exists:
    """Whether a row of ``model`` has each field of ``where`` equal to its value, asked
    within another statement: ``lock_many_asking``'s question, or a part of ``write``
    (read with the writes' snapshot, so it does not see them). The ORM's
    ``model.objects.filter(**where).exists()``."""
    model: type
    where: dict


def _question_sql(question) -> tuple | None:
    return None if question is None else (question.model, tuple(question.where))


def _question_params(question) -> list:
    return [_prepared(question.model, n, v) for n, v in question.where.items()]


@cache
def _exists_sql(model, names: tuple) -> str:
    return f"SELECT 1 FROM {quoted(model._meta.db_table)} WHERE {_condition(model, names)}"


@cache
def _select_sql(model, vendor: str, how: str, locked: bool, question: tuple | None = None
                ) -> str:
    """Every column of ``model``'s rows by primary key: ``one`` (``= %s``) or ``many``
    (``IN ({marks})``, in key order, with the database's clock on PostgreSQL, and
    ``question``'s answer when asked: ``(model, field names)`` of an ``Exists``)."""
    pk = quoted(model._meta.pk.column)
    columns = ", ".join(quoted(f.column) for f in model._meta.concrete_fields)
    if how == "many" and vendor == "postgresql":
        columns += ", statement_timestamp() AS database_clock"
    if question is not None:
        columns += f", EXISTS ({_exists_sql(*question)}) AS answer"
    where = f"{pk} = %s" if how == "one" else f"{pk} IN ({{marks}}) ORDER BY {pk}"
    table = quoted(model._meta.db_table)
    # OF the table: the question's rows are read, not locked.
    lock_clause = f" FOR NO KEY UPDATE OF {table}" if locked and vendor == "postgresql" else ""
    return f"SELECT {columns} FROM {table} WHERE {where}{lock_clause}"


def _prepared(model, name: str, value):
    return model._meta.get_field(name).get_db_prep_value(value, connection)


# --- the writes of one transition -------------------------------------------------------------

@dataclass(frozen=True)
class Update:
    """Write the fields ``names`` of ``instance`` (a saved row) to its row, ``auto_now``
    applied: ``instance.save(update_fields=names)``. A foreign key of ``names`` set to a
    new row that an ``Insert`` of one row earlier in the same write makes takes that row's
    key as the database makes it, as ``save`` takes the key of a related row saved after
    it was set (a run's update naming its new control intent)."""
    instance: object
    names: tuple


@dataclass(frozen=True)
class UpdateWhere:
    """``model.objects.filter(**where).update(**values)``."""
    model: type
    values: dict
    where: dict


@dataclass(frozen=True)
class Insert:
    """Insert ``instances`` (all of one model, made by ``new``), defaults and
    ``auto_now_add`` applied as by ``save``; an automatic primary key is read back into
    each: ``bulk_create``."""
    instances: tuple


@dataclass(frozen=True)
class Keys:
    """The primary keys of the rows of ``model`` whose ``where`` fields equal the values
    given and whose ``unless`` fields do not, in primary key order: one of the answers
    ``write`` returns. Read in the same statement as the writes on PostgreSQL, so it does
    not see them."""
    model: type
    where: dict
    unless: dict


class _Gathering(threading.local):
    """The state of this thread's ``gathered`` block: whether it is open, and the writes
    held in it, each with the function its answers go to."""
    open = False
    held: list = []


_gathering = _Gathering()


@contextmanager
def gathered():
    """Make the block's writes as one statement on PostgreSQL, at its end: the transitions
    of one transaction (a run's last step and its end; the ends of runs a worker gathers)
    cost one statement whatever their number.

    Each write is held, its reads with it. At the end of the block, the Updates of one row
    are made one (the last one's values, for every field any of them names), the Inserts
    of one model one, in order (so an automatic key, an event's ``seq``, still follows the
    order of the writes); the Updates, UpdateWheres and Keys of one shape each one part
    whose values come as arrays; and equal Exists parts one. Then each write's ``then``
    gets its answers, in the order of the writes, with the block closed: what they write
    is made as it comes. Until the end nothing held is in the database, so no read of the
    block sees it. Inside a transaction only, which the writes join; elsewhere than on
    PostgreSQL, and in a block already open, writes are made as they come."""
    if connection.vendor != "postgresql" or _gathering.open:
        yield
        return
    _gathering.open, _gathering.held = True, []
    try:
        yield
        held = _gathering.held
    finally:
        _gathering.open, _gathering.held = False, []
    if held:
        answers = iter(_statement(_merged([p for writes, _, _ in held for p in writes]),
                                  [p for _, reads, _ in held for p in reads]))
        for _, reads, then in held:
            mine = [next(answers) for _ in reads]
            if then is not None:
                then(mine)


def write(*parts, then=None) -> list | None:
    """Make the writes ``parts`` (``Update``, ``UpdateWhere``, ``Insert``), in one statement
    on PostgreSQL, one after the other elsewhere, and read the ``Keys`` and ``Exists``
    parts, which come after them: returns their answers in order (a list of keys, a
    bool), and gives them to ``then`` first if given. The parts must not write the same
    rows: in one statement, PostgreSQL makes them all against the same snapshot, in no set
    order (``gathered`` makes the writes of one row one). In a ``gathered`` block the
    write is held, and returns None: its answers go to ``then`` at the end of the block
    (a write that reads must give one)."""
    reads = [part for part in parts if isinstance(part, (Keys, Exists))]
    writes = parts[:len(parts) - len(reads)]
    if any(isinstance(part, (Keys, Exists)) for part in writes):
        raise ValueError("The Keys and Exists parts of a write come after its writes.")
    if connection.vendor != "postgresql":
        answers = _write_by_orm(writes, reads)
    elif _gathering.open:
        if reads and then is None:
            raise ValueError("A write that reads in a gathered block gives its answers "
                             "to `then`.")
        _gathering.held.append((writes, reads, then))
        return None
    else:
        answers = _statement(writes, reads)
    if then is not None:
        then(answers)
    return answers


def _statement(writes, reads) -> list:
    """``write``'s one statement on PostgreSQL: the answers of ``reads``, in order."""
    asked, placed = _asked(reads)
    parts = [*_grouped(writes), *asked]
    shape, params, named = [], [], []
    db = connections[DEFAULT_DB_ALIAS]  # what ``connection`` stands for, looked up once
    for index, part in enumerate(parts):
        if isinstance(part, _UpdateMany):
            model = part.model
            shape.append(("update_many", model, part.names))
            params += _columns(model, part.names, False, part.instances, db)
            params.append(_column_of(model, model._meta.pk.name)(
                _prepared(model, model._meta.pk.name, i.pk) for i in part.instances))
        elif isinstance(part, Update):
            model = type(part.instance)
            names = tuple(part.names)
            made = _made_by(part.instance, names, parts[:index])
            shape.append(("update", model, names, made))
            given = names
            if made:
                taken = {name for name, _ in made}
                given = tuple(n for n in names if n not in taken)
                named.append((part.instance, taken))
            _saved_values(params, _saving(model, given, False), (part.instance,), False, db)
            params.append(_prepared(model, model._meta.pk.name, part.instance.pk))
        elif isinstance(part, _UpdateWhereMany):
            model, names, where = part.model, part.names, part.where
            shape.append(("update_where_many", model, names, where))
            for at, ((_, _, prepare), column) in enumerate(zip(
                    _saving(model, names, False), _column_classes(model, names), strict=True)):
                params.append(column(prepare(values[at], db) for values, _ in part.rows))
            params += _where_columns(model, where, [keys for _, keys in part.rows])
        elif isinstance(part, UpdateWhere):
            names = tuple(part.values)
            shape.append(("update_where", part.model, names, tuple(part.where)))
            params += [prepare(value, db) for (_, _, prepare), value
                       in zip(_saving(part.model, names, False), part.values.values(),
                                  strict=True)]
            params += [_prepared(part.model, n, v) for n, v in part.where.items()]
        elif isinstance(part, Insert) and len(part.instances) > 1:
            model = type(part.instances[0])
            shape.append(("insert_many", model))
            params += _columns(model, None, True, part.instances, db)
        elif isinstance(part, Insert):
            model = type(part.instances[0])
            values = []
            _saved_values(values, _saving(model, None, True), part.instances, True, db)
            # A NULL is left to a column without a default of the database's own: an
            # insert names the columns it gives a value (``_given``).
            given = _given(model, values)
            shape.append(("insert", model, given))
            params += [values[i] for i in given]
        elif isinstance(part, Exists):
            shape.append(("exists", part.model, tuple(part.where)))
            params += _question_params(part)
        elif isinstance(part, _KeysMany):
            shape.append(("keys_many", part.model, part.where, tuple(part.unless)))
            # The subquery's values come first in the statement's text, then the arrays.
            params += [_prepared(part.model, n, v) for n, v in part.unless.items()]
            params += _where_columns(part.model, part.where, part.rows)
        else:
            shape.append(("keys", part.model, tuple(part.where), tuple(part.unless)))
            params += [_prepared(part.model, n, v) for n, v in part.where.items()]
            params += [_prepared(part.model, n, v) for n, v in part.unless.items()]
    with connection.cursor() as cursor:
        cursor.execute(_write_sql(tuple(shape)), params)
        returned = cursor.fetchall()
    by_part: dict[tuple, list] = {}
    for index, key, member in returned:
        by_part.setdefault((index, member), []).append(key)
    for index, part in enumerate(parts):
        if isinstance(part, Insert) and _automatic_key(type(part.instances[0])) is not None:
            auto = _automatic_key(type(part.instances[0]))
            # PostgreSQL returns the rows in the order of VALUES, and of UNNEST (Django's
            # bulk_create relies on both).
            for instance, key in zip(part.instances, by_part[(index, None)], strict=True):
                setattr(instance, auto.attname, auto.to_python(key))
    for instance, taken in named:  # the new rows named again, now with the keys made
        for name in taken:
            setattr(instance, name, getattr(instance, name))
    answers = []
    for at, member in placed:
        index = len(parts) - len(asked) + at
        read = asked[at]
        if isinstance(read, Exists):
            answers.append((index, None) in by_part)
        else:
            pk = read.model._meta.pk
            answers.append(sorted(pk.to_python(key) for key in by_part.get((index, member), [])))
    return answers


def _made_by(instance, names: tuple, earlier: list) -> tuple:
    """The foreign keys of ``names`` that ``instance`` has set to a new row, each with the
    index among ``earlier`` of the one-row Insert that makes it: ``(name, index)`` pairs,
    which the update takes from that part (``Update``). A new row that no earlier part
    makes, or that an Insert of several rows makes, is refused, as ``save`` refuses an
    unsaved related row: nothing would give its key."""
    made = []
    for field in _foreign_keys(type(instance), names):
        name = field.name
        if getattr(instance, field.attname) is not None or not field.is_cached(instance):
            continue
        related = field.get_cached_value(instance)
        if related is None or related.pk is not None:
            continue
        found = [at for at, part in enumerate(earlier)
                 if isinstance(part, Insert) and part.instances == (related,)]
        if not found:
            raise ValueError(f"The {name} of {instance!r} is a new row that no one-row "
                             "insert before it in the write makes.")
        made.append((name, found[0]))
    return tuple(made)


@cache
def _foreign_keys(model, names: tuple) -> tuple:
    """The fields of ``names`` that are foreign keys of ``model``."""
    return tuple(field for field in map(model._meta.get_field, names) if field.many_to_one)


@dataclass(frozen=True)
class _KeysMany:
    """The Keys parts of a write that ask the same fields of one model's rows: one part,
    whose ``rows`` are the values each asks (an answer is told by its number among them,
    from 1)."""
    model: type
    where: tuple
    unless: dict
    rows: tuple


def _asked(reads) -> tuple[list, list]:
    """The parts that read ``reads``: equal Exists parts made one, and the Keys parts of
    one shape (two or more) one ``_KeysMany``; and where the answer of each read is among
    them: (its part's position, its number in a ``_KeysMany`` or None)."""
    groups: dict[tuple, tuple[int, list]] = {}
    placed = []
    for read in reads:
        if isinstance(read, Exists):
            key = (read.model, tuple(read.where.items()))
        else:
            key = (read.model, tuple(read.where), tuple(read.unless.items()))
        at, group = groups.setdefault(key, (len(groups), []))
        group.append(read)
        placed.append((at, len(group)))
    asked = []
    for _, group in groups.values():
        first = group[0]
        asked.append(first if isinstance(first, Exists) or len(group) == 1 else _KeysMany(
            first.model, tuple(first.where), first.unless,
            tuple(tuple(read.where.values()) for read in group)))
    return asked, [(at, member if isinstance(asked[at], _KeysMany) else None)
                   for at, member in placed]


@dataclass(frozen=True)
class _UpdateMany:
    """The Updates of a write that name the same fields of rows of one model: one part."""
    model: type
    names: tuple
    instances: tuple


def _combined(parts, key, join) -> list:
    """``parts`` with those of one ``key(part)`` made one, ``join(first, later)``, at the
    place of the first; a part whose key is None stays as it is."""
    combined, at = [], {}
    for part in parts:
        found = key(part)
        if found is None:
            combined.append(part)
        elif found in at:
            combined[at[found]] = join(combined[at[found]], part)
        else:
            at[found] = len(combined)
            combined.append(part)
    return combined


@dataclass(frozen=True)
class _UpdateWhereMany:
    """The UpdateWheres of a write that set the same fields of one model's rows found by
    the same fields: one part, each of its ``rows`` the values set and the values found
    by."""
    model: type
    names: tuple
    where: tuple
    rows: tuple


def _grouped(parts) -> list:
    """``parts`` with the Updates that name the same fields of one model's rows made one
    ``_UpdateMany`` (a claim's runs), and the UpdateWheres of one shape one
    ``_UpdateWhereMany`` (the attempts of ends gathered): one part, whose statement is
    the same however many rows it writes."""
    def key(part):
        if isinstance(part, Update):
            return (type(part.instance), tuple(part.names))
        if isinstance(part, UpdateWhere):
            return (part.model, tuple(part.values), tuple(part.where))
        return None

    def join(first, later):
        if isinstance(later, UpdateWhere):
            rows = first.rows if isinstance(first, _UpdateWhereMany) else (_found(first),)
            return _UpdateWhereMany(later.model, tuple(later.values), tuple(later.where),
                                    (*rows, _found(later)))
        instances = first.instances if isinstance(first, _UpdateMany) else (first.instance,)
        return _UpdateMany(type(later.instance), tuple(later.names),
                           (*instances, later.instance))

    return _combined(parts, key, join)


def _found(part: UpdateWhere) -> tuple:
    """A row of an ``_UpdateWhereMany``: the values an UpdateWhere sets and finds by."""
    return tuple(part.values.values()), tuple(part.where.values())


def _where_columns(model, names: tuple, rows) -> list:
    """One ``Column`` per field ``names`` of ``model``: each row's value of it, prepared."""
    return [_column_of(model, name)(_prepared(model, name, row[at]) for row in rows)
            for at, name in enumerate(names)]


def _columns(model, names: tuple | None, add: bool, instances, db) -> list:
    """Each field ``names`` of ``model`` (None: the fields an insert writes) over
    ``instances`` as ``save`` writes it, one ``Column`` of the field's type per field: the
    arrays that ``UNNEST`` makes rows of again."""
    saving = _saving(model, names, add)
    flat = []
    _saved_values(flat, saving, instances, add, db)
    return [column(flat[at::len(saving)])
            for at, column in enumerate(_column_classes(model, names))]


@cache
def _column_classes(model, names: tuple | None) -> tuple:
    """The ``Column`` class of each field ``names`` of ``model`` (None: the fields an insert
    writes), in ``_saving``'s order."""
    names = names or tuple(f.name for f in _inserted_fields(model))
    return tuple(_column_of(model, name) for name in names)


@cache
def _column_of(model, name: str):
    """The ``Column`` class of the values of ``model``'s field ``name``."""
    return column_of(_array_type(model, name).removesuffix("[]"))


def _merged(writes: list) -> list:
    """``writes`` with the Updates of one row made one, at the place of the first, with
    the last one's instance (which holds every value the transaction gave the row) and
    every field named; and the Inserts of one model made one, in order. The instances of
    the Updates left out get their ``auto_now`` values all the same, as ``save`` gives
    them. A row inserted and updated is refused: the update would not see it."""
    db = connections[DEFAULT_DB_ALIAS]
    inserted = {(type(made), made.pk) for part in writes if isinstance(part, Insert)
                for made in part.instances if made.pk is not None}

    def key(part):
        if isinstance(part, Update):
            row = (type(part.instance), part.instance.pk)
            if row in inserted:  # the update would not see the row: one snapshot
                raise ValueError("A row inserted is updated in the same statement.")
            return ("update", *row)
        return ("insert", type(part.instances[0])) if isinstance(part, Insert) else None

    def join(before, later):
        if isinstance(later, Insert):
            return Insert((*before.instances, *later.instances))
        model = type(later.instance)
        _saved_values([], _saving(model, before.names, False), (before.instance,), False, db)
        return Update(later.instance, tuple(dict.fromkeys((*before.names, *later.names))))

    return _combined(writes, key, join)


def _saved_values(params: list, saving: tuple, instances, add: bool, db) -> None:
    """Append to ``params`` each field's value of each of ``instances`` as ``save`` writes
    it: ``field.get_db_prep_save(field.pre_save(instance, add), connection)``."""
    for instance in instances:
        for attname, pre_save, prepare in saving:
            params.append(prepare(getattr(instance, attname) if pre_save is None
                                  else pre_save(instance, add), db))


@cache
def _saving(model, names: tuple | None, add: bool) -> tuple:
    """How ``write`` takes and prepares the fields ``names`` of ``model`` (None: the fields
    an insert writes), worked out once per model and shape: for each field, its attribute,
    its ``pre_save`` when that does more than read the attribute (``auto_now``, and
    ``auto_now_add`` on an insert), else None, and its preparation (``_preparer``)."""
    fields = (_inserted_fields(model) if names is None
              else [model._meta.get_field(n) for n in names])
    return tuple((f.attname, None if _reads_attribute(f, add) else f.pre_save, _preparer(f))
                 for f in fields)


def _reads_attribute(field, add: bool) -> bool:
    """Whether ``field.pre_save(instance, add)`` only reads the field's attribute."""
    kind = type(field)
    if kind.pre_save is models.Field.pre_save:
        return True
    return (kind.pre_save is models.DateTimeField.pre_save and not field.auto_now
            and not (field.auto_now_add and add))


# The fields whose preparation for PostgreSQL gives back a value of these exact types as it
# is, and the methods of theirs that do so (a subclass that overrides any is prepared in
# full): Django's own get_db_prep_save, get_db_prep_value, get_prep_value and to_python of
# each return a str, a bool, an aware datetime or a UUID unchanged. tests/test_sql.py holds
# each to the field's own get_db_prep_save.
_AS_THEY_ARE = (
    (models.CharField, models.Field, (str,)),
    (models.TextField, models.Field, (str,)),
    (models.BooleanField, models.Field, (bool,)),
    (models.UUIDField, models.UUIDField, (uuid.UUID,)),
    (models.DateTimeField, models.DateTimeField, (datetime.datetime,)),
)


def _preparer(field):
    """A function of a value and a connection that returns what
    ``field.get_db_prep_save(value, connection)`` returns on PostgreSQL, without the
    generic steps for the values that the field's own methods pass as they are (None, and
    the types of ``_AS_THEY_ARE``), or convert without a check (an int of an integer
    field). Any other value or field goes through ``get_db_prep_save`` itself."""
    kind = type(field)
    whole = field.get_db_prep_save

    def in_full(value, db):
        return whole(value, db)

    if isinstance(field, models.ForeignKey) and (
            kind.get_db_prep_save is models.ForeignKey.get_db_prep_save):
        target = _preparer(field.target_field)

        # ForeignKey.get_db_prep_save: None, and an empty string, may be NULL; any other
        # value is prepared by the target field.
        def related(value, db):
            if value is None:
                return None
            return in_full(value, db) if isinstance(value, str) else target(value, db)
        return related
    if kind.get_db_prep_save is not models.Field.get_db_prep_save:
        return in_full
    if (kind.get_db_prep_value is models.IntegerField.get_db_prep_value
            and kind.get_prep_value is models.IntegerField.get_prep_value):
        # IntegerField.get_db_prep_value: int(value) is the value itself for an int, which
        # the backend then adapts (on PostgreSQL, wrapped in the driver's type of its size).
        internal_type = field.get_internal_type()

        def integer(value, db):
            if type(value) is int:
                return db.ops.adapt_integerfield_value(value, internal_type)
            return in_full(value, db)
        return integer
    for base, prep_value_of, types in _AS_THEY_ARE:
        if (isinstance(field, base)
                and kind.get_db_prep_value is prep_value_of.get_db_prep_value
                and kind.get_prep_value is base.get_prep_value
                and kind.to_python is base.to_python):
            aware = base is models.DateTimeField  # a naive datetime is made aware

            def as_it_is(value, db, types=types, aware=aware):
                if value is None:
                    return None
                if type(value) in types and not (aware and value.utcoffset() is None):
                    return value
                return in_full(value, db)
            return as_it_is
    return in_full


def _write_by_orm(writes, reads) -> list:
    for part in writes:
        if isinstance(part, Update):
            part.instance.save(update_fields=list(part.names))
        elif isinstance(part, UpdateWhere):
            part.model.objects.filter(**part.where).update(**part.values)
        else:
            type(part.instances[0]).objects.bulk_create(part.instances)
    answers = []
    for part in reads:
        rows = part.model.objects.filter(**part.where)
        if isinstance(part, Exists):
            answers.append(rows.exists())
            continue
        for name, value in part.unless.items():
            rows = rows.exclude(**{name: value})
        answers.append(list(rows.order_by("pk").values_list("pk", flat=True)))
    return answers


def _automatic_key(model):
    """The primary key field if the database makes its values, else None."""
    return model._meta.pk if model._meta.pk.db_returning else None


def _given(model, values: list) -> tuple:
    """The positions among ``_inserted_fields`` of the columns a one-row insert names:
    every column but those whose value is None and whose database has no default for them
    (NULL, then, as it would be given). A run and its event are then about 30 parameters,
    not 54: the driver sends a statement of fewer parameters for less (psycopg, for one,
    rewrites the placeholders of a statement of more than 50 at every execution, and keeps
    the work for fewer). The statements are one per pattern of NULLs, a handful a model."""
    nullable = _left_null(model)
    return tuple(i for i, value in enumerate(values) if value is not None or i not in nullable)


@cache
def _left_null(model) -> frozenset:
    """The positions among ``_inserted_fields`` of the columns whose database default is
    NULL (no ``db_default``)."""
    return frozenset(i for i, field in enumerate(_inserted_fields(model))
                     if field.db_default is models.NOT_PROVIDED)


def _inserted_fields(model) -> list:
    auto = _automatic_key(model)
    return [f for f in model._meta.concrete_fields if f is not auto]


def _condition(model, where, unless=()) -> str:
    return " AND ".join([*(f"{_column(model, n)} = %s" for n in where),
                         *(f"{_column(model, n)} <> %s" for n in unless)])


def _made_key(model, name: str) -> str:
    """The quoted key column of the row that ``model``'s foreign key ``name`` refers to, as
    the insert of that row returns it."""
    return quoted(_automatic_key(model._meta.get_field(name).related_model).column)


def _column(model, name: str) -> str:
    """The quoted column of ``model``'s field ``name``."""
    return quoted(model._meta.get_field(name).column)


def _aliases(model, names: Sequence[str], prefix: str) -> list[str]:
    """The names an ``UNNEST`` gives the arrays of ``model``'s fields ``names``, quoted:
    ``prefix`` and the column's name."""
    return [quoted(f"{prefix}_{model._meta.get_field(n).column}") for n in names]


def _arrays(model, names: Sequence[str]) -> str:
    """The parameters of an ``UNNEST``: one array of the values of each field ``names``."""
    return ", ".join(f"%s::{_array_type(model, n)}" for n in names)


def _array_type(model, name: str) -> str:
    """The type of an array of the values of ``model``'s field ``name``: its column's type
    without a length, as Django's bulk_create on PostgreSQL casts its arrays (no value is
    cut short on the way; the column still checks it)."""
    return model._meta.get_field(name).db_type(connection).split("(")[0] + "[]"


@cache
def _write_sql(shape: tuple) -> str:
    """The one statement of ``write`` for parts of this ``shape`` (PostgreSQL): each part a
    ``WITH`` query; the keys that inserts read back and the ``Keys`` parts, as
    ``(part index, key as text, NULL)`` rows (a ``keys_many`` part's with the number of
    the row that asked for the key in place of the NULL), and a ``(part index, NULL,
    NULL)`` row for an ``Exists`` part that a row matches."""
    queries, outputs = [], []
    for index, (kind, model, *rest) in enumerate(shape):
        name = f"part{index}"
        table = quoted(model._meta.db_table)
        pk = quoted(model._meta.pk.column)
        if kind in ("update_many", "update_where_many"):  # each row's values in arrays
            names = rest[0]
            where = rest[1] if kind == "update_where_many" else (model._meta.pk.name,)
            new, old = _aliases(model, names, "new"), _aliases(model, where, "old")
            assignments = ", ".join(f"{_column(model, n)} = {quoted('rows')}.{alias}"
                                    for n, alias in zip(names, new, strict=True))
            found = " AND ".join(f"{table}.{_column(model, n)} = {quoted('rows')}.{alias}"
                                 for n, alias in zip(where, old, strict=True))
            query = (f"UPDATE {table} SET {assignments} FROM UNNEST("
                     f"{_arrays(model, (*names, *where))}) AS {quoted('rows')} "
                     f"({', '.join((*new, *old))}) WHERE {found}")
        elif kind in ("update", "update_where"):
            names, where = rest[0], (rest[1] if kind == "update_where" else (model._meta.pk.name,))
            made = dict(rest[1]) if kind == "update" else {}
            assignments = ", ".join(
                f"{_column(model, n)} = (SELECT {_made_key(model, n)} FROM part{made[n]})"
                if n in made else f"{_column(model, n)} = %s" for n in names)
            query = f"UPDATE {table} SET {assignments} WHERE {_condition(model, where)}"
        elif kind in ("insert", "insert_many"):
            fields = _inserted_fields(model)
            if kind == "insert":  # the columns given a value (``_given``)
                fields = [fields[i] for i in rest[0]]
                rows = f"VALUES ({', '.join(['%s'] * len(fields))})"
            else:  # one array per column, so one statement for any number of rows
                rows = f"SELECT * FROM UNNEST({_arrays(model, [f.name for f in fields])})"
            query = (f"INSERT INTO {table} ({', '.join(quoted(f.column) for f in fields)}) "
                     f"{rows}")
            auto = _automatic_key(model)
            if auto is not None:
                query += f" RETURNING {quoted(auto.column)}"
                outputs.append(
                    f"SELECT {index}, {quoted(auto.column)}::text, NULL::bigint FROM {name}")
        elif kind == "exists":
            query = f"{_exists_sql(model, rest[0])} LIMIT 1"
            outputs.append(f"SELECT {index}, NULL::text, NULL::bigint FROM {name}")
        elif kind == "keys_many":  # each key with the number of the row that asked it
            # The keys of each row asked for by a subquery of its own, which PostgreSQL
            # never merges into a join: each is read as one Keys part is read alone (by
            # an index of the fields asked, whatever the planner guesses of their rows).
            where, unless = rest
            asked = _aliases(model, where, "asked")
            found = " AND ".join([
                *(f"{_column(model, n)} = {quoted('asked')}.{alias}"
                  for n, alias in zip(where, asked, strict=True)),
                *(f"{_column(model, n)} <> %s" for n in unless)])
            query = (f"SELECT {quoted('asked')}.{quoted('member')}, ARRAY(SELECT {pk} FROM "
                     f"{table} WHERE {found}) AS {quoted('keys')} FROM UNNEST("
                     f"{_arrays(model, where)}) WITH ORDINALITY AS {quoted('asked')} "
                     f"({', '.join(asked)}, {quoted('member')})")
            outputs.append(f"SELECT {index}, UNNEST({quoted('keys')})::text, "
                           f"{quoted('member')} FROM {name}")
        else:
            where, unless = rest
            query = f"SELECT {pk} FROM {table} WHERE {_condition(model, where, unless)}"
            outputs.append(f"SELECT {index}, {pk}::text, NULL::bigint FROM {name}")
        # A keys_many part is made once, not inlined where it is read: its subquery's
        # cost is then counted once per row asked, as it is run.
        materialized = "MATERIALIZED " if kind == "keys_many" else ""
        queries.append(f"{name} AS {materialized}({query})")
    final = " UNION ALL ".join(outputs) or "SELECT 0, NULL::text, NULL::bigint WHERE false"
    return f"WITH {', '.join(queries)} {final}"
