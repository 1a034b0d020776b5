"""Reads on every request's path, built with the ORM once and run again with new values.

Building and compiling a queryset costs far more CPU than running its statement: the API
key lookup of each request (three subqueries) spent about 4 ms of the web process's CPU in
the query compiler for a 0.3 ms statement. A ``Prepared`` read is a queryset written as
usual, in a function of its parameters; it is built and compiled once per database
connection with a stand-in value for each parameter, and each call runs the compiled SQL
with the values given in their places. Each value goes through the preparation of the
model field it is compared with, as the ORM's own lookup would prepare it, and the rows
become model instances (``select_related`` and annotations included) or tuples
(``values_list``) as the queryset itself would give them. tests/test_prepared.py holds
each prepared read to the plain queryset's result.
"""

import datetime
import itertools
import uuid
import weakref

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Field, fields
from django.db.models.query import ModelIterable, get_related_populators

_stand_ins = itertools.count(1)


def _stand_in(field: Field):
    """A value for ``field`` that nothing else in a statement's parameters equals."""
    number = next(_stand_ins)
    if isinstance(field, fields.UUIDField):
        return uuid.UUID(int=(0xA3A3 << 112) + number)
    if isinstance(field, fields.DateTimeField):
        return datetime.datetime(1901, 2, 3, 4, 5, 6, number % 1_000_000,
                                 tzinfo=datetime.UTC)
    if isinstance(field, fields.IntegerField):  # within every integer field's range
        return 1_987_654_321 - number
    if isinstance(field, (fields.CharField, fields.TextField)):
        return f"\x1fstand-in {number}\x1f"
    raise TypeError(f"No stand-in for a {type(field).__name__}.")


class Prepared:
    """``build(**params)`` returns the queryset; ``params`` names each parameter's field."""

    def __init__(self, build, **params: Field):
        self.build = build
        self.params = params
        # One compiled form per connection object: each thread has its own connection.
        self._compiled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def rows(self, **values) -> list:
        """The queryset's results for ``values``: model instances or tuples."""
        db = connections[DEFAULT_DB_ALIAS]
        compiled = self._compiled.get(db)
        if compiled is None:
            compiled = self._compiled[db] = _Compiled(self, db)
        return compiled.run(values)

    def first(self, **values):
        found = self.rows(**values)
        return found[0] if found else None


class _Compiled:
    def __init__(self, prepared: Prepared, db):
        stand_ins = {name: _stand_in(field) for name, field in prepared.params.items()}
        queryset = prepared.build(**stand_ins)
        self.db = db
        self.compiler = queryset.query.get_compiler(connection=db)
        self.sql, params = self.compiler.as_sql()
        self.params = list(params)
        self.places: dict[str, list[int]] = {}
        for name, field in prepared.params.items():
            mark = field.get_db_prep_value(stand_ins[name], db)
            self.places[name] = [i for i, value in enumerate(self.params) if value == mark]
            if not self.places[name]:
                raise ValueError(f"Parameter {name!r} is not in the statement's parameters.")
        self.fields = prepared.params
        self.models = issubclass(queryset._iterable_class, ModelIterable)
        if self.models:
            select, klass_info = self.compiler.select, self.compiler.klass_info
            start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
            self.model, self.span = klass_info["model"], (start, end)
            self.init_list = [column[0].target.attname for column in select[start:end]]
            self.related = get_related_populators(klass_info, select, db.alias)
            self.annotations = self.compiler.annotation_col_map

    def run(self, values: dict) -> list:
        params = list(self.params)
        for name, places in self.places.items():
            value = self.fields[name].get_db_prep_value(values[name], self.db)
            for place in places:
                params[place] = value
        with self.db.cursor() as cursor:
            cursor.execute(self.sql, params)
            rows = cursor.fetchall()
        rows = self.compiler.results_iter([rows])
        if not self.models:
            return [tuple(row) for row in rows]
        start, end = self.span
        found = []
        for row in rows:
            instance = self.model.from_db(self.db.alias, self.init_list, row[start:end])
            for populator in self.related:
                populator.populate(row, instance)
            for name, column in self.annotations.items():
                setattr(instance, name, row[column])
            found.append(instance)
        return found
