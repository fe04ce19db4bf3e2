"""One table from domain errors to HTTP statuses, rendered in Letta's shape: {"detail": ...}.

An unexpected exception never shows its text to the tenant (it may name internal hosts, paths, SQL): the
answer is a plain 500 with an `error_id`, and the log has that id with the exception and its traceback.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.core.signals import got_request_exception
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from apps.agents.errors import AgentFileTooLarge, MaxStepsExceeded, PendingApproval
from apps.core.errors import Conflict, DomainError, InvalidInput, NotFound, PermissionDenied
from apps.folders.errors import FileTooLarge, UnsupportedFileType

logger = logging.getLogger(__name__)

NOT_FOUND = "Not Found"
METHOD_NOT_ALLOWED = "Method Not Allowed"
"""Letta's (FastAPI's) bodies for a path no route serves and for a method a route does not take."""

STATUS_FOR: dict[type[DomainError], int] = {
    NotFound: status.HTTP_404_NOT_FOUND,
    InvalidInput: status.HTTP_400_BAD_REQUEST,
    Conflict: status.HTTP_409_CONFLICT,
    # The caller can see the object (it is their organisation's) but their role may not do this: 403
    # with the reason. What they may not even see is a NotFound (404) raised by the service.
    PermissionDenied: status.HTTP_403_FORBIDDEN,
    AgentFileTooLarge: status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    MaxStepsExceeded: status.HTTP_422_UNPROCESSABLE_ENTITY,  # a request field out of range, as Letta's 422s
    FileTooLarge: status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,  # FOLDER_FILE_MAX_BYTES, FOLDER_STORAGE_QUOTA_BYTES
    UnsupportedFileType: status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,  # as Letta
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


def new_error_id() -> str:
    return uuid.uuid4().hex


def log_internal_error(event: str, exc: BaseException, **extra: Any) -> str:
    """Log an unexpected exception with its traceback under a new error id (also in the message, since
    the log format shows no extras); returns the id, the one thing about it a tenant may see."""
    error_id = new_error_id()
    logger.error(
        "%s error_id=%s",
        event,
        error_id,
        exc_info=(type(exc), exc, exc.__traceback__),
        extra={"error_id": error_id, **extra},
    )
    return error_id


def internal_error_body(error_id: str) -> dict[str, str]:
    return {"detail": f"Internal server error (error_id: {error_id})", "error_id": error_id}


def internal_error_response(exc: BaseException, request: Any = None) -> Response:
    """500 in Letta's shape for an exception no handler knows, logged with its error id."""
    error_id = log_internal_error("api.internal_error", exc, path=getattr(request, "path", None))
    if request is not None:
        # What Django does for an uncaught exception (error reporting hooks, the test client's re-raise).
        got_request_exception.send(sender=None, request=getattr(request, "_request", request))
    return Response(internal_error_body(error_id), status=status.HTTP_500_INTERNAL_SERVER_ERROR)


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
    if isinstance(exc, exceptions.MethodNotAllowed):
        # FastAPI's wording, which Letta's clients see; DRF keeps the Allow header.
        return Response({"detail": METHOD_NOT_ALLOWED}, status=status.HTTP_405_METHOD_NOT_ALLOWED)
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        response = Response({"detail": str(exc.detail)}, status=status.HTTP_401_UNAUTHORIZED)
        response["WWW-Authenticate"] = "Bearer"
        return response
    response = drf_exception_handler(exc, context)
    if response is None:  # not an APIException, Http404 or PermissionDenied: unexpected
        return internal_error_response(exc, context.get("request"))
    return response
