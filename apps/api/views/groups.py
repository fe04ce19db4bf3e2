"""/v1/groups (Letta's multi-agent groups: CRUD, count, send blocking / stream / async, list and reset the
group's messages) and /v1/agents/{agent_id}/groups: thin adapters over apps.agents.groups.

A send stores a group turn and has a worker drive it; its answers come from the runs of the agents that
spoke, in order: the blocking send waits for the turn, the stream relays each run's events in turn (every
message carries `agent_id`, the agent that produced it), the async send answers the turn in Letta's Run
shape. Ours, beyond Letta: GET /v1/groups/{id}/turns/{turn_id} (the turn as a Run),
POST /v1/groups/{id}/turns/{turn_id}/cancel and POST /v1/groups/{id}/messages/cancel (the group's turns in
progress), which cancel a turn as a whole.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from django.http import HttpResponse, StreamingHttpResponse
from django.urls import re_path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import groups as group_services
from apps.agents import selectors as agent_selectors
from apps.agents.models import GroupTurn, Message, Run
from apps.agents.wire import StopReasonEvent, to_letta_messages
from apps.api import throttles
from apps.api.base import OrgApiView
from apps.api.serializers import groups as s
from apps.api.serializers import messages as message_s
from apps.api.sse import (
    CONTROL_TYPES,
    DONE,
    PING_INTERVAL_S,
    POLL_MS,
    LettaEventTranslator,
    StreamOptions,
    encode,
    encode_error,
    ping,
    sse_response,
)
from apps.api.views.agents import json_null
from apps.api.views.messages import FAILED_RUN_STATUS, MessageSendApiView, blocking_wait_s, filter_types
from apps.core.actor import Actor
from apps.core.db import release_pooled_connection
from apps.core.errors import Conflict, InvalidInput
from apps.core.pagination import PageParams
from apps.streams.events import START, follow_events

GROUP = r"(?P<group_id>[^/]+)"
GROUP_LIST_LIMIT = 50
AGENT_GROUP_LIST_LIMIT = 100
GROUP_MESSAGES_LIMIT = 10
TURN_POLL_S = 0.1
FOLLOW_TIMEOUT_S = 3600.0


def _groups(groups: list[Any]) -> list[dict[str, Any]]:
    return list(s.GroupOut(groups, many=True).data)


class GroupListCreateApi(OrgApiView):
    @extend_schema(
        operation_id="list_groups", parameters=[s.GroupListQueryIn], responses=s.GroupOut(many=True)
    )
    def get(self, request: Request) -> Response:
        query = s.GroupListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        page = PageParams.from_query(request.query_params, default_limit=GROUP_LIST_LIMIT)
        if not request.query_params.get("order"):
            page = PageParams(before=page.before, after=page.after, limit=page.limit, order="asc")
        groups = group_services.group_list(
            actor=self.actor,
            page=page,
            manager_type=params.get("manager_type"),
            project_id=params.get("project_id"),
            show_hidden=params.get("show_hidden_groups", False),
        )
        return Response(_groups(groups))

    @extend_schema(operation_id="create_group", request=s.GroupCreateIn, responses=s.GroupOut)
    def post(self, request: Request) -> Response:
        data = s.GroupCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        group = group_services.group_create(actor=self.actor, **data.to_service_kwargs())
        return Response(s.GroupOut(group).data)


class GroupCountApi(OrgApiView):
    @extend_schema(operation_id="count_groups", responses={200: OpenApiTypes.INT})
    def get(self, request: Request) -> Response:
        return Response(group_services.group_count(actor=self.actor))


class GroupDetailApi(OrgApiView):
    @extend_schema(operation_id="retrieve_group", responses=s.GroupOut)
    def get(self, request: Request, group_id: str) -> Response:
        return Response(s.GroupOut(group_services.group_get(actor=self.actor, group_id=group_id)).data)

    @extend_schema(operation_id="modify_group", request=s.GroupUpdateIn, responses=s.GroupOut)
    def patch(self, request: Request, group_id: str) -> Response:
        data = s.GroupUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        group = group_services.group_update(actor=self.actor, group_id=group_id, **data.to_service_kwargs())
        return Response(s.GroupOut(group).data)

    @extend_schema(operation_id="delete_group", responses={200: dict})
    def delete(self, request: Request, group_id: str) -> Response:
        group_services.group_delete(actor=self.actor, group_id=group_id)
        return Response({"message": f"Group id={group_id} successfully deleted"})


class AgentGroupListApi(OrgApiView):
    @extend_schema(operation_id="list_groups_for_agent", responses=s.GroupOut(many=True))
    def get(self, request: Request, agent_id: str) -> Response:
        page = PageParams.from_query(request.query_params, default_limit=AGENT_GROUP_LIST_LIMIT)
        groups = group_services.group_list_for_agent(
            actor=self.actor,
            agent_id=agent_id,
            page=page,
            manager_type=request.query_params.get("manager_type") or None,
        )
        return Response(_groups(groups))


# --- messages ---------------------------------------------------------------------------------------------


def _with_agent(items: list[dict[str, Any]], agent_id: str) -> list[dict[str, Any]]:
    return [{**item, "agent_id": agent_id} for item in items]


def render_group_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Stored messages as LettaMessages, each with the agent whose thread holds it (`agent_id`)."""
    return [item for m in messages for item in _with_agent(to_letta_messages(m), m.agent_id)]


def _send_inputs(send: message_s.SendRequest) -> list[dict[str, Any]]:
    if send.approvals is not None:
        raise InvalidInput("A group takes messages, not approval decisions: answer the agent itself")
    return [
        {"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})} for m in send.messages
    ]


class GroupSendApiView(MessageSendApiView):
    def start_turn(
        self, request: Request, group_id: str, *, background: bool = False
    ) -> tuple[GroupTurn, Any]:
        send = self.parse_send(request)
        turn = group_services.group_turn_create(
            actor=self.actor,
            group_id=group_id,
            messages=_send_inputs(send),
            max_steps=send.max_steps,
            background=background,
            stream_tokens=bool(send.stream_tokens),
        )
        return turn, send

    def stream_turn(self, request: Request, group_id: str) -> HttpResponse | StreamingHttpResponse:
        slot = throttles.require_stream_slot(self.actor)
        try:
            turn, send = self.start_turn(request, group_id)
        except BaseException:
            slot.release()
            raise
        options = StreamOptions(
            stream_tokens=send.stream_tokens,
            include_types=send.include_return_message_types,
            include_pings=send.include_pings,
        )
        chunks = group_sse(actor=self.actor, turn_id=turn.id, options=options, keepalive=slot.refresh)
        return sse_response(request, _Held(chunks, slot))


class GroupMessagesApi(GroupSendApiView):
    @extend_schema(operation_id="list_group_messages", responses={200: dict})
    def get(self, request: Request, group_id: str) -> Response:
        page = PageParams.from_query(request.query_params, default_limit=GROUP_MESSAGES_LIMIT)
        qs = group_services.group_message_list(actor=self.actor, group_id=group_id)
        messages = agent_selectors.message_page(
            qs, actor=self.actor, before=page.before, after=page.after, limit=page.limit, order=page.order
        )
        include = request.query_params.getlist("include_return_message_types")
        return Response(
            filter_types(render_group_messages(messages), frozenset(include) if include else None)
        )

    @extend_schema(operation_id="send_group_message", request=message_s.LettaRequestIn, responses={200: dict})
    def post(self, request: Request, group_id: str) -> HttpResponse | StreamingHttpResponse:
        if request.data.get("streaming") if hasattr(request.data, "get") else False:
            return self.stream_turn(request, group_id)
        wait_s = blocking_wait_s(request)
        slot = throttles.require_stream_slot(self.actor, ttl_s=wait_s + throttles.BLOCKING_SLOT_MARGIN_S)
        try:
            turn, send = self.start_turn(request, group_id)
            finished = wait_for_turn(actor=self.actor, turn_id=turn.id, timeout_s=wait_s)
        finally:
            slot.release()
        messages = filter_types(
            render_group_messages(group_services.group_turn_messages(actor=self.actor, turn=finished)),
            send.include_return_message_types,
        )
        if finished.status not in agent_selectors.TERMINAL_RUN_STATUSES:
            return Response(
                {
                    "detail": f"Group turn {turn.id} is still in progress. It goes on: follow it with "
                    f"GET /v1/groups/{group_id}/turns/{turn.id}, then GET /v1/groups/{group_id}/messages.",
                    "code": "RUN_STILL_RUNNING",
                    "run_id": turn.id,
                    "messages": messages,
                },
                status=status.HTTP_504_GATEWAY_TIMEOUT,
            )
        if finished.status == Run.Status.FAILED:
            return Response(
                {
                    "detail": (finished.error or {}).get("message") or "The group turn failed.",
                    "run_id": finished.id,
                    "stop_reason": finished.stop_reason,
                },
                status=FAILED_RUN_STATUS.get(finished.stop_reason, status.HTTP_500_INTERNAL_SERVER_ERROR),
            )
        return Response(
            {
                "messages": messages,
                "stop_reason": StopReasonEvent(finished.stop_reason or "end_turn").event(),
                "usage": group_services.group_turn_usage(actor=self.actor, turn=finished),
                "logprobs": None,
                "turns": None,
            }
        )


class GroupMessagesStreamApi(GroupSendApiView):
    @extend_schema(
        operation_id="send_group_message_streaming", request=message_s.LettaRequestIn, responses={200: str}
    )
    def post(self, request: Request, group_id: str) -> HttpResponse | StreamingHttpResponse:
        return self.stream_turn(request, group_id)


class GroupMessagesAsyncApi(GroupSendApiView):
    @extend_schema(
        operation_id="send_group_message_async", request=message_s.LettaRequestIn, responses={200: dict}
    )
    def post(self, request: Request, group_id: str) -> Response:
        turn, _ = self.start_turn(request, group_id, background=True)
        turn = group_services.group_turn_get(actor=self.actor, turn_id=turn.id)
        return Response(group_services.group_turn_as_run(turn))


class GroupMessagesCancelApi(OrgApiView):
    @extend_schema(operation_id="cancel_group_message", request=None, responses={200: dict})
    def post(self, request: Request, group_id: str) -> Response:
        group_services.group_get(actor=self.actor, group_id=group_id)
        turns = group_services.group_active_turns(actor=self.actor, group_id=group_id)
        if not turns:
            raise Conflict(f"Group '{group_id}' has no turn in progress to cancel")
        results = {}
        for turn in turns:
            cancelled = group_services.group_turn_cancel(actor=self.actor, turn_id=turn.id)
            results[turn.id] = "cancelled" if cancelled.status == Run.Status.CANCELLED else cancelled.status
        return Response(results)


class GroupTurnApi(OrgApiView):
    @extend_schema(operation_id="retrieve_group_turn", responses={200: dict})
    def get(self, request: Request, group_id: str, turn_id: str) -> Response:
        turn = group_services.group_turn_get(actor=self.actor, turn_id=turn_id, group_id=group_id)
        return Response(group_services.group_turn_as_run(turn))


class GroupTurnCancelApi(OrgApiView):
    @extend_schema(operation_id="cancel_group_turn", request=None, responses={200: dict})
    def post(self, request: Request, group_id: str, turn_id: str) -> Response:
        turn = group_services.group_turn_cancel(actor=self.actor, turn_id=turn_id, group_id=group_id)
        return Response(group_services.group_turn_as_run(turn))


class GroupResetMessagesApi(OrgApiView):
    @extend_schema(operation_id="reset_group_messages", request=None, responses={200: None})
    def patch(self, request: Request, group_id: str) -> HttpResponse:
        group_services.group_reset_messages(actor=self.actor, group_id=group_id)
        return json_null()


# --- following a turn -------------------------------------------------------------------------------------


def wait_for_turn(*, actor: Actor, turn_id: str, timeout_s: float) -> GroupTurn:
    """The turn once it is over, or as it is at the timeout."""
    give_up = time.monotonic() + timeout_s
    while True:
        turn = group_services.group_turn_get(actor=actor, turn_id=turn_id)
        release_pooled_connection()
        if turn.status in agent_selectors.TERMINAL_RUN_STATUSES or time.monotonic() > give_up:
            return turn
        time.sleep(TURN_POLL_S)


class _Held:
    """SSE chunks holding a stream slot, released at their end or when closed."""

    def __init__(self, chunks: Iterator[bytes], slot: throttles.StreamSlot) -> None:
        self.chunks, self.slot = chunks, slot

    def __iter__(self) -> _Held:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self.chunks)
        except BaseException:
            self.slot.release()
            raise

    def close(self) -> None:
        try:
            self.chunks.close()  # type: ignore[attr-defined]
        finally:
            self.slot.release()


def group_sse(
    *, actor: Actor, turn_id: str, options: StreamOptions, keepalive: Any = None
) -> Iterator[bytes]:
    """The turn's runs' events, one run after the other as the turn starts them, each message with its
    agent_id; then the turn's stop_reason, its usage over all runs, an error event if it failed, [DONE]."""
    relayed = 0
    seq = 0
    last_output = time.monotonic()
    give_up = time.monotonic() + FOLLOW_TIMEOUT_S
    while time.monotonic() < give_up:
        turn = group_services.group_turn_get(actor=actor, turn_id=turn_id)
        runs = group_services.group_turn_runs(actor=actor, turn=turn)
        release_pooled_connection()
        if relayed < len(runs):
            run = runs[relayed]
            relayed += 1
            translator = LettaEventTranslator(options)
            for event in follow_events(
                run.id,
                after=START,
                timeout_s=FOLLOW_TIMEOUT_S,
                poll_ms=POLL_MS,
                on_idle=_RunOver(actor, run.id),
            ):
                if keepalive is not None:
                    keepalive()
                if event is None:
                    if options.include_pings and time.monotonic() - last_output >= PING_INTERVAL_S:
                        last_output = time.monotonic()
                        yield encode(ping(turn_id))
                    continue
                if event.is_end:
                    break
                seq += 1
                item = translator.translate(seq, event.data)
                if item is None or item.get("message_type") in CONTROL_TYPES:
                    continue
                last_output = time.monotonic()
                yield encode({**item, "agent_id": run.agent_id})
            continue
        if turn.status in agent_selectors.TERMINAL_RUN_STATUSES:
            break
        if options.include_pings and time.monotonic() - last_output >= PING_INTERVAL_S:
            last_output = time.monotonic()
            yield encode(ping(turn_id))
        time.sleep(TURN_POLL_S)
    turn = group_services.group_turn_get(actor=actor, turn_id=turn_id)
    yield encode(StopReasonEvent(turn.stop_reason or "error").event())
    yield encode(group_services.group_turn_usage(actor=actor, turn=turn))
    if turn.status == Run.Status.FAILED:
        detail = (turn.error or {}).get("message") or "The group turn failed."
        yield encode_error(
            {
                "message_type": "error_message",
                "run_id": turn.id,
                "error_type": turn.stop_reason or "error",
                "message": detail,
                "detail": detail,
                "seq_id": None,
            }
        )
    yield DONE


class _RunOver:
    """follow_events' on_idle: the run is over in the database but its stream stays silent."""

    def __init__(self, actor: Actor, run_id: str) -> None:
        self.actor, self.run_id, self.polls = actor, run_id, 0

    def __call__(self) -> bool:
        run_status = agent_selectors.run_get(actor=self.actor, run_id=self.run_id).status
        release_pooled_connection()
        if run_status not in agent_selectors.TERMINAL_RUN_STATUSES:
            self.polls = 0
            return False
        self.polls += 1
        return self.polls >= 3


urlpatterns = [
    re_path(r"^v1/groups/?$", GroupListCreateApi.as_view(), name="groups"),
    re_path(r"^v1/groups/count/?$", GroupCountApi.as_view(), name="groups-count"),
    re_path(rf"^v1/groups/{GROUP}/?$", GroupDetailApi.as_view(), name="group-detail"),
    re_path(rf"^v1/groups/{GROUP}/messages/?$", GroupMessagesApi.as_view(), name="group-messages"),
    re_path(rf"^v1/groups/{GROUP}/messages/stream/?$", GroupMessagesStreamApi.as_view(), name="group-stream"),
    re_path(rf"^v1/groups/{GROUP}/messages/async/?$", GroupMessagesAsyncApi.as_view(), name="group-async"),
    re_path(rf"^v1/groups/{GROUP}/messages/cancel/?$", GroupMessagesCancelApi.as_view(), name="group-cancel"),
    re_path(rf"^v1/groups/{GROUP}/reset-messages/?$", GroupResetMessagesApi.as_view(), name="group-reset"),
    re_path(rf"^v1/groups/{GROUP}/turns/(?P<turn_id>[^/]+)/?$", GroupTurnApi.as_view(), name="group-turn"),
    re_path(
        rf"^v1/groups/{GROUP}/turns/(?P<turn_id>[^/]+)/cancel/?$",
        GroupTurnCancelApi.as_view(),
        name="group-turn-cancel",
    ),
    re_path(r"^v1/agents/(?P<agent_id>[^/]+)/groups/?$", AgentGroupListApi.as_view(), name="agent-groups"),
]
