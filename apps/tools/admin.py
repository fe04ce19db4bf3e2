from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from apps.accounts.admin_base import OrgScopedAdmin, admin_roles, secret_form
from apps.core.permissions import Action
from apps.tools.mcp import http_target_refusal, stdio_refusal
from apps.tools.models import MCPServer, Tool, parse_string_map


class MCPServerAdminForm(secret_form(MCPServer, ("env_json", "auth_token", "custom_headers_json"))):  # type: ignore[misc]
    """The same rules as the API: a stdio server's command must be one the operator allows; an HTTP
    server's URL must pass the outbound guard and its headers carry no metadata or hop-by-hop names."""

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if cleaned.get("server_type") == MCPServer.Type.STDIO:
            reason = stdio_refusal((cleaned.get("command") or "").strip())
            if reason:
                raise forms.ValidationError({"command": reason})
        elif cleaned.get("server_url"):
            try:
                names = list(parse_string_map(cleaned.get("custom_headers_json") or ""))
            except ValueError:
                names = []  # the model's own clean says what is wrong with it
            if cleaned.get("auth_header"):
                names.append(cleaned["auth_header"])
            reason = http_target_refusal(cleaned["server_url"].strip(), names)
            if reason:
                raise forms.ValidationError({"server_url": reason})
        return cleaned


@admin.register(Tool)
class ToolAdmin(OrgScopedAdmin):
    """A member changes the tools they created until an agent someone else created uses one (it runs with
    that agent's secrets); owners and admins every tool (as tools.services._require_tool_writer)."""

    add_action = Action.TOOL_CREATE
    change_action = Action.TOOL_WRITE
    list_display = [
        "name",
        "tool_type",
        "default_requires_approval",
        "return_char_limit",
        "organization",
        "updated_at",
    ]
    list_filter = ["tool_type", "default_requires_approval"]
    search_fields = ["name", "description", "id"]

    def row_shared(self, request: HttpRequest, obj: Tool) -> bool:
        return obj.agent_attachments.exclude(agent__created_by_id=request.user.pk).exists()

    def save_model(self, request: HttpRequest, obj: Tool, form: Any, change: bool) -> None:
        if not change and obj.created_by_id is None and obj.organization_id in admin_roles(request):
            obj.created_by = request.user  # as the services record who created it
        super().save_model(request, obj, form, change)


@admin.register(MCPServer)
class MCPServerAdmin(OrgScopedAdmin):
    """Env values, the auth token and custom header values are write-only: the form never shows them."""

    form = MCPServerAdminForm
    add_action = change_action = Action.MCP_SERVER_MANAGE
    list_display = ["server_name", "server_type", "endpoint", "organization", "updated_at"]
    list_filter = ["server_type"]
    search_fields = ["server_name", "server_url", "command", "id"]
    readonly_fields = ["env_keys", "custom_header_keys"]

    @admin.display(description="endpoint")
    def endpoint(self, server: MCPServer) -> str:
        return server.command if server.server_type == MCPServer.Type.STDIO else server.server_url

    @admin.display(description="environment variables set")
    def env_keys(self, server: MCPServer) -> str:
        return ", ".join(sorted(server.env)) or "-"

    @admin.display(description="custom headers set")
    def custom_header_keys(self, server: MCPServer) -> str:
        return ", ".join(sorted(server.custom_headers)) or "-"
