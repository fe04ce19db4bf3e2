"""/v1/identities (CRUD, upsert, count, properties, the identity's agents and blocks),
/v1/agents/{agent_id}/identities/attach|detach and /v1/blocks/{block_id}/identities/attach|detach: thin
adapters over apps.identities.

Who may do what is decided in those services (the role matrix's IDENTITY_CREATE / IDENTITY_WRITE, and
AGENT_CONFIGURE / BLOCK_WRITE on what is linked); another organisation's identity, agent or block is a 404.
"""

from __future__ import annotations

from django.http import HttpResponse
from django.urls import re_path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.api.base import OrgApiView
from apps.api.serializers import agents as agent_s
from apps.api.serializers import identities as s
from apps.api.serializers.common import BlockOut
from apps.api.views.agents import json_null, requested_relationships
from apps.core.pagination import PageParams, paginate
from apps.identities import selectors, services

DEFAULT_LIST_LIMIT = 50  # Letta's default page of identities, and of an identity's agents and blocks


class IdentityListCreateApi(OrgApiView):
    @extend_schema(
        operation_id="list_identities", parameters=[s.IdentityListQueryIn], responses=s.IdentityOut(many=True)
    )
    def get(self, request: Request) -> Response:
        query = s.IdentityListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        qs = selectors.identity_list(
            actor=self.actor,
            name=params.get("name"),
            project_id=params.get("project_id"),
            identifier_key=params.get("identifier_key"),
            identity_type=params.get("identity_type"),
        )
        page = paginate(qs, PageParams.from_query(request.query_params, default_limit=DEFAULT_LIST_LIMIT))
        return Response(s.IdentityOut(page, many=True).data)

    @extend_schema(operation_id="create_identity", request=s.IdentityCreateIn, responses=s.IdentityOut)
    def post(self, request: Request) -> Response:
        data = s.IdentityCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        identity = services.identity_create(actor=self.actor, **data.to_service_kwargs())
        return Response(s.IdentityOut(identity).data)

    @extend_schema(operation_id="upsert_identity", request=s.IdentityCreateIn, responses=s.IdentityOut)
    def put(self, request: Request) -> Response:
        data = s.IdentityCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        identity = services.identity_upsert(actor=self.actor, **data.to_service_kwargs())
        return Response(s.IdentityOut(identity).data)


class IdentityCountApi(OrgApiView):
    @extend_schema(operation_id="count_identities", responses={200: OpenApiTypes.INT})
    def get(self, request: Request) -> Response:
        return Response(selectors.identity_count(actor=self.actor))


class IdentityDetailApi(OrgApiView):
    @extend_schema(operation_id="retrieve_identity", responses=s.IdentityOut)
    def get(self, request: Request, identity_id: str) -> Response:
        identity = selectors.identity_get(actor=self.actor, identity_id=identity_id)
        return Response(s.IdentityOut(identity).data)

    @extend_schema(operation_id="update_identity", request=s.IdentityUpdateIn, responses=s.IdentityOut)
    def patch(self, request: Request, identity_id: str) -> Response:
        data = s.IdentityUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        identity = services.identity_update(
            actor=self.actor, identity_id=identity_id, **data.to_service_kwargs()
        )
        return Response(s.IdentityOut(identity).data)

    @extend_schema(operation_id="delete_identity", responses={200: None})
    def delete(self, request: Request, identity_id: str) -> HttpResponse:
        services.identity_delete(actor=self.actor, identity_id=identity_id)
        return json_null()


class IdentityPropertiesApi(OrgApiView):
    @extend_schema(
        operation_id="upsert_properties_for_identity",
        request=s.IdentityPropertyIn(many=True),
        responses=s.IdentityOut,
    )
    def put(self, request: Request, identity_id: str) -> Response:
        """Replace the identity's properties with this list."""
        data = s.IdentityPropertyIn(data=request.data, many=True)
        data.is_valid(raise_exception=True)
        properties = s.IdentityPropertyIn.to_properties(list(data.validated_data)) or []
        identity = services.identity_properties_set(
            actor=self.actor, identity_id=identity_id, properties=properties
        )
        return Response(s.IdentityOut(identity).data)


class IdentityAgentListApi(OrgApiView):
    @extend_schema(
        operation_id="list_agents_for_identity",
        parameters=[agent_s.AgentIncludeIn],
        responses=agent_s.AgentStateOut(many=True),
    )
    def get(self, request: Request, identity_id: str) -> Response:
        """The agents linked to the identity. Raises IdentityNotFound (404) first."""
        identity = selectors.identity_get(actor=self.actor, identity_id=identity_id)
        include = requested_relationships(request, legacy_by_default=False)
        qs = selectors.filter_agents_by_identity(
            agent_selectors.agent_state_queryset(actor=self.actor, include=include), identity_id=identity.id
        )
        page = paginate(qs, PageParams.from_query(request.query_params, default_limit=DEFAULT_LIST_LIMIT))
        return Response(agent_s.agent_states(page, actor=self.actor, include=include))


class IdentityBlockListApi(OrgApiView):
    @extend_schema(operation_id="list_blocks_for_identity", responses=BlockOut(many=True))
    def get(self, request: Request, identity_id: str) -> Response:
        """The blocks linked to the identity. Raises IdentityNotFound (404) first."""
        qs = selectors.identity_blocks(actor=self.actor, identity_id=identity_id)
        page = paginate(qs, PageParams.from_query(request.query_params, default_limit=DEFAULT_LIST_LIMIT))
        return Response(BlockOut(page, many=True).data)


class AgentIdentityAttachApi(OrgApiView):
    @extend_schema(operation_id="attach_identity_to_agent", request=None, responses={200: None})
    def patch(self, request: Request, agent_id: str, identity_id: str) -> HttpResponse:
        services.identity_attach_agent(actor=self.actor, identity_id=identity_id, agent_id=agent_id)
        return json_null()


class AgentIdentityDetachApi(OrgApiView):
    @extend_schema(operation_id="detach_identity_from_agent", request=None, responses={200: None})
    def patch(self, request: Request, agent_id: str, identity_id: str) -> HttpResponse:
        services.identity_detach_agent(actor=self.actor, identity_id=identity_id, agent_id=agent_id)
        return json_null()


class BlockIdentityAttachApi(OrgApiView):
    @extend_schema(operation_id="attach_identity_to_block", request=None, responses=BlockOut)
    def patch(self, request: Request, block_id: str, identity_id: str) -> Response:
        block = services.identity_attach_block(actor=self.actor, identity_id=identity_id, block_id=block_id)
        return Response(BlockOut(block).data)


class BlockIdentityDetachApi(OrgApiView):
    @extend_schema(operation_id="detach_identity_from_block", request=None, responses=BlockOut)
    def patch(self, request: Request, block_id: str, identity_id: str) -> Response:
        block = services.identity_detach_block(actor=self.actor, identity_id=identity_id, block_id=block_id)
        return Response(BlockOut(block).data)


IDENTITY = r"(?P<identity_id>[^/]+)"

urlpatterns = [
    re_path(r"^v1/identities/?$", IdentityListCreateApi.as_view(), name="identities"),
    re_path(r"^v1/identities/count/?$", IdentityCountApi.as_view(), name="identities-count"),  # before {id}
    re_path(rf"^v1/identities/{IDENTITY}/?$", IdentityDetailApi.as_view(), name="identity-detail"),
    re_path(
        rf"^v1/identities/{IDENTITY}/properties/?$",
        IdentityPropertiesApi.as_view(),
        name="identity-properties",
    ),
    re_path(rf"^v1/identities/{IDENTITY}/agents/?$", IdentityAgentListApi.as_view(), name="identity-agents"),
    re_path(rf"^v1/identities/{IDENTITY}/blocks/?$", IdentityBlockListApi.as_view(), name="identity-blocks"),
    re_path(
        rf"^v1/agents/(?P<agent_id>[^/]+)/identities/attach/{IDENTITY}/?$",
        AgentIdentityAttachApi.as_view(),
        name="agent-identity-attach",
    ),
    re_path(
        rf"^v1/agents/(?P<agent_id>[^/]+)/identities/detach/{IDENTITY}/?$",
        AgentIdentityDetachApi.as_view(),
        name="agent-identity-detach",
    ),
    re_path(
        rf"^v1/blocks/(?P<block_id>[^/]+)/identities/attach/{IDENTITY}/?$",
        BlockIdentityAttachApi.as_view(),
        name="block-identity-attach",
    ),
    re_path(
        rf"^v1/blocks/(?P<block_id>[^/]+)/identities/detach/{IDENTITY}/?$",
        BlockIdentityDetachApi.as_view(),
        name="block-identity-detach",
    ),
]
