"""Domain errors: every app subclasses DomainError; adapters (API, ADE) map them to responses."""

from __future__ import annotations


class DomainError(Exception):
    """A failure the caller can act on. `code` is stable; `message` is for humans (and models)."""

    code: str = "domain_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message


class NotFound(DomainError):
    code = "not_found"


class InvalidInput(DomainError):
    code = "invalid_input"


class Conflict(DomainError):
    code = "conflict"


class PermissionDenied(DomainError):
    code = "permission_denied"
