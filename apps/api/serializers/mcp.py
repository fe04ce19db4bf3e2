"""Wire shapes of /v1/mcp-servers (Letta's MCPServerUnion, its create/update configs, the refresh summary,
ToolExecutionResult) and of the legacy live listing under /v1/tools/mcp/servers.

Secrets never leave: `env` and `custom_headers` show their keys with null values, `auth_token` is null.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.tools.models import MCPServer

STDIO_FIELDS = ("command", "args", "env")
HTTP_FIELDS = ("server_url", "auth_header", "auth_token", "custom_headers")


class StdioConfigIn(serializers.Serializer):
    mcp_server_type = serializers.ChoiceField(choices=[MCPServer.Type.STDIO.value], required=False)
    command = serializers.CharField(max_length=1000)
    args = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False, default=list
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False, allow_null=True
    )


class HttpConfigIn(serializers.Serializer):
    mcp_server_type = serializers.ChoiceField(
        choices=[MCPServer.Type.SSE.value, MCPServer.Type.STREAMABLE_HTTP.value], required=False
    )
    server_url = serializers.CharField(max_length=2000)
    auth_header = serializers.CharField(max_length=200, required=False, allow_null=True, allow_blank=True)
    auth_token = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, trim_whitespace=False
    )
    custom_headers = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False, allow_null=True
    )


def _inferred_type(config: dict[str, Any]) -> str | None:
    """The SDK lets `mcp_server_type` be omitted: a command means stdio; a URL ending in /sse means SSE,
    any other URL Streamable HTTP (the current MCP transport)."""
    if config.get("command"):
        return MCPServer.Type.STDIO
    url = config.get("server_url")
    if isinstance(url, str) and url:
        return MCPServer.Type.SSE if urlsplit(url).path.rstrip("/").endswith("/sse") else "streamable_http"
    return None


def parse_config(config: Any, *, partial: bool, current_type: str | None = None) -> dict[str, Any]:
    """Validate one `config` object; returns `server_type` plus the fields that were sent."""
    if not isinstance(config, dict):
        raise serializers.ValidationError({"config": "must be an object"})
    server_type = config.get("mcp_server_type") or _inferred_type(config) or current_type
    if server_type not in MCPServer.Type.values:
        raise serializers.ValidationError(
            {"config": f"mcp_server_type must be one of {', '.join(MCPServer.Type.values)}"}
        )
    shape = StdioConfigIn if server_type == MCPServer.Type.STDIO else HttpConfigIn
    data = shape(data=config, partial=partial)
    if not data.is_valid():
        raise serializers.ValidationError({"config": data.errors})
    fields = {key: value for key, value in data.validated_data.items() if key != "mcp_server_type"}
    return {"server_type": server_type, **fields}


class McpServerCreateIn(serializers.Serializer):
    server_name = serializers.CharField(max_length=200)
    config = serializers.JSONField(help_text="The MCP server configuration (Stdio, SSE, or Streamable HTTP)")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return {"server_name": attrs["server_name"], **parse_config(attrs["config"], partial=False)}


class McpServerUpdateIn(serializers.Serializer):
    """PATCH: a field sent changes (null clears a secret), a field not sent stays."""

    server_name = serializers.CharField(max_length=200, required=False, allow_null=True)
    config = serializers.JSONField(required=False, allow_null=True)

    def changes(self, *, current_type: str) -> dict[str, Any]:
        data = self.validated_data
        changes: dict[str, Any] = {}
        if data.get("server_name") is not None:
            changes["server_name"] = data["server_name"]
        if data.get("config") is not None:
            changes |= parse_config(data["config"], partial=True, current_type=current_type)
        return changes


class McpServerOut(serializers.Serializer):
    """Letta's StdioMcpServer / SseMcpServer / StreamableHTTPMcpServer, by `mcp_server_type`."""

    id = serializers.CharField()
    server_name = serializers.CharField()
    mcp_server_type = serializers.CharField(source="server_type")
    command = serializers.CharField()
    args = serializers.ListField(child=serializers.CharField())
    env = serializers.SerializerMethodField()
    server_url = serializers.CharField()
    auth_header = serializers.SerializerMethodField()
    auth_token = serializers.SerializerMethodField()
    custom_headers = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    # Ours (Letta registers inline): how the registration of its tools went.
    sync_status = serializers.CharField(allow_blank=True)
    sync_error = serializers.CharField(allow_blank=True)
    synced_at = serializers.DateTimeField(allow_null=True)

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "string", "nullable": True}})
    def get_env(self, server: MCPServer) -> dict[str, None]:
        return dict.fromkeys(server.env)

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "string", "nullable": True}})
    def get_custom_headers(self, server: MCPServer) -> dict[str, None]:
        return dict.fromkeys(server.custom_headers)

    @extend_schema_field(OpenApiTypes.STR)
    def get_auth_header(self, server: MCPServer) -> str | None:
        return server.auth_header or None

    @extend_schema_field(OpenApiTypes.STR)
    def get_auth_token(self, server: MCPServer) -> None:
        return None

    def to_representation(self, instance: MCPServer) -> dict[str, Any]:
        data = super().to_representation(instance)
        other = HTTP_FIELDS if instance.server_type == MCPServer.Type.STDIO else STDIO_FIELDS
        return {key: value for key, value in data.items() if key not in other}


class McpToolRunIn(serializers.Serializer):
    args = serializers.DictField(required=False, default=dict)


class ToolExecutionResultOut(serializers.Serializer):
    status = serializers.CharField()
    func_return = serializers.CharField(source="return_value")
    stdout = serializers.ListField(child=serializers.CharField())
    stderr = serializers.ListField(child=serializers.CharField())
    sandbox_config_fingerprint = serializers.SerializerMethodField()
    agent_state = serializers.SerializerMethodField()

    @extend_schema_field(OpenApiTypes.STR)
    def get_sandbox_config_fingerprint(self, result: object) -> None:
        return None

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_agent_state(self, result: object) -> None:
        return None


class SkippedToolOut(serializers.Serializer):
    name = serializers.CharField()
    reason = serializers.CharField()


class RefreshSummaryOut(serializers.Serializer):
    added = serializers.ListField(child=serializers.CharField())
    updated = serializers.ListField(child=serializers.CharField())
    unchanged = serializers.ListField(child=serializers.CharField())
    deleted = serializers.ListField(child=serializers.CharField())
    skipped = SkippedToolOut(many=True)
    attached_to_agent = serializers.ListField(child=serializers.CharField())


class McpToolHealthOut(serializers.Serializer):
    status = serializers.CharField()
    reasons = serializers.ListField(child=serializers.CharField())


class McpToolOut(serializers.Serializer):
    """Letta's MCPTool: the tool as the server lists it (JSON keys in MCP's camelCase)."""

    name = serializers.CharField(source="spec.name")
    description = serializers.CharField(source="spec.description")
    inputSchema = serializers.JSONField(source="spec.input_schema")  # MCP spells it in camelCase
    annotations = serializers.JSONField(source="spec.annotations", allow_null=True)
    health = serializers.SerializerMethodField()

    @extend_schema_field(McpToolHealthOut)
    def get_health(self, remote: Any) -> dict[str, Any]:
        return {"status": "INVALID" if remote.problems else "VALID", "reasons": list(remote.problems)}
