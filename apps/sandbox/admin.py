from typing import Any

from django.contrib import admin

from apps.accounts.admin_base import OrgAdminForm, OrgScopedAdmin, secret_form
from apps.core.permissions import Action
from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable
from apps.sandbox.services import CONFIG_FIELDS, SandboxFieldInvalid, validate_config_fields


class SandboxConfigForm(OrgAdminForm):
    """The admin's config form checks what the API checks (apps.sandbox.services): limits within the
    platform's (SANDBOX_RUNNER_MAX_*), images the runner allows, no Docker-only settings on the local
    jail; a refused value is an error on its field."""

    class Meta:
        model = SandboxConfig
        fields = "__all__"

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        sandbox_type = data.get("sandbox_type") or SandboxConfig.Type.DOCKER
        # What the person changed (a new config's defaults are the service's own, already within bounds).
        given = {name: data[name] for name in CONFIG_FIELDS if name in data and name in self.changed_data}
        try:
            data.update(validate_config_fields(sandbox_type, given))
        except SandboxFieldInvalid as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.reason)
        return data


@admin.register(SandboxConfig)
class SandboxConfigAdmin(OrgScopedAdmin):
    form = SandboxConfigForm
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
