"""Throttles of /v1 (DRF's `rest_framework.throttling`) and the cap on the streams a user holds open.

- Request rates: per API key (`API_RATE_PER_KEY`; an ADE session counts as its user's key) and per
  organisation (`API_RATE_PER_ORG`), by default on every /v1 view (REST_FRAMEWORK's
  DEFAULT_THROTTLE_CLASSES). Past the rate: 429 with Retry-After.
- Wrong API keys per client address (`API_KEY_FAILURE_LIMIT` per `API_KEY_FAILURE_WINDOW` seconds),
  checked by apps.api.authentication before the key is looked up.
- Open streams per user (`MAX_STREAMS_PER_USER`): SSE streams, blocking sends waiting for their run and the
  ADE's WebSocket relays each hold a slot while open.

The rates count in Redis (settings.REDIS_URL, shared by every process), in fixed windows: one atomic
counter per client and window, a single pipelined round trip on the process's Redis client (~40 us), that
expires by itself. Not SimpleRateThrottle's list of timestamps in Django's cache: processes sharing it
would overwrite each other's entries (read, append, write back), and each call of Django's Redis cache
costs ~150 us here (redis-py builds a client per call), two of them per throttle and request.
"""

from __future__ import annotations

import functools
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from apps.core.actor import Actor
from apps.streams.redis_client import get_redis


class FixedWindowRateThrottle(SimpleRateThrottle):
    """SimpleRateThrottle counting requests in fixed windows of its period, with an atomic cache counter.

    The rate comes from the setting named by `rate_setting`, read when the throttle is made (each request),
    as "N/s|min|hour|day" or "N/<seconds>"; empty: no limit."""

    rate_setting = ""
    # Set by SimpleRateThrottle from the rate, and by each count.
    num_requests: int
    duration: int
    key: str | None
    now: float
    window_ends: float

    def get_rate(self) -> str | None:
        return getattr(settings, self.rate_setting, None) or None

    def parse_rate(self, rate: str | None) -> tuple[int | None, int | None]:
        if rate is None:
            return None, None
        num, _, period = rate.partition("/")
        if period.isdigit():
            return int(num), int(period)
        return super().parse_rate(rate)

    def allow_request(self, request: Request, view: Any) -> bool:
        return not refused_by([self], request, view)

    def _window_key(self) -> str:
        self.now = self.timer()
        window = int(self.now // self.duration)
        self.window_ends = (window + 1) * self.duration
        return f"{self.key}_{window}"

    def hit(self) -> int:
        """Count one more in the current window; returns the window's count."""
        pipe = get_redis().pipeline(transaction=False)
        self._count_in(pipe)
        return pipe.execute()[1]

    def _count_in(self, pipe: Any) -> None:
        """Queue the two commands that count one more in the current window (the count is the second's)."""
        key = self._window_key()
        # Created with its expiry (kept a whole period past its window's end, so no request of its window
        # can find it expiring between the two commands and have INCR recreate it without one).
        pipe.set(key, 0, ex=2 * self.duration, nx=True)
        pipe.incr(key)

    def count(self) -> int:
        """The current window's count, without counting."""
        return int(get_redis().get(self._window_key()) or 0)

    def wait(self) -> float:
        return max(self.window_ends - self.now, 1.0)


def refused_by(throttles: Sequence[FixedWindowRateThrottle], request: Request, view: Any) -> list[Any]:
    """Count the request in each throttle's window, all in one Redis round trip (a /v1 request has two);
    returns the throttles it is past the rate of (their `wait()` says for how long)."""
    counting = []
    pipe = get_redis().pipeline(transaction=False)
    for throttle in throttles:
        if throttle.rate is None:
            continue
        throttle.key = throttle.get_cache_key(request, view)
        if throttle.key is None:
            continue
        throttle._count_in(pipe)
        counting.append(throttle)
    if not counting:
        return []
    counts = pipe.execute()[1::2]
    return [
        throttle for throttle, count in zip(counting, counts, strict=True) if count > throttle.num_requests
    ]


class ApiKeyRateThrottle(FixedWindowRateThrottle):
    """Requests per API key (per user for session-authenticated requests)."""

    scope = "api_key"
    rate_setting = "API_RATE_PER_KEY"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if not isinstance(request.auth, Actor):
            return None  # not authenticated: nothing to count against (views that need no key)
        ident = getattr(request, "api_key_hash", None) or f"user-{request.user.pk}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


class OrganizationRateThrottle(FixedWindowRateThrottle):
    """Requests per organisation, over all its keys and users."""

    scope = "organization"
    rate_setting = "API_RATE_PER_ORG"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if not isinstance(request.auth, Actor):
            return None
        return self.cache_format % {"scope": self.scope, "ident": request.auth.organization_id}


class ApiKeyFailureThrottle(FixedWindowRateThrottle):
    """Wrong API keys per client address (the connection's: REST_FRAMEWORK's NUM_PROXIES is 0)."""

    scope = "api_key_failures"

    def get_rate(self) -> str | None:
        limit, window = settings.API_KEY_FAILURE_LIMIT, settings.API_KEY_FAILURE_WINDOW
        return f"{limit}/{window}" if limit > 0 and window > 0 else None

    def get_cache_key(self, request: Request, view: Any = None) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

    def check(self, request: Request) -> None:
        """Raises Throttled (429, Retry-After) for an address past its limit, whatever key it sends now."""
        if self.rate is None:
            return
        self.key = self.get_cache_key(request)
        if self.count() >= self.num_requests:
            raise exceptions.Throttled(wait=self.wait())

    def record_failure(self, request: Request) -> None:
        if self.rate is None:
            return
        self.key = self.get_cache_key(request)
        self.hit()


# --- open streams per user ----------------------------------------------------------------------------

STREAM_SLOT_TTL_S = 60.0
"""Seconds a slot lives unless refreshed: what a stream of a crashed process keeps counting at most."""
STREAM_SLOT_REFRESH_S = 20.0
"""Seconds between refreshes of an open stream's slot (well under its TTL)."""
BLOCKING_SLOT_MARGIN_S = 30.0
"""A blocking wait is not refreshed: its slot lives for the wait and this margin."""
STREAM_CLOSE_CODE = 4429
"""WebSocket close code of a relay refused past the cap (4000-4999: the application's own)."""

# KEYS[1]: the user's open streams, a sorted set of one member per stream scored by when it expires.
# ARGV: now, the member's expiry, the cap (-1: none; a member already in is never refused), the member,
# the set's own TTL (it never outlives its members). Returns 1 when the member holds a slot, 0 if refused.
_CLAIM = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local cap = tonumber(ARGV[3])
if cap >= 0 and not redis.call('ZSCORE', KEYS[1], ARGV[4]) and redis.call('ZCARD', KEYS[1]) >= cap then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
if redis.call('TTL', KEYS[1]) < tonumber(ARGV[5]) then
  redis.call('EXPIRE', KEYS[1], ARGV[5])
end
return 1
"""


@functools.cache
def _claim_script() -> Any:
    return get_redis().register_script(_CLAIM)


def _streams_key(user_id: str) -> str:
    return f"streams:user:{user_id}"


def _cap() -> int:
    cap = settings.MAX_STREAMS_PER_USER
    return cap if cap > 0 else -1


@dataclass
class StreamSlot:
    """One open stream of a user. Refresh it while open (at most every STREAM_SLOT_REFRESH_S it costs a
    Redis call) and release it when the stream ends; a slot never released expires after its TTL."""

    key: str
    ttl_s: float
    member: str = field(default_factory=lambda: uuid.uuid4().hex)
    refreshed_at: float = field(default_factory=time.monotonic)
    released: bool = False

    def claim_args(self, cap: int) -> list[Any]:
        now = time.time()
        return [now, now + self.ttl_s, cap, self.member, math.ceil(self.ttl_s) + 1]

    def _refresh_due(self) -> bool:
        if self.released or time.monotonic() - self.refreshed_at < STREAM_SLOT_REFRESH_S:
            return False
        self.refreshed_at = time.monotonic()
        return True

    def refresh(self) -> None:
        if self._refresh_due():
            _claim_script()(keys=[self.key], args=self.claim_args(-1))

    def release(self) -> None:
        if not self.released:
            self.released = True
            get_redis().zrem(self.key, self.member)

    async def arefresh(self, client: redis.asyncio.Redis) -> None:
        if self._refresh_due():
            await client.eval(_CLAIM, 1, self.key, *self.claim_args(-1))

    async def arelease(self, client: redis.asyncio.Redis) -> None:
        if not self.released:
            self.released = True
            await client.zrem(self.key, self.member)


def stream_slot(user_id: str, *, ttl_s: float | None = None) -> StreamSlot | None:
    """A slot for one more open stream of this user, or None past MAX_STREAMS_PER_USER."""
    slot = StreamSlot(key=_streams_key(user_id), ttl_s=ttl_s or STREAM_SLOT_TTL_S)
    return slot if _claim_script()(keys=[slot.key], args=slot.claim_args(_cap())) else None


async def astream_slot(
    client: redis.asyncio.Redis, user_id: str, *, ttl_s: float | None = None
) -> StreamSlot | None:
    """stream_slot for asynchronous consumers, on their own client."""
    slot = StreamSlot(key=_streams_key(user_id), ttl_s=ttl_s or STREAM_SLOT_TTL_S)
    return slot if await client.eval(_CLAIM, 1, slot.key, *slot.claim_args(_cap())) else None


def open_streams(user_id: str, client: redis.Redis | None = None) -> int:
    """The user's streams open now (slots neither released nor expired)."""
    return (client or get_redis()).zcount(_streams_key(user_id), f"({time.time()}", "+inf")


def too_many_streams_reason() -> str:
    """Short enough for a WebSocket close frame (at most 123 bytes)."""
    return f"Too many open streams (MAX_STREAMS_PER_USER={settings.MAX_STREAMS_PER_USER}): close one first."


class TooManyStreams(exceptions.APIException):
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = "too_many_streams"

    def __init__(self) -> None:
        super().__init__(
            f"Too many open streams: a user may hold {settings.MAX_STREAMS_PER_USER} at once "
            "(MAX_STREAMS_PER_USER), counting SSE streams, blocking sends waiting for their run and the "
            "ADE's live views. Close one or wait for a run to end, then try again."
        )


def require_stream_slot(actor: Actor, *, ttl_s: float | None = None) -> StreamSlot:
    """The acting user's slot for a stream or a blocking wait; raises TooManyStreams past the cap."""
    slot = stream_slot(actor.user_id or f"org-{actor.organization_id}", ttl_s=ttl_s)
    if slot is None:
        raise TooManyStreams()
    return slot
