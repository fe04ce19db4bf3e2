"""One table from domain errors to HTTP statuses, rendered in Letta's shape: {"detail": ...}."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from apps.agents.errors import PendingApproval
from apps.core.errors import Conflict, DomainError, InvalidInput, NotFound, PermissionDenied

STATUS_FOR: dict[type[DomainError], int] = {
    NotFound: status.HTTP_404_NOT_FOUND,
    InvalidInput: status.HTTP_400_BAD_REQUEST,
    Conflict: status.HTTP_409_CONFLICT,
    # A caller without the role sees the same as a caller from elsewhere: nothing leaks.
    PermissionDenied: status.HTTP_404_NOT_FOUND,
}


def status_for(error: DomainError) -> int:
    for cls in type(error).__mro__:
        if cls in STATUS_FOR:
            return STATUS_FOR[cls]
    return status.HTTP_400_BAD_REQUEST


def _flatten(detail: Any, prefix: str = "") -> list[str]:
    if isinstance(detail, dict):
        return [m for key, value in detail.items() for m in _flatten(value, f"{prefix}{key}.")]
    if isinstance(detail, list):
        return [m for item in detail for m in _flatten(item, prefix)]
    return [f"{prefix.rstrip('.')}: {detail}" if prefix else str(detail)]


def pending_approval_response(exc: PendingApproval) -> Response:
    """Letta's sync-send body for a message sent while a tool call awaits approval; never retried."""
    response = Response(
        {
            "detail": {
                "code": "PENDING_APPROVAL",
                "message": exc.message,
                "pending_request_id": exc.pending_request_id,
            }
        },
        status=status.HTTP_409_CONFLICT,
    )
    response["x-should-retry"] = "false"
    return response


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, PendingApproval):
        return pending_approval_response(exc)
    if isinstance(exc, DomainError):
        return Response({"detail": exc.message, "code": exc.code}, status=status_for(exc))
    if isinstance(exc, exceptions.ValidationError):
        # Letta answers request-validation errors with 422 and a readable detail string.
        messages = _flatten(exc.detail)
        return Response(
            {"detail": "; ".join(messages), "errors": exc.detail},
            status=status.HTTP_422_UNPROCESSABLE_ENTITY,
        )
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        response = Response({"detail": str(exc.detail)}, status=status.HTTP_401_UNAUTHORIZED)
        response["WWW-Authenticate"] = "Bearer"
        return response
    return drf_exception_handler(exc, context)
