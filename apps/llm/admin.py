from django.contrib import admin

from apps.accounts.admin_base import OrgScopedAdmin, secret_form
from apps.llm.models import Provider


@admin.register(Provider)
class ProviderAdmin(OrgScopedAdmin):
    form = secret_form(Provider, ("api_key",))
    list_display = ["name", "provider_type", "base_url", "organization", "created_at"]
    list_filter = ["provider_type"]
    search_fields = ["name", "base_url"]
