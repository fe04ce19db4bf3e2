"""Errors of the llm app: unresolvable handles (caller's input) and failed provider calls."""

from __future__ import annotations

from apps.core.errors import DomainError, InvalidInput


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
