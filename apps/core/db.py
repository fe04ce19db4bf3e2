"""Database connection helpers."""

from __future__ import annotations

from django.db import connection


def release_pooled_connection() -> None:
    """With a connection pool (the web process: DATABASE_POOL_MAX_SIZE), give this thread's connection back
    to the pool, e.g. before waiting on a run's event stream, so a waiting request holds no connection; the
    next query takes one again. Without a pool, or inside a transaction, it does nothing."""
    if getattr(connection, "pool", None) is not None and not connection.in_atomic_block:
        connection.close()
