"""Celery's broker transport: kombu's Redis transport, with one Redis client per channel.

kombu's Redis channel makes a new `redis.Redis` client for every command it sends outside its consumer
connection (`Channel.conn_or_acquire`): each task publish, and in a worker each delivered task's
unacked bookkeeping and its ack. A client is cheap to use but not to make (redis-py copies its ~170
response callbacks into a case-insensitive dict for each), so making them was ~17% of a worker's Python
time per task and ~0.15 ms of every publish (bench/RESULTS.md, 2026-12-07). The channel's client is now
made once and reused; it talks through the channel's connection pool as before (a Redis client is safe to
share between threads: each command checks a connection out of the pool), and a new one is made when the
channel replaces its pool (after a connection error).

Used for `redis://` broker URLs (config/settings.py: CELERY_BROKER_TRANSPORT); a `rediss://` URL keeps
kombu's own transport, whose TLS defaults come with its scheme.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _reused_client: tuple[Any, Any] | None = None  # (the pool it was made for, the client)

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        pool = self.pool
        reused = self._reused_client
        if reused is None or reused[0] is not pool:
            reused = self._reused_client = (pool, self._create_client())
        yield reused[1]


class Transport(kombu_redis.Transport):
    Channel = Channel
