"""Wire shapes of /v1/sandbox-config (Letta's SandboxConfig, SandboxConfigCreate/Update, LocalSandboxConfig
and SandboxEnvironmentVariable).

Types: ours are `docker` (a container; Letta's remote E2B sandbox is its nearest kin, so `e2b` is accepted
as another name for it) and `local` (the bubblewrap jail). A config's settings, under `config`:

    docker: image (Letta's E2B `template` is accepted too), pip_requirements, network_enabled, memory_mb,
            cpus, pids_limit, timeout (seconds)
    local:  pip_requirements (empty: the jail installs no packages), memory_mb, pids_limit, timeout

Letta's host-side settings of its local sandbox (`sandbox_dir`, `use_venv`, `venv_name`) have no meaning
in a jail and are refused like any unknown setting, with a 422 naming the field.

A variable's `value` is write-only: every answer has `"value": null` (Letta returns it in clear).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable

TYPE_ALIASES = {"e2b": SandboxConfig.Type.DOCKER.value}
WIRE_TO_FIELD = {
    "image": "image",
    "template": "image",
    "pip_requirements": "pip_requirements",
    "network_enabled": "network_enabled",
    "memory_mb": "memory_mb",
    "cpus": "cpus",
    "pids_limit": "pids_limit",
    "timeout": "timeout_seconds",
}
FIELD_TO_WIRE = {
    "image": "image",
    "pip_requirements": "pip_requirements",
    "network_enabled": "network_enabled",
    "memory_mb": "memory_mb",
    "cpus": "cpus",
    "pids_limit": "pids_limit",
    "timeout_seconds": "timeout",
}
DOCKER_WIRE = ("image", "pip_requirements", "network_enabled", "memory_mb", "cpus", "pids_limit", "timeout")
LOCAL_WIRE = ("pip_requirements", "memory_mb", "pids_limit", "timeout")


def sandbox_type(value: Any) -> str:
    """Our type for a wire type (Letta's `e2b` is Docker); anything else is left for the service to refuse."""
    text = str(value or SandboxConfig.Type.DOCKER.value)
    return TYPE_ALIASES.get(text, text)


def config_fields(config: dict[str, Any]) -> dict[str, Any]:
    """A wire `config` as the service's fields. An unknown key is passed on under its own name, for the
    service to refuse by name."""
    fields: dict[str, Any] = {}
    for key, value in config.items():
        if key == "type":
            continue
        fields[WIRE_TO_FIELD.get(key, key)] = value
    return fields


def wire_field(field: str, *, prefix: str) -> str:
    """The name a client knows for a service field (`timeout_seconds` -> `config.timeout`)."""
    if field in ("type", "key", "value", "description"):
        return field
    return prefix + FIELD_TO_WIRE.get(field, field)


class SandboxConfigOut(serializers.Serializer):
    id = serializers.CharField()
    type = serializers.CharField(source="sandbox_type")
    organization_id = serializers.CharField()
    config = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_config(self, config: SandboxConfig) -> dict[str, Any]:
        values = {
            "image": config.image or None,
            "pip_requirements": list(config.pip_requirements or []),
            "network_enabled": config.network_enabled,
            "memory_mb": config.memory_mb,
            "cpus": config.cpus,
            "pids_limit": config.pids_limit,
            "timeout": config.timeout_seconds,
        }
        keys = LOCAL_WIRE if config.sandbox_type == SandboxConfig.Type.LOCAL else DOCKER_WIRE
        return {key: values[key] for key in keys}


class SandboxConfigCreateIn(serializers.Serializer):
    """Letta's SandboxConfigCreate, plus an optional `type` (default docker; also read from `config`)."""

    config = serializers.DictField()
    type = serializers.CharField(required=False, allow_null=True, max_length=32)

    def service_kwargs(self) -> dict[str, Any]:
        data = self.validated_data
        config = data["config"]
        return {
            "sandbox_type": sandbox_type(data.get("type") or config.get("type")),
            "fields": config_fields(config),
        }


class SandboxConfigUpdateIn(serializers.Serializer):
    config = serializers.DictField(required=False, default=dict)

    def service_kwargs(self) -> dict[str, Any]:
        return {"fields": config_fields(self.validated_data["config"])}


class SandboxEnvVarOut(serializers.Serializer):
    id = serializers.CharField()
    key = serializers.CharField()
    value = serializers.SerializerMethodField()
    description = serializers.CharField(allow_blank=True)
    organization_id = serializers.CharField()
    sandbox_config_id = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    @extend_schema_field(serializers.CharField(allow_null=True, help_text="Write-only: always null."))
    def get_value(self, variable: SandboxEnvironmentVariable) -> None:
        """Write-only."""
        return None


class SandboxEnvVarCreateIn(serializers.Serializer):
    key = serializers.CharField(max_length=200)
    value = serializers.CharField(allow_blank=True, trim_whitespace=False)
    description = serializers.CharField(required=False, allow_blank=True, allow_null=True)


class SandboxEnvVarUpdateIn(serializers.Serializer):
    """Absent or null: unchanged."""

    key = serializers.CharField(max_length=200, required=False, allow_null=True)
    value = serializers.CharField(allow_blank=True, trim_whitespace=False, required=False, allow_null=True)
    description = serializers.CharField(required=False, allow_blank=True, allow_null=True)
