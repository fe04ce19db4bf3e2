"""/v1/sandbox-config (Letta's sandbox-config router): how an organisation's custom tools run (one config
per type: `docker`, `local`) and the variables injected into them, as thin adapters over
apps.sandbox.services / selectors.

Reads are open to every member (a variable shows its key, never its value); every write is for owners and
admins (403 "Not allowed" for others). A setting that is malformed or outside what the platform allows
(the sandbox runner's maxima, SANDBOX_RUNNER_MAX_*) is a 422 naming the field (`config.memory_mb`).
Letta's `POST /local/recreate-venv` has no counterpart (the jail has no virtualenv) and is not served.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.http import HttpResponse
from django.urls import re_path
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.base import OrgApiView
from apps.api.serializers import sandbox_config as s
from apps.core.pagination import PageParams
from apps.sandbox import selectors as sandbox_selectors
from apps.sandbox import services as sandbox_services

LIST_DEFAULT_LIMIT = 1000  # Letta's


class SandboxApiView(OrgApiView):
    config_prefix = "config."
    """How the fields of a config are named in this endpoint's body (a 422 names the one at fault)."""

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, sandbox_services.SandboxFieldInvalid):
            field = s.wire_field(exc.field, prefix=self.config_prefix)
            exc = serializers.ValidationError({field: [exc.reason]})
        return super().handle_exception(exc)


def page_params(request: Request) -> PageParams:
    """Letta's `limit` and `after`; oldest first unless `order` says otherwise."""
    page = PageParams.from_query(request.query_params, default_limit=LIST_DEFAULT_LIMIT)
    return replace(page, order=request.query_params.get("order") or "asc")


LIST_PARAMETERS = [
    OpenApiParameter("limit", int),
    OpenApiParameter("after", str),
    OpenApiParameter("order", str, enum=["asc", "desc"]),
]


class SandboxConfigListCreateApi(SandboxApiView):
    @extend_schema(
        operation_id="list_sandbox_configs",
        parameters=[*LIST_PARAMETERS, OpenApiParameter("sandbox_type", str)],
        responses=s.SandboxConfigOut(many=True),
    )
    def get(self, request: Request) -> Response:
        kind = request.query_params.get("sandbox_type")
        configs = sandbox_selectors.sandbox_config_list(
            actor=self.actor, page=page_params(request), sandbox_type=s.sandbox_type(kind) if kind else None
        )
        return Response(s.SandboxConfigOut(configs, many=True).data)

    @extend_schema(
        operation_id="create_sandbox_config", request=s.SandboxConfigCreateIn, responses=s.SandboxConfigOut
    )
    def post(self, request: Request) -> Response:
        """Create the organisation's config of that type, or replace the one it has (Letta's
        create-or-update); settings left out take their defaults."""
        data = s.SandboxConfigCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        config = sandbox_services.sandbox_config_upsert(actor=self.actor, **data.service_kwargs())
        return Response(s.SandboxConfigOut(config).data)


class SandboxConfigLocalApi(SandboxApiView):
    config_prefix = ""  # the body is the local config itself

    @extend_schema(
        operation_id="create_custom_local_sandbox_config", request=dict, responses=s.SandboxConfigOut
    )
    def post(self, request: Request) -> Response:
        body = request.data if isinstance(request.data, dict) else None
        if body is None:
            raise serializers.ValidationError({"non_field_errors": ["The body must be a JSON object."]})
        if s.sandbox_type(body.get("type") or "local") != "local":
            raise serializers.ValidationError({"type": ["Provided config must be of type 'local'."]})
        config = sandbox_services.sandbox_config_upsert(
            actor=self.actor, sandbox_type="local", fields=s.config_fields(body)
        )
        return Response(s.SandboxConfigOut(config).data)


class SandboxConfigDefaultApi(SandboxApiView):
    @extend_schema(operation_id="create_default_sandbox_config", request=None, responses=s.SandboxConfigOut)
    def post(self, request: Request, kind: str) -> Response:
        """The organisation's config of that type, created with the defaults if it has none
        (`e2b/default` is the Docker one)."""
        config = sandbox_services.sandbox_config_get_or_create_default(
            actor=self.actor, sandbox_type=s.sandbox_type(kind)
        )
        return Response(s.SandboxConfigOut(config).data)


class SandboxConfigDetailApi(SandboxApiView):
    @extend_schema(operation_id="retrieve_sandbox_config", responses=s.SandboxConfigOut)
    def get(self, request: Request, sandbox_config_id: str) -> Response:
        config = sandbox_selectors.sandbox_config_get(actor=self.actor, sandbox_config_id=sandbox_config_id)
        return Response(s.SandboxConfigOut(config).data)

    @extend_schema(
        operation_id="update_sandbox_config", request=s.SandboxConfigUpdateIn, responses=s.SandboxConfigOut
    )
    def patch(self, request: Request, sandbox_config_id: str) -> Response:
        """Change the settings given; the others stay."""
        data = s.SandboxConfigUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        config = sandbox_services.sandbox_config_update(
            actor=self.actor, sandbox_config_id=sandbox_config_id, **data.service_kwargs()
        )
        return Response(s.SandboxConfigOut(config).data)

    @extend_schema(operation_id="delete_sandbox_config", responses={204: None})
    def delete(self, request: Request, sandbox_config_id: str) -> HttpResponse:
        sandbox_services.sandbox_config_delete(actor=self.actor, sandbox_config_id=sandbox_config_id)
        return HttpResponse(status=status.HTTP_204_NO_CONTENT)


class SandboxEnvVarListCreateApi(SandboxApiView):
    @extend_schema(
        operation_id="list_sandbox_env_vars",
        parameters=LIST_PARAMETERS,
        responses=s.SandboxEnvVarOut(many=True),
    )
    def get(self, request: Request, sandbox_config_id: str) -> Response:
        variables = sandbox_selectors.sandbox_env_var_list(
            actor=self.actor, sandbox_config_id=sandbox_config_id, page=page_params(request)
        )
        return Response(s.SandboxEnvVarOut(variables, many=True).data)

    @extend_schema(
        operation_id="create_sandbox_env_var", request=s.SandboxEnvVarCreateIn, responses=s.SandboxEnvVarOut
    )
    def post(self, request: Request, sandbox_config_id: str) -> Response:
        data = s.SandboxEnvVarCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        variable = sandbox_services.sandbox_env_var_create(
            actor=self.actor, sandbox_config_id=sandbox_config_id, **data.validated_data
        )
        return Response(s.SandboxEnvVarOut(variable).data)


class SandboxEnvVarDetailApi(SandboxApiView):
    @extend_schema(
        operation_id="update_sandbox_env_var", request=s.SandboxEnvVarUpdateIn, responses=s.SandboxEnvVarOut
    )
    def patch(self, request: Request, env_var_id: str) -> Response:
        data = s.SandboxEnvVarUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        changes: dict[str, Any] = data.validated_data
        variable = sandbox_services.sandbox_env_var_update(actor=self.actor, env_var_id=env_var_id, **changes)
        return Response(s.SandboxEnvVarOut(variable).data)

    @extend_schema(operation_id="delete_sandbox_env_var", responses={204: None})
    def delete(self, request: Request, env_var_id: str) -> HttpResponse:
        sandbox_services.sandbox_env_var_delete(actor=self.actor, env_var_id=env_var_id)
        return HttpResponse(status=status.HTTP_204_NO_CONTENT)


_ROOT = r"^v1/sandbox-config"
_CONFIG = rf"{_ROOT}/(?P<sandbox_config_id>[^/]+)"

urlpatterns = [
    # Static segments first: they would otherwise be read as a config id.
    re_path(rf"{_ROOT}/?$", SandboxConfigListCreateApi.as_view(), name="sandbox-configs"),
    re_path(
        rf"{_ROOT}/(?P<kind>local|docker|e2b)/default/?$",
        SandboxConfigDefaultApi.as_view(),
        name="sandbox-config-default",
    ),
    re_path(rf"{_ROOT}/local/?$", SandboxConfigLocalApi.as_view(), name="sandbox-config-local"),
    re_path(
        rf"{_ROOT}/environment-variable/(?P<env_var_id>[^/]+)/?$",
        SandboxEnvVarDetailApi.as_view(),
        name="sandbox-env-var-detail",
    ),
    re_path(rf"{_CONFIG}/?$", SandboxConfigDetailApi.as_view(), name="sandbox-config-detail"),
    re_path(
        rf"{_CONFIG}/environment-variable/?$",
        SandboxEnvVarListCreateApi.as_view(),
        name="sandbox-env-vars",
    ),
]
