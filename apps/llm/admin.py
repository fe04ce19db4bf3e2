from django import forms
from django.contrib import admin

from apps.accounts.admin_base import OrgScopedAdmin, secret_form
from apps.core.errors import InvalidInput
from apps.core.permissions import Action
from apps.llm.models import Provider
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
