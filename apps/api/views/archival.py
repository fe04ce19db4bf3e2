"""/v1/agents/{agent_id}/archival-memory: insert, list, search and delete an agent's passages.

Thin adapters over archival memory through the memory app's selectors (the agent's archives, embedding,
pgvector search, or a text match for archives without an embedding model); the agent is fetched first through the agents selector, so
another organisation's agent is a 404 before anything runs.
"""

from __future__ import annotations

from django.http import QueryDict
from django.urls import re_path
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.agents import services as agent_services
from apps.agents.models import Agent
from apps.api.base import OrgApiView
from apps.api.serializers import archival as s
from apps.core.actor import Actor
from apps.core.errors import InvalidInput
from apps.core.pagination import PageParams, paginate
from apps.memory import selectors as memory_selectors
from apps.memory.models import Archive

DEFAULT_LIST_LIMIT = 100  # Letta's default page of passages


def _archives(actor: Actor, agent: Agent) -> dict[str, Archive]:
    return {
        archive.id: archive for archive in memory_selectors.agent_archives(actor=actor, agent_id=agent.id)
    }


def _list_order(query: QueryDict) -> str:
    """`order` (asc|desc) when given, else Letta's `ascending` flag (default true: oldest first)."""
    order = query.get("order")
    if order:
        return order
    ascending = query.get("ascending", "true")
    if ascending not in ("true", "false"):
        raise InvalidInput("ascending must be true or false")
    return "asc" if ascending == "true" else "desc"


class PassageListCreateApi(OrgApiView):
    @extend_schema(operation_id="list_passages", responses=s.PassageOut(many=True))
    def get(self, request: Request, agent_id: str) -> Response:
        query = request.query_params
        agent = agent_selectors.agent_get(actor=self.actor, agent_id=agent_id)
        archives = _archives(self.actor, agent)
        qs = memory_selectors.passage_list(actor=self.actor, archive_ids=list(archives))
        if query.get("search"):
            qs = qs.filter(text__icontains=query["search"])
        params = PageParams.from_query(
            {**query.dict(), "order": _list_order(query)}, default_limit=DEFAULT_LIST_LIMIT
        )
        page = paginate(qs, params)
        return Response(s.PassageOut(page, many=True, context={"archives": archives}).data)

    @extend_schema(
        operation_id="create_passage", request=s.PassageCreateIn, responses=s.PassageOut(many=True)
    )
    def post(self, request: Request, agent_id: str) -> Response:
        data = s.PassageCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        archive, passages = agent_services.agent_passage_insert(
            actor=self.actor,
            agent_id=agent_id,
            text=data.validated_data["text"],
            tags=data.validated_data.get("tags"),
        )
        return Response(s.PassageOut(passages, many=True, context={"archives": {archive.id: archive}}).data)


class PassageSearchApi(OrgApiView):
    @extend_schema(operation_id="search_archival_memory", responses=s.PassageSearchOut)
    def get(self, request: Request, agent_id: str) -> Response:
        """Search the agent's archives: by meaning where an archive has an embedding model, by a text match
        (every word of the query) where it has none, as Letta falls back to text search."""
        query = request.query_params
        data = s.PassageSearchIn(data={**query.dict(), "tags": query.getlist("tags")})
        data.is_valid(raise_exception=True)
        params = data.validated_data
        agent = agent_selectors.agent_get(actor=self.actor, agent_id=agent_id)
        zone = agent_selectors.agent_zone(agent.timezone)
        start = agent_selectors.parse_time_bound(
            params.get("start_datetime"), zone=zone, end=False, name="start_datetime"
        )
        end = agent_selectors.parse_time_bound(
            params.get("end_datetime"), zone=zone, end=True, name="end_datetime"
        )
        hits = memory_selectors.archive_search(
            actor=self.actor,
            archives=list(_archives(self.actor, agent).values()),
            query=params["query"],
            tags=params.get("tags"),
            tag_match_mode=params["tag_match_mode"],
            top_k=params.get("top_k") or memory_selectors.DEFAULT_TOP_K,
            start=start,
            end=end,
        )
        results = [
            {
                "id": hit.passage.id,
                "timestamp": hit.passage.created_at.astimezone(zone).isoformat(timespec="seconds"),
                "content": hit.passage.text,
                "tags": hit.passage.tags,
            }
            for hit in hits
        ]
        return Response(s.PassageSearchOut({"results": results, "count": len(results)}).data)


class PassageDeleteApi(OrgApiView):
    @extend_schema(operation_id="delete_passage", responses={200: None})
    def delete(self, request: Request, agent_id: str, memory_id: str) -> Response:
        agent_services.agent_passage_delete(actor=self.actor, agent_id=agent_id, passage_id=memory_id)
        return Response({"message": f"Memory id={memory_id} successfully deleted"})


urlpatterns = [
    re_path(
        r"^v1/agents/(?P<agent_id>[^/]+)/archival-memory/search/?$",
        PassageSearchApi.as_view(),
        name="agent-archival-search",
    ),
    re_path(
        r"^v1/agents/(?P<agent_id>[^/]+)/archival-memory/?$",
        PassageListCreateApi.as_view(),
        name="agent-archival",
    ),
    re_path(
        r"^v1/agents/(?P<agent_id>[^/]+)/archival-memory/(?P<memory_id>[^/]+)/?$",
        PassageDeleteApi.as_view(),
        name="agent-archival-detail",
    ),
]
