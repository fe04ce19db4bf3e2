"""/v1/agents/{agent_id}/messages (send, stream, async, cancel, list), reset-messages and /v1/messages/.

The web process never runs the agent: a send persists the input and a Run (run_create), has a worker
execute it (run_submit), then answers from the run's event stream (run_collect, or SSE for streaming).

Decisions a client can observe:
- Idempotency: a send whose message `otid` this agent has already taken (the SDK resending after a
  timeout) starts nothing new; it is answered from the run that took it (waited for, or its stream
  replayed from the start).
- A blocking send waits for its run up to the client's read timeout minus 5 s (the SDK announces it in
  `x-stainless-read-timeout`; 60 s by default, so 55 s), and never longer than BLOCKING_WAIT_SECONDS. A
  run still going then is answered with 504, `x-should-retry: false`, the run id and the messages it
  produced so far, so the SDK does not resend the message; the run carries on and can be followed with
  GET /v1/runs/{run_id} or POST /v1/runs/{run_id}/stream.
- A stream and a blocking wait each hold one of the user's MAX_STREAMS_PER_USER slots while open; past
  the cap the send is 429 and starts nothing.
- A run that failed on the LLM provider answers 502 (`llm_api_error`), one that crashed 500 (`error`);
  other stop reasons are a normal LettaResponse. 409 and 5xx from these endpoints carry
  `x-should-retry: false`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import IntegrityError
from django.http import HttpResponse
from django.urls import re_path
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.agents import services as agent_services
from apps.agents.errors import PendingApproval
from apps.agents.models import Message, Run
from apps.agents.wire import StopReasonEvent, UsageStatistics, to_letta_messages
from apps.api import throttles
from apps.api.base import OrgApiView
from apps.api.errors import internal_error_response
from apps.api.serializers import agents as agent_serializers
from apps.api.serializers import messages as s
from apps.api.sse import StreamOptions, acollect_run, run_sse_response
from apps.core.actor import Actor
from apps.core.asgi import AwaitedResponse, awaits_answers
from apps.core.errors import Conflict, NotFound
from apps.core.pagination import PageParams
from apps.streams.hub import get_hub

logger = logging.getLogger(__name__)

MESSAGES_DEFAULT_LIMIT = 100
DEFAULT_CLIENT_READ_TIMEOUT_S = 60.0
READ_TIMEOUT_MARGIN_S = 5.0
AGENT = r"(?P<agent_id>[^/]+)"


class LenientContentNegotiation(DefaultContentNegotiation):
    """SSE endpoints answer text/event-stream whatever Accept says; their JSON errors never become 406."""

    def select_renderer(
        self, request: Request, renderers: list[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except NotAcceptable:
            return renderers[0], renderers[0].media_type


class MessageSendApiView(OrgApiView):
    """Base of the endpoints that send messages: the SDK must never resend on a 409 or a 5xx."""

    content_negotiation_class = LenientContentNegotiation

    def handle_exception(self, exc: Exception) -> Response:
        try:
            return super().handle_exception(exc)
        except Exception as unhandled:
            return internal_error_response(unhandled)

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)
        if response.status_code == status.HTTP_409_CONFLICT or response.status_code >= 500:
            response["x-should-retry"] = "false"
        return response

    def parse_send(self, request: Request) -> s.SendRequest:
        data = s.LettaRequestIn(data=request.data)
        data.is_valid(raise_exception=True)
        return data.to_request()

    def start_run(self, *, agent_id: str, send: s.SendRequest, conversation_id: str | None = None) -> Run:
        """The run that answers this request: the one that already took its otids, or a new one."""
        existing = agent_selectors.run_find_by_otids(actor=self.actor, agent_id=agent_id, otids=send.otids)
        if existing is not None:
            return existing
        try:
            run = agent_services.run_create(
                actor=self.actor, agent_id=agent_id, conversation_id=conversation_id, **send.run_inputs()
            )
        except IntegrityError:  # a concurrent resend took the otid first (message_otid_once_per_conversation)
            existing = agent_selectors.run_find_by_otids(
                actor=self.actor, agent_id=agent_id, otids=send.otids
            )
            if existing is None:
                raise
            return existing
        agent_services.run_submit(run)
        return run

    def stream(self, request: Request, *, agent_id: str, send: s.SendRequest, **kwargs: Any) -> HttpResponse:
        """SSE from the start of the run; a pending approval is a plain 409 here (letta_api.md 4.4)."""
        slot = throttles.require_stream_slot(self.actor)
        try:
            run = self.start_run(agent_id=agent_id, send=send, **kwargs)
        except PendingApproval as exc:
            slot.release()
            return Response({"detail": exc.message}, status=status.HTTP_409_CONFLICT)
        except BaseException:
            slot.release()
            raise
        approval_tools: frozenset[str] = frozenset()
        if send.stream_tokens:
            approval_tools = agent_selectors.agent_approval_tool_names(
                actor=self.actor, agent_id=agent_id
            ) | {tool["name"] for tool in send.client_tools}
        options = StreamOptions(
            stream_tokens=send.stream_tokens,
            include_types=send.include_return_message_types,
            include_pings=send.include_pings,
            approval_tools=approval_tools,
        )
        return run_sse_response(request, actor=self.actor, run_id=run.id, options=options, slot=slot)

    def blocking(
        self,
        request: Request,
        *,
        agent_id: str,
        send: s.SendRequest,
        on_event_loop: bool = True,
        **kwargs: Any,
    ) -> HttpResponse:
        """The run's answer once it ends (or the 504 at the client's deadline). Under ASGI, unless
        `on_event_loop` is False (a caller that reads the response's data), an AwaitedResponse."""
        wait_s = blocking_wait_s(request)
        slot = throttles.require_stream_slot(self.actor, ttl_s=wait_s + throttles.BLOCKING_SLOT_MARGIN_S)
        handed_over = False
        try:
            run = self.start_run(agent_id=agent_id, send=send, **kwargs)
            if on_event_loop and awaits_answers(request):
                # Under ASGI the wait is the event loop's (no thread held for it); the slot goes with it.
                answer = partial(self.blocking_answer, request, run=run, send=send, wait_s=wait_s, slot=slot)
                handed_over = True
                return AwaitedResponse(answer)
            collected = agent_services.run_collect(
                actor=self.actor, run_id=run.id, run=run, reread=False, timeout_s=wait_s
            )
        finally:
            if not handed_over:
                slot.release()
        return self.blocking_response(run, collected, send)

    async def blocking_answer(
        self, request: Request, *, run: Run, send: s.SendRequest, wait_s: float, slot: throttles.StreamSlot
    ) -> HttpResponse:
        """The blocking send's answer, waited for on the event loop (sse.acollect_run), then built as the
        view would have (in one of the loop's shared threads: it reads the database)."""
        answer: Callable[[], Response] | Exception
        try:
            collected = await acollect_run(actor=self.actor, run=run, timeout_s=wait_s)
            answer = partial(self.blocking_response, run, collected, send)
        except Exception as exc:
            answer = exc
        finally:
            await slot.arelease(get_hub().commands)
        return await database_sync_to_async(self.finish_answer, thread_sensitive=False)(request, answer)

    def finish_answer(self, request: Request, answer: Callable[[], Response] | Exception) -> HttpResponse:
        """What DRF's dispatch does with a view's result or exception: handled, finalized, rendered."""
        try:
            if isinstance(answer, Exception):
                raise answer
            response = answer()
        except Exception as exc:
            response = self.handle_exception(exc)
        response = self.finalize_response(request, response)
        response.render()
        return response

    def blocking_response(
        self, run: Run, collected: agent_services.CollectedRun, send: s.SendRequest
    ) -> Response:
        if not collected.finished:
            return Response(
                {
                    "detail": (
                        f"Run {run.id} is still in progress. It goes on: follow it with GET /v1/runs/{run.id} "
                        f"or POST /v1/runs/{run.id}/stream, then GET /v1/runs/{run.id}/messages."
                    ),
                    "code": "RUN_STILL_RUNNING",
                    "run_id": run.id,
                    "messages": filter_types(collected.messages, send.include_return_message_types),
                },
                status=status.HTTP_504_GATEWAY_TIMEOUT,
            )
        finished = collected.run
        if finished.status == Run.Status.FAILED and finished.stop_reason in FAILED_RUN_STATUS:
            return Response(
                {
                    "detail": (finished.error or {}).get("message")
                    or f"The run failed ({finished.stop_reason}).",
                    "run_id": finished.id,
                    "stop_reason": finished.stop_reason,
                },
                status=FAILED_RUN_STATUS[finished.stop_reason],
            )
        return Response(letta_response(collected, send.include_return_message_types, actor=self.actor))


FAILED_RUN_STATUS = {
    "llm_api_error": status.HTTP_502_BAD_GATEWAY,
    "error": status.HTTP_500_INTERNAL_SERVER_ERROR,
}


def blocking_wait_s(request: Request) -> float:
    """How long a blocking send may wait: just under the client's read timeout, so it gets an answer, and
    at most BLOCKING_WAIT_SECONDS (each wait holds a stream slot; under WSGI a thread too)."""
    try:
        client_timeout = float(
            request.headers.get("x-stainless-read-timeout") or DEFAULT_CLIENT_READ_TIMEOUT_S
        )
    except ValueError:
        client_timeout = DEFAULT_CLIENT_READ_TIMEOUT_S
    return max(1.0, min(client_timeout - READ_TIMEOUT_MARGIN_S, settings.BLOCKING_WAIT_SECONDS))


def letta_response(
    collected: agent_services.CollectedRun, include: frozenset[str] | None, *, actor: Actor
) -> dict[str, Any]:
    """LettaResponse (letta_api.md 5.1): only what the agent produced in this run."""
    run = collected.run
    usage = collected.usage or UsageStatistics(run_ids=(run.id,)).event()
    messages = filter_types(collected.messages, include)
    if include and "user_message" in include:  # asked for: the run's input comes first, as on Letta
        inputs = agent_selectors.run_message_list(actor=actor, run_id=run.id)
        given = inputs.filter(role=Message.Role.USER).order_by("sequence_id")
        messages = [*(form for m in given for form in to_letta_messages(m)), *messages]
    return {
        "messages": messages,
        "stop_reason": collected.stop_reason or StopReasonEvent(run.stop_reason or "error").event(),
        "usage": {
            "cached_input_tokens": None,
            "cache_write_tokens": None,
            "reasoning_tokens": None,
            "context_tokens": None,
            **usage,
        },
        "logprobs": _last_logprobs(run, actor=actor),
        "turns": agent_selectors.run_token_turns(actor=actor, run_id=run.id)
        if run.request_config.get("return_token_ids")
        else None,
    }


def _last_logprobs(run: Run, *, actor: Actor) -> dict[str, Any] | None:
    """The last LLM call's output-token log probabilities, when the send asked for them (as Letta answers)."""
    if not run.request_config.get("return_logprobs"):
        return None
    return agent_selectors.run_last_logprobs(actor=actor, run_id=run.id)


def filter_types(messages: list[dict[str, Any]], include: frozenset[str] | None) -> list[dict[str, Any]]:
    if include is None:
        return messages
    return [m for m in messages if m.get("message_type") in include]


def page_params(request: Request, *, default_limit: int = MESSAGES_DEFAULT_LIMIT) -> PageParams:
    return PageParams.from_query(request.query_params, default_limit=default_limit)


def render_messages(messages: list[Message], request: Request) -> list[dict[str, Any]]:
    """Stored messages as LettaMessages, filtered by `include_return_message_types`."""
    include = request.query_params.getlist("include_return_message_types")
    rendered = [item for message in messages for item in to_letta_messages(message)]
    return filter_types(rendered, frozenset(include) if include else None)


def message_list_response(qs: Any, request: Request, *, actor: Any, default_order: str = "desc") -> Response:
    page = page_params(request)
    order = page.order if request.query_params.get("order") else default_order
    messages = agent_selectors.message_page(
        qs, actor=actor, before=page.before, after=page.after, limit=page.limit, order=order
    )
    return Response(render_messages(messages, request))


def include_system(request: Request) -> bool:
    return request.query_params.get("include_system", "").lower() == "true"


LIST_PARAMETERS = [
    OpenApiParameter("before", str),
    OpenApiParameter("after", str),
    OpenApiParameter("limit", int),
    OpenApiParameter("order", str, enum=["asc", "desc"]),
    OpenApiParameter("include_return_message_types", str, many=True),
]


class AgentMessagesApi(MessageSendApiView):
    @extend_schema(
        operation_id="list_messages",
        parameters=[
            *LIST_PARAMETERS,
            OpenApiParameter("conversation_id", str),
            OpenApiParameter("include_err", bool),
        ],
        responses={200: dict},
    )
    def get(self, request: Request, agent_id: str) -> Response:
        qs = agent_selectors.agent_message_list(
            actor=self.actor,
            agent_id=agent_id,
            conversation_id=request.query_params.get("conversation_id") or None,
            include_system=include_system(request),
        )
        return message_list_response(qs, request, actor=self.actor)

    @extend_schema(operation_id="send_message", request=s.LettaRequestIn, responses={200: dict})
    def post(self, request: Request, agent_id: str) -> HttpResponse:
        send = self.parse_send(request)
        if send.streaming:
            return self.stream(request, agent_id=agent_id, send=send)
        return self.blocking(request, agent_id=agent_id, send=send)


class AgentMessagesStreamApi(MessageSendApiView):
    """Deprecated in SDK 1.12.1 (`agents.messages.stream`), kept: always SSE."""

    @extend_schema(operation_id="create_agent_message_stream", request=s.LettaRequestIn, responses={200: str})
    def post(self, request: Request, agent_id: str) -> HttpResponse:
        return self.stream(request, agent_id=agent_id, send=self.parse_send(request))


class AgentMessagesAsyncApi(MessageSendApiView):
    @extend_schema(operation_id="create_agent_message_async", request=s.LettaRequestIn, responses=s.RunOut)
    def post(self, request: Request, agent_id: str) -> Response:
        send = self.parse_send(request)
        send.background = True
        run = self.start_run(agent_id=agent_id, send=send)
        return Response(s.RunOut(agent_selectors.run_get(actor=self.actor, run_id=run.id)).data)


class AgentMessagesCancelApi(MessageSendApiView):
    @extend_schema(operation_id="cancel_message", request=s.CancelIn, responses={200: dict})
    def post(self, request: Request, agent_id: str) -> Response:
        data = s.CancelIn(data=request.data)
        data.is_valid(raise_exception=True)
        agent_selectors.agent_require(actor=self.actor, agent_id=agent_id)
        run_ids = data.validated_data.get("run_ids")
        if run_ids:
            runs = [agent_selectors.run_get(actor=self.actor, run_id=run_id) for run_id in run_ids]
            foreign = [run.id for run in runs if run.agent_id != agent_id]
            if foreign:
                raise NotFound(f"Run with id '{foreign[0]}' not found")
        else:
            runs = list(agent_selectors.run_list(actor=self.actor, agent_id=agent_id, active=True))
            if not runs:
                raise Conflict(f"Agent '{agent_id}' has no active run to cancel")
        results = {}
        for run in runs:
            cancelled = agent_services.run_cancel(actor=self.actor, run_id=run.id)
            results[run.id] = "cancelled" if cancelled.status == Run.Status.CANCELLED else "failed"
        return Response(results)


class AgentResetMessagesApi(OrgApiView):
    @extend_schema(operation_id="reset_messages", request=s.ResetMessagesIn, responses={200: dict})
    def patch(self, request: Request, agent_id: str) -> Response:
        """Empties the context window; every message stays in recall (history and search)."""
        data = s.ResetMessagesIn(data=request.data)
        data.is_valid(raise_exception=True)
        agent_services.agent_reset_messages(actor=self.actor, agent_id=agent_id)
        agent = agent_selectors.agent_state_get(actor=self.actor, agent_id=agent_id)
        return Response(agent_serializers.agent_state(agent, actor=self.actor))


MESSAGES_ARE_IMMUTABLE = (
    "Message editing is no longer supported. Messages are immutable as they may be shared across multiple "
    "conversations via forking."
)


class AgentMessageModifyApi(OrgApiView):
    """Letta's deprecated modify_message: refused with a 405, as Letta 0.16.7 refuses it. Stored messages
    never change (forks share them, and workers keep the ones they have loaded: loop/stored_messages.py)."""

    @extend_schema(operation_id="modify_message", request=None, responses={405: dict}, deprecated=True)
    def patch(self, request: Request, agent_id: str, message_id: str) -> Response:
        return Response({"detail": MESSAGES_ARE_IMMUTABLE}, status=status.HTTP_405_METHOD_NOT_ALLOWED)


class MessageListApi(OrgApiView):
    @extend_schema(
        operation_id="list_all_messages",
        parameters=[*LIST_PARAMETERS, OpenApiParameter("conversation_id", str)],
        responses={200: dict},
    )
    def get(self, request: Request) -> Response:
        qs = agent_selectors.message_list(
            actor=self.actor,
            conversation_id=request.query_params.get("conversation_id") or None,
            include_system=include_system(request),
        )
        return message_list_response(qs, request, actor=self.actor)


class MessageRetrieveApi(OrgApiView):
    @extend_schema(operation_id="retrieve_message", responses={200: dict})
    def get(self, request: Request, message_id: str) -> Response:
        """A list: one stored message can show as several LettaMessages (reasoning, tool call, text)."""
        message = agent_selectors.message_get(actor=self.actor, message_id=message_id)
        return Response(to_letta_messages(message))


urlpatterns = [
    re_path(rf"^v1/agents/{AGENT}/messages/?$", AgentMessagesApi.as_view(), name="agent-messages"),
    re_path(
        rf"^v1/agents/{AGENT}/messages/stream/?$",
        AgentMessagesStreamApi.as_view(),
        name="agent-messages-stream",
    ),
    re_path(
        rf"^v1/agents/{AGENT}/messages/async/?$", AgentMessagesAsyncApi.as_view(), name="agent-messages-async"
    ),
    re_path(
        rf"^v1/agents/{AGENT}/messages/cancel/?$",
        AgentMessagesCancelApi.as_view(),
        name="agent-messages-cancel",
    ),
    re_path(
        rf"^v1/agents/{AGENT}/reset-messages/?$", AgentResetMessagesApi.as_view(), name="agent-reset-messages"
    ),
    re_path(
        rf"^v1/agents/{AGENT}/messages/(?P<message_id>message-[^/]+)/?$",
        AgentMessageModifyApi.as_view(),
        name="agent-message-modify",
    ),
    re_path(r"^v1/messages/?$", MessageListApi.as_view(), name="messages"),
    # Only message ids: /v1/messages/search (not served here) must not land on the detail view.
    re_path(
        r"^v1/messages/(?P<message_id>message-[^/]+)/?$", MessageRetrieveApi.as_view(), name="message-detail"
    ),
]
