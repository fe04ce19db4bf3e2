"""/v1/llm-calls (an extension; Letta keeps one provider trace per step, GET /v1/steps/{id}/trace, which this
server serves too): every LLM call of a run as sent and received, with tokens, latency, cost and error.
Bodies are JSON text cut at LLM_RECORD_MAX_BYTES (`truncated`), returned by retrieve only (a list page
leaves them out); no key or header is ever stored."""

from __future__ import annotations

from django.urls import re_path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.base import OrgApiView
from apps.api.views.runs import run_page_params
from apps.core.pagination import paginate
from apps.llm import selectors as llm_selectors
from apps.llm.models import LlmCall

LLM_CALL = r"(?P<llm_call_id>[^/]+)"


class LlmCallOut(serializers.Serializer):
    id = serializers.CharField()
    agent_id = serializers.CharField(allow_null=True)
    run_id = serializers.CharField(allow_null=True)
    step_id = serializers.CharField(allow_null=True)
    model = serializers.CharField()
    model_handle = serializers.CharField()
    model_endpoint = serializers.CharField(source="endpoint", allow_null=True)
    streamed = serializers.BooleanField()
    status = serializers.CharField()
    request_json = serializers.CharField(
        source="request_body", allow_null=True, help_text="The body as sent (JSON text); null in lists."
    )
    response_json = serializers.CharField(
        source="response_body", allow_null=True, help_text="The answer (JSON text); null in lists."
    )
    truncated = serializers.BooleanField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    latency_ms = serializers.IntegerField(allow_null=True)
    attempts = serializers.IntegerField()
    cost_usd = serializers.FloatField(allow_null=True)
    error_type = serializers.CharField(allow_null=True)
    error_message = serializers.CharField(allow_null=True)
    output_token_ids = serializers.ListField(child=serializers.IntegerField(), allow_null=True)
    logprobs = serializers.JSONField(allow_null=True)
    created_at = serializers.DateTimeField()

    def to_representation(self, instance: LlmCall) -> dict[str, object]:
        if not self.context.get("bodies", True):
            instance.request_body = instance.response_body = ""  # deferred: not read from the database
        data = super().to_representation(instance)
        if not self.context.get("bodies", True):
            data["request_json"] = data["response_json"] = None
        for key in ("agent_id", "run_id", "step_id", "model_endpoint", "error_type", "error_message"):
            data[key] = data[key] or None
        return data


class LlmCallListQueryIn(serializers.Serializer):
    agent_id = serializers.CharField(required=False, allow_blank=True)
    run_id = serializers.CharField(required=False, allow_blank=True)
    step_id = serializers.CharField(required=False, allow_blank=True)
    status = serializers.ChoiceField(choices=[c.value for c in LlmCall.Status], required=False)


class LlmCallListApi(OrgApiView):
    @extend_schema(
        operation_id="list_llm_calls", parameters=[LlmCallListQueryIn], responses=LlmCallOut(many=True)
    )
    def get(self, request: Request) -> Response:
        query = LlmCallListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        filters = {k: v for k, v in query.validated_data.items() if v}
        # Without the bodies (up to 2 x LLM_RECORD_MAX_BYTES each): a page stays small; retrieve has them.
        qs = llm_selectors.llm_call_list(actor=self.actor, **filters).defer("request_body", "response_body")
        page = paginate(qs, run_page_params(request, default_limit=50))
        rows = LlmCallOut(page, many=True, context={"bodies": False}).data
        return Response(rows)


class LlmCallRetrieveApi(OrgApiView):
    @extend_schema(operation_id="retrieve_llm_call", responses=LlmCallOut)
    def get(self, request: Request, llm_call_id: str) -> Response:
        record = llm_selectors.llm_call_get(actor=self.actor, llm_call_id=llm_call_id)
        return Response(LlmCallOut(record).data)


urlpatterns = [
    re_path(r"^v1/llm-calls/?$", LlmCallListApi.as_view(), name="llm-calls"),
    re_path(rf"^v1/llm-calls/{LLM_CALL}/?$", LlmCallRetrieveApi.as_view(), name="llm-call-detail"),
]
