"""One Redis connection pool per process (redis-py clients are thread-safe and pool their sockets)."""

from __future__ import annotations

from functools import cache

import redis
import redis.asyncio
from django.conf import settings


@cache
def get_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True, health_check_interval=30)


def get_async_redis() -> redis.asyncio.Redis:
    """Async client for consumers. Not cached: an asyncio client is bound to the loop that created it."""
    return redis.asyncio.Redis.from_url(settings.REDIS_URL, decode_responses=True)
