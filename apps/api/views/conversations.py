"""/v1/conversations: threads of an agent with their own messages (letta_api.md 3.9).

`conversation_id="default"` with an `agent_id` addresses the agent's default thread. Sending a message
answers SSE unless the body says `streaming: false` (the SDK always parses this endpoint as a stream).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpResponse
from django.urls import re_path
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.agents import services as agent_services
from apps.agents.models import Run
from apps.api import throttles
from apps.api.base import OrgApiView
from apps.api.serializers import messages as s
from apps.api.sse import StreamOptions, run_sse, sse_response
from apps.api.views.messages import (
    LIST_PARAMETERS,
    LenientContentNegotiation,
    MessageSendApiView,
    message_list_response,
)
from apps.api.views.runs import run_page_params
from apps.core.actor import Actor
from apps.core.errors import Conflict, InvalidInput, NotFound
from apps.core.pagination import paginate

CONVERSATIONS_DEFAULT_LIMIT = 50
DEFAULT_CONVERSATION = "default"
CONVERSATION = r"(?P<conversation_id>[^/]+)"


@dataclass(frozen=True)
class Thread:
    """Where a conversation request goes: the agent, and its conversation (None: the default thread)."""

    agent_id: str
    conversation_id: str | None


def resolve_thread(*, actor: Actor, conversation_id: str, agent_id: str | None) -> Thread:
    """Raises NotFound (unknown, other organisation's, or another agent's conversation), InvalidInput."""
    if conversation_id == DEFAULT_CONVERSATION:
        if not agent_id:
            raise InvalidInput("agent_id is required with conversation_id 'default'")
        agent_selectors.agent_require(actor=actor, agent_id=agent_id)
        return Thread(agent_id=agent_id, conversation_id=None)
    conversation = agent_selectors.conversation_get(
        actor=actor, conversation_id=conversation_id, agent_id=agent_id or None
    )
    return Thread(agent_id=conversation.agent_id, conversation_id=conversation.id)


class ConversationListQueryIn(serializers.Serializer):
    agent_id = serializers.CharField(required=False, allow_blank=True)
    summary_search = serializers.CharField(required=False, allow_blank=True)


class ConversationListCreateApi(OrgApiView):
    @extend_schema(
        operation_id="list_conversations",
        parameters=[ConversationListQueryIn],
        responses=s.ConversationOut(many=True),
    )
    def get(self, request: Request) -> Response:
        query = ConversationListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        qs = agent_selectors.conversation_list(
            actor=self.actor,
            agent_id=query.validated_data.get("agent_id") or None,
            summary_search=query.validated_data.get("summary_search") or None,
        )
        page = paginate(qs, run_page_params(request, default_limit=CONVERSATIONS_DEFAULT_LIMIT))
        return Response(s.ConversationOut(page, many=True).data)

    @extend_schema(
        operation_id="create_conversation",
        parameters=[OpenApiParameter("agent_id", str, required=True)],
        request=s.ConversationCreateIn,
        responses=s.ConversationOut,
    )
    def post(self, request: Request) -> Response:
        agent_id = request.query_params.get("agent_id")
        if not agent_id:
            raise serializers.ValidationError({"agent_id": "This query parameter is required."})
        data = s.ConversationCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        conversation = agent_services.conversation_create(
            actor=self.actor, agent_id=agent_id, summary=data.validated_data.get("summary") or ""
        )
        return Response(s.ConversationOut(conversation).data)


class ConversationRetrieveApi(OrgApiView):
    @extend_schema(operation_id="retrieve_conversation", responses=s.ConversationOut)
    def get(self, request: Request, conversation_id: str) -> Response:
        conversation = agent_selectors.conversation_get(actor=self.actor, conversation_id=conversation_id)
        return Response(s.ConversationOut(conversation).data)


class ConversationMessagesApi(MessageSendApiView):
    @extend_schema(
        operation_id="list_conversation_messages",
        parameters=[*LIST_PARAMETERS, OpenApiParameter("agent_id", str)],
        responses={200: dict},
    )
    def get(self, request: Request, conversation_id: str) -> Response:
        thread = resolve_thread(
            actor=self.actor, conversation_id=conversation_id, agent_id=request.query_params.get("agent_id")
        )
        qs = agent_selectors.agent_message_list(
            actor=self.actor, agent_id=thread.agent_id, conversation_id=thread.conversation_id
        )
        return message_list_response(qs, request, actor=self.actor)

    @extend_schema(operation_id="send_conversation_message", request=s.LettaRequestIn, responses={200: str})
    def post(self, request: Request, conversation_id: str) -> HttpResponse:
        thread = resolve_thread(
            actor=self.actor, conversation_id=conversation_id, agent_id=request.data.get("agent_id")
        )
        send = self.parse_send(request)
        if request.data.get("streaming") is None:
            send.streaming = True  # this endpoint streams unless told otherwise
        if send.streaming:
            return self.stream(
                request, agent_id=thread.agent_id, send=send, conversation_id=thread.conversation_id
            )
        return self.blocking(
            request, agent_id=thread.agent_id, send=send, conversation_id=thread.conversation_id
        )


class ConversationStreamApi(OrgApiView):
    """Attach to the conversation's current run (or its latest), from `starting_after`."""

    content_negotiation_class = LenientContentNegotiation

    @extend_schema(operation_id="retrieve_conversation_stream", request=s.RunStreamIn, responses={200: str})
    def post(self, request: Request, conversation_id: str) -> HttpResponse:
        data = s.RunStreamIn(data=request.data)
        data.is_valid(raise_exception=True)
        thread = resolve_thread(
            actor=self.actor, conversation_id=conversation_id, agent_id=data.validated_data.get("agent_id")
        )
        run = _latest_run(actor=self.actor, thread=thread, run_id=data.validated_data.get("run_id"))
        config = run.request_config or {}
        options = StreamOptions(
            stream_tokens=bool(config.get("stream_tokens")),
            include_pings=data.validated_data["include_pings"] is not False,
            approval_tools=agent_selectors.agent_approval_tool_names(actor=self.actor, agent_id=run.agent_id)
            | {tool["name"] for tool in config.get("client_tools") or []},
            starting_after=data.validated_data["starting_after"] or 0,
        )
        slot = throttles.require_stream_slot(self.actor)
        return sse_response(request, run_sse(actor=self.actor, run_id=run.id, options=options, slot=slot))


def _thread_runs(*, actor: Actor, thread: Thread) -> list[Run]:
    runs = agent_selectors.run_list(actor=actor, agent_id=thread.agent_id)
    if thread.conversation_id is None:
        return list(runs.filter(conversation__isnull=True).order_by("-created_at"))
    return list(runs.filter(conversation_id=thread.conversation_id).order_by("-created_at"))


def _latest_run(*, actor: Actor, thread: Thread, run_id: str | None) -> Run:
    if run_id:
        run = agent_selectors.run_get(actor=actor, run_id=run_id)
        if run.agent_id == thread.agent_id and run.conversation_id == thread.conversation_id:
            return run
        raise NotFound(f"Run with id '{run_id}' not found")
    runs = _thread_runs(actor=actor, thread=thread)
    active = [r for r in runs if r.status in agent_selectors.ACTIVE_RUN_STATUSES]
    if active or runs:
        return (active or runs)[0]
    raise NotFound("No run found for this conversation")


class ConversationCancelApi(MessageSendApiView):
    @extend_schema(
        operation_id="cancel_conversation",
        parameters=[OpenApiParameter("agent_id", str)],
        request=None,
        responses={200: dict},
    )
    def post(self, request: Request, conversation_id: str) -> Response:
        thread = resolve_thread(
            actor=self.actor, conversation_id=conversation_id, agent_id=request.query_params.get("agent_id")
        )
        active = [
            r
            for r in _thread_runs(actor=self.actor, thread=thread)
            if r.status in agent_selectors.ACTIVE_RUN_STATUSES
        ]
        if not active:
            raise Conflict(f"Conversation '{conversation_id}' has no active run to cancel")
        results = {}
        for run in active:
            cancelled = agent_services.run_cancel(actor=self.actor, run_id=run.id)
            results[run.id] = "cancelled" if cancelled.status == Run.Status.CANCELLED else "failed"
        return Response(results)


urlpatterns = [
    re_path(r"^v1/conversations/?$", ConversationListCreateApi.as_view(), name="conversations"),
    re_path(
        rf"^v1/conversations/{CONVERSATION}/?$", ConversationRetrieveApi.as_view(), name="conversation-detail"
    ),
    re_path(
        rf"^v1/conversations/{CONVERSATION}/messages/?$",
        ConversationMessagesApi.as_view(),
        name="conversation-messages",
    ),
    re_path(
        rf"^v1/conversations/{CONVERSATION}/stream/?$",
        ConversationStreamApi.as_view(),
        name="conversation-stream",
    ),
    re_path(
        rf"^v1/conversations/{CONVERSATION}/cancel/?$",
        ConversationCancelApi.as_view(),
        name="conversation-cancel",
    ),
]
