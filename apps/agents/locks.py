"""One executor per agent conversation, with no check-then-act race and nothing to clean up after a crash.

A PostgreSQL session-level advisory lock, keyed by (agent, conversation), is held by the process that
executes a run for as long as it runs. Two workers can never both hold it. If the worker dies
(kill -9, lost machine), PostgreSQL ends its session and the lock is free again, so "running but
unlocked" reliably means "its executor is gone" (see recovery.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


def conversation_lock_key(agent_id: str, conversation_id: str | None) -> int:
    digest = hashlib.blake2b(f"{agent_id}:{conversation_id or ''}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@contextmanager
def conversation_lock(agent_id: str, conversation_id: str | None) -> Iterator[bool]:
    """Try to take the lock without waiting; yields whether this process holds it."""
    key = conversation_lock_key(agent_id, conversation_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        acquired = bool(cursor.fetchone()[0])
    try:
        yield acquired
    finally:
        if acquired:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


def conversation_is_locked(agent_id: str, conversation_id: str | None) -> bool:
    """Whether some live session holds the lock (probing takes and releases it at once)."""
    with conversation_lock(agent_id, conversation_id) as acquired:
        return not acquired
