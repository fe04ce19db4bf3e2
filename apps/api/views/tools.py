"""/v1/tools (create, upsert, list, retrieve, modify, delete, search, run) and the per-agent approval switch:
thin adapters over apps.tools services and selectors."""

from __future__ import annotations

from django.http import HttpResponse
from django.urls import re_path
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.agents import services as agent_services
from apps.api.base import OrgApiView
from apps.api.serializers import tools as s
from apps.core.errors import InvalidInput
from apps.core.ids import new_id, new_message_id
from apps.core.pagination import PageParams, paginate
from apps.tools import selectors as tool_selectors
from apps.tools import services as tool_services
from apps.tools.models import Tool

JSON_NULL = b"null"
"""Letta answers SDK 1.x with JSON null where it once returned the agent (approval, delete)."""


def _json_null() -> HttpResponse:
    return HttpResponse(JSON_NULL, content_type="application/json")


def _split_list(values: list[str]) -> list[str]:
    """Repeated keys and/or comma-separated values, as Letta accepts them for ids and tool types."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def _tool_types(values: list[str], param: str) -> list[str]:
    types = _split_list(values)
    for tool_type in types:
        if tool_type not in Tool.Type.values:
            raise InvalidInput(
                f"Invalid {param} '{tool_type}'. Must be one of: {', '.join(Tool.Type.values)}"
            )
    return types


def _create_fields(request: Request) -> dict[str, object]:
    data = s.ToolCreateIn(data=request.data)
    data.is_valid(raise_exception=True)
    return {key: value for key, value in data.validated_data.items() if value is not None}


class ToolListCreateApi(OrgApiView):
    @extend_schema(operation_id="list_tools", responses=s.ToolResponse(many=True))
    def get(self, request: Request) -> Response:
        query = request.query_params
        tool_services.tool_upsert_builtins(actor=self.actor)  # Letta lists its built-ins in every org
        names = [*([query["name"]] if query.get("name") else []), *query.getlist("names")]
        qs = tool_selectors.tool_list_filtered(
            actor=self.actor,
            names=names,
            tool_ids=_split_list(query.getlist("tool_ids")),
            search=query.get("search"),
            tool_types=_tool_types(query.getlist("tool_types"), "tool_type"),
            exclude_tool_types=_tool_types(query.getlist("exclude_tool_types"), "tool_type"),
            letta_only=query.get("return_only_letta_tools") == "true",
        )
        page = paginate(qs, PageParams.from_query(query))
        return Response(s.ToolResponse(page, many=True).data)

    @extend_schema(operation_id="create_tool", request=s.ToolCreateIn, responses=s.ToolResponse)
    def post(self, request: Request) -> Response:
        tool = tool_services.tool_upsert(actor=self.actor, **_create_fields(request))
        return Response(s.ToolResponse(tool).data)

    @extend_schema(operation_id="upsert_tool", request=s.ToolCreateIn, responses=s.ToolResponse)
    def put(self, request: Request) -> Response:
        tool = tool_services.tool_upsert(actor=self.actor, **_create_fields(request))
        return Response(s.ToolResponse(tool).data)


class ToolSearchApi(OrgApiView):
    @extend_schema(
        operation_id="search_tools", request=s.ToolSearchIn, responses=s.ToolSearchResultOut(many=True)
    )
    def post(self, request: Request) -> Response:
        data = s.ToolSearchIn(data=request.data)
        data.is_valid(raise_exception=True)
        params = data.validated_data
        ranked = tool_selectors.tool_search(
            actor=self.actor,
            query=params.get("query"),
            tool_types=params.get("tool_types"),
            tags=params.get("tags"),
            limit=params["limit"],
        )
        results = [
            {
                "tool": tool,
                "combined_score": score,
                "fts_rank": rank,
                "vector_rank": None,
                "embedded_text": None,
            }
            for rank, (tool, score) in enumerate(ranked, start=1)
        ]
        return Response(s.ToolSearchResultOut(results, many=True).data)


class ToolRunApi(OrgApiView):
    @extend_schema(operation_id="run_tool_from_source", request=s.ToolRunIn, responses=s.ToolRunOut)
    def post(self, request: Request) -> Response:
        data = s.ToolRunIn(data=request.data)
        data.is_valid(raise_exception=True)
        params = data.validated_data
        outcome = tool_services.tool_run(
            actor=self.actor,
            args=params["args"],
            source_code=params.get("source_code"),
            tool_id=params.get("tool_id"),
            name=params.get("name"),
            env_vars=params.get("env_vars"),
        )
        message = {
            "id": new_message_id(),
            "date": timezone.now(),
            "message_type": "tool_return_message",
            "name": outcome.name,
            "tool_call_id": new_id("call"),
            "tool_return": outcome.tool_return,
            "status": outcome.status,
            "stdout": outcome.stdout,
            "stderr": outcome.stderr,
            "sandbox": outcome.sandbox,
        }
        return Response(s.ToolRunOut(message).data)


class ToolDetailApi(OrgApiView):
    @extend_schema(operation_id="retrieve_tool", responses=s.ToolResponse)
    def get(self, request: Request, tool_id: str) -> Response:
        tool = tool_selectors.tool_get(actor=self.actor, tool_id=tool_id)
        return Response(s.ToolResponse(tool).data)

    @extend_schema(operation_id="modify_tool", request=s.ToolUpdateIn, responses=s.ToolResponse)
    def patch(self, request: Request, tool_id: str) -> Response:
        data = s.ToolUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        tool = tool_services.tool_update(actor=self.actor, tool_id=tool_id, **data.changes())
        return Response(s.ToolResponse(tool).data)

    @extend_schema(operation_id="delete_tool", responses={200: None})
    def delete(self, request: Request, tool_id: str) -> HttpResponse:
        tool_services.tool_delete(actor=self.actor, tool_id=tool_id)
        return _json_null()


class AgentToolApprovalApi(OrgApiView):
    @extend_schema(operation_id="modify_approval_for_tool", request=s.ApprovalIn, responses={200: None})
    def patch(self, request: Request, agent_id: str, tool_name: str) -> HttpResponse:
        deprecated_query = request.query_params.get("requires_approval")
        body = (
            request.data
            if request.data or deprecated_query is None
            else {"requires_approval": deprecated_query}
        )
        data = s.ApprovalIn(data=body)
        data.is_valid(raise_exception=True)
        agent = agent_selectors.agent_get(actor=self.actor, agent_id=agent_id)
        rules = tool_services.tool_rules_with_approval(
            agent.tool_rules, tool_name=tool_name, requires_approval=data.validated_data["requires_approval"]
        )
        agent_services.agent_set_tool_rules(actor=self.actor, agent_id=agent.id, tool_rules=rules)
        return _json_null()


urlpatterns = [
    re_path(r"^v1/tools/?$", ToolListCreateApi.as_view(), name="tools"),
    re_path(r"^v1/tools/search/?$", ToolSearchApi.as_view(), name="tools-search"),
    re_path(r"^v1/tools/run/?$", ToolRunApi.as_view(), name="tools-run"),
    re_path(r"^v1/tools/(?P<tool_id>[^/]+)/?$", ToolDetailApi.as_view(), name="tool-detail"),
    re_path(
        r"^v1/agents/(?P<agent_id>[^/]+)/tools/approval/(?P<tool_name>[^/]+)/?$",
        AgentToolApprovalApi.as_view(),
        name="agent-tool-approval",
    ),
]
