"""/v1/runs: list, active, retrieve, messages, steps, usage, trace, and the resumable SSE stream of a run."""

from __future__ import annotations

from django.http import HttpResponse
from django.urls import re_path
from drf_spectacular.plumbing import build_array_type, build_basic_type
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.api import throttles
from apps.api.base import OrgApiView
from apps.api.serializers import messages as s
from apps.api.sse import StreamOptions, run_sse_response
from apps.api.views.messages import LIST_PARAMETERS, LenientContentNegotiation, message_list_response
from apps.core.pagination import PageParams, paginate
from apps.observability import selectors as observability_selectors

RUNS_DEFAULT_LIMIT = 100
ACTIVE_RUNS_LIMIT = 100  # Letta's list_active_runs answers at most this many
STEPS_DEFAULT_LIMIT = 50
RUN = r"(?P<run_id>[^/]+)"


def run_page_params(request: Request, *, default_limit: int) -> PageParams:
    """Letta's cursors, plus the deprecated `ascending` flag when `order` is not given."""
    params = request.query_params.dict()
    if "order" not in params and "ascending" in params:
        params["order"] = "asc" if params["ascending"].lower() == "true" else "desc"
    return PageParams.from_query(params, default_limit=default_limit)


class RunListQueryIn(serializers.Serializer):
    agent_id = serializers.CharField(required=False, allow_blank=True)
    active = serializers.BooleanField(required=False, default=False)
    background = serializers.BooleanField(required=False, allow_null=True, default=None)
    stop_reason = serializers.ChoiceField(choices=s.STOP_REASONS, required=False)
    conversation_id = serializers.CharField(required=False, allow_blank=True)


class RunListApi(OrgApiView):
    @extend_schema(
        operation_id="list_runs",
        parameters=[RunListQueryIn, OpenApiParameter("statuses", str, many=True)],
        responses=s.RunOut(many=True),
    )
    def get(self, request: Request) -> Response:
        query = RunListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = request.query_params
        qs = agent_selectors.run_list(
            actor=self.actor,
            agent_id=query.validated_data.get("agent_id") or (params.getlist("agent_ids") or [None])[0],
            statuses=params.getlist("statuses") or None,
            active=query.validated_data["active"],
            background=query.validated_data["background"],
            stop_reason=query.validated_data.get("stop_reason"),
            conversation_id=query.validated_data.get("conversation_id") or None,
        )
        page = paginate(qs, run_page_params(request, default_limit=RUNS_DEFAULT_LIMIT))
        return Response(s.RunOut(page, many=True).data)


class RunActiveListQueryIn(serializers.Serializer):
    agent_id = serializers.CharField(required=False, allow_blank=True)
    background = serializers.BooleanField(required=False, allow_null=True, default=None)


class RunActiveListApi(OrgApiView):
    @extend_schema(
        operation_id="list_active_runs", parameters=[RunActiveListQueryIn], responses=s.RunOut(many=True)
    )
    def get(self, request: Request) -> Response:
        """Runs not finished yet (created or running), newest first, at most 100 (Letta's deprecated
        list_active_runs; `GET /v1/runs/?active=true` pages through them)."""
        query = RunActiveListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        qs = agent_selectors.run_list(
            actor=self.actor,
            agent_id=query.validated_data.get("agent_id") or None,
            active=True,
            background=query.validated_data["background"],
        )
        page = paginate(qs, PageParams(limit=ACTIVE_RUNS_LIMIT))
        return Response(s.RunOut(page, many=True).data)


class RunRetrieveApi(OrgApiView):
    @extend_schema(operation_id="retrieve_run", responses=s.RunOut)
    def get(self, request: Request, run_id: str) -> Response:
        return Response(s.RunOut(agent_selectors.run_get(actor=self.actor, run_id=run_id)).data)


class RunMessagesApi(OrgApiView):
    @extend_schema(operation_id="list_messages_for_run", parameters=LIST_PARAMETERS, responses={200: dict})
    def get(self, request: Request, run_id: str) -> Response:
        """The run's messages, oldest first by default (Letta's default for this list)."""
        qs = agent_selectors.run_message_list(actor=self.actor, run_id=run_id)
        return message_list_response(qs, request, actor=self.actor, default_order="asc")


class RunStepsApi(OrgApiView):
    @extend_schema(operation_id="list_steps_for_run", responses=s.StepOut(many=True))
    def get(self, request: Request, run_id: str) -> Response:
        agent_selectors.run_get(actor=self.actor, run_id=run_id)
        qs = agent_selectors.step_list(actor=self.actor, run_id=run_id)
        page = paginate(qs, run_page_params(request, default_limit=STEPS_DEFAULT_LIMIT))
        return Response(s.StepOut(page, many=True).data)


class RunUsageApi(OrgApiView):
    @extend_schema(operation_id="retrieve_run_usage", responses=s.UsageOut)
    def get(self, request: Request, run_id: str) -> Response:
        return Response(s.usage_out(agent_selectors.run_usage(actor=self.actor, run_id=run_id)))


class RunTraceQueryIn(serializers.Serializer):
    limit = serializers.IntegerField(required=False, default=1000, min_value=1, max_value=5000)


class RunTraceApi(OrgApiView):
    @extend_schema(
        operation_id="retrieve_trace_for_run",
        parameters=[RunTraceQueryIn],
        responses={200: build_array_type(build_basic_type(OpenApiTypes.OBJECT))},
    )
    def get(self, request: Request, run_id: str) -> Response:
        """The run's OpenTelemetry spans from the platform's own store (Letta reads ClickHouse), as Letta's
        span objects, oldest first, at most `limit`: its queue wait, load, steps, LLM and tool calls,
        memory edits and persistence (and, with OTLP on, its database, Redis and HTTP spans). A run not
        traced (RUN_TRACES off, or still executing) answers []; another organisation's run is 404."""
        query = RunTraceQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        run = agent_selectors.run_get(actor=self.actor, run_id=run_id)
        return Response(
            observability_selectors.run_spans(
                actor=self.actor, run_id=run.id, limit=query.validated_data["limit"]
            )
        )


class RunStreamApi(OrgApiView):
    """Attach to a run's stream (Letta's retrieve_stream): what came after `starting_after` (a seq_id the
    client saw), then the live tail until the run ends. Any run can be attached, background or not."""

    content_negotiation_class = LenientContentNegotiation

    @extend_schema(operation_id="retrieve_stream_for_run", request=s.RunStreamIn, responses={200: str})
    def post(self, request: Request, run_id: str) -> HttpResponse:
        return self._stream(request, run_id, request.data)

    @extend_schema(
        operation_id="retrieve_stream_for_run_get", parameters=[s.RunStreamIn], responses={200: str}
    )
    def get(self, request: Request, run_id: str) -> HttpResponse:
        return self._stream(request, run_id, request.query_params)

    def _stream(self, request: Request, run_id: str, body: object) -> HttpResponse:
        data = s.RunStreamIn(data=body)
        data.is_valid(raise_exception=True)
        run = agent_selectors.run_get(actor=self.actor, run_id=run_id)
        config = run.request_config or {}
        types = config.get("include_return_message_types")  # what the send asked for (async runs too)
        options = StreamOptions(
            stream_tokens=bool(config.get("stream_tokens")),
            include_types=frozenset(types) if types else None,
            include_pings=data.validated_data["include_pings"] is not False,
            approval_tools=agent_selectors.agent_approval_tool_names(actor=self.actor, agent_id=run.agent_id)
            | {tool["name"] for tool in config.get("client_tools") or []},
            starting_after=data.validated_data["starting_after"] or 0,
        )
        slot = throttles.require_stream_slot(self.actor)
        return run_sse_response(request, actor=self.actor, run_id=run.id, options=options, slot=slot)


urlpatterns = [
    re_path(r"^v1/runs/?$", RunListApi.as_view(), name="runs"),
    re_path(r"^v1/runs/active/?$", RunActiveListApi.as_view(), name="runs-active"),  # before {run_id}
    re_path(rf"^v1/runs/{RUN}/?$", RunRetrieveApi.as_view(), name="run-detail"),
    re_path(rf"^v1/runs/{RUN}/messages/?$", RunMessagesApi.as_view(), name="run-messages"),
    re_path(rf"^v1/runs/{RUN}/steps/?$", RunStepsApi.as_view(), name="run-steps"),
    re_path(rf"^v1/runs/{RUN}/usage/?$", RunUsageApi.as_view(), name="run-usage"),
    re_path(rf"^v1/runs/{RUN}/trace/?$", RunTraceApi.as_view(), name="run-trace"),
    re_path(rf"^v1/runs/{RUN}/stream/?$", RunStreamApi.as_view(), name="run-stream"),
]
