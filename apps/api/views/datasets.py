"""/v1/datasets/runs (an extension: Letta has no export): finished runs as a JSONL dataset, streamed, one run
per line: messages with a loss mask (1 for what the model produced), tool calls, per-call token ids and
logprobs (`turns`), and step feedback. Filtered by agent, time and feedback; at most DATASET_MAX_RUNS runs
per request (page on with `start_date` = the last row's created_at). `manage.py export_dataset` writes the
same rows (and Parquet)."""

from __future__ import annotations

import json

from django.http import StreamingHttpResponse
from django.urls import re_path
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request

from apps.agents import selectors as agent_selectors
from apps.agents.models import Step
from apps.api.base import OrgApiView

DATASET_MAX_RUNS = 1000


class DatasetQueryIn(serializers.Serializer):
    agent_id = serializers.CharField(required=False, allow_blank=True)
    start_date = serializers.DateTimeField(required=False, help_text="Runs created at or after this time.")
    end_date = serializers.DateTimeField(required=False, help_text="Runs created before this time.")
    feedback = serializers.ChoiceField(
        choices=[c.value for c in Step.Feedback],
        required=False,
        help_text="Runs with a step of this feedback.",
    )
    limit = serializers.IntegerField(required=False, min_value=1, max_value=DATASET_MAX_RUNS, default=100)


class RunDatasetApi(OrgApiView):
    @extend_schema(
        operation_id="export_runs_dataset",
        parameters=[DatasetQueryIn],
        responses={200: OpenApiResponse(description="JSONL: one run per line")},
    )
    def get(self, request: Request) -> StreamingHttpResponse:
        query = DatasetQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        rows = agent_selectors.run_dataset_rows(
            actor=self.actor,
            agent_id=data.get("agent_id") or None,
            since=data.get("start_date"),
            until=data.get("end_date"),
            feedback=data.get("feedback"),
            limit=data["limit"],
        )
        lines = (json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in rows)
        return StreamingHttpResponse(lines, content_type="application/x-ndjson")


urlpatterns = [
    re_path(r"^v1/datasets/runs/?$", RunDatasetApi.as_view(), name="datasets-runs"),
]
