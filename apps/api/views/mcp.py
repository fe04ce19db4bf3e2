"""/v1/mcp-servers (Letta's MCP server router) and the legacy live listing / add-one-tool routes under
/v1/tools/mcp/servers that the ADE uses: thin adapters over the tools app's MCP selectors and services.

Reads are open to every member; creating, changing, deleting, refreshing, running and live listing are
for owners and admins (others get 404, as for another organisation's server). A server that is down or
too slow is 502 with `x-should-retry: false` (the SDK would otherwise retry a long timeout twice).
"""

from __future__ import annotations

from django.http import HttpResponse
from django.urls import re_path
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.agents import services as agent_services
from apps.api.base import OrgApiView
from apps.api.serializers import mcp as s
from apps.api.serializers.tools import ToolResponse
from apps.tools import selectors as tool_selectors
from apps.tools import services as tool_services
from apps.tools.errors import McpServerError


class McpApiView(OrgApiView):
    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, McpServerError):
            detail = exc.message
            if exc.stderr_tail:
                detail += f"\nThe server's stderr ends with:\n{exc.stderr_tail}"
            response = Response({"detail": detail, "code": exc.code}, status=status.HTTP_502_BAD_GATEWAY)
            response["x-should-retry"] = "false"
            return response
        return super().handle_exception(exc)


class McpServerListCreateApi(McpApiView):
    @extend_schema(operation_id="mcp_list_mcp_servers", responses=s.McpServerOut(many=True))
    def get(self, request: Request) -> Response:
        servers = tool_selectors.mcp_server_list(actor=self.actor)
        return Response(s.McpServerOut(servers, many=True).data)

    @extend_schema(
        operation_id="mcp_create_mcp_server", request=s.McpServerCreateIn, responses=s.McpServerOut
    )
    def post(self, request: Request) -> Response:
        data = s.McpServerCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        server, _ = tool_services.mcp_server_create(actor=self.actor, **data.validated_data)
        return Response(s.McpServerOut(server).data)


class McpServerDetailApi(McpApiView):
    @extend_schema(operation_id="mcp_get_mcp_server", responses=s.McpServerOut)
    def get(self, request: Request, mcp_server_id: str) -> Response:
        server = tool_selectors.mcp_server_get(actor=self.actor, server_id=mcp_server_id)
        return Response(s.McpServerOut(server).data)

    @extend_schema(
        operation_id="mcp_update_mcp_server", request=s.McpServerUpdateIn, responses=s.McpServerOut
    )
    def patch(self, request: Request, mcp_server_id: str) -> Response:
        data = s.McpServerUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        current = tool_selectors.mcp_server_get(actor=self.actor, server_id=mcp_server_id)
        server = tool_services.mcp_server_update(
            actor=self.actor, server_id=current.id, **data.changes(current_type=current.server_type)
        )
        return Response(s.McpServerOut(server).data)

    @extend_schema(operation_id="mcp_delete_mcp_server", responses={204: None})
    def delete(self, request: Request, mcp_server_id: str) -> HttpResponse:
        tool_services.mcp_server_delete(actor=self.actor, server_id=mcp_server_id)
        return HttpResponse(status=status.HTTP_204_NO_CONTENT)


class McpServerToolListApi(McpApiView):
    @extend_schema(operation_id="mcp_list_mcp_tools_by_server", responses=ToolResponse(many=True))
    def get(self, request: Request, mcp_server_id: str) -> Response:
        server = tool_selectors.mcp_server_get(actor=self.actor, server_id=mcp_server_id)
        tools = tool_selectors.mcp_server_tools(actor=self.actor, server=server).order_by("name")
        return Response(ToolResponse(tools, many=True).data)


class McpServerToolDetailApi(McpApiView):
    @extend_schema(operation_id="mcp_get_mcp_tool", responses=ToolResponse)
    def get(self, request: Request, mcp_server_id: str, tool_id: str) -> Response:
        server = tool_selectors.mcp_server_get(actor=self.actor, server_id=mcp_server_id)
        tool = tool_selectors.mcp_server_tool_get(actor=self.actor, server=server, tool_id=tool_id)
        return Response(ToolResponse(tool).data)


class McpServerToolRunApi(McpApiView):
    @extend_schema(operation_id="mcp_run_tool", request=s.McpToolRunIn, responses=s.ToolExecutionResultOut)
    def post(self, request: Request, mcp_server_id: str, tool_id: str) -> Response:
        data = s.McpToolRunIn(data=request.data)
        data.is_valid(raise_exception=True)
        server = tool_selectors.mcp_server_get(actor=self.actor, server_id=mcp_server_id)
        tool = tool_selectors.mcp_server_tool_get(actor=self.actor, server=server, tool_id=tool_id)
        result = tool_services.mcp_tool_run(
            actor=self.actor, server=server, tool=tool, arguments=data.validated_data["args"]
        )
        return Response(s.ToolExecutionResultOut(result).data)


class McpServerRefreshApi(McpApiView):
    @extend_schema(
        operation_id="mcp_refresh_mcp_server_tools",
        request=None,
        parameters=[OpenApiParameter("agent_id", str, required=False)],
        responses=s.RefreshSummaryOut,
    )
    def patch(self, request: Request, mcp_server_id: str) -> Response:
        agent_id = request.query_params.get("agent_id")
        server = tool_selectors.mcp_server_get(actor=self.actor, server_id=mcp_server_id)
        if agent_id:
            agent_selectors.agent_get(actor=self.actor, agent_id=agent_id)  # 404 before anything changes
        summary = tool_services.mcp_server_sync_tools(actor=self.actor, server=server)
        attached = []
        if agent_id:
            for tool in summary.added_tools:
                agent_services.agent_attach_tool(actor=self.actor, agent_id=agent_id, tool_id=tool.id)
                attached.append(tool.name)
        body = {
            "added": summary.added,
            "updated": summary.updated,
            "unchanged": summary.unchanged,
            "deleted": summary.deleted,
            "skipped": summary.skipped,
            "attached_to_agent": attached,
        }
        return Response(s.RefreshSummaryOut(body).data)


class LegacyMcpServerToolsApi(McpApiView):
    @extend_schema(operation_id="list_mcp_tools_by_server", responses=s.McpToolOut(many=True))
    def get(self, request: Request, mcp_server_name: str) -> Response:
        server = tool_selectors.mcp_server_get_by_name(actor=self.actor, server_name=mcp_server_name)
        remote = tool_selectors.mcp_server_remote_tools(actor=self.actor, server=server)
        return Response(s.McpToolOut(remote, many=True).data)


class McpResyncOut(serializers.Serializer):
    """Letta's MCPServerResyncResult (added, updated, deleted tool names), plus what was unchanged and
    what was skipped and why."""

    added = serializers.ListField(child=serializers.CharField())
    updated = serializers.ListField(child=serializers.CharField())
    deleted = serializers.ListField(child=serializers.CharField())
    unchanged = serializers.ListField(child=serializers.CharField())
    skipped = s.SkippedToolOut(many=True)


class LegacyMcpServerResyncApi(McpApiView):
    @extend_schema(
        operation_id="resync_mcp_server_tools",
        request=None,
        parameters=[OpenApiParameter("agent_id", str, required=False)],
        responses=McpResyncOut,
    )
    def post(self, request: Request, mcp_server_name: str) -> Response:
        """Make the server's registered tools match what it lists now: new ones added, changed schemas
        updated, tools it no longer has deleted (Letta's resync; nothing is attached to the agent)."""
        server = tool_selectors.mcp_server_get_by_name(actor=self.actor, server_name=mcp_server_name)
        agent_id = request.query_params.get("agent_id")
        if agent_id:
            agent_selectors.agent_get(actor=self.actor, agent_id=agent_id)  # 404 before anything changes
        summary = tool_services.mcp_server_sync_tools(actor=self.actor, server=server)
        body = {
            "added": summary.added,
            "updated": summary.updated,
            "deleted": summary.deleted,
            "unchanged": summary.unchanged,
            "skipped": summary.skipped,
        }
        return Response(McpResyncOut(body).data)


class LegacyMcpToolAddApi(McpApiView):
    @extend_schema(operation_id="add_mcp_tool", request=None, responses=ToolResponse)
    def post(self, request: Request, mcp_server_name: str, mcp_tool_name: str) -> Response:
        server = tool_selectors.mcp_server_get_by_name(actor=self.actor, server_name=mcp_server_name)
        tool = tool_services.mcp_tool_register(actor=self.actor, server=server, tool_name=mcp_tool_name)
        return Response(ToolResponse(tool).data)


_SERVER = r"^v1/mcp-servers/(?P<mcp_server_id>[^/]+)"
_LEGACY = r"^v1/tools/mcp/servers/(?P<mcp_server_name>[^/]+)"

urlpatterns = [
    re_path(r"^v1/mcp-servers/?$", McpServerListCreateApi.as_view(), name="mcp-servers"),
    re_path(rf"{_SERVER}/?$", McpServerDetailApi.as_view(), name="mcp-server-detail"),
    re_path(rf"{_SERVER}/refresh/?$", McpServerRefreshApi.as_view(), name="mcp-server-refresh"),
    re_path(rf"{_SERVER}/tools/?$", McpServerToolListApi.as_view(), name="mcp-server-tools"),
    re_path(
        rf"{_SERVER}/tools/(?P<tool_id>[^/]+)/?$", McpServerToolDetailApi.as_view(), name="mcp-server-tool"
    ),
    re_path(
        rf"{_SERVER}/tools/(?P<tool_id>[^/]+)/run/?$",
        McpServerToolRunApi.as_view(),
        name="mcp-server-tool-run",
    ),
    re_path(rf"{_LEGACY}/tools/?$", LegacyMcpServerToolsApi.as_view(), name="mcp-legacy-server-tools"),
    # Before {mcp_tool_name}, as in Letta: "resync" is the action, not a tool to add.
    re_path(rf"{_LEGACY}/resync/?$", LegacyMcpServerResyncApi.as_view(), name="mcp-legacy-server-resync"),
    re_path(
        rf"{_LEGACY}/(?P<mcp_tool_name>[^/]+)/?$", LegacyMcpToolAddApi.as_view(), name="mcp-legacy-tool-add"
    ),
]
