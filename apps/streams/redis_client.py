"""One Redis connection pool per process (redis-py clients are thread-safe and pool their sockets)."""

from __future__ import annotations

from functools import cache

import redis
import redis.asyncio
from django.conf import settings

POOL_MAX_CONNECTIONS = 100
"""redis-py's own default bound. Under ASGI every request runs in a thread of its own, so a burst of
requests can want more at once: they wait for one (up to POOL_WAIT_S) instead of failing."""
POOL_WAIT_S = 10.0


@cache
def get_redis() -> redis.Redis:
    pool = redis.BlockingConnectionPool.from_url(
        settings.REDIS_URL,
        decode_responses=True,
        health_check_interval=30,
        max_connections=POOL_MAX_CONNECTIONS,
        timeout=POOL_WAIT_S,
    )
    return redis.Redis(connection_pool=pool)


def get_async_redis() -> redis.asyncio.Redis:
    """Async client for consumers. Not cached: an asyncio client is bound to the loop that created it."""
    return redis.asyncio.Redis.from_url(settings.REDIS_URL, decode_responses=True)
