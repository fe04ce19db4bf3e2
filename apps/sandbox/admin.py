from django.contrib import admin

from apps.accounts.admin_base import OrgScopedAdmin, secret_form
from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable


@admin.register(SandboxConfig)
class SandboxConfigAdmin(OrgScopedAdmin):
    list_display = [
        "sandbox_type",
        "image",
        "network_enabled",
        "memory_mb",
        "timeout_seconds",
        "organization",
    ]
    list_filter = ["sandbox_type", "network_enabled"]
    search_fields = ["image"]


@admin.register(SandboxEnvironmentVariable)
class SandboxEnvironmentVariableAdmin(OrgScopedAdmin):
    form = secret_form(SandboxEnvironmentVariable, ("value",))
    list_display = ["key", "sandbox_config", "description", "organization", "updated_at"]
    search_fields = ["key", "description"]
