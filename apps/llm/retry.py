"""Our one retry policy for provider calls, and the translation of litellm errors into domain errors.

litellm and the OpenAI SDK each retry on their own; callers pass `max_retries=0` / `num_retries=0` so
that the policy here is the only one, and a retry shows up once in our logs and attempt counts.

Transient (retried with exponential backoff): HTTP 408, 429 and 5xx from the provider, timeouts and
connection failures. Not retried: other 4xx (bad request, bad key), a context window overflow
(`ContextWindowExceeded`, the caller compacts) and a response we cannot read (`InvalidLLMResponse`).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import httpx
import openai
import pydantic
from django.conf import settings

from apps.llm._litellm import litellm
from apps.llm._litellm import load as load_litellm
from apps.llm.errors import ContextWindowExceeded, InvalidLLMResponse, LLMApiError, LLMError

logger = logging.getLogger(__name__)

T = TypeVar("T")

PROVIDER_ERRORS: tuple[type[Exception], ...] = (openai.OpenAIError, httpx.HTTPError)
"""What a litellm call raises for provider trouble (litellm's exceptions subclass the OpenAI SDK's)."""

TRANSIENT_STATUSES = frozenset({408, 429})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to call a provider.

    Settings (all optional): LLM_MAX_ATTEMPTS (4: the first call and 3 retries), LLM_RETRY_BASE_DELAY
    (1.0 s, doubled per retry), LLM_RETRY_MAX_DELAY (20.0 s, also caps a provider's Retry-After),
    LLM_REQUEST_TIMEOUT (120.0 s per request). The timeout stays one constant per process because
    litellm keys its cached HTTP clients on it.
    """

    max_attempts: int = 4
    base_delay: float = 1.0
    max_delay: float = 20.0
    timeout: float = 120.0

    @classmethod
    def from_settings(cls) -> RetryPolicy:
        return cls(
            max_attempts=max(1, int(getattr(settings, "LLM_MAX_ATTEMPTS", 4))),
            base_delay=float(getattr(settings, "LLM_RETRY_BASE_DELAY", 1.0)),
            max_delay=float(getattr(settings, "LLM_RETRY_MAX_DELAY", 20.0)),
            timeout=float(getattr(settings, "LLM_REQUEST_TIMEOUT", 120.0)),
        )

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds before retry number `retry` (1-based): the provider's Retry-After when it sent one,
        else exponential backoff with jitter (so many workers hitting one limit do not retry in step)."""
        if retry_after is not None:
            return min(self.max_delay, max(0.0, retry_after))
        backoff = min(self.max_delay, self.base_delay * 2 ** (retry - 1))
        return backoff * random.uniform(0.5, 1.0)  # jitter, not cryptography


@dataclass(frozen=True, slots=True)
class _Failure:
    """A provider error, classified once."""

    error: LLMError
    transient: bool
    retry_after: float | None = None


def call_with_retries(
    attempt: Callable[[], T],
    *,
    policy: RetryPolicy,
    label: str,
    retryable: Callable[[], bool] = lambda: True,
) -> tuple[T, int]:
    """Run `attempt` until it succeeds or fails for good; returns its result and the attempts made.

    `retryable` lets a streaming caller refuse a retry once it has handed deltas on (they would be
    sent twice). Raises LLMApiError, ContextWindowExceeded or InvalidLLMResponse.
    """
    for number in range(1, policy.max_attempts + 1):
        try:
            return attempt(), number
        except PROVIDER_ERRORS as exc:
            failure = classify(exc, attempts=number, label=label)
            if not failure.transient or number == policy.max_attempts or not retryable():
                raise failure.error from exc
            wait = policy.delay(number, failure.retry_after)
            logger.warning(
                "llm.retry",
                extra={
                    "llm_target": label,
                    "attempt": number,
                    "wait_s": round(wait, 3),
                    "error": str(failure.error),
                },
            )
            time.sleep(wait)
    raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover


def classify(exc: BaseException, *, attempts: int, label: str) -> _Failure:
    """Map a litellm / SDK / httpx exception to a domain error, deciding whether it is transient.

    litellm's own exception classes carry a status even when no HTTP response said so (a 200 whose body
    is not JSON surfaces as a "500"), so the status is taken from the httpx error underneath instead.
    """
    chain = list(_chain(exc))
    if any(_is_context_overflow(e) for e in chain):
        message = _provider_message(chain, exc)
        return _Failure(
            ContextWindowExceeded(
                f"{label}: the prompt exceeds the model's context window: {message}", provider_message=message
            ),
            transient=False,
        )
    status_error = next((e for e in chain if isinstance(e, httpx.HTTPStatusError)), None)
    if status_error is not None:
        status = status_error.response.status_code
        message = _provider_message(chain, exc)
        return _Failure(
            LLMApiError(
                f"{label}: provider answered HTTP {status} after {attempts} attempt(s): {message}",
                status=status,
                provider_message=message,
                attempts=attempts,
            ),
            transient=status in TRANSIENT_STATUSES or status >= 500,
            retry_after=_retry_after(status_error.response),
        )
    if any(
        isinstance(e, json.JSONDecodeError | openai.APIResponseValidationError | pydantic.ValidationError)
        for e in chain
    ):
        return _Failure(InvalidLLMResponse(f"{label}: unreadable response: {exc}"), transient=False)
    if any(isinstance(e, openai.APITimeoutError | httpx.TimeoutException | litellm.Timeout) for e in chain):
        return _Failure(
            _no_answer(f"{label}: timed out after {attempts} attempt(s)", attempts), transient=True
        )
    if any(_is_connection_error(e) for e in chain):
        return _Failure(
            _no_answer(f"{label}: connection failed after {attempts} attempt(s): {exc}", attempts),
            transient=True,
        )
    if any(isinstance(e, litellm.exceptions.MidStreamFallbackError) for e in chain):
        # An error event inside a stream (the direct client raises LLMApiError for it itself).
        message = _provider_message(chain, exc)
        return _Failure(
            LLMApiError(
                f"{label}: the provider ended the stream with an error: {message}",
                status=None,
                provider_message=message,
                attempts=attempts,
            ),
            transient=False,
        )
    if isinstance(exc, openai.APIStatusError) and 400 <= exc.status_code < 500:
        # litellm refused the call before sending it (unsupported parameter, missing key).
        return _Failure(
            LLMApiError(
                f"{label}: {exc}", status=exc.status_code, provider_message=str(exc), attempts=attempts
            ),
            transient=False,
        )
    return _Failure(InvalidLLMResponse(f"{label}: unreadable response: {exc}"), transient=False)


def _is_context_overflow(exc: BaseException) -> bool:
    """litellm recognises providers' wording; OpenAI-style servers may only send the error code.
    A 4xx answer to an OpenAI-wire call (apps.llm.openai_wire) is checked with litellm's wording list."""
    if isinstance(exc, litellm.ContextWindowExceededError):
        return True
    if isinstance(exc, httpx.HTTPStatusError) and 400 <= exc.response.status_code < 500:
        try:
            text = exc.response.text
        except httpx.ResponseNotRead:
            return False
        return _context_overflow_text(text)
    body = getattr(exc, "body", None)
    return isinstance(body, dict) and body.get("code") == "context_length_exceeded"


def _context_overflow_text(text: str) -> bool:
    load_litellm()  # configured before any of its modules is imported
    from litellm.litellm_core_utils.exception_mapping_utils import ExceptionCheckers

    if ExceptionCheckers.is_error_str_context_window_exceeded(text):
        return True
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(error, dict) and error.get("code") == "context_length_exceeded"


def _no_answer(message: str, attempts: int) -> LLMApiError:
    return LLMApiError(message, status=None, provider_message="", attempts=attempts)


def _is_connection_error(exc: BaseException) -> bool:
    """A transport failure underneath; litellm's APIConnectionError alone also wraps parse failures."""
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, openai.APIConnectionError) and not type(exc).__module__.startswith("litellm")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _provider_message(chain: list[BaseException], exc: BaseException) -> str:
    """The provider's own words: `error.message` in OpenAI's and Anthropic's error bodies."""
    for error in chain:
        body = getattr(error, "body", None)
        if (
            isinstance(error, openai.APIStatusError)
            and isinstance(body, dict)
            and isinstance(body.get("message"), str)
        ):
            return str(body["message"])
        if isinstance(error, httpx.HTTPStatusError):
            try:
                payload = json.loads(error.response.text)
            except (httpx.ResponseNotRead, ValueError):
                continue
            inner = payload.get("error") if isinstance(payload, dict) else None
            if isinstance(inner, dict) and isinstance(inner.get("message"), str):
                return str(inner["message"])
    return str(exc)


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds form; dates are ignored)."""
    for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = response.headers.get(header)
        if value is None:
            continue
        try:
            return float(value) * scale
        except ValueError:
            continue
    return None
