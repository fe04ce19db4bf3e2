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
    """One statement: insert the run's spans, or append them to those an earlier execution of the run
    stored (a run handed back by a stopping worker and resumed by another), never past
    RUN_TRACE_MAX_SPANS (the rest are counted in dropped_spans). A run deleted meanwhile gets no row.

    Its commit does not wait for the WAL flush (synchronous_commit off for this statement's transaction
    only): a trace is diagnostics, and a crash within a fraction of a second losing one is worth not
    paying a disk flush on every run."""
    table = RunTrace._meta.db_table
    run_table = RunTrace._meta.get_field("run").related_model._meta.db_table
    cap = settings.RUN_TRACE_MAX_SPANS
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)) "
            f"INSERT INTO {table} (run_id, organization_id, trace_id, spans, span_count, dropped_spans, "
            "created_at, updated_at) "
            "SELECT %s, %s, %s, %s::jsonb, %s, %s, now(), now() FROM relaxed "
            f"WHERE EXISTS (SELECT 1 FROM {run_table} WHERE id = %s) "
            "ON CONFLICT (run_id) DO UPDATE SET "
            f"spans = CASE WHEN {table}.span_count + EXCLUDED.span_count <= %s "
            f"THEN {table}.spans || EXCLUDED.spans ELSE {table}.spans END, "
            f"dropped_spans = {table}.dropped_spans + EXCLUDED.dropped_spans + CASE WHEN "
            f"{table}.span_count + EXCLUDED.span_count <= %s THEN 0 ELSE EXCLUDED.span_count END, "
            f"span_count = CASE WHEN {table}.span_count + EXCLUDED.span_count <= %s "
            f"THEN {table}.span_count + EXCLUDED.span_count ELSE {table}.span_count END, "
            "updated_at = now()",
            [
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
            ],
        )
