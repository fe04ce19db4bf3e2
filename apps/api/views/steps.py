"""/v1/steps: list, retrieve, feedback, a step's messages, metrics and provider trace."""

from __future__ import annotations

from typing import Any

from django.urls import re_path
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.agents import services as agent_services
from apps.agents.models import Step
from apps.api.base import OrgApiView
from apps.api.serializers import messages as s
from apps.api.serializers.strict import refuse_unsupported
from apps.api.views.messages import LIST_PARAMETERS, message_list_response
from apps.api.views.runs import STEPS_DEFAULT_LIMIT, run_page_params
from apps.core.pagination import paginate
from apps.llm.selectors import endpoint_for_tenants

STEP = r"(?P<step_id>[^/]+)"


class StepListQueryIn(serializers.Serializer):
    agent_id = serializers.CharField(required=False, allow_blank=True)
    run_id = serializers.CharField(required=False, allow_blank=True)
    model = serializers.CharField(required=False, allow_blank=True)
    feedback = serializers.ChoiceField(choices=[c.value for c in Step.Feedback], required=False)
    has_feedback = serializers.BooleanField(required=False, allow_null=True, default=None)
    start_date = serializers.DateTimeField(required=False)
    end_date = serializers.DateTimeField(required=False)


class StepListApi(OrgApiView):
    @extend_schema(
        operation_id="list_steps",
        parameters=[StepListQueryIn, OpenApiParameter("tags", str, many=True)],
        responses=s.StepOut(many=True),
    )
    def get(self, request: Request) -> Response:
        query = StepListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        # Refused, not dropped: an empty page would claim no step belongs to those traces.
        refuse_unsupported(
            {"trace_ids": request.query_params.getlist("trace_ids")},
            {"trace_ids": "steps carry no trace ids on this server yet (they come with tracing)"},
        )
        filters = {k: v for k, v in query.validated_data.items() if v not in (None, "")}
        qs = agent_selectors.step_list(
            actor=self.actor, tags=request.query_params.getlist("tags") or None, **filters
        )
        page = paginate(qs, run_page_params(request, default_limit=STEPS_DEFAULT_LIMIT))
        return Response(s.StepOut(page, many=True).data)


class StepRetrieveApi(OrgApiView):
    @extend_schema(operation_id="retrieve_step", responses=s.StepOut)
    def get(self, request: Request, step_id: str) -> Response:
        return Response(s.StepOut(agent_selectors.step_get(actor=self.actor, step_id=step_id)).data)


class StepFeedbackApi(OrgApiView):
    @extend_schema(operation_id="add_feedback", request=s.StepFeedbackIn, responses=s.StepOut)
    def patch(self, request: Request, step_id: str) -> Response:
        data = s.StepFeedbackIn(data=request.data)
        data.is_valid(raise_exception=True)
        agent_selectors.step_get(actor=self.actor, step_id=step_id)
        # Only what the body carries: a PATCH with tags alone keeps the feedback, `null` clears it.
        step = agent_services.step_set_feedback(actor=self.actor, step_id=step_id, **data.validated_data)
        return Response(s.StepOut(step).data)


class StepMessagesApi(OrgApiView):
    @extend_schema(operation_id="list_messages_for_step", parameters=LIST_PARAMETERS, responses={200: dict})
    def get(self, request: Request, step_id: str) -> Response:
        qs = agent_selectors.step_message_list(actor=self.actor, step_id=step_id)
        return message_list_response(qs, request, actor=self.actor, default_order="asc")


class StepMetricsApi(OrgApiView):
    @extend_schema(operation_id="retrieve_metrics_for_step", responses={200: dict})
    def get(self, request: Request, step_id: str) -> Response:
        step = agent_selectors.step_get(actor=self.actor, step_id=step_id)
        llm_ns = step.latency_ms * 1_000_000 if step.latency_ms is not None else None
        return Response(
            {
                "id": step.id,
                "agent_id": step.agent_id,
                "run_id": step.run_id,
                "step_ns": llm_ns,
                "llm_request_ns": llm_ns,
                "tool_execution_ns": None,
                "step_start_ns": None,
                "llm_request_start_ns": None,
            }
        )


class StepTraceApi(OrgApiView):
    @extend_schema(operation_id="retrieve_trace_for_step", responses={200: dict})
    def get(self, request: Request, step_id: str) -> Response:
        """The exact request sent to the LLM and its response (Letta's ProviderTrace)."""
        step = agent_selectors.step_get(actor=self.actor, step_id=step_id)
        return Response(
            {
                "id": f"provider_trace-{step.id.removeprefix('step-')}",
                "step_id": step.id,
                "request_json": request_for_tenants(step.request_json),
                "response_json": step.response_json or {},
                "created_at": step.created_at,
            }
        )


def request_for_tenants(request_json: Any) -> Any:
    """A stored LLM request with its `api_base` as a tenant may see it: traces written before that rule
    (apps.llm.client) hold the deployment's own provider URL."""
    if not isinstance(request_json, dict) or "api_base" not in request_json:
        return request_json or {}
    return {**request_json, "api_base": endpoint_for_tenants(request_json["api_base"])}


urlpatterns = [
    re_path(r"^v1/steps/?$", StepListApi.as_view(), name="steps"),
    re_path(rf"^v1/steps/{STEP}/?$", StepRetrieveApi.as_view(), name="step-detail"),
    re_path(rf"^v1/steps/{STEP}/feedback/?$", StepFeedbackApi.as_view(), name="step-feedback"),
    re_path(rf"^v1/steps/{STEP}/messages/?$", StepMessagesApi.as_view(), name="step-messages"),
    re_path(rf"^v1/steps/{STEP}/metrics/?$", StepMetricsApi.as_view(), name="step-metrics"),
    re_path(rf"^v1/steps/{STEP}/trace/?$", StepTraceApi.as_view(), name="step-trace"),
]
