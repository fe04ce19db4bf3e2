"""Writes of the observability app: a run's spans into its RunTrace row."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import connection

from apps.observability.models import RunTrace


def run_trace_store(
    *, run_id: str, organization_id: str, trace_id: str, spans: list[dict[str, Any]], dropped: int = 0
) -> None:
    """One statement: `run_trace_upsert` on its own. Its commit does not wait for the WAL flush
    (synchronous_commit off for this statement's transaction only): a trace is diagnostics, and a crash
    within a fraction of a second losing one is worth not paying a disk flush on every run."""
    sql, params = run_trace_upsert(
        run_id=run_id,
        organization_id=organization_id,
        trace_id=trace_id,
        spans=spans,
        dropped=dropped,
        relaxed=True,
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def run_trace_upsert(
    *,
    run_id: str,
    organization_id: str,
    trace_id: str,
    spans: list[dict[str, Any]],
    dropped: int = 0,
    relaxed: bool = False,
) -> tuple[str, list[Any]]:
    """The statement (SQL, params) that inserts the run's spans, or appends them to those an earlier
    execution of the run stored (a run handed back by a stopping worker and resumed by another), never
    past RUN_TRACE_MAX_SPANS (the rest are counted in dropped_spans); a run deleted meanwhile gets no row.
    Also a part of another statement (apps.core.db.insert_all's `also`): the worker stores a finished
    run's spans with its steps' provider traces. `relaxed`: the transaction commits asynchronously."""
    table = RunTrace._meta.db_table
    run_table = RunTrace._meta.get_field("run").related_model._meta.db_table
    cap = settings.RUN_TRACE_MAX_SPANS
    prefix, source = (
        ("WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)) ", "FROM relaxed ")
        if relaxed
        else ("", "")
    )
    sql = (
        f"{prefix}INSERT INTO {table} (run_id, organization_id, trace_id, spans, span_count, dropped_spans, "
        "created_at, updated_at) "
        f"SELECT %s, %s, %s, %s::jsonb, %s, %s, now(), now() {source}"
        f"WHERE EXISTS (SELECT 1 FROM {run_table} WHERE id = %s) "
        "ON CONFLICT (run_id) DO UPDATE SET "
        f"spans = CASE WHEN {table}.span_count + EXCLUDED.span_count <= %s "
        f"THEN {table}.spans || EXCLUDED.spans ELSE {table}.spans END, "
        f"dropped_spans = {table}.dropped_spans + EXCLUDED.dropped_spans + CASE WHEN "
        f"{table}.span_count + EXCLUDED.span_count <= %s THEN 0 ELSE EXCLUDED.span_count END, "
        f"span_count = CASE WHEN {table}.span_count + EXCLUDED.span_count <= %s "
        f"THEN {table}.span_count + EXCLUDED.span_count ELSE {table}.span_count END, "
        "updated_at = now()"
    )
    params = [
        run_id,
        organization_id,
        trace_id,
        json.dumps(spans),
        len(spans),
        dropped,
        run_id,
        cap,
        cap,
        cap,
    ]
    return sql, params
