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


def insert_all(
    *batches: tuple[type[models.Model], Sequence[models.Model]], then: tuple[str, list[Any]] | None = None
) -> tuple[Any, ...] | None:
    """Insert several models' rows in one statement (data-modifying CTEs): one round trip, atomic by
    itself. `then` (SQL, params) is the statement's main part, run with the inserts; its first row is
    returned. The objects are marked saved, as bulk_create does."""
    inserts = [insert_sql(model, objs) for model, objs in batches if objs]
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
