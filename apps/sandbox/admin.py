from django.contrib import admin

from apps.accounts.admin_base import OrgScopedAdmin, secret_form
from apps.core.permissions import Action
from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable


@admin.register(SandboxConfig)
class SandboxConfigAdmin(OrgScopedAdmin):
    add_action = change_action = Action.SANDBOX_MANAGE
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
    add_action = change_action = Action.SANDBOX_MANAGE
    list_display = ["key", "sandbox_config", "description", "organization", "updated_at"]
    search_fields = ["key", "description"]
