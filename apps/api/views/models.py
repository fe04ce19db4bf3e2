"""/v1/models: the chat and embedding model handles this organisation can use."""

from __future__ import annotations

from django.urls import re_path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.api.base import OrgApiView
from apps.api.serializers import agents as s


class ModelListQueryIn(serializers.Serializer):
    provider_name = serializers.CharField(required=False)
    provider_type = serializers.CharField(required=False)


class ModelListApi(OrgApiView):
    @extend_schema(operation_id="list_models", parameters=[ModelListQueryIn], responses=s.ModelOut(many=True))
    def get(self, request: Request) -> Response:
        query = ModelListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        models = agent_selectors.model_list(
            actor=self.actor,
            provider_category=request.query_params.getlist("provider_category") or None,
            **query.validated_data,
        )
        return Response(s.ModelOut(models, many=True).data)


class EmbeddingModelListApi(OrgApiView):
    @extend_schema(operation_id="list_embedding_models", responses=s.EmbeddingModelOut(many=True))
    def get(self, request: Request) -> Response:
        models = agent_selectors.embedding_model_list(actor=self.actor)
        return Response(s.EmbeddingModelOut(models, many=True).data)


urlpatterns = [
    # /models/embedding before anything else under /models/.
    re_path(r"^v1/models/embedding/?$", EmbeddingModelListApi.as_view(), name="embedding-models"),
    re_path(r"^v1/models/?$", ModelListApi.as_view(), name="models"),
]
