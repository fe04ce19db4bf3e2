"""Database connection helpers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection, models
from django.db.models.sql import InsertQuery


def release_pooled_connection() -> None:
    """With a connection pool (the web process: DATABASE_POOL_MAX_SIZE), give this thread's connection back
    to the pool, e.g. before waiting on a run's event stream, so a waiting request holds no connection; the
    next query takes one again. Without a pool, or inside a transaction, it does nothing."""
    if getattr(connection, "pool", None) is not None and not connection.in_atomic_block:
        connection.close()


def insert_sql(model: type[models.Model], objs: Sequence[models.Model]) -> tuple[str, list[Any]]:
    """Django's own INSERT of these unsaved rows (defaults, auto_now, JSON adaptation, all concrete
    fields: the models' ids are made in Python), as SQL to embed in a larger statement."""
    query = InsertQuery(model)
    query.insert_values(model._meta.concrete_fields, objs)
    [(sql, params)] = query.get_compiler(connection=connection).as_sql()
    return sql, list(params)


def insert_all(*batches: tuple[type[models.Model], Sequence[models.Model]]) -> None:
    """Insert several models' rows in one statement (data-modifying CTEs): one round trip, atomic by
    itself. The objects are marked saved, as bulk_create does."""
    batches = tuple((model, objs) for model, objs in batches if objs)
    if not batches:
        return
    inserts = [insert_sql(model, objs) for model, objs in batches]
    *first, (last_sql, _) = inserts
    ctes = ", ".join(f"insert_{index} AS ({sql})" for index, (sql, _) in enumerate(first))
    statement = f"WITH {ctes} {last_sql}" if first else last_sql
    with connection.cursor() as cursor:
        cursor.execute(statement, [param for _, params in inserts for param in params])
    mark_saved(obj for _, objs in batches for obj in objs)


def mark_saved(objs: Any) -> None:
    """What Django sets on a model instance once its row exists."""
    for obj in objs:
        obj._state.adding, obj._state.db = False, connection.alias
