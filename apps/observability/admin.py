from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.accounts.admin_base import OrgScopedAdmin
from apps.observability.models import RunTrace


@admin.register(RunTrace)
class RunTraceAdmin(OrgScopedAdmin):
    """Written by the agent loop only: shown, never edited."""

    list_display = ["run", "trace_id", "span_count", "dropped_spans", "created_at"]
    search_fields = ["run__id", "trace_id"]
    readonly_fields = ("run", "trace_id", "spans", "span_count", "dropped_spans")
    fields = ("run", "trace_id", "spans", "span_count", "dropped_spans")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
