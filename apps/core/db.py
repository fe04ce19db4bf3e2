"""Database connection helpers."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from django.db import connection, models
from django.db.models.constants import OnConflict
from django.db.models.sql import InsertQuery
from django.db.models.sql.compiler import SQLInsertCompiler  # the base class: no UNNEST (insert_sql)

M = TypeVar("M", bound=models.Model)


def release_pooled_connection() -> None:
    """With a connection pool (the web process: DATABASE_POOL_MAX_SIZE), give this thread's connection back
    to the pool, e.g. before waiting on a run's event stream, so a waiting request holds no connection; the
    next query takes one again. Without a pool, or inside a transaction, it does nothing."""
    if getattr(connection, "pool", None) is not None and not connection.in_atomic_block:
        connection.close()


def insert_sql(model: type[models.Model], objs: Sequence[models.Model]) -> tuple[str, list[Any]]:
    """Django's own INSERT of these unsaved rows (defaults, auto_now, JSON adaptation, all concrete
    fields: the models' ids are made in Python), as SQL to embed in a larger statement.

    Always as VALUES rows (Django's PostgreSQL compiler may choose an UNNEST of one array per column,
    whose text elements psycopg quotes in Python with client-side binding). Rows whose values are all
    plain skip the compiler's generality; a model with a database default (messages' sequence) takes
    Django's own compiler."""
    fields = model._meta.concrete_fields
    if objs and not any(hasattr(field, "get_placeholder") for field in fields):
        # Django's compiler, without its generality (~40% of a turn's insert cost): the same pre_save
        # (defaults, auto_now) and get_db_prep_save per value, "%s" placeholders. A value that is an
        # expression (a db_default) takes Django's way.
        params: list[Any] = []
        for obj in objs:
            for field in fields:
                value = field.pre_save(obj, True)
                if hasattr(value, "resolve_expression"):
                    break
                params.append(field.get_db_prep_save(value, connection))
            else:
                continue
            break
        else:
            quote = connection.ops.quote_name
            columns = ", ".join(quote(str(field.column)) for field in fields)
            row = "(" + ", ".join(["%s"] * len(fields)) + ")"
            sql = (
                f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES {', '.join([row] * len(objs))}"
            )
            return sql, params
    query = InsertQuery(model)
    query.insert_values(fields, objs)
    [(sql, values)] = SQLInsertCompiler(query, connection, connection.alias).as_sql()
    return sql, list(values)


def upsert_sql(
    model: type[models.Model],
    objs: Sequence[models.Model],
    *,
    unique_fields: list[str],
    update_fields: list[str],
) -> tuple[str, list[Any]]:
    """Django's INSERT ... ON CONFLICT (unique_fields) DO UPDATE SET update_fields of these rows (what
    bulk_create(update_conflicts=True) sends), as SQL to embed in a larger statement."""
    field = model._meta.get_field
    query = InsertQuery(
        model,
        on_conflict=OnConflict.UPDATE,
        update_fields=[field(name) for name in update_fields],
        unique_fields=[field(name) for name in unique_fields],
    )
    query.insert_values(model._meta.concrete_fields, objs)
    [(sql, params)] = SQLInsertCompiler(query, connection, connection.alias).as_sql()  # VALUES: insert_sql
    return sql, list(params)


def insert_all(
    *batches: tuple[type[models.Model], Sequence[models.Model]],
    also: Sequence[tuple[str, list[Any]]] = (),
    then: tuple[str, list[Any]] | None = None,
) -> tuple[Any, ...] | None:
    """Insert several models' rows in one statement (data-modifying CTEs): one round trip, atomic by
    itself. `also` are more data-modifying statements (SQL, params) to run in it, e.g. from upsert_sql.
    `then` (SQL, params) is the statement's main part, run with the inserts; its first row is
    returned. The objects are marked saved, as bulk_create does."""
    inserts = [insert_sql(model, objs) for model, objs in batches if objs] + list(also)
    if then is None:
        if not inserts:
            return None
        *inserts, then = inserts
    ctes = ", ".join(f"insert_{index} AS ({sql})" for index, (sql, _) in enumerate(inserts))
    main_sql, main_params = then
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH {ctes} {main_sql}" if ctes else main_sql,
            [param for _, params in inserts for param in params] + list(main_params),
        )
        row = cursor.fetchone() if cursor.description else None
    mark_saved(obj for _, objs in batches for obj in objs)
    return row


def mark_saved(objs: Any) -> None:
    """What Django sets on a model instance once its row exists."""
    for obj in objs:
        obj._state.adding, obj._state.db = False, connection.alias


class RowReader(Generic[M]):
    """Model instances from a hand-written SELECT, as the ORM would build them.

    For hot paths where compiling the ORM's query costs more than running it (~0.3-0.6 ms of CPU against
    ~0.15 ms for the round trip). `columns` is the select list to put in the query: every concrete column
    of the table aliased `alias` except `exclude` (deferred, as QuerySet.defer leaves them); `instance`
    turns the first `width` values of a row into a model instance, with the converters the ORM applies
    (JSON text parsed, encrypted fields decrypted)."""

    def __init__(self, model: type[M], alias: str, exclude: frozenset[str]) -> None:
        fields = [f for f in model._meta.concrete_fields if f.name not in exclude]
        self.model = model
        self.columns = ", ".join(f'{alias}."{f.column}"' for f in fields)
        self.width = len(fields)
        self._attnames = [f.attname for f in fields]
        self._converters: list[tuple[int, list[Callable[..., Any]], Any]] = []
        for index, field in enumerate(fields):
            column = field.get_col(alias)
            converters = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            if converters:
                self._converters.append((index, converters, column))

    def position(self, attname: str) -> int:
        """Where a field's value is in a row."""
        return self._attnames.index(attname)

    def instance(self, row: Sequence[Any]) -> M:
        values = list(row[: self.width])
        for index, converters, column in self._converters:
            for convert in converters:
                values[index] = convert(values[index], column, connection)
        return self.model.from_db(connection.alias, self._attnames, values)


@functools.cache
def row_reader(model: type[M], alias: str, exclude: frozenset[str] = frozenset()) -> RowReader[M]:
    return RowReader(model, alias, exclude)


def fetch_instances(
    model: type[M], sql: str, params: Sequence[Any], *, alias: str, exclude: frozenset[str] = frozenset()
) -> list[M]:
    """Instances of `model` from `sql`, whose select list is written `{columns}` (RowReader)."""
    reader = row_reader(model, alias, exclude)
    with connection.cursor() as cursor:
        cursor.execute(sql.replace("{columns}", reader.columns), params)
        return [reader.instance(row) for row in cursor.fetchall()]
