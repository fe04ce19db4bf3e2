"""/v1/providers (Letta's providers router): an organisation's own LLM provider credentials (BYOK).

Reads are open to every member (names, types, base URLs without credentials; never a key); creating,
changing, deleting and checking are for owners and admins (403 "Not allowed" for others, before anything
is validated further or sent anywhere). A check lists the provider's models once, through the outbound
guard for a URL the organisation chose and within the LLM client's deadlines (apps.llm.services):
200 with Letta's message, 401 when the provider refused the key (as Letta), 502 when it could not be
asked or answered oddly (Letta: 500), 400 for a URL the guard refuses.
"""

from __future__ import annotations

from django.urls import re_path
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.base import OrgApiView
from apps.api.serializers import providers as s
from apps.core.pagination import PageParams
from apps.llm import selectors as llm_selectors
from apps.llm import services as llm_services

PROVIDERS_DEFAULT_LIMIT = 50


class ProviderApiView(OrgApiView):
    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, llm_services.ProviderCheckFailed):
            code = status.HTTP_401_UNAUTHORIZED if exc.key_refused else status.HTTP_502_BAD_GATEWAY
            response = Response({"detail": exc.message, "code": exc.code}, status=code)
            response["x-should-retry"] = "false"
            return response
        return super().handle_exception(exc)


class ProviderListCreateApi(ProviderApiView):
    @extend_schema(
        operation_id="list_providers",
        parameters=[
            OpenApiParameter("before", str),
            OpenApiParameter("after", str),
            OpenApiParameter("limit", int),
            OpenApiParameter("order", str, enum=["asc", "desc"]),
            OpenApiParameter("order_by", str, enum=["created_at"]),
            OpenApiParameter("name", str),
            OpenApiParameter("provider_type", str),
        ],
        responses=s.ProviderOut(many=True),
    )
    def get(self, request: Request) -> Response:
        page = PageParams.from_query(request.query_params, default_limit=PROVIDERS_DEFAULT_LIMIT)
        providers = llm_selectors.provider_page(
            actor=self.actor,
            page=page,
            name=request.query_params.get("name") or None,
            provider_type=request.query_params.get("provider_type") or None,
        )
        return Response(s.ProviderOut(providers, many=True).data)

    @extend_schema(operation_id="create_provider", request=s.ProviderCreateIn, responses=s.ProviderOut)
    def post(self, request: Request) -> Response:
        data = s.ProviderCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        provider = llm_services.provider_create(actor=self.actor, **data.service_kwargs())
        return Response(s.ProviderOut(provider).data)


class ProviderDetailApi(ProviderApiView):
    @extend_schema(operation_id="retrieve_provider", responses=s.ProviderOut)
    def get(self, request: Request, provider_id: str) -> Response:
        provider = llm_selectors.provider_get(actor=self.actor, provider_id=provider_id)
        return Response(s.ProviderOut(provider).data)

    @extend_schema(operation_id="modify_provider", request=s.ProviderUpdateIn, responses=s.ProviderOut)
    def patch(self, request: Request, provider_id: str) -> Response:
        data = s.ProviderUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        provider = llm_services.provider_update(
            actor=self.actor, provider_id=provider_id, **data.service_kwargs()
        )
        return Response(s.ProviderOut(provider).data)

    @extend_schema(operation_id="delete_provider", responses=s.MessageOut)
    def delete(self, request: Request, provider_id: str) -> Response:
        llm_services.provider_delete(actor=self.actor, provider_id=provider_id)
        return Response({"message": f"Provider id={provider_id} successfully deleted"})


class ProviderCheckApi(ProviderApiView):
    # The schema fuzzer (tests/api/test_schema_fuzz.py) skips both checks: a check calls the provider.
    @extend_schema(operation_id="check_provider", request=s.ProviderCheckIn, responses={200: dict})
    def post(self, request: Request) -> Response:
        data = s.ProviderCheckIn(data=request.data)
        data.is_valid(raise_exception=True)
        message = llm_services.provider_check(actor=self.actor, **data.service_kwargs())
        return Response({"message": message})


class ProviderCheckStoredApi(ProviderApiView):
    @extend_schema(operation_id="check_existing_provider", request=None, responses={200: dict})
    def post(self, request: Request, provider_id: str) -> Response:
        message = llm_services.provider_check_stored(actor=self.actor, provider_id=provider_id)
        return Response({"message": message})


_PROVIDER = r"^v1/providers/(?P<provider_id>[^/]+)"

urlpatterns = [
    re_path(r"^v1/providers/?$", ProviderListCreateApi.as_view(), name="providers"),
    re_path(r"^v1/providers/check/?$", ProviderCheckApi.as_view(), name="provider-check"),
    re_path(rf"{_PROVIDER}/?$", ProviderDetailApi.as_view(), name="provider-detail"),
    re_path(rf"{_PROVIDER}/check/?$", ProviderCheckStoredApi.as_view(), name="provider-check-stored"),
]
