"""GET /v1/agents/{agent_id}/export and POST /v1/agents/import: agent files (logic in apps.agents.agent_file,
through the agents' services).

`/v1/agents/import` must be routed before any `/v1/agents/{agent_id}` pattern: list these patterns first.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from django.urls import re_path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import services as agent_services
from apps.agents.errors import AgentFileTooLarge
from apps.api.base import OrgApiView
from apps.core.errors import InvalidInput


class FormBooleanField(serializers.BooleanField):
    """A form boolean whose absence means its default (DRF reads an absent HTML-form boolean as False)."""

    default_empty_html = serializers.empty


class AgentExportApi(OrgApiView):
    class InputSerializer(serializers.Serializer):
        conversation_id = serializers.CharField(required=False, allow_blank=True)
        scrub_messages = FormBooleanField(required=False, default=False)
        use_legacy_format = FormBooleanField(required=False, default=False)
        max_steps = serializers.IntegerField(required=False)  # deprecated, ignored

    @extend_schema(operation_id="export_agent", parameters=[InputSerializer], responses={200: dict})
    def get(self, request: Request, agent_id: str) -> HttpResponse:
        data = self.InputSerializer(data=request.query_params)
        data.is_valid(raise_exception=True)
        params = data.validated_data
        if params["use_legacy_format"]:
            raise InvalidInput("Legacy format is not supported")
        document = agent_services.agent_export(
            actor=self.actor,
            agent_id=agent_id,
            conversation_id=params.get("conversation_id") or None,
            scrub_messages=params["scrub_messages"],
        )
        return HttpResponse(
            json.dumps(document, indent=2, ensure_ascii=False), content_type="application/json"
        )


FORM_ALLOWANCE_BYTES = 1024 * 1024
"""What an import's body may have besides its file: the multipart framing and the form fields."""


class RefusalOut(serializers.Serializer):
    kind = serializers.CharField()
    name = serializers.CharField()
    reason = serializers.CharField()


class AgentImportApi(OrgApiView):
    """Multipart, as the SDK sends it: the `file` part and plain form fields (booleans "true"/"false").

    A file past AGENT_FILE_MAX_BYTES is a 413: by its Content-Length before the body is parsed, else by the
    upload's size before it is read."""

    parser_classes = [MultiPartParser, FormParser]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # OrgApiView.initial parses the body (its NUL check reads request.data): look at its size first.
        declared = request.META.get("CONTENT_LENGTH") or ""
        if declared.isdigit() and int(declared) > settings.AGENT_FILE_MAX_BYTES + FORM_ALLOWANCE_BYTES:
            raise AgentFileTooLarge.over_limit()
        super().initial(request, *args, **kwargs)

    class InputSerializer(serializers.Serializer):
        file = serializers.FileField()
        append_copy_suffix = FormBooleanField(required=False, default=True)
        override_existing_tools = FormBooleanField(required=False, default=True)
        strip_messages = FormBooleanField(required=False, default=False)
        name = serializers.CharField(required=False, allow_null=True, allow_blank=True)
        override_name = serializers.CharField(required=False, allow_null=True, allow_blank=True)
        model = serializers.CharField(required=False, allow_null=True, allow_blank=True)
        override_model_handle = serializers.CharField(required=False, allow_null=True, allow_blank=True)
        embedding = serializers.CharField(required=False, allow_null=True, allow_blank=True)
        override_embedding_handle = serializers.CharField(required=False, allow_null=True, allow_blank=True)
        secrets = serializers.CharField(required=False, allow_null=True, allow_blank=True)
        env_vars_json = serializers.CharField(required=False, allow_null=True, allow_blank=True)
        project_id = serializers.CharField(required=False, allow_null=True, allow_blank=True)  # ignored

    class OutputSerializer(serializers.Serializer):
        agent_ids = serializers.ListField(child=serializers.CharField())
        refused = serializers.ListField(child=RefusalOut(), required=False)

    @extend_schema(operation_id="import_agent", request=InputSerializer, responses=OutputSerializer)
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        params = data.validated_data
        if params["file"].size > settings.AGENT_FILE_MAX_BYTES:
            raise AgentFileTooLarge.over_limit()
        parsed = agent_services.parse_agent_file(params["file"].read())
        result = agent_services.agent_import(
            actor=self.actor,
            file=parsed,
            append_copy_suffix=params["append_copy_suffix"],
            override_existing_tools=params["override_existing_tools"],
            strip_messages=params["strip_messages"],
            name=params.get("name") or params.get("override_name") or None,
            model=params.get("model") or params.get("override_model_handle") or None,
            embedding=params.get("embedding")
            or params.get("override_embedding_handle")
            or request.headers.get("x-override-embedding-model")
            or None,
            secrets=_secrets(params.get("secrets") or params.get("env_vars_json")),
        )
        # `refused` is ours (Letta has none): what the importer's role kept out of the import.
        refused = [refusal.as_dict() for refusal in result.refused]
        return Response(self.OutputSerializer({"agent_ids": result.agent_ids, "refused": refused}).data)


def _secrets(raw: str | None) -> dict[str, str] | None:
    """The `secrets` form field: a JSON object of strings."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidInput('secrets must be a JSON object of strings, e.g. {"API_KEY": "..."}')
    return value


urlpatterns = [
    re_path(r"^v1/agents/import/?$", AgentImportApi.as_view(), name="agent-import"),
    re_path(r"^v1/agents/(?P<agent_id>[^/]+)/export/?$", AgentExportApi.as_view(), name="agent-export"),
]
