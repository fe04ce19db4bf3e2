from __future__ import annotations

import json

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from apps.core.crypto import EncryptedTextField
from apps.core.ids import ID_MAX_LENGTH, new_id, new_tool_id
from apps.core.models import OrgOwnedModel

DEFAULT_RETURN_CHAR_LIMIT = 50_000  # Letta's FUNCTION_RETURN_CHAR_LIMIT


class Tool(OrgOwnedModel):
    class Type(models.TextChoices):
        CUSTOM = "custom"
        LETTA_CORE = "letta_core"
        LETTA_MEMORY_CORE = "letta_memory_core"
        LETTA_MULTI_AGENT_CORE = "letta_multi_agent_core"
        LETTA_SLEEPTIME_CORE = "letta_sleeptime_core"
        LETTA_VOICE_SLEEPTIME_CORE = "letta_voice_sleeptime_core"
        LETTA_BUILTIN = "letta_builtin"
        LETTA_FILES_CORE = "letta_files_core"
        EXTERNAL_MCP = "external_mcp"
        CLIENT = "client", "Client-side (executed by the caller)"

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_tool_id, editable=False)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    tool_type = models.CharField(max_length=32, choices=Type.choices, default=Type.CUSTOM)
    source_type = models.CharField(max_length=32, default="python")
    source_code = models.TextField(blank=True, default="")
    json_schema = models.JSONField(default=dict, blank=True)
    args_json_schema = models.JSONField(null=True, blank=True)
    return_char_limit = models.PositiveIntegerField(default=DEFAULT_RETURN_CHAR_LIMIT)
    tags = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    pip_requirements = models.JSONField(default=list, blank=True)
    npm_requirements = models.JSONField(default=list, blank=True)
    default_requires_approval = models.BooleanField(default=False)
    enable_parallel_execution = models.BooleanField(default=False)
    metadata = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    last_updated_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="tool_unique_name_per_org")
        ]

    def __str__(self) -> str:
        return self.name


def new_mcp_server_id() -> str:
    return new_id("mcp_server")


class MCPServer(OrgOwnedModel):
    """An organisation's connection to an external MCP server, whose tools become `external_mcp` Tools.

    Secrets (stdio env values, the auth token, custom header values) are Fernet-encrypted at rest and
    never leave through the API; `env` and `custom_headers` are JSON objects kept in encrypted text.
    """

    class Type(models.TextChoices):
        STDIO = "stdio"
        SSE = "sse"
        STREAMABLE_HTTP = "streamable_http", "Streamable HTTP"

    id = models.CharField(
        primary_key=True, max_length=ID_MAX_LENGTH, default=new_mcp_server_id, editable=False
    )
    server_name = models.CharField(max_length=200)
    server_type = models.CharField(max_length=32, choices=Type.choices)
    server_url = models.CharField(max_length=2000, blank=True, default="")
    command = models.CharField(max_length=1000, blank=True, default="")
    args = models.JSONField(default=list, blank=True)
    env_json = EncryptedTextField(
        blank=True,
        default="",
        help_text='stdio only: environment variables as a JSON object {"NAME": "value"}',
    )
    auth_header = models.CharField(
        max_length=200, blank=True, default="", help_text="HTTP only: header carrying auth_token"
    )
    auth_token = EncryptedTextField(blank=True, default="")
    custom_headers_json = EncryptedTextField(
        blank=True, default="", help_text='HTTP only: extra headers as a JSON object {"Name": "value"}'
    )
    # The last registration of its tools: "syncing" while a worker still waits for a slow server.
    sync_status = models.CharField(
        max_length=16,
        blank=True,
        default="",
        choices=[("syncing", "Syncing"), ("ok", "OK"), ("error", "Error")],
    )
    sync_error = models.TextField(blank=True, default="")
    synced_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["server_name"]
        verbose_name = "MCP server"
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "server_name"], name="mcp_server_unique_name_per_org"
            ),
            models.CheckConstraint(
                condition=(Q(server_type="stdio") & ~Q(command=""))
                | (Q(server_type__in=["sse", "streamable_http"]) & ~Q(server_url="")),
                name="mcp_server_has_endpoint",
            ),
        ]

    def __str__(self) -> str:
        return self.server_name

    def clean(self) -> None:
        """Form-level checks (the admin): JSON secrets are objects of strings; the type has its endpoint."""
        errors: dict[str, str] = {}
        for field in ("env_json", "custom_headers_json"):
            try:
                parse_string_map(getattr(self, field))
            except ValueError as exc:
                errors[field] = str(exc)
        if self.server_type == self.Type.STDIO and not self.command:
            errors["command"] = "A stdio MCP server needs a command."
        if self.server_type in (self.Type.SSE, self.Type.STREAMABLE_HTTP) and not self.server_url:
            errors["server_url"] = "An HTTP MCP server needs a server_url."
        if errors:
            raise ValidationError(errors)

    @property
    def env(self) -> dict[str, str]:
        return parse_string_map(self.env_json)

    @env.setter
    def env(self, value: dict[str, str] | None) -> None:
        self.env_json = dump_string_map(value)

    @property
    def custom_headers(self) -> dict[str, str]:
        return parse_string_map(self.custom_headers_json)

    @custom_headers.setter
    def custom_headers(self, value: dict[str, str] | None) -> None:
        self.custom_headers_json = dump_string_map(value)


def parse_string_map(text: str) -> dict[str, str]:
    """A JSON object of strings from encrypted text ("" is {}); ValueError for anything else."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError('must be a JSON object of strings, e.g. {"NAME": "value"}')
    return value


def dump_string_map(value: dict[str, str] | None) -> str:
    return json.dumps(value, ensure_ascii=False) if value else ""
