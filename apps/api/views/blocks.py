"""/v1/blocks: thin adapters over services and selectors."""

from __future__ import annotations

from django.db.models import QuerySet
from django.urls import re_path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.api.base import OrgApiView
from apps.api.serializers import agents as agent_s
from apps.api.serializers import blocks as block_s
from apps.api.serializers import common as s
from apps.api.views.agents import requested_relationships
from apps.core.actor import Actor
from apps.core.pagination import PageParams, paginate
from apps.identities import selectors as identity_selectors
from apps.memory import selectors as memory_selectors
from apps.memory import services as memory_services
from apps.memory.models import Block

REPEATED_BLOCK_FILTERS = [
    OpenApiParameter("tags", str, many=True),
    OpenApiParameter("identifier_keys", str, many=True),
    OpenApiParameter("connected_to_agents_count_eq", int, many=True),
]


def _filtered_blocks(actor: Actor, request: Request) -> QuerySet[Block]:
    filters = block_s.block_filters(request.query_params)
    qs = memory_selectors.block_list(
        actor=actor, label=filters.pop("label", None), templates_only=bool(filters.pop("templates_only"))
    )
    qs = identity_selectors.filter_blocks_by_identity(
        qs, identity_id=filters.pop("identity_id", None), identifier_keys=filters.pop("identifier_keys")
    )
    return memory_selectors.block_filter(qs, **filters)


class BlockListCreateApi(OrgApiView):
    @extend_schema(
        operation_id="list_blocks",
        parameters=[block_s.BlockListQueryIn, *REPEATED_BLOCK_FILTERS],
        responses=s.BlockOut(many=True),
    )
    def get(self, request: Request) -> Response:
        qs = _filtered_blocks(self.actor, request)
        page = paginate(qs, PageParams.from_query(request.query_params))
        return Response(s.BlockOut(page, many=True).data)

    @extend_schema(operation_id="create_block", request=s.BlockCreateIn, responses=s.BlockOut)
    def post(self, request: Request) -> Response:
        data = s.BlockCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        fields = {k: v for k, v in data.validated_data.items() if v is not None}
        block = memory_services.block_create(actor=self.actor, **fields)
        return Response(s.BlockOut(block).data)


class BlockCountApi(OrgApiView):
    @extend_schema(
        operation_id="count_blocks",
        parameters=[block_s.BlockListQueryIn, *REPEATED_BLOCK_FILTERS],
        responses={200: OpenApiTypes.INT},
    )
    def get(self, request: Request) -> Response:
        """How many blocks the list would show with the same filters."""
        return Response(_filtered_blocks(self.actor, request).count())


class BlockAgentListApi(OrgApiView):
    @extend_schema(
        operation_id="list_agents_for_block",
        parameters=[agent_s.AgentIncludeIn],
        responses=agent_s.AgentStateOut(many=True),
    )
    def get(self, request: Request, block_id: str) -> Response:
        """The agents the block is attached to. Raises BlockNotFound (404) first."""
        memory_selectors.block_get(actor=self.actor, block_id=block_id)
        include = requested_relationships(request, legacy_by_default=False)
        qs = agent_selectors.agent_state_queryset(actor=self.actor, include=include).filter(
            block_attachments__block_id=block_id
        )
        page = paginate(qs, PageParams.from_query(request.query_params))
        return Response(agent_s.agent_states(page, actor=self.actor, include=include))


class BlockDetailApi(OrgApiView):
    @extend_schema(operation_id="retrieve_block", responses=s.BlockOut)
    def get(self, request: Request, block_id: str) -> Response:
        block = memory_selectors.block_get(actor=self.actor, block_id=block_id)
        return Response(s.BlockOut(block).data)

    @extend_schema(operation_id="modify_block", request=s.BlockUpdateIn, responses=s.BlockOut)
    def patch(self, request: Request, block_id: str) -> Response:
        data = s.BlockUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        block = memory_services.block_update(actor=self.actor, block_id=block_id, **data.validated_data)
        return Response(s.BlockOut(block).data)

    @extend_schema(operation_id="delete_block", responses={200: None})
    def delete(self, request: Request, block_id: str) -> Response:
        memory_services.block_delete(actor=self.actor, block_id=block_id)
        return Response({"message": f"Block {block_id} deleted"})


urlpatterns = [
    re_path(r"^v1/blocks/?$", BlockListCreateApi.as_view(), name="blocks"),
    re_path(r"^v1/blocks/count/?$", BlockCountApi.as_view(), name="blocks-count"),  # before {block_id}
    re_path(r"^v1/blocks/(?P<block_id>[^/]+)/?$", BlockDetailApi.as_view(), name="block-detail"),
    re_path(r"^v1/blocks/(?P<block_id>[^/]+)/agents/?$", BlockAgentListApi.as_view(), name="block-agents"),
]
