from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from apps.accounts.admin_base import OrgScopedAdmin, secret_form
from apps.core.errors import InvalidInput
from apps.core.permissions import Action
from apps.llm.models import LlmCall, LlmRecordPolicy, Provider
from apps.llm.services import check_base_url


class ProviderAdminForm(secret_form(Provider, ("api_key",))):  # type: ignore[misc]
    """The same rule as the API and the ADE: a base URL the outbound guard lets tenants reach."""

    def clean_base_url(self) -> str:
        url = (self.cleaned_data.get("base_url") or "").strip()
        if url:
            try:
                check_base_url(url)
            except InvalidInput as exc:
                raise forms.ValidationError(exc.message) from exc
        return url


@admin.register(Provider)
class ProviderAdmin(OrgScopedAdmin):
    form = ProviderAdminForm
    add_action = change_action = Action.PROVIDER_MANAGE
    list_display = ["name", "provider_type", "base_url", "organization", "created_at"]
    list_filter = ["provider_type"]
    search_fields = ["name", "base_url"]


@admin.register(LlmCall)
class LlmCallAdmin(OrgScopedAdmin):
    """Read-only: records are written by runs and removed by retention (LlmRecordPolicy)."""

    add_action = change_action = Action.PROVIDER_MANAGE
    list_display = [
        "id",
        "model_handle",
        "status",
        "prompt_tokens",
        "completion_tokens",
        "latency_ms",
        "created_at",
    ]
    list_filter = ["status", "streamed", "truncated"]
    search_fields = ["id", "run_id", "step_id", "agent_id", "model"]
    readonly_fields = [f.name for f in LlmCall._meta.fields if f.name != "organization"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(LlmRecordPolicy)
class LlmRecordPolicyAdmin(OrgScopedAdmin):
    add_action = change_action = Action.PROVIDER_MANAGE
    list_display = ["organization", "retention_days", "updated_at"]
