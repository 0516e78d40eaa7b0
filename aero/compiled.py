"""Hot statements whose SQL Django builds once per connection, not once per call.

Building and compiling a queryset costs several times the CPU of running its statement
(`Session.objects.select_for_update().get(pk=...)`, say), and a job runs a few dozen
statements, most of them the same few shapes with other values, so the shapes on the
job's hot path are written
as `Compiled` statements: the queryset is built with `Arg(n)` placeholders where the
values go, compiled the first time it runs on a connection, and run again after that
with the call's values in the placeholders' places. Rows come back through the
compiler's own converters and `Model.from_db`, as the queryset would return them.

Only shapes whose SQL does not depend on the values may be written this way (a filter
on `pk=Arg(0)`, not on a list whose length varies): the compiled SQL is reused whatever
the values are. A shape that asks for what this does not handle (select_related,
prefetches, a value Django inlines into the SQL) is refused when it is first compiled.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, cast

import orjson
from django.apps import apps
from django.db import DatabaseError, connections, router, transaction
from django.db.models import BooleanField, F, Field, ForeignObjectRel, JSONField, Model, QuerySet
from django.db.models.expressions import Expression
from django.db.models.query import FlatValuesListIterable, ModelIterable, ValuesListIterable
from django.db.models.signals import post_save, pre_save
from django.db.models.sql import UpdateQuery
from psycopg.types.json import Jsonb

__all__ = [
    "AnyOf",
    "Arg",
    "Compiled",
    "CompiledUpdate",
    "Statement",
    "bind",
    "cached_sql",
    "insert_rows",
    "insert_sql",
    "insert_values",
    "mark_saved",
    "save_fields",
    "slot",
]


# A model's column, as `_meta.get_field` returns it (a relation's reverse side has no
# column: an Arg given one is refused).
Column = Field[Any, Any] | ForeignObjectRel


class _Slot:
    """Marks a parameter that takes the call's n-th value."""

    __slots__ = ("field", "index")

    def __init__(self, index: int, field: Column | None) -> None:
        if isinstance(field, ForeignObjectRel):
            raise ValueError(f"{field} is no column")
        self.index = index
        self.field: Field[Any, Any] | None = field


def slot(index: int, field: Column | None = None) -> Any:
    """The call's n-th value as a parameter of hand-written SQL (see `Statement`)."""
    return _Slot(index, field)


class Arg(Expression):
    """The call's n-th value, where a queryset takes a value: `filter(pk=Arg(0))`,
    `update(status=Arg(1))`. `field`: the column's type, which prepares the value as a
    filter on that column would (a str becomes a UUID for a UUIDField, say)."""

    def __init__(self, index: int, field: Column | None = None) -> None:
        self.index = index
        self.slot = _Slot(index, field)  # refuses a field that is no column
        super().__init__(output_field=self.slot.field)

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        return "%s", (self.slot,)

    def get_group_by_cols(self) -> list[Any]:
        return []


class AnyOf(Expression):
    """`column` is one of the call's n-th value (a list): `filter(AnyOf("key", 0))`. The
    SQL is the same whatever the list's length, as a compiled statement's must be (a
    filter on `key__in` is not: one placeholder per value). PostgreSQL compares with
    the list as one array; SQLite (the embedded mode) reads it as one JSON text."""

    conditional = True

    def __init__(self, column: str, index: int) -> None:
        super().__init__(output_field=BooleanField())
        self.column: Any = F(column)
        self.index = index

    def resolve_expression(self, *args: Any, **kwargs: Any) -> AnyOf:
        resolved = self.copy()
        resolved.column = self.column.resolve_expression(*args, **kwargs)
        return resolved

    # The column as a source expression: a subquery's aliases are relabeled (U0) after
    # it is resolved, and only the expressions it is told of follow.
    def get_source_expressions(self) -> list[Any]:
        return [self.column]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        (self.column,) = exprs

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        column, params = compiler.compile(self.column)
        if connection.vendor == "postgresql":
            return f"{column} = ANY(%s)", (*params, _Slot(self.index, None))
        values = _Slot(self.index, _JSON_TEXT)
        return f"{column} IN (SELECT value FROM json_each(%s))", (*params, values)

    def get_group_by_cols(self) -> list[Any]:
        return []


# Prepares a list as one JSON text (SQLite's json_each reads it).
_JSON_TEXT = JSONField()


def bind(params: tuple[Any, ...], args: tuple[Any, ...], connection: Any) -> list[Any]:
    """The parameters to run compiled SQL with: each slot takes the call's value."""
    bound = []
    for param in params:
        if isinstance(param, _Slot):
            value = args[param.index]
            if param.field is not None:
                value = param.field.get_db_prep_value(value, connection)
            bound.append(value)
        else:
            bound.append(param)
    return bound


class _Plan:
    """One connection's compiled shape: the SQL, its parameters (slots and constants),
    and what turns a row into what the queryset would have returned."""

    def __init__(self, queryset: QuerySet[Any], connection: Any) -> None:
        query = queryset.query
        prefetches = getattr(queryset, "_prefetch_related_lookups", ())
        if query.select_related or prefetches or query.extra_select:
            raise ValueError("a compiled statement cannot follow relations or add SQL")
        kind = queryset._iterable_class
        if kind not in (ModelIterable, ValuesListIterable, FlatValuesListIterable):
            raise ValueError(f"a compiled statement cannot return {kind.__name__} rows")
        if kind is ModelIterable and query.annotation_select:
            raise ValueError("a compiled statement of model rows cannot annotate them")
        self.compiler = query.get_compiler(connection=connection)
        self.sql, params = self.compiler.as_sql()
        self.params = tuple(params)
        self.model: type[Model] = queryset.model
        self.fetch_mode = getattr(queryset, "_fetch_mode", None)
        self.flat = kind is not ModelIterable  # tuples, not model instances
        self.values = kind is FlatValuesListIterable
        klass_info = self.compiler.klass_info
        select = self.compiler.select
        if self.flat:
            self.start, self.end = 0, len(select)
            self.attnames: list[str] = []
        else:
            fields = klass_info["select_fields"]
            self.start, self.end = fields[0], fields[-1] + 1
            self.attnames = [column[0].target.attname for column in select[self.start : self.end]]
        columns = [column[0] for column in select[: self.compiler.col_count]]
        self.converters = self.compiler.get_converters(columns)


class _Key:
    """A statement's key among a connection's plans. Not id(statement): a statement
    dropped (a test's) frees its id for the next one, which would then run its SQL."""

    __slots__ = ()


def _plans(connection: Any) -> dict[Any, Any]:
    """The compiled statements of this connection (a thread's own): the SQL text holds
    for the connection's vendor and settings, and survives its reconnects."""
    return cast(dict[Any, Any], connection.__dict__.setdefault("_aero_compiled", {}))


class Compiled[T: Model]:
    """A read of `model` rows compiled once per connection. `build()` returns the
    queryset with `Arg(n)` placeholders (called only to compile it); `rows(*values)` runs
    it with these values and yields model instances (or, for `values_list`, tuples or,
    flat, values)."""

    def __init__(self, model: type[T] | str, build: Callable[[], QuerySet[Any]]) -> None:
        # A model, or its "app_label.Model" for a module imported before the models are.
        self._model = model
        self.build = build
        self._key = _Key()

    @property
    def model(self) -> type[T]:
        if isinstance(self._model, str):
            self._model = cast(type[T], apps.get_model(self._model))
        return self._model

    def _plan(self, connection: Any) -> _Plan:
        plans = _plans(connection)
        plan = plans.get(self._key)
        if plan is None:
            plan = plans[self._key] = _Plan(self.build(), connection)
        return cast(_Plan, plan)

    def rows(self, *args: Any) -> Iterator[Any]:
        """The rows, read when the first one is asked for (as a queryset's)."""
        connection = connections[router.db_for_read(self.model)]
        plan = self._plan(connection)
        with connection.cursor() as cursor:
            cursor.execute(plan.sql, bind(plan.params, args, connection))
            fetched = cursor.fetchall()
        rows: Any = fetched
        if plan.converters:
            rows = plan.compiler.apply_converters(fetched, plan.converters)
        alias = connection.alias
        for row in rows:
            if plan.values:
                yield row[0]
            elif plan.flat:
                yield tuple(row)
            else:
                yield plan.model.from_db(
                    alias, plan.attnames, row[plan.start : plan.end], fetch_mode=plan.fetch_mode
                )

    def from_row(self, row: Any, connection: Any) -> T:
        """A model instance from a row whose first columns are this statement's (a
        `Statement` that returns them, say): converted as the statement's own rows are."""
        plan = self._plan(connection)
        values = row[plan.start : plan.end]
        if plan.converters:
            values = next(plan.compiler.apply_converters([values], plan.converters))
        return cast(
            T,
            plan.model.from_db(connection.alias, plan.attnames, values, fetch_mode=plan.fetch_mode),
        )

    def first(self, *args: Any) -> Any:
        return next(self.rows(*args), None)

    def get(self, *args: Any) -> T:
        """The one model instance, as QuerySet.get() returns it (and raises)."""
        found = list(self.rows(*args))
        if not found:
            raise cast(Any, self.model).DoesNotExist(
                f"{self.model.__name__} matching query does not exist."
            )
        if len(found) > 1:
            raise cast(Any, self.model).MultipleObjectsReturned(
                f"get() returned more than one {self.model.__name__}"
            )
        return cast(T, found[0])


class CompiledUpdate:
    """An UPDATE of `model` rows compiled once per connection: `build()` returns the
    filtered queryset, `values` the columns to set (each an `Arg`, a constant or an
    expression); `run(*args)` returns the number of rows updated."""

    def __init__(
        self, model: type[Model], build: Callable[[], QuerySet[Any]], values: dict[str, Any]
    ) -> None:
        self.model = model
        self.build = build
        self.values = values
        self._key = _Key()

    def run(self, *args: Any) -> int:
        alias = router.db_for_write(self.model)
        connection = connections[alias]

        def build() -> tuple[str, Any]:
            # What QuerySet.update() compiles.
            query = cast(UpdateQuery, self.build().query.chain(UpdateQuery))
            query.add_update_values(self.values)
            query.annotations = {}
            return cast(tuple[str, Any], query.get_compiler(connection=connection).as_sql())

        sql, params = cached_sql(connection, (self._key,), build)
        with transaction.mark_for_rollback_on_error(alias), connection.cursor() as cursor:
            cursor.execute(sql, bind(params, args, connection))
            return int(cursor.rowcount)


class Statement:
    """Any statement whose SQL is built once per connection: `build(connection)` returns
    the SQL and its parameters, where the call's values go as `slot(n)` (and as the
    `Arg`s of the querysets it compiles into it). `run(*values)` returns the rows, if the
    statement returns any, and the row count."""

    def __init__(self, build: Callable[[Any], tuple[str, Any]], *, using: str = "default") -> None:
        self.build = build
        self.using = using
        self._key = _Key()

    def run(self, *args: Any) -> tuple[list[Any], int]:
        connection = connections[self.using]
        sql, params = cached_sql(connection, (self._key,), lambda: self.build(connection))
        with transaction.mark_for_rollback_on_error(self.using), connection.cursor() as cursor:
            cursor.execute(sql, bind(params, args, connection))
            rows = cursor.fetchall() if cursor.description else []
            return rows, int(cursor.rowcount)


def cached_sql(
    connection: Any, key: tuple[Any, ...], build: Callable[[], tuple[str, Any]]
) -> tuple[str, tuple[Any, ...]]:
    """SQL whose shape is `key` (what its text depends on: the columns it sets, how many
    rows it inserts...), built by `build()` the first time this connection needs it."""
    plans = _plans(connection)
    found = plans.get(key)
    if found is None:
        sql, params = build()
        found = plans[key] = (sql, tuple(params))
    return cast(tuple[str, tuple[Any, ...]], found)


def _inserted_fields(model: type[Model], with_pk: bool = False) -> list[Any]:
    return [f for f in model._meta.concrete_fields if with_pk or f is not model._meta.pk]


def insert_sql(
    connection: Any,
    model: type[Model],
    count: int,
    *,
    returning: bool,
    with_pk: bool = False,
    where: str = "",
) -> str:
    """The INSERT of `count` rows of `model` (every column but its pk, unless `with_pk`).
    One row as Django writes it (VALUES). Several rows (PostgreSQL only) from ONE jsonb
    parameter (`jsonb_to_recordset`), so that the SQL and its parameters are the same
    whatever the number of rows: one prepared statement; psycopg parses a statement of
    more than 50 parameters anew at every run, and dumps a list parameter (Django's
    UNNEST of one array per column) element by element in Python. `where`: a condition
    the rows are inserted on (several rows' form only)."""
    quote = connection.ops.quote_name
    fields = _inserted_fields(model, with_pk)
    if count == 1 and where:
        raise ValueError("a condition needs the several rows' form")
    if count == 1:
        values = connection.ops.bulk_insert_sql(fields, [["%s"] * len(fields)])
    else:
        record = ", ".join(
            f"{quote(f.column)} {f.db_type(connection).split('(')[0]}" for f in fields
        )
        names = ", ".join(quote(f.column) for f in fields)
        values = f"SELECT {names} FROM jsonb_to_recordset(%s::jsonb) AS r({record})"
        if where:
            values += f" WHERE {where}"
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)}"
        f" ({', '.join(quote(f.column) for f in fields)}) {values}"
    )
    return f"{sql} RETURNING {quote(model._meta.pk.column)}" if returning else sql


def insert_values(
    model: type[Model],
    objs: Sequence[Model],
    connection: Any,
    with_pk: bool = False,
    *,
    many: bool = False,
) -> list[Any]:
    """The values of `insert_sql`'s rows, prepared as Django's INSERT prepares them: a
    row's values, or for several rows the JSON of their columns. `many`: the JSON for
    one row too (an INSERT built for several)."""
    fields = _inserted_fields(model, with_pk)
    rows = [[f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields] for obj in objs]
    if len(rows) == 1 and not many:
        return rows[0]
    columns = [f.column for f in fields]
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    try:
        # orjson: several times faster than json for the events' payloads a job writes,
        # and any JSON of the same values is the same rows to jsonb_to_recordset.
        return [orjson.dumps(records, default=_json_value, option=orjson.OPT_NON_STR_KEYS).decode()]
    except TypeError:  # what orjson refuses (an int over 64 bits): as json writes it
        return [json.dumps(records, default=_json_value)]


def _json_value(value: Any) -> Any:
    """A prepared value as `jsonb_to_recordset` reads it back into its column."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Jsonb):
        return value.obj
    raise TypeError(f"{type(value).__name__} is not JSON")


def insert_rows[M: Model](model: type[M], objs: list[M]) -> list[M]:
    """`model.objects.bulk_create(objs)`: one INSERT whose SQL is built once per
    connection (one shape for any number of rows on PostgreSQL), each row given its pk
    as bulk_create gives it. Rows whose pks are all set already (reserved from the
    sequence) are inserted with them, nothing read back. Elsewhere, bulk_create."""
    connection = connections[router.db_for_write(model)]
    if not objs:
        return objs
    with_pk = all(obj.pk is not None for obj in objs)
    if connection.vendor != "postgresql" or (not with_pk and any(o.pk is not None for o in objs)):
        return model._default_manager.bulk_create(objs)
    sql, _ = cached_sql(
        connection,
        ("insert_rows", model, with_pk, min(len(objs), 2)),
        lambda: (
            insert_sql(connection, model, len(objs), returning=not with_pk, with_pk=with_pk),
            [],
        ),
    )
    with transaction.mark_for_rollback_on_error(connection.alias), connection.cursor() as cursor:
        cursor.execute(sql, insert_values(model, objs, connection, with_pk))
        ids = [obj.pk for obj in objs] if with_pk else [row[0] for row in cursor.fetchall()]
    mark_saved(objs, ids, connection.alias)
    return objs


def mark_saved(objs: Sequence[Model], ids: list[Any], alias: str) -> None:
    """What saving gives a new row: its pk (in the order the INSERT returned them) and
    its state, as bulk_create leaves them."""
    for obj, pk in zip(objs, ids, strict=True):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = alias


def save_fields(obj: Model, fields: Sequence[str]) -> None:
    """`obj.save(update_fields=fields)` for a saved row: one UPDATE by its pk whose SQL is
    built once per connection (Django builds and compiles an UpdateQuery per save, several
    times the CPU of running it). A model with save signal receivers is saved by Django,
    so that they run."""
    model = type(obj)
    if pre_save.has_listeners(model) or post_save.has_listeners(model):
        obj.save(update_fields=fields)
        return
    connection = connections[router.db_for_write(model)]
    meta = model._meta
    columns = [cast(Field[Any, Any], meta.get_field(name)) for name in fields]

    def build() -> tuple[str, list[Any]]:
        quote = connection.ops.quote_name
        assignments = ", ".join(f"{quote(str(f.column))} = %s" for f in columns)
        return (
            f"UPDATE {quote(meta.db_table)} SET {assignments}"
            f" WHERE {quote(str(meta.pk.column))} = %s",
            [],
        )

    sql, _ = cached_sql(connection, ("save_fields", model, tuple(fields)), build)
    params = [f.get_db_prep_save(f.pre_save(obj, False), connection) for f in columns]
    params.append(meta.pk.get_db_prep_value(obj.pk, connection))
    with transaction.mark_for_rollback_on_error(connection.alias), connection.cursor() as cursor:
        cursor.execute(sql, params)
        if cursor.rowcount == 0:
            # As Model.save(update_fields=...) says it.
            raise DatabaseError("Save with update_fields did not affect any rows.")
