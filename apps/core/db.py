"""Database connection helpers."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.backends.postgresql.base import TIMESTAMPTZ_OID, ServerBindingCursor
from django.db.backends.postgresql.psycopg_any import register_tzloader
from django.db.backends.utils import CursorWrapper
from django.db.models.constants import OnConflict
from django.db.models.expressions import DatabaseDefault
from django.db.models.sql import InsertQuery
from django.db.models.sql.compiler import SQLInsertCompiler  # the base class: no UNNEST (insert_sql)
from psycopg import _queries as _psycopg_queries  # private: see cache_wide_statements
from psycopg.pq import Format

M = TypeVar("M", bound=models.Model)


WIDE_STATEMENT_PARAMS = 256


def cache_wide_statements() -> None:
    """Let psycopg keep its conversion of statements with up to WIDE_STATEMENT_PARAMS parameters.

    psycopg converts a statement's %s placeholders to $n with a regular expression at every execution
    unless it has at most 50 parameters (its guard against ORMs' INSERTs of any number of rows), while a
    step's statements have 60-90 (the step with its messages, the run's LLM call records) in a few
    shapes, repeated every step: 1.1 ms of a memory turn's CPU (bench/cpu_turn.py). The cache stays
    psycopg's LRU of 128 statements of at most 4 KB, so a few MB at most."""
    if _psycopg_queries.MAX_CACHED_STATEMENT_PARAMS < WIDE_STATEMENT_PARAMS:
        _psycopg_queries.MAX_CACHED_STATEMENT_PARAMS = WIDE_STATEMENT_PARAMS


def release_pooled_connection() -> None:
    """With a connection pool (the web process: DATABASE_POOL_MAX_SIZE), give this thread's connection back
    to the pool, e.g. before waiting on a run's event stream, so a waiting request holds no connection; the
    next query takes one again. Without a pool, or inside a transaction, it does nothing."""
    if getattr(connection, "pool", None) is not None and not connection.in_atomic_block:
        connection.close()


# django-stubs declare ServerBindingCursor as Django's mixin alone, without psycopg's Cursor under it
_ServerBindingCursor: Any = ServerBindingCursor


class PreparingCursor(_ServerBindingCursor):
    """Django's server-binding cursor, keeping each statement where Django's query log (DEBUG,
    CaptureQueriesContext) reads it: psycopg sets `_query` at every execution but that of a statement it
    has prepared."""

    def _convert_query(self, query: Any, params: Any = None) -> Any:
        self._query = converted = super()._convert_query(query, params)
        return converted


@contextlib.contextmanager
def prepared_cursor() -> Iterator[CursorWrapper]:
    """Django's cursor, binding its parameters on the server, for the few hand-written statements every
    request runs (an API key's lookup, a send's locked agent and run): psycopg prepares a statement once
    it has run `prepare_threshold` times on a connection (DATABASE_PREPARE_THRESHOLD), so PostgreSQL
    parses and plans it once per connection, not at every request. The web process keeps Django's
    client-side binding for everything else (DATABASE_SERVER_SIDE_BINDING: some ORM queries fail with
    server-side binding); where binding is on the server already (the workers) this is Django's cursor
    as it is. Execute wrappers and query logging apply as to any statement."""
    with connection.cursor() as cursor:
        inner = cursor.cursor
        if isinstance(inner, psycopg.ClientCursor):
            raw = cursor.db.connection
            server_binding = PreparingCursor(raw)
            # Django's time zone loader, registered on its cursors when the connection's differs
            if cursor.db.timezone != raw.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT).timezone:
                register_tzloader(cursor.db.timezone, server_binding)
            inner.close()
            cursor.cursor = server_binding
        yield cursor


def insert_sql(model: type[models.Model], objs: Sequence[models.Model]) -> tuple[str, list[Any]]:
    """Django's own INSERT of these unsaved rows (defaults, auto_now, JSON adaptation, all concrete
    fields: the models' ids are made in Python), as SQL to embed in a larger statement.

    Always as VALUES rows (Django's PostgreSQL compiler may choose an UNNEST of one array per column,
    whose text elements psycopg quotes in Python with client-side binding). The rows are written here
    as Django's compiler writes them (pre_save, get_db_prep_save, a field's own placeholder, DEFAULT for
    a database default, expressions compiled) without its generality, which cost, with psycopg's parsing
    of the statements again (cache_wide_statements), 2.4-3.5 ms of a memory turn's CPU (bench/RESULTS.md).
    Rows Django refuses go to its compiler, which raises its error."""
    fields = model._meta.concrete_fields
    rows = _values_rows(model, fields, objs) if objs else None
    if rows is not None:
        placeholders, params = rows
        return f"{_insert_into(model)} VALUES {', '.join(placeholders)}", params
    query = InsertQuery(model)
    query.insert_values(fields, objs)
    [(sql, values)] = SQLInsertCompiler(query, connection, connection.alias).as_sql()
    return sql, list(values)


@functools.cache
def _insert_into(model: type[models.Model]) -> str:
    """`INSERT INTO table (every concrete column)`, quoted once per model."""
    quote = connection.ops.quote_name
    columns = ", ".join(quote(str(field.column)) for field in model._meta.concrete_fields)
    return f"INSERT INTO {quote(model._meta.db_table)} ({columns})"


def _values_rows(
    model: type[models.Model], fields: Sequence[models.Field[Any, Any]], objs: Sequence[models.Model]
) -> tuple[list[str], list[Any]] | None:
    """Each row's `(...)` and the parameters of all rows, as SQLInsertCompiler's prepare_value and
    field_as_sql make them; None for what Django refuses (an expression reading a column, an aggregate),
    so that its compiler raises its own error."""
    db = connections[DEFAULT_DB_ALIAS]  # the wrapper itself: the proxy looks it up at every use
    made: list[SQLInsertCompiler] = []  # for expressions and fields' own placeholders, made when needed

    def compiler() -> SQLInsertCompiler:
        if not made:
            made.append(SQLInsertCompiler(InsertQuery(model), db, db.alias))
        return made[0]

    default_keyword = db.features.supports_default_keyword_in_insert
    placeholders: list[str] = []
    params: list[Any] = []
    for obj in objs:
        row: list[str] = []
        for field in fields:
            value = field.pre_save(obj, True)
            if isinstance(value, DatabaseDefault) and default_keyword:
                row.append("DEFAULT")
            elif hasattr(value, "resolve_expression"):
                value = value.resolve_expression(compiler().query, allow_joins=False, for_save=True)
                if value.contains_column_references or value.contains_aggregate or value.contains_over_clause:
                    return None
                sql, expression_params = compiler().compile(value)
                row.append(sql)
                params.extend(expression_params)
            else:
                value = field.get_db_prep_save(value, db)
                get_placeholder = getattr(field, "get_placeholder", None)
                row.append("%s" if get_placeholder is None else get_placeholder(value, compiler(), db))
                params.append(value)
        placeholders.append("(" + ", ".join(row) + ")")
    return placeholders, params


def upsert_sql(
    model: type[models.Model],
    objs: Sequence[models.Model],
    *,
    unique_fields: list[str],
    update_fields: list[str],
) -> tuple[str, list[Any]]:
    """Django's INSERT ... ON CONFLICT (unique_fields) DO UPDATE SET update_fields of these rows (what
    bulk_create(update_conflicts=True) sends, as insert_sql writes rows), as SQL to embed in a larger
    statement."""
    columns = {field.name: field.column for field in model._meta.concrete_fields}
    sql, params = insert_sql(model, objs)
    suffix = connection.ops.on_conflict_suffix_sql(
        model._meta.concrete_fields,
        OnConflict.UPDATE,
        [columns[name] for name in update_fields],
        [columns[name] for name in unique_fields],
    )
    return f"{sql} {suffix}", params


def insert_all(
    *batches: tuple[type[models.Model], Sequence[models.Model]],
    also: Sequence[tuple[str, list[Any]]] = (),
    then: tuple[str, list[Any]] | None = None,
) -> tuple[Any, ...] | None:
    """Insert several models' rows in one statement (data-modifying CTEs): one round trip, atomic by
    itself. `also` are more data-modifying statements (SQL, params) to run in it, e.g. from upsert_sql.
    `then` (SQL, params) is the statement's main part, run with the inserts; its first row is
    returned. The objects are marked saved, as bulk_create does. Prepared (prepared_cursor): a send's
    run and a step's rows are statements of the same few shapes every time."""
    inserts = [insert_sql(model, objs) for model, objs in batches if objs] + list(also)
    if then is None:
        if not inserts:
            return None
        *inserts, then = inserts
    ctes = ", ".join(f"insert_{index} AS ({sql})" for index, (sql, _) in enumerate(inserts))
    main_sql, main_params = then
    with prepared_cursor() as cursor:
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
        obj._state.adding, obj._state.db = False, DEFAULT_DB_ALIAS


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
        db = connections[DEFAULT_DB_ALIAS]  # not the proxy, which looks it up at every use
        for index, converters, column in self._converters:
            for convert in converters:
                values[index] = convert(values[index], column, db)
        return self.model.from_db(DEFAULT_DB_ALIAS, self._attnames, values)


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
