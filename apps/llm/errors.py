"""Errors of the llm app: unresolvable handles (caller's input) and failed provider calls."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import httpx

from apps.core.errors import DomainError, InvalidInput
from apps.core.outbound import OutboundRefused

if TYPE_CHECKING:
    from apps.llm.retry import Deadline


class UnknownModelHandle(InvalidInput):
    """A model or embedding handle that names no provider this organisation can use."""

    code = "unknown_model_handle"


class ProviderNotConfigured(UnknownModelHandle):
    """The handle's provider is known (openai, anthropic, ollama) but has no credentials or URL."""

    code = "provider_not_configured"


class ContextWindowLimitTooLarge(InvalidInput):
    """An explicit context window larger than the model accepts."""

    code = "context_window_limit_too_large"


class LLMError(DomainError):
    """Base of every failed call to a model provider."""

    code = "llm_error"


class LLMApiError(LLMError):
    """The provider refused or failed the call; transient failures were retried first.

    `status` is the provider's HTTP status (None for timeouts and connection errors),
    `provider_message` its own words, `attempts` how many requests were made.
    """

    code = "llm_api_error"

    def __init__(self, message: str, *, status: int | None, provider_message: str, attempts: int) -> None:
        super().__init__(message)
        self.status = status
        self.provider_message = provider_message
        self.attempts = attempts


class ContextWindowExceeded(LLMError):
    """The prompt does not fit the model's context window; the caller should compact and retry."""

    code = "context_window_exceeded"

    def __init__(self, message: str, *, provider_message: str) -> None:
        super().__init__(message)
        self.provider_message = provider_message


class InvalidLLMResponse(LLMError):
    """The provider answered, but not with something we can read as a chat completion or embedding."""

    code = "invalid_llm_response"


class LLMDeadlineExceeded(LLMApiError):
    """The call was still going at its deadline (apps.llm.retry.CallBounds) and was ended there, retries
    and streamed body included. `deadline` is the one that passed: the call's own (LLM_CALL_DEADLINE) or
    the caller's (e.g. its run's RUN_DEADLINE); the message says which."""

    def __init__(self, message: str, *, deadline: Deadline, attempts: int) -> None:
        super().__init__(message, status=None, provider_message="", attempts=attempts)
        self.deadline = deadline


class LLMCallCancelled(LLMError):
    """The caller's cancellation check said stop while the call was in flight (e.g. its run was cancelled):
    the call was ended and its connection closed."""

    code = "cancelled"


# --- what an organisation is told about a call to a provider URL it chose ---------------------------------

logger = logging.getLogger(__name__)

STATUS_HINTS = {
    401: "check the API key",
    403: "check the API key's permissions",
    404: "check the base URL and the model name",
    429: "rate limited",
}


@contextmanager
def told_to_tenant(handle: str, *, applies: bool) -> Iterator[None]:
    """Around a call to a provider URL an organisation chose (`applies`): its failures become
    `for_tenant`'s summaries, and the full error goes to the server log only."""
    try:
        yield
    except (LLMError, OutboundRefused) as exc:
        if not applies:
            raise
        told = for_tenant(exc, handle=handle)
        if told is exc:
            raise
        logger.warning("llm.tenant_call_failed", extra={"llm_target": handle, "error": str(exc)})
        raise told from exc


def for_tenant(exc: LLMError | OutboundRefused, *, handle: str) -> LLMError:
    """A failed call to a tenant-chosen URL as the tenant may see it (run.error, API details): the kind
    of failure and the HTTP status, never the response body, a redirect's target or the network's own
    words, which would make the platform a reader of internal services and a port scanner. A refusal
    of the outbound guard says why. Failures raised by this app (deadlines, cancellation) pass as they are.
    """
    refused = next((e for e in _chain(exc) if isinstance(e, OutboundRefused)), None)
    attempts = int(getattr(exc, "attempts", 1))
    if refused is not None:
        return LLMApiError(
            f"{handle}: {refused.message}", status=None, provider_message="", attempts=attempts
        )
    if type(exc) is ContextWindowExceeded:
        return ContextWindowExceeded(
            f"{handle}: the prompt exceeds the model's context window", provider_message=""
        )
    if type(exc) is InvalidLLMResponse:
        return InvalidLLMResponse(f"{handle}: the provider's answer could not be read")
    if type(exc) is not LLMApiError or isinstance(exc, OutboundRefused):
        return exc  # type: ignore[return-value]  # an error of ours (a deadline, a cancellation)
    return LLMApiError(
        f"{handle}: {_summary(exc)} after {attempts} attempt(s)",
        status=exc.status,
        provider_message="",
        attempts=attempts,
    )


def _summary(exc: LLMApiError) -> str:
    if exc.status is not None:
        if 300 <= exc.status < 400:
            return f"the provider answered HTTP {exc.status} (redirects are not followed)"
        hint = STATUS_HINTS.get(exc.status)
        return f"the provider answered HTTP {exc.status}" + (f" ({hint})" if hint else "")
    chain = _chain(exc)
    if any(isinstance(e, httpx.ConnectError | httpx.ConnectTimeout) for e in chain):
        return "could not connect to the provider"
    if any(isinstance(e, httpx.TimeoutException) for e in chain):
        return "the provider did not answer in time"
    if any(isinstance(e, httpx.TransportError) for e in chain):
        return "the connection to the provider failed"
    return "the provider ended the call with an error"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
