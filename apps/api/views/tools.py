"""/v1/tools (create, upsert, list, count, retrieve, modify, delete, search, run, add-base-tools,
generate-schema) and the per-agent approval switch: thin adapters over apps.tools services and selectors."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import HttpResponse
from django.urls import re_path
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.agents import services as agent_services
from apps.api.base import OrgApiView
from apps.api.serializers import tools as s
from apps.core.actor import Actor
from apps.core.errors import InvalidInput
from apps.core.ids import new_id, new_message_id
from apps.core.pagination import PageParams, paginate
from apps.tools import selectors as tool_selectors
from apps.tools import services as tool_services
from apps.tools.models import Tool
from apps.tools.selectors import LETTA_TOOL_TYPE_PREFIX

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


def _filtered_tools(request: Request, actor: Actor) -> QuerySet[Tool]:
    """The organisation's tools under the list filters Letta's list and count endpoints share."""
    query = request.query_params
    names = [*([query["name"]] if query.get("name") else []), *query.getlist("names")]
    return tool_selectors.tool_list_filtered(
        actor=actor,
        names=names,
        tool_ids=_split_list(query.getlist("tool_ids")),
        search=query.get("search"),
        tool_types=_tool_types(query.getlist("tool_types"), "tool_type"),
        exclude_tool_types=_tool_types(query.getlist("exclude_tool_types"), "tool_type"),
        letta_only=query.get("return_only_letta_tools") == "true",
    )


class ToolListCreateApi(OrgApiView):
    @extend_schema(operation_id="list_tools", responses=s.ToolResponse(many=True))
    def get(self, request: Request) -> Response:
        tool_services.tool_upsert_builtins(actor=self.actor)  # Letta lists its built-ins in every org
        page = paginate(_filtered_tools(request, self.actor), PageParams.from_query(request.query_params))
        return Response(s.ToolResponse(page, many=True).data)

    @extend_schema(operation_id="create_tool", request=s.ToolCreateIn, responses=s.ToolResponse)
    def post(self, request: Request) -> Response:
        tool = tool_services.tool_upsert(actor=self.actor, **_create_fields(request))
        return Response(s.ToolResponse(tool).data)

    @extend_schema(operation_id="upsert_tool", request=s.ToolCreateIn, responses=s.ToolResponse)
    def put(self, request: Request) -> Response:
        tool = tool_services.tool_upsert(actor=self.actor, **_create_fields(request))
        return Response(s.ToolResponse(tool).data)


class ToolCountApi(OrgApiView):
    @extend_schema(
        operation_id="count_tools",
        parameters=[OpenApiParameter("exclude_letta_tools", bool, required=False)],
        responses={200: OpenApiTypes.INT},
    )
    def get(self, request: Request) -> Response:
        """How many tools the list would show with the same filters (Letta's count_tools, which also
        takes `exclude_letta_tools`)."""
        qs = _filtered_tools(request, self.actor)
        if request.query_params.get("exclude_letta_tools") == "true":
            qs = qs.exclude(tool_type__startswith=LETTA_TOOL_TYPE_PREFIX)
        return Response(qs.count())


class ToolAddBaseToolsApi(OrgApiView):
    @extend_schema(operation_id="add_base_tools", request=None, responses=s.ToolResponse(many=True))
    def post(self, request: Request) -> Response:
        """Create or refresh every Letta base tool in the organisation; answers them all, by name."""
        tools = tool_services.tool_upsert_builtins(actor=self.actor)
        return Response(s.ToolResponse(sorted(tools.values(), key=lambda t: t.name), many=True).data)


class ToolGenerateSchemaApi(OrgApiView):
    @extend_schema(
        operation_id="generate_json_schema", request=s.GenerateSchemaIn, responses={200: OpenApiTypes.OBJECT}
    )
    def post(self, request: Request) -> Response:
        """The JSON schema a tool with this source would get (read from the source, never run)."""
        data = s.GenerateSchemaIn(data=request.data)
        data.is_valid(raise_exception=True)
        schema = tool_services.tool_generate_schema(
            source_code=data.validated_data["code"], source_type=data.validated_data["source_type"]
        )
        return Response(schema)


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
            # Letta names the function to call after json_schema when it is given.
            name=params.get("name") or (params.get("json_schema") or {}).get("name"),
            env_vars=params.get("env_vars"),
            pip_requirements=params.get("pip_requirements"),
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
    # Static paths before /v1/tools/{tool_id}, which would take them for ids.
    re_path(r"^v1/tools/count/?$", ToolCountApi.as_view(), name="tools-count"),
    re_path(r"^v1/tools/add-base-tools/?$", ToolAddBaseToolsApi.as_view(), name="tools-add-base-tools"),
    re_path(r"^v1/tools/generate-schema/?$", ToolGenerateSchemaApi.as_view(), name="tools-generate-schema"),
    re_path(r"^v1/tools/search/?$", ToolSearchApi.as_view(), name="tools-search"),
    re_path(r"^v1/tools/run/?$", ToolRunApi.as_view(), name="tools-run"),
    re_path(r"^v1/tools/(?P<tool_id>[^/]+)/?$", ToolDetailApi.as_view(), name="tool-detail"),
    re_path(
        r"^v1/agents/(?P<agent_id>[^/]+)/tools/approval/(?P<tool_name>[^/]+)/?$",
        AgentToolApprovalApi.as_view(),
        name="agent-tool-approval",
    ),
]
