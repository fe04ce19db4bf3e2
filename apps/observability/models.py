from __future__ import annotations

from typing import Any

from django.db import models

from apps.core.models import OrgOwnedModel


class RunTrace(OrgOwnedModel):
    """The spans of one run, as Letta's trace endpoint returns them (ClickHouse `otel_traces` columns),
    written in one statement when the run's execution ends (apps.observability.tracing). Bounded:
    RUN_TRACE_MAX_SPANS spans, attribute values cut to a few hundred characters. An execution resumed by
    another worker appends its spans to the same row."""

    # No database constraint: runs are also deleted in bulk by SQL (the benchmark's clean-up); Django's
    # cascade still removes the trace with its run or organisation, and the insert checks the run exists.
    run = models.OneToOneField(
        "agents.Run", primary_key=True, on_delete=models.CASCADE, related_name="+", db_constraint=False
    )
    trace_id = models.CharField(max_length=32, db_index=True)
    spans: models.JSONField[list[dict[str, Any]]] = models.JSONField(default=list)
    span_count = models.PositiveIntegerField(default=0)
    dropped_spans = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name = "run trace"

    def __str__(self) -> str:
        return f"trace of {self.run_id}"
