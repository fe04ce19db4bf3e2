"""Our one retry policy for provider calls, and the translation of litellm errors into domain errors.

litellm and the OpenAI SDK each retry on their own; callers pass `max_retries=0` / `num_retries=0` so
that the policy here is the only one, and a retry shows up once in our logs and attempt counts.

Transient (retried with exponential backoff): HTTP 408, 429 and 5xx from the provider, timeouts and
connection failures. Not retried: other 4xx (bad request, bad key), a context window overflow
(`ContextWindowExceeded`, the caller compacts) and a response we cannot read (`InvalidLLMResponse`).

Bounds (`CallBounds`, `guarded`): LLM_REQUEST_TIMEOUT bounds each read, so a provider that trickles a byte
at a time would hold a call (and a worker thread) forever. A call therefore also has a wall-clock deadline
(LLM_CALL_DEADLINE, or the caller's when that comes first) covering its attempts, their backoff and the
whole body, and may have a cancellation check. The reader checks both between chunks and attempts, each
read's timeout is cut to the time left, and one watchdog thread per process ends a read that blocks past
them: it shuts the call's socket down, so the read returns at once and the connection is closed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

import httpcore
import httpx
import openai
import pydantic
from django.conf import settings

from apps.llm._litellm import litellm
from apps.llm._litellm import load as load_litellm
from apps.llm.errors import (
    ContextWindowExceeded,
    InvalidLLMResponse,
    LLMApiError,
    LLMCallCancelled,
    LLMDeadlineExceeded,
    LLMError,
    for_tenant,
)

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
    LLM_REQUEST_TIMEOUT (120.0 s per read). The timeout stays one constant per process because
    litellm keys its cached HTTP clients on it (near a call's deadline it is cut to the time left, in
    whole seconds for litellm: read_timeout).
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
    guard: CallGuard | None = None,
) -> tuple[T, int]:
    """Run `attempt` until it succeeds or fails for good; returns its result and the attempts made.

    `retryable` lets a streaming caller refuse a retry once it has handed deltas on (they would be
    sent twice). `guard` (a bounded call, `guarded`): no attempt starts past its deadline or after a
    cancellation, no backoff waits past the deadline, and an attempt the guard ended fails with its
    error, not retried. Raises LLMApiError (LLMDeadlineExceeded), ContextWindowExceeded,
    InvalidLLMResponse or LLMCallCancelled.
    """
    for number in range(1, policy.max_attempts + 1):
        if guard is not None:
            guard.attempts = number
            guard.check()
        try:
            return attempt(), number
        except PROVIDER_ERRORS as exc:
            stop = guard.stop_after_failure() if guard is not None else None
            if stop is not None:  # the deadline or a cancellation ended the attempt: that is the error
                raise stop from exc
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
            if guard is None:
                time.sleep(wait)
            else:
                guard.sleep(wait, after=failure.error)
        except Exception as exc:
            # Whatever a read the watchdog cut short turns into on its way up (litellm wraps it), the
            # call ended because of the guard's stop.
            if guard is not None and guard.stopped is not None and exc is not guard.stopped:
                raise guard.stopped from exc
            raise
    raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover


def classify(exc: BaseException, *, attempts: int, label: str) -> _Failure:
    """Map a litellm / SDK / httpx exception to a domain error, deciding whether it is transient.

    litellm's own exception classes carry a status even when no HTTP response said so (a 200 whose body
    is not JSON surfaces as a "500"), so the status is taken from the httpx error underneath instead.

    The error's message is what a tenant reads (run.error, API details), also for the deployment's own
    providers (OPENAI_BASE_URL, ...): `for_tenant`'s summary (the kind of failure, the HTTP status) plus
    the provider's own JSON `error.message`, never a URL, a host name or a body that is not JSON. The
    full error goes to the server log.
    """
    failure = _classify(exc, attempts=attempts, label=label)
    failure.error.__cause__ = exc
    told = for_tenant(failure.error, handle=label)
    if told is failure.error:
        return failure
    words = str(getattr(failure.error, "provider_message", ""))
    if isinstance(told, ContextWindowExceeded):
        told = ContextWindowExceeded(
            f"{told.message}: {words}" if words else told.message, provider_message=words
        )
    elif isinstance(told, LLMApiError):
        told = LLMApiError(
            f"{told.message}: {words}" if words else told.message,
            status=told.status,
            provider_message=words,
            attempts=told.attempts,
        )
    logger.info("llm.provider_failed", extra={"llm_target": label, "error": str(failure.error)})
    return replace(failure, error=told)


def _classify(exc: BaseException, *, attempts: int, label: str) -> _Failure:
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
        # An error event inside a stream (the direct client raises LLMApiError for it itself): the
        # provider's words from the event, as litellm quotes them.
        message = _provider_message(chain, exc) or str(exc)
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
    """The provider's own words: `error.message` in OpenAI's and Anthropic's error bodies; "" when the
    body is not such JSON (then `exc`'s own text, with the URL and maybe the body, is for the log only)."""
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
    return ""


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


# --- bounds: a deadline per call, cancellation from outside ------------------------------------------

WATCH_INTERVAL = 0.25
"""Seconds between the watchdog's visits to the calls in flight."""
CANCEL_CHECK_INTERVAL = 0.5
"""Seconds between two cancellation checks of one call (for a run's call, one Redis read); a call is
first checked this long after it starts, so the many calls that answer sooner cost no check at all."""
DEADLINE_SLACK = 0.05
"""An attempt that fails this close to the deadline failed because of it (its read timeout was cut to the
time left)."""
_IO_FRAMES = frozenset({"read", "write", "recv", "recv_into", "send", "sendall"})


@dataclass(frozen=True, slots=True)
class Deadline:
    """A time on the monotonic clock, and what a call still going then is told (`reason`)."""

    at: float
    reason: str

    @classmethod
    def after(cls, seconds: float, reason: str) -> Deadline:
        return cls(time.monotonic() + seconds, reason)

    def remaining(self) -> float:
        return self.at - time.monotonic()


def earliest(first: Deadline, *others: Deadline | None) -> Deadline:
    """The deadline that comes first (on a tie, the first given)."""
    return min((first, *(d for d in others if d is not None)), key=lambda d: d.at)


def read_timeout(per_read: float, remaining: float, *, whole_seconds: bool = False) -> float:
    """One attempt's read timeout: the per-read timeout, cut to the time the call has left, so a read that
    blocks ends at the deadline. `whole_seconds` rounds a cut timeout up (litellm keys the provider clients
    it caches on the timeout: this keeps them to a few; the watchdog still ends the read on time)."""
    timeout = max(0.001, min(per_read, remaining))
    if whole_seconds and timeout < per_read:
        return float(min(per_read, math.ceil(timeout)))
    return timeout


@dataclass(frozen=True, slots=True)
class CallBounds:
    """What may end a provider call before it answers: a deadline for the whole call (its attempts, their
    backoff, the whole body) and a cancellation check (cheap and thread-safe: the watchdog calls it).

    LLM_CALL_DEADLINE (300 s) is the call's own; `within` is the caller's (a run's), when it comes first."""

    deadline: Deadline
    cancelled: Callable[[], bool] | None = None

    @classmethod
    def from_settings(
        cls, *, within: Deadline | None = None, cancelled: Callable[[], bool] | None = None
    ) -> CallBounds:
        seconds = float(getattr(settings, "LLM_CALL_DEADLINE", 300.0))
        own = Deadline.after(seconds, f"the model did not answer within {seconds:g} s (LLM_CALL_DEADLINE)")
        return cls(earliest(own, within), cancelled)


class CallGuard:
    """A bounded call in flight (made by `guarded`): the reader's checks raise its stop, between chunks and
    attempts, and the watchdog ends a read that blocks past it."""

    def __init__(self, bounds: CallBounds, label: str) -> None:
        self.bounds = bounds
        self.label = label
        self.thread_id = threading.get_ident()
        self.attempts = 0
        self.stopped: LLMError | None = None
        self._lock = threading.Lock()
        self._woken = threading.Event()
        self._next_cancel_check = time.monotonic() + CANCEL_CHECK_INTERVAL

    def check(self) -> None:
        """Raise the call's stop, or its deadline's error once that has passed (cheap: once per chunk)."""
        if self.stopped is None and time.monotonic() >= self.bounds.deadline.at:
            self.stop(self._expired())
        if self.stopped is not None:
            raise self.stopped

    def stop_after_failure(self) -> LLMError | None:
        """After a failed attempt: the stop, if that is what ended it (a socket the watchdog shut down, a read
        timeout cut to the time left)."""
        if self.stopped is None and self.bounds.deadline.remaining() <= DEADLINE_SLACK:
            self.stop(self._expired())
        return self.stopped

    def read_timeout(self, per_read: float, *, whole_seconds: bool = False) -> float:
        return read_timeout(per_read, self.bounds.deadline.remaining(), whole_seconds=whole_seconds)

    def sleep(self, seconds: float, *, after: LLMError) -> None:
        """The wait before a retry: woken by a stop; when the deadline comes first, the call fails now,
        saying what failed last."""
        if seconds >= self.bounds.deadline.remaining():
            self.stop(self._expired(after))
        else:
            self._woken.wait(seconds)
        self.check()

    def stop(self, error: LLMError) -> None:
        with self._lock:
            if self.stopped is None:
                self.stopped = error
        self._woken.set()

    def visit(self, now: float) -> bool:
        """The watchdog's look: stop the call at its deadline or when cancelled. Returns whether it is
        stopped (then the watchdog ends the read it may be blocked in)."""
        if self.stopped is None:
            if now >= self.bounds.deadline.at:
                self.stop(self._expired())
            elif self.bounds.cancelled is not None and now >= self._next_cancel_check:
                self._next_cancel_check = now + CANCEL_CHECK_INTERVAL
                if self.bounds.cancelled():
                    self.stop(LLMCallCancelled(f"{self.label}: the call was cancelled"))
        return self.stopped is not None

    def _expired(self, after: LLMError | None = None) -> LLMDeadlineExceeded:
        message = f"{self.label}: {self.bounds.deadline.reason}"
        if after is not None:
            message += f" (last failure: {after.message})"
        return LLMDeadlineExceeded(message, deadline=self.bounds.deadline, attempts=max(1, self.attempts))


def _interrupt_io(thread_id: int) -> None:
    """Shut down the socket the thread is blocked on in httpcore, so its read (or write) returns at once.

    Only when the thread's innermost frames are a read or write of httpcore's network stream (at most ssl's
    methods above it): never a Redis or database socket, and never a connection the call has already given
    back to the pool. Shutting down (not closing) wakes a blocked recv; httpcore then drops the connection."""
    frame = sys._current_frames().get(thread_id)
    for _ in range(4):
        if frame is None or frame.f_code.co_name not in _IO_FRAMES:
            return
        owner = frame.f_locals.get("self")
        if isinstance(owner, httpcore.NetworkStream):
            sock = owner.get_extra_info("socket")
            if isinstance(sock, socket.socket):
                with contextlib.suppress(OSError):  # already shut down, or closed meanwhile
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)  # not SSLSocket's, which unwraps
            return
        if not isinstance(owner, socket.socket):
            return
        frame = frame.f_back


class _Watchdog:
    """One daemon thread per process, started by the first guarded call, visits the calls in flight every
    WATCH_INTERVAL (and, while there are none, looks again every WATCH_INTERVAL).

    A new call is not announced to it: waking the thread put a thread switch (the GIL, and on busy cores
    the scheduler: ~3 ms at load 9) between a run's compiled request and its sending, on the path to the
    first token. The first visit of a call is at most WATCH_INTERVAL later, as every later one is."""

    def __init__(self) -> None:
        self._calls: set[CallGuard] = set()
        self._changed = threading.Condition()
        self._started = False

    def add(self, guard: CallGuard) -> None:
        with self._changed:
            if not self._started:
                threading.Thread(target=self._run, name="llm-call-watchdog", daemon=True).start()
                self._started = True
            self._calls.add(guard)

    def discard(self, guard: CallGuard) -> None:
        """The call is over: from now on its thread's reads are another call's, never interrupted for it."""
        with self._changed:
            self._calls.discard(guard)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._calls:
                    self._changed.wait(WATCH_INTERVAL)
                calls = list(self._calls)
            now = time.monotonic()
            for guard in calls:
                try:
                    if guard.visit(now):
                        with self._changed:  # only while its thread is still in the call (see discard)
                            if guard in self._calls:
                                _interrupt_io(guard.thread_id)
                except Exception:  # a failing cancellation check (Redis down): the deadline still holds
                    logger.warning(
                        "llm.watchdog_visit_failed", exc_info=True, extra={"llm_target": guard.label}
                    )
            time.sleep(WATCH_INTERVAL)


_watchdog = _Watchdog()


def _new_watchdog_after_fork() -> None:
    """A forked child (a Celery prefork worker) has none of its parent's threads: it starts its own."""
    global _watchdog
    _watchdog = _Watchdog()


os.register_at_fork(after_in_child=_new_watchdog_after_fork)


@contextmanager
def guarded(bounds: CallBounds, *, label: str) -> Iterator[CallGuard]:
    """The bounded call made inside this block, on this thread (pass the guard to call_with_retries)."""
    guard = CallGuard(bounds, label)
    _watchdog.add(guard)
    try:
        yield guard
    finally:
        _watchdog.discard(guard)
