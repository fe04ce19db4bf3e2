"""/v1/agents (CRUD, count, tools and running one, core-memory blocks) and /v1/tags: thin adapters over
agents' services and selectors."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet, Value
from django.db.models.functions import Coalesce
from django.http import HttpResponse
from django.urls import re_path
from drf_spectacular.plumbing import build_array_type, build_basic_type
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.agents import services as agent_services
from apps.agents.models import Agent, StopReason
from apps.api.base import OrgApiView
from apps.api.serializers import agents as s
from apps.api.serializers.common import BlockOut, BlockUpdateIn, validated_query
from apps.api.serializers.strict import CLOUD_ONLY, refuse_unsupported
from apps.api.serializers.tools import AgentToolRunIn, AgentToolRunOut, ToolResponse
from apps.core.actor import Actor
from apps.core.pagination import PageParams, paginate
from apps.folders import selectors as folder_selectors
from apps.folders import services as folder_services
from apps.identities import selectors as identity_selectors
from apps.identities import services as identity_services

AGENT_TOOLS_DEFAULT_LIMIT = 10  # Letta's default for GET /v1/agents/{id}/tools
AGENT_BLOCKS_DEFAULT_LIMIT = 100  # Letta's default for GET /v1/agents/{id}/core-memory/blocks


def is_sdk_v1(request: Request) -> bool:
    """Letta's test for a 1.x client (its `is_1_0_sdk_version`), on which some endpoints change: agent lists
    and retrieves leave out relationships not asked for, attach/detach answer null. A 1.x client is the
    Stainless SDK (its X-Stainless-Package-Version header), a request with no User-Agent at all (curl -A '',
    a bare HTTP library: nothing pinned), or a `letta-client/1.x` or `@letta-ai/letta-client/1.x` one."""
    if "X-Stainless-Package-Version" in request.headers:
        return True
    user_agent = request.headers.get("User-Agent")
    if not user_agent:
        return True
    parts = user_agent.split("/")
    if not (parts[:-1] == ["letta-client"] or parts[:-1] == ["@letta-ai", "letta-client"]):
        return False
    version = parts[-1].split("-")[0].split("a")[0].split("b")[0]
    return "." in version and version.split(".")[0] == "1"


def requested_relationships(request: Request, *, legacy_by_default: bool = True) -> frozenset[str]:
    """What this request's AgentStates carry (serializers.agents.requested_relationships). Only the agents
    list and retrieve give a pre-1.0 client every relationship by default (`legacy_by_default`)."""
    return s.requested_relationships(
        request.query_params, legacy_client=legacy_by_default and not is_sdk_v1(request)
    )


def json_null() -> HttpResponse:
    """A JSON `null` body: DRF renders Response(None) as an empty body, which the SDK cannot decode."""
    return HttpResponse(b"null", content_type="application/json")


NEVER = datetime(1970, 1, 1, tzinfo=UTC)  # the last_run_completion of an agent that never ran, for ordering
AGENT_ORDER_KEYS = {
    "created_at": "created_at",
    "updated_at": "updated_at",
    "last_run_completion": "run_order",
}
"""Letta's order_by values and the column each pages by (agents that never ran come first, ascending)."""


class AgentListQueryIn(serializers.Serializer):
    name = serializers.CharField(required=False)
    query_text = serializers.CharField(required=False)
    match_all_tags = serializers.BooleanField(required=False, default=False)
    created_by_id = serializers.CharField(required=False)
    last_stop_reason = serializers.ChoiceField(choices=[r.value for r in StopReason], required=False)
    ascending = serializers.BooleanField(required=False)
    identity_id = serializers.CharField(required=False)
    order_by = serializers.ChoiceField(choices=list(AGENT_ORDER_KEYS), required=False)
    sort_by = serializers.ChoiceField(choices=list(AGENT_ORDER_KEYS), required=False)  # deprecated order_by
    project_id = serializers.CharField(required=False)
    template_id = serializers.CharField(required=False)
    base_template_id = serializers.CharField(required=False)
    show_hidden_agents = serializers.BooleanField(required=False, default=False, allow_null=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        refuse_unsupported(
            attrs, {key: CLOUD_ONLY for key in ("project_id", "template_id", "base_template_id")}
        )
        return attrs


def _agent_list(
    actor: Actor, request: Request, *, include: frozenset[str] = frozenset()
) -> tuple[QuerySet[Agent], str]:
    """The agents a list or count request selects (prefetched with `include`), and the column its pages
    are ordered by."""
    params = validated_query(AgentListQueryIn, request.query_params)
    filters: dict[str, Any] = {
        key: params[key]
        for key in ("name", "query_text", "match_all_tags", "created_by_id", "last_stop_reason")
        if key in params
    }
    filters["show_hidden"] = bool(params.get("show_hidden_agents"))
    qs = agent_selectors.agent_state_list(
        actor=actor, tags=request.query_params.getlist("tags"), include=include, **filters
    )
    qs = identity_selectors.filter_agents_by_identity(
        qs,
        identity_id=params.get("identity_id"),
        identifier_keys=request.query_params.getlist("identifier_keys"),
    )
    key = AGENT_ORDER_KEYS[params.get("order_by") or params.get("sort_by") or "created_at"]
    if key == "run_order":
        qs = qs.annotate(run_order=Coalesce("last_run_completion", Value(NEVER)))
    return qs, key


def _page_params(request: Request, *, default_limit: int = 50) -> PageParams:
    """Letta's cursors, plus the deprecated `ascending` flag when `order` is not given."""
    params = request.query_params.dict()
    if "order" not in params and "ascending" in params:
        params["order"] = "asc" if params["ascending"].lower() == "true" else "desc"
    return PageParams.from_query(params, default_limit=default_limit)


def _set_identities(actor: Actor, agent_id: str, identity_ids: list[str] | None) -> None:
    """CreateAgent's / UpdateAgent's identity_ids: absent or null keeps them; a list is the agent's set."""
    if identity_ids is not None:
        identity_services.agent_identities_set(actor=actor, agent_id=agent_id, identity_ids=identity_ids)


class AgentListCreateApi(OrgApiView):
    @extend_schema(
        operation_id="list_agents",
        parameters=[
            AgentListQueryIn,
            OpenApiParameter("tags", str, many=True),
            OpenApiParameter("identifier_keys", str, many=True),
            s.AgentIncludeIn,
        ],
        responses=s.AgentStateOut(many=True),
    )
    def get(self, request: Request) -> Response:
        include = requested_relationships(request)
        qs, key = _agent_list(self.actor, request, include=include)
        page = paginate(folder_selectors.with_file_limits(qs), _page_params(request), key=key)
        return Response(s.agent_states(page, actor=self.actor, include=include))

    @extend_schema(operation_id="create_agent", request=s.AgentCreateIn, responses=s.AgentStateOut)
    def post(self, request: Request) -> Response:
        data = s.AgentCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        with transaction.atomic():  # a folder that cannot be attached leaves no agent behind
            agent = agent_services.agent_create_with_settings(actor=self.actor, **data.to_service_kwargs())
            folder_services.agent_configure_files(actor=self.actor, agent_id=agent.id, **data.files_kwargs())
            _set_identities(self.actor, agent.id, data.validated_data.get(s.IDENTITY_FIELD))
        return self._state(agent.id)

    def _state(self, agent_id: str) -> Response:
        agent = agent_selectors.agent_state_get(actor=self.actor, agent_id=agent_id)
        return Response(s.agent_state(agent, actor=self.actor))


class AgentCountApi(OrgApiView):
    @extend_schema(
        operation_id="count_agents",
        parameters=[
            AgentListQueryIn,
            OpenApiParameter("tags", str, many=True),
            OpenApiParameter("identifier_keys", str, many=True),
        ],
        responses={200: OpenApiTypes.INT},
    )
    def get(self, request: Request) -> Response:
        """How many agents the list would show with the same filters (Letta's count_agents)."""
        qs, _key = _agent_list(self.actor, request)
        return Response(qs.count())


class AgentDetailApi(OrgApiView):
    @extend_schema(operation_id="retrieve_agent", parameters=[s.AgentIncludeIn], responses=s.AgentStateOut)
    def get(self, request: Request, agent_id: str) -> Response:
        include = requested_relationships(request)
        agent = agent_selectors.agent_state_get(actor=self.actor, agent_id=agent_id, include=include)
        return Response(s.agent_state(agent, actor=self.actor, include=include))

    @extend_schema(operation_id="modify_agent", request=s.AgentUpdateIn, responses=s.AgentStateOut)
    def patch(self, request: Request, agent_id: str) -> Response:
        data = s.AgentUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        with transaction.atomic():
            agent_services.agent_update(actor=self.actor, agent_id=agent_id, **data.to_service_kwargs())
            folder_services.agent_configure_files(actor=self.actor, agent_id=agent_id, **data.files_kwargs())
            _set_identities(self.actor, agent_id, data.validated_data.get(s.IDENTITY_FIELD))
        agent = agent_selectors.agent_state_get(actor=self.actor, agent_id=agent_id)
        return Response(s.agent_state(agent, actor=self.actor))

    @extend_schema(operation_id="delete_agent", responses={200: None})
    def delete(self, request: Request, agent_id: str) -> Response:
        agent_services.agent_delete(actor=self.actor, agent_id=agent_id)
        return Response({"message": f"Agent id={agent_id} successfully deleted"})


class AgentToolListApi(OrgApiView):
    @extend_schema(operation_id="list_tools_for_agent", responses=ToolResponse(many=True))
    def get(self, request: Request, agent_id: str) -> Response:
        qs = agent_selectors.agent_tool_list(actor=self.actor, agent_id=agent_id)
        page = paginate(qs, _page_params(request, default_limit=AGENT_TOOLS_DEFAULT_LIMIT))
        return Response(ToolResponse(page, many=True).data)


class AgentToolRunApi(OrgApiView):
    @extend_schema(operation_id="run_tool_for_agent", request=AgentToolRunIn, responses=AgentToolRunOut)
    def post(self, request: Request, agent_id: str, tool_name: str) -> Response:
        """Run one of the agent's tools now, as a turn would (its memory, its secrets, its sandbox)."""
        data = AgentToolRunIn(data=request.data)
        data.is_valid(raise_exception=True)
        result = agent_services.agent_tool_run(
            actor=self.actor, agent_id=agent_id, tool_name=tool_name, args=data.validated_data["args"]
        )
        failed = result.status == "error"
        stderr = list(result.stderr)
        if failed and result.return_value not in stderr:
            stderr.append(result.return_value)  # Letta answers no func_return for a failure: say why here
        body = {
            "status": result.status,
            "func_return": None if failed else result.return_value,
            "stdout": list(result.stdout),
            "stderr": stderr,
            "agent_state": None,  # deprecated in Letta, which always answers null
            "sandbox_config_fingerprint": None,
            "sandbox": result.sandbox,
        }
        return Response(AgentToolRunOut(body).data)


class _AgentStateOrNullApi(OrgApiView):
    """Letta answers these with the AgentState, or with null to 1.x SDKs (which type it Optional)."""

    def _answer(self, request: Request, agent_id: str) -> Response | HttpResponse:
        if is_sdk_v1(request):
            return json_null()
        agent = agent_selectors.agent_state_get(actor=self.actor, agent_id=agent_id)
        return Response(s.agent_state(agent, actor=self.actor))


class AgentToolAttachApi(_AgentStateOrNullApi):
    @extend_schema(operation_id="attach_tool_to_agent", request=None, responses=s.AgentStateOut)
    def patch(self, request: Request, agent_id: str, tool_id: str) -> Response | HttpResponse:
        agent_services.agent_attach_tool(actor=self.actor, agent_id=agent_id, tool_id=tool_id)
        return self._answer(request, agent_id)


class AgentToolDetachApi(_AgentStateOrNullApi):
    @extend_schema(operation_id="detach_tool_from_agent", request=None, responses=s.AgentStateOut)
    def patch(self, request: Request, agent_id: str, tool_id: str) -> Response | HttpResponse:
        agent_services.agent_detach_tool(actor=self.actor, agent_id=agent_id, tool_id=tool_id)
        return self._answer(request, agent_id)


class CoreMemoryBlockListApi(OrgApiView):
    @extend_schema(operation_id="list_core_memory_blocks", responses=BlockOut(many=True))
    def get(self, request: Request, agent_id: str) -> Response:
        qs = agent_selectors.agent_block_list(actor=self.actor, agent_id=agent_id)
        page = paginate(qs, _page_params(request, default_limit=AGENT_BLOCKS_DEFAULT_LIMIT))
        return Response(BlockOut(page, many=True).data)


class CoreMemoryBlockAttachApi(OrgApiView):
    @extend_schema(operation_id="attach_core_memory_block", request=None, responses=s.AgentStateOut)
    def patch(self, request: Request, agent_id: str, block_id: str) -> Response:
        agent_services.agent_attach_block(actor=self.actor, agent_id=agent_id, block_id=block_id)
        agent = agent_selectors.agent_state_get(actor=self.actor, agent_id=agent_id)
        return Response(s.agent_state(agent, actor=self.actor))


class CoreMemoryBlockDetachApi(OrgApiView):
    @extend_schema(operation_id="detach_core_memory_block", request=None, responses=s.AgentStateOut)
    def patch(self, request: Request, agent_id: str, block_id: str) -> Response:
        agent_services.agent_detach_block(actor=self.actor, agent_id=agent_id, block_id=block_id)
        agent = agent_selectors.agent_state_get(actor=self.actor, agent_id=agent_id)
        return Response(s.agent_state(agent, actor=self.actor))


class CoreMemoryBlockDetailApi(OrgApiView):
    @extend_schema(operation_id="retrieve_core_memory_block", responses=BlockOut)
    def get(self, request: Request, agent_id: str, block_label: str) -> Response:
        block = agent_selectors.agent_block_get_by_label(
            actor=self.actor, agent_id=agent_id, label=block_label
        )
        return Response(BlockOut(block).data)

    @extend_schema(operation_id="modify_core_memory_block", request=BlockUpdateIn, responses=BlockOut)
    def patch(self, request: Request, agent_id: str, block_label: str) -> Response:
        data = BlockUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        block = agent_services.agent_block_update_by_label(
            actor=self.actor, agent_id=agent_id, block_label=block_label, **data.validated_data
        )
        return Response(BlockOut(block).data)


class TagListQueryIn(serializers.Serializer):
    name = serializers.CharField(required=False)
    query_text = serializers.CharField(required=False)
    after = serializers.CharField(required=False)
    before = serializers.CharField(required=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=50)
    order = serializers.ChoiceField(choices=["asc", "desc"], required=False, default="asc")


class TagListApi(OrgApiView):
    @extend_schema(
        operation_id="list_tags",
        parameters=[TagListQueryIn],
        responses={200: build_array_type(build_basic_type(OpenApiTypes.STR))},
    )
    def get(self, request: Request) -> Response:
        query = TagListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        q: dict[str, Any] = dict(query.validated_data)
        tags = agent_selectors.agent_tag_list(
            actor=self.actor,
            query_text=q.get("name") or q.get("query_text"),
            after=q.get("after"),
            before=q.get("before"),
            limit=q["limit"],
            order=q["order"],
        )
        return Response(tags)


AGENT = r"(?P<agent_id>(?!import/?$)[^/]+)"  # /v1/agents/import belongs to the import endpoint

urlpatterns = [
    re_path(r"^v1/agents/?$", AgentListCreateApi.as_view(), name="agents"),
    re_path(r"^v1/agents/count/?$", AgentCountApi.as_view(), name="agents-count"),  # before {agent_id}
    re_path(rf"^v1/agents/{AGENT}/?$", AgentDetailApi.as_view(), name="agent-detail"),
    re_path(rf"^v1/agents/{AGENT}/tools/?$", AgentToolListApi.as_view(), name="agent-tools"),
    re_path(
        rf"^v1/agents/{AGENT}/tools/attach/(?P<tool_id>[^/]+)/?$",
        AgentToolAttachApi.as_view(),
        name="agent-tool-attach",
    ),
    re_path(
        rf"^v1/agents/{AGENT}/tools/detach/(?P<tool_id>[^/]+)/?$",
        AgentToolDetachApi.as_view(),
        name="agent-tool-detach",
    ),
    # After attach/ and detach/, as in Letta: .../tools/attach/run attaches the tool with id "run".
    re_path(
        rf"^v1/agents/{AGENT}/tools/(?P<tool_name>[^/]+)/run/?$",
        AgentToolRunApi.as_view(),
        name="agent-tool-run",
    ),
    re_path(
        rf"^v1/agents/{AGENT}/core-memory/blocks/?$", CoreMemoryBlockListApi.as_view(), name="agent-blocks"
    ),
    # attach/ and detach/ before {block_label}: a label may literally be "attach".
    re_path(
        rf"^v1/agents/{AGENT}/core-memory/blocks/attach/(?P<block_id>[^/]+)/?$",
        CoreMemoryBlockAttachApi.as_view(),
        name="agent-block-attach",
    ),
    re_path(
        rf"^v1/agents/{AGENT}/core-memory/blocks/detach/(?P<block_id>[^/]+)/?$",
        CoreMemoryBlockDetachApi.as_view(),
        name="agent-block-detach",
    ),
    # Last, and the label may hold slashes (git memory's `system/human`, `skills/x`; the SDK sends them
    # unencoded): anything after blocks/ but a trailing slash.
    re_path(
        rf"^v1/agents/{AGENT}/core-memory/blocks/(?P<block_label>.+?)/?$",
        CoreMemoryBlockDetailApi.as_view(),
        name="agent-block-detail",
    ),
    re_path(r"^v1/tags/?$", TagListApi.as_view(), name="tags"),
]
