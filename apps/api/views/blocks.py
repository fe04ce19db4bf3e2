"""/v1/health and /v1/blocks: thin adapters over services and selectors."""

from __future__ import annotations

from django.db import connection
from django.urls import re_path
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api.base import OrgApiView
from apps.api.serializers import common as s
from apps.core.pagination import PageParams, paginate
from apps.memory import selectors as memory_selectors
from apps.memory import services as memory_services

VERSION = "0.1.0"


class HealthApi(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(operation_id="health", responses=s.HealthOut)
    def get(self, request: Request) -> Response:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return Response({"status": "ok", "version": VERSION})


class BlockListCreateApi(OrgApiView):
    @extend_schema(operation_id="list_blocks", responses=s.BlockOut(many=True))
    def get(self, request: Request) -> Response:
        label = request.query_params.get("label")
        templates_only = request.query_params.get("templates_only") == "true"
        qs = memory_selectors.block_list(actor=self.actor, label=label, templates_only=templates_only)
        page = paginate(qs, PageParams.from_query(request.query_params))
        return Response(s.BlockOut(page, many=True).data)

    @extend_schema(operation_id="create_block", request=s.BlockCreateIn, responses=s.BlockOut)
    def post(self, request: Request) -> Response:
        data = s.BlockCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        fields = {k: v for k, v in data.validated_data.items() if v is not None}
        block = memory_services.block_create(actor=self.actor, **fields)
        return Response(s.BlockOut(block).data)


class BlockDetailApi(OrgApiView):
    @extend_schema(operation_id="retrieve_block", responses=s.BlockOut)
    def get(self, request: Request, block_id: str) -> Response:
        block = memory_selectors.block_get(actor=self.actor, block_id=block_id)
        return Response(s.BlockOut(block).data)

    @extend_schema(operation_id="modify_block", request=s.BlockUpdateIn, responses=s.BlockOut)
    def patch(self, request: Request, block_id: str) -> Response:
        data = s.BlockUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        block = memory_services.block_update(actor=self.actor, block_id=block_id, **data.validated_data)
        return Response(s.BlockOut(block).data)

    @extend_schema(operation_id="delete_block", responses={200: None})
    def delete(self, request: Request, block_id: str) -> Response:
        memory_services.block_delete(actor=self.actor, block_id=block_id)
        return Response({"message": f"Block {block_id} deleted"})


urlpatterns = [
    re_path(r"^v1/health/?$", HealthApi.as_view(), name="health"),
    re_path(r"^v1/blocks/?$", BlockListCreateApi.as_view(), name="blocks"),
    re_path(r"^v1/blocks/(?P<block_id>[^/]+)/?$", BlockDetailApi.as_view(), name="block-detail"),
]
