"""/v1/conversations: threads of an agent with their own messages (letta_api.md 3.9).

Agent-direct mode, on the routes where Letta accepts it (messages, stream, cancel, fork, compact,
recompile): `conversation_id="default"` with an `agent_id`, or the agent's id itself as the conversation
id, addresses the agent's default thread. Retrieve, update and delete take conversation ids only.

Decisions a client can observe:
- Sending a message answers SSE unless the body says `streaming: false` (the SDK always parses this
  endpoint as a stream).
- A conversation's messages are listed newest first by default (`order=desc`), oldest first with
  `order=asc`, as Letta lists conversations; the default thread keeps the agent list's order (newest
  page, oldest first within it). A fork lists the messages it shares with its source while they are in
  its context.
- A fork shares the source's in-context messages (the same ids), without its system messages; deleting
  the source hands the shared messages over to the fork. Deleting a conversation with a run in progress
  is a 409.
- Stream retrieve follows the thread's active run, which must be a background one (400 otherwise, and
  400 when none is active); with `run_id` or `otid` it follows that run, finished or not, from
  `starting_after`.
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
from apps.api.serializers import conversations as cs
from apps.api.serializers import messages as s
from apps.api.sse import StreamOptions, run_sse_response
from apps.api.views.agent_ops import llm_error_response
from apps.api.views.messages import (
    LIST_PARAMETERS,
    LenientContentNegotiation,
    MessageSendApiView,
    message_list_response,
    page_params,
    render_messages,
)
from apps.api.views.runs import run_page_params
from apps.core.actor import Actor
from apps.core.errors import Conflict, InvalidInput, NotFound
from apps.core.pagination import paginate
from apps.llm.errors import LLMError

CONVERSATIONS_DEFAULT_LIMIT = 50
DEFAULT_CONVERSATION = "default"
AGENT_ID_PREFIX = "agent-"
CONVERSATION = r"(?P<conversation_id>[^/]+)"


@dataclass(frozen=True)
class Thread:
    """Where a conversation request goes: the agent, and its conversation (None: the default thread)."""

    agent_id: str
    conversation_id: str | None


def resolve_thread(*, actor: Actor, conversation_id: str, agent_id: str | None) -> Thread:
    """A conversation id, "default" with an agent id, or an agent id (Letta's deprecated agent-direct form).
    Raises NotFound (unknown, other organisation's, or another agent's conversation), InvalidInput."""
    if conversation_id == DEFAULT_CONVERSATION:
        if not agent_id:
            raise InvalidInput("agent_id is required with conversation_id 'default'")
        agent_selectors.agent_require(actor=actor, agent_id=agent_id)
        return Thread(agent_id=agent_id, conversation_id=None)
    if conversation_id.startswith(AGENT_ID_PREFIX):
        agent_selectors.agent_require(actor=actor, agent_id=conversation_id)
        return Thread(agent_id=conversation_id, conversation_id=None)
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


class ConversationDetailApi(OrgApiView):
    @extend_schema(operation_id="retrieve_conversation", responses=s.ConversationOut)
    def get(self, request: Request, conversation_id: str) -> Response:
        conversation = agent_selectors.conversation_get(actor=self.actor, conversation_id=conversation_id)
        return Response(s.ConversationOut(conversation).data)

    @extend_schema(
        operation_id="update_conversation", request=cs.ConversationUpdateIn, responses=s.ConversationOut
    )
    def patch(self, request: Request, conversation_id: str) -> Response:
        data = cs.ConversationUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        conversation = agent_services.conversation_update(
            actor=self.actor, conversation_id=conversation_id, **data.validated_data
        )
        return Response(s.ConversationOut(conversation).data)

    @extend_schema(operation_id="delete_conversation", responses={200: None})
    def delete(self, request: Request, conversation_id: str) -> HttpResponse:
        agent_services.conversation_delete(actor=self.actor, conversation_id=conversation_id)
        return HttpResponse(b"null", content_type="application/json")  # Letta answers JSON null


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
        if thread.conversation_id is None:  # the default thread lists as the agent's messages do
            qs = agent_selectors.agent_message_list(actor=self.actor, agent_id=thread.agent_id)
            return message_list_response(qs, request, actor=self.actor)
        conversation = agent_selectors.conversation_get(
            actor=self.actor, conversation_id=thread.conversation_id
        )
        qs = agent_selectors.conversation_message_list(actor=self.actor, conversation=conversation)
        page = page_params(request)
        messages = agent_selectors.message_page(
            qs, actor=self.actor, before=page.before, after=page.after, limit=page.limit, order=page.order
        )
        if page.order == "desc":
            messages.reverse()  # Letta lists a conversation newest first
        return Response(render_messages(messages, request))

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
    """Follow the thread's active background run, or the run named by `run_id` or `otid` (finished or
    not), from `starting_after`."""

    content_negotiation_class = LenientContentNegotiation

    @extend_schema(operation_id="retrieve_conversation_stream", request=s.RunStreamIn, responses={200: str})
    def post(self, request: Request, conversation_id: str) -> HttpResponse:
        data = s.RunStreamIn(data=request.data or {})
        data.is_valid(raise_exception=True)
        given = data.validated_data
        thread = resolve_thread(
            actor=self.actor, conversation_id=conversation_id, agent_id=given.get("agent_id")
        )
        run = _run_to_follow(
            actor=self.actor, thread=thread, run_id=given.get("run_id"), otid=given.get("otid")
        )
        config = run.request_config or {}
        options = StreamOptions(
            stream_tokens=bool(config.get("stream_tokens")),
            include_pings=given["include_pings"] is not False,
            approval_tools=agent_selectors.agent_approval_tool_names(actor=self.actor, agent_id=run.agent_id)
            | {tool["name"] for tool in config.get("client_tools") or []},
            starting_after=given["starting_after"] or 0,
        )
        slot = throttles.require_stream_slot(self.actor)
        return run_sse_response(request, actor=self.actor, run_id=run.id, options=options, slot=slot)


def _run_to_follow(*, actor: Actor, thread: Thread, run_id: str | None, otid: str | None) -> Run:
    """Letta's order: the run id, else the run that took the message with this otid, else the thread's
    newest active run, which must have been started in the background. Raises NotFound, InvalidInput."""
    if run_id:
        run = agent_selectors.run_get(actor=actor, run_id=run_id)
        if run.agent_id == thread.agent_id and run.conversation_id == thread.conversation_id:
            return run
        raise NotFound(f"Run with id '{run_id}' not found")
    if otid:
        found = agent_selectors.run_find_by_otids(actor=actor, agent_id=thread.agent_id, otids=[otid])
        if found is None or found.conversation_id != thread.conversation_id:
            raise NotFound(f"No run found for otid={otid}. The run may have expired or never existed.")
        return found
    active = agent_selectors.thread_run_list(
        actor=actor, agent_id=thread.agent_id, conversation_id=thread.conversation_id, active=True
    ).first()
    if active is None:
        raise InvalidInput("No active runs found for this conversation.")
    if not active.background:
        raise InvalidInput("Run was not created in background mode, so it cannot be retrieved.")
    return active


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
        active = list(
            agent_selectors.thread_run_list(
                actor=self.actor,
                agent_id=thread.agent_id,
                conversation_id=thread.conversation_id,
                active=True,
            )
        )
        if not active:
            raise Conflict(f"No active runs to cancel for conversation {conversation_id}")
        results = {}
        for run in active:
            cancelled = agent_services.run_cancel(actor=self.actor, run_id=run.id)
            results[run.id] = "cancelled" if cancelled.status == Run.Status.CANCELLED else "failed"
        return Response(results)


class ConversationForkApi(OrgApiView):
    @extend_schema(
        operation_id="fork_conversation",
        parameters=[cs.ForkQueryIn],
        request=None,
        responses=s.ConversationOut,
    )
    def post(self, request: Request, conversation_id: str) -> Response:
        query = cs.ForkQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        thread = resolve_thread(
            actor=self.actor, conversation_id=conversation_id, agent_id=query.validated_data.get("agent_id")
        )
        fork = agent_services.conversation_fork(
            actor=self.actor, agent_id=thread.agent_id, conversation_id=thread.conversation_id
        )
        return Response(s.ConversationOut(fork).data)


class ConversationCompactApi(OrgApiView):
    @extend_schema(
        operation_id="compact_conversation", request=cs.CompactionRequestIn, responses=cs.CompactionOut
    )
    def post(self, request: Request, conversation_id: str) -> Response:
        data = cs.CompactionRequestIn(data=request.data or {})
        data.is_valid(raise_exception=True)
        thread = resolve_thread(
            actor=self.actor, conversation_id=conversation_id, agent_id=data.validated_data.get("agent_id")
        )
        try:
            compaction = agent_services.conversation_compact(
                actor=self.actor,
                agent_id=thread.agent_id,
                conversation_id=thread.conversation_id,
                compaction_settings=data.settings(),
            )
        except LLMError as exc:
            return llm_error_response(exc)
        return Response(cs.compaction_out(compaction))


class ConversationRecompileApi(OrgApiView):
    """The thread's system message, compiled now and stored unless `dry_run` (see agent_ops)."""

    @extend_schema(
        operation_id="recompile_conversation",
        parameters=[cs.RecompileQueryIn],
        request=cs.CompactionRequestIn,
        responses=str,
    )
    def post(self, request: Request, conversation_id: str) -> Response:
        query = cs.RecompileQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = cs.CompactionRequestIn(data=request.data or {})
        data.is_valid(raise_exception=True)
        thread = resolve_thread(
            actor=self.actor, conversation_id=conversation_id, agent_id=data.validated_data.get("agent_id")
        )
        compiled = agent_services.thread_recompile(
            actor=self.actor,
            agent_id=thread.agent_id,
            conversation_id=thread.conversation_id,
            dry_run=query.validated_data["dry_run"],
        )
        return Response(compiled)


urlpatterns = [
    re_path(r"^v1/conversations/?$", ConversationListCreateApi.as_view(), name="conversations"),
    re_path(
        rf"^v1/conversations/{CONVERSATION}/?$", ConversationDetailApi.as_view(), name="conversation-detail"
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
    re_path(
        rf"^v1/conversations/{CONVERSATION}/fork/?$", ConversationForkApi.as_view(), name="conversation-fork"
    ),
    re_path(
        rf"^v1/conversations/{CONVERSATION}/compact/?$",
        ConversationCompactApi.as_view(),
        name="conversation-compact",
    ),
    re_path(
        rf"^v1/conversations/{CONVERSATION}/recompile/?$",
        ConversationRecompileApi.as_view(),
        name="conversation-recompile",
    ),
]
