"""/v1/archives (CRUD, the agents using an archive, its passages), /v1/agents/{agent_id}/archives/attach|detach
and /v1/passages/search: thin adapters over archival memory (the memory app's selectors and services) and the
agents' services.

Who may do what is decided in those services (the role matrix's ARCHIVE_CREATE / ARCHIVE_WRITE, and
AGENT_CONFIGURE for attaching to an agent); another organisation's archive or agent is a 404.
"""

from __future__ import annotations

from django.http import HttpResponse
from django.urls import re_path
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.agents import services as agent_services
from apps.api.base import OrgApiView
from apps.api.serializers import agents as agent_s
from apps.api.serializers import archives as s
from apps.api.serializers.archival import PassageOut
from apps.api.views.agents import json_null, requested_relationships
from apps.core.pagination import PageParams, paginate
from apps.memory import selectors as memory_selectors
from apps.memory import services as memory_services
from apps.memory.models import Archive

DEFAULT_LIST_LIMIT = 50  # Letta's default page of archives, and of an archive's agents


class ArchiveListCreateApi(OrgApiView):
    @extend_schema(
        operation_id="list_archives", parameters=[s.ArchiveListQueryIn], responses=s.ArchiveOut(many=True)
    )
    def get(self, request: Request) -> Response:
        query = s.ArchiveListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        agent_id = query.validated_data.get("agent_id")
        if agent_id is not None:
            agent_selectors.agent_require(actor=self.actor, agent_id=agent_id)
        qs = memory_selectors.archive_list(
            actor=self.actor, name=query.validated_data.get("name"), agent_id=agent_id
        )
        page = paginate(qs, PageParams.from_query(request.query_params, default_limit=DEFAULT_LIST_LIMIT))
        return Response(s.ArchiveOut(page, many=True).data)

    @extend_schema(operation_id="create_archive", request=s.ArchiveCreateIn, responses=s.ArchiveOut)
    def post(self, request: Request) -> Response:
        data = s.ArchiveCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        archive = memory_services.archive_create(
            actor=self.actor,
            name=data.validated_data["name"],
            description=data.validated_data.get("description") or "",
            embedding_handle=data.embedding_handle(),
        )
        return Response(s.ArchiveOut(archive).data)


class ArchiveDetailApi(OrgApiView):
    @extend_schema(operation_id="retrieve_archive", responses=s.ArchiveOut)
    def get(self, request: Request, archive_id: str) -> Response:
        archive = memory_selectors.archive_get(actor=self.actor, archive_id=archive_id)
        return Response(s.ArchiveOut(archive).data)

    @extend_schema(operation_id="modify_archive", request=s.ArchiveUpdateIn, responses=s.ArchiveOut)
    def patch(self, request: Request, archive_id: str) -> Response:
        data = s.ArchiveUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        archive = memory_services.archive_update(
            actor=self.actor,
            archive_id=archive_id,
            name=data.validated_data.get("name"),
            description=data.validated_data.get("description"),
        )
        return Response(s.ArchiveOut(archive).data)

    @extend_schema(operation_id="delete_archive", responses={204: None})
    def delete(self, request: Request, archive_id: str) -> Response:
        memory_services.archive_delete(actor=self.actor, archive_id=archive_id)
        return Response(status=204)


class ArchiveAgentListApi(OrgApiView):
    @extend_schema(
        operation_id="list_agents_for_archive",
        parameters=[agent_s.AgentIncludeIn],
        responses=agent_s.AgentStateOut(many=True),
    )
    def get(self, request: Request, archive_id: str) -> Response:
        archive = memory_selectors.archive_get(actor=self.actor, archive_id=archive_id)
        include = requested_relationships(request, legacy_by_default=False)
        qs = agent_selectors.agent_state_queryset(actor=self.actor, include=include).filter(
            archives__id=archive.id
        )
        page = paginate(qs, PageParams.from_query(request.query_params, default_limit=DEFAULT_LIST_LIMIT))
        return Response(agent_s.agent_states(page, actor=self.actor, include=include))


def _passages_out(archive: Archive, passages: list, *, many: bool) -> dict | list:
    context = {"archives": {archive.id: archive}}
    return PassageOut(passages if many else passages[0], many=many, context=context).data


class ArchivePassageCreateApi(OrgApiView):
    @extend_schema(operation_id="create_passage_in_archive", request=s.ArchivePassageIn, responses=PassageOut)
    def post(self, request: Request, archive_id: str) -> Response:
        data = s.ArchivePassageIn(data=request.data)
        data.is_valid(raise_exception=True)
        archive, passages = memory_services.archive_passages_create(
            actor=self.actor, archive_id=archive_id, passages=[s.ArchivePassageIn.spec(data.validated_data)]
        )
        return Response(_passages_out(archive, passages, many=False))


class ArchivePassageBatchCreateApi(OrgApiView):
    @extend_schema(
        operation_id="create_passages_in_archive",
        request=s.ArchivePassageBatchIn,
        responses=PassageOut(many=True),
    )
    def post(self, request: Request, archive_id: str) -> Response:
        data = s.ArchivePassageBatchIn(data=request.data)
        data.is_valid(raise_exception=True)
        specs = [s.ArchivePassageIn.spec(item) for item in data.validated_data["passages"]]
        archive, passages = memory_services.archive_passages_create(
            actor=self.actor, archive_id=archive_id, passages=specs
        )
        return Response(_passages_out(archive, passages, many=True))


class ArchivePassageDeleteApi(OrgApiView):
    @extend_schema(operation_id="delete_passage_from_archive", responses={204: None})
    def delete(self, request: Request, archive_id: str, passage_id: str) -> Response:
        memory_services.archive_passage_delete(actor=self.actor, archive_id=archive_id, passage_id=passage_id)
        return Response(status=204)


class AgentArchiveAttachApi(OrgApiView):
    @extend_schema(operation_id="attach_archive_to_agent", request=None, responses={200: None})
    def patch(self, request: Request, agent_id: str, archive_id: str) -> HttpResponse:
        agent_services.agent_attach_archive(actor=self.actor, agent_id=agent_id, archive_id=archive_id)
        return json_null()


class AgentArchiveDetachApi(OrgApiView):
    @extend_schema(operation_id="detach_archive_from_agent", request=None, responses={200: None})
    def patch(self, request: Request, agent_id: str, archive_id: str) -> HttpResponse:
        agent_services.agent_detach_archive(actor=self.actor, agent_id=agent_id, archive_id=archive_id)
        return json_null()


class PassageSearchApi(OrgApiView):
    @extend_schema(
        operation_id="search_passages",
        request=s.PassageSearchRequestIn,
        responses=s.PassageSearchResultOut(many=True),
    )
    def post(self, request: Request) -> Response:
        """Search the agent's archives (`agent_id`, which wins over `archive_id`), one archive, or every
        archive of the organisation: by meaning where an archive has an embedding model, by a text match
        (every word of the query) where it has none; without a query, the passages the filters keep."""
        data = s.PassageSearchRequestIn(data=request.data)
        data.is_valid(raise_exception=True)
        params = data.validated_data
        if params.get("agent_id"):
            agent = agent_selectors.agent_get(actor=self.actor, agent_id=params["agent_id"])
            archives = list(memory_selectors.agent_archives(actor=self.actor, agent_id=agent.id))
        elif params.get("archive_id"):
            archives = [memory_selectors.archive_get(actor=self.actor, archive_id=params["archive_id"])]
        else:
            archives = list(memory_selectors.archive_list(actor=self.actor))
        hits = memory_selectors.archive_search(
            actor=self.actor,
            archives=archives,
            query=(params.get("query") or "").strip() or None,
            tags=params.get("tags"),
            tag_match_mode=params["tag_match_mode"],
            top_k=params["limit"],
            start=params.get("start_date"),
            end=params.get("end_date"),
        )
        context = {"archives": {archive.id: archive for archive in archives}}
        return Response(s.PassageSearchResultOut(hits, many=True, context=context).data)


ARCHIVE = r"(?P<archive_id>[^/]+)"

urlpatterns = [
    re_path(r"^v1/archives/?$", ArchiveListCreateApi.as_view(), name="archives"),
    re_path(rf"^v1/archives/{ARCHIVE}/?$", ArchiveDetailApi.as_view(), name="archive-detail"),
    re_path(rf"^v1/archives/{ARCHIVE}/agents/?$", ArchiveAgentListApi.as_view(), name="archive-agents"),
    re_path(
        rf"^v1/archives/{ARCHIVE}/passages/?$", ArchivePassageCreateApi.as_view(), name="archive-passages"
    ),
    # batch before {passage_id}: "batch" is a path segment, not an id.
    re_path(
        rf"^v1/archives/{ARCHIVE}/passages/batch/?$",
        ArchivePassageBatchCreateApi.as_view(),
        name="archive-passages-batch",
    ),
    re_path(
        rf"^v1/archives/{ARCHIVE}/passages/(?P<passage_id>[^/]+)/?$",
        ArchivePassageDeleteApi.as_view(),
        name="archive-passage-detail",
    ),
    re_path(
        rf"^v1/agents/(?P<agent_id>[^/]+)/archives/attach/{ARCHIVE}/?$",
        AgentArchiveAttachApi.as_view(),
        name="agent-archive-attach",
    ),
    re_path(
        rf"^v1/agents/(?P<agent_id>[^/]+)/archives/detach/{ARCHIVE}/?$",
        AgentArchiveDetachApi.as_view(),
        name="agent-archive-detach",
    ),
    re_path(r"^v1/passages/search/?$", PassageSearchApi.as_view(), name="passages-search"),
]
