"""One Redis connection pool per process (redis-py clients are thread-safe and pool their sockets)."""

from __future__ import annotations

from functools import cache

import redis
from django.conf import settings


@cache
def get_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True, health_check_interval=30)
