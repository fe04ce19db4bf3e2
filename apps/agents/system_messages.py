"""Each thread's stored system message: the compiled system prompt, listed first in its history.

Letta keeps the system prompt as the first message of every context (the agent's default thread and
each conversation) and recompiles it when memory changes. This server compiles the prompt afresh for
every LLM call, so nothing the model sees can be stale; the stored row is the record of it that Letta's
clients read: `messages.list` starts with it, `message_ids[0]` names it, agent files carry it.

One row per thread, kept outside the thread's `message_ids` (the loop builds the system message itself,
so compaction, reset, forks and token counts never handle it):
- its id is derived from the agent and conversation ids, so serializers name it without a query;
- its `sequence_id` is negative (minus a fresh value of the message sequence), so it sorts before every
  other message of its thread and every cursor still compares sequences;
- it is the one message whose content changes (the loop rewrites it when the compiled prompt does); it is
  never in a `message_ids` list, so the process's store of in-context messages never holds it;
- the stored-message counts (migration 0005's triggers) leave it out: it is not between agent and user.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from django.db import connection
from django.db.models import Func, Q, Value
from django.utils import timezone

from apps.agents.models import MESSAGE_SEQUENCE, Message
from apps.core.db import upsert_sql

_NAMESPACE = uuid.UUID("6f1b7f0e-3c0a-4a8e-9c51-2b7d3f4e8a10")

THREAD_SYSTEM_MESSAGE = Q(role=Message.Role.SYSTEM, sequence_id__lt=0)
"""Matches threads' stored system messages (other system messages, the loop's alerts and system-role
input, have positive sequence numbers)."""


@functools.lru_cache(maxsize=16_384)
def thread_system_message_id(agent_id: str, conversation_id: str | None) -> str:
    """The id of the thread's stored system message (`conversation_id` None: the agent's default thread).
    Remembered: every AgentState lists it (a uuid5 is ~6 us, 50 of them a list page)."""
    thread = f"{agent_id}/{conversation_id or 'default'}"
    return f"message-{uuid.uuid5(_NAMESPACE, thread)}"


def with_thread_system_message(
    agent_id: str, conversation_id: str | None, message_ids: list[str]
) -> list[str]:
    """A thread's in-context message ids as Letta reports them: its system message first."""
    return [thread_system_message_id(agent_id, conversation_id), *message_ids]


def without_thread_system_message(
    agent_id: str, conversation_id: str | None, message_ids: list[str]
) -> list[str]:
    """`message_ids` as a client may send them back (Letta's, system message first) without that message,
    which is never part of a stored context."""
    system_id = thread_system_message_id(agent_id, conversation_id)
    return [message_id for message_id in message_ids if message_id != system_id]


def thread_system_message_upsert(
    *, organization_id: str, agent_id: str, conversation_id: str | None, text: str, model: str = ""
) -> tuple[str, list[Any]]:
    """The statement (SQL, params) that creates the thread's system message or rewrites it with `text`,
    to run alone (save_thread_system_message) or inside a step's write (the loop)."""
    now = timezone.now()
    row = Message(
        id=thread_system_message_id(agent_id, conversation_id),
        organization_id=organization_id,
        agent_id=agent_id,
        conversation_id=conversation_id,
        role=Message.Role.SYSTEM,
        content=[{"type": "text", "text": text}],
        text=text.replace("\x00", ""),
        model=model,
        sequence_id=-Func(Value(MESSAGE_SEQUENCE), function="nextval"),
        created_at=now,
        updated_at=now,
    )
    return upsert_sql(
        Message, [row], unique_fields=["id"], update_fields=["content", "text", "model", "updated_at"]
    )


def save_thread_system_message(
    *, organization_id: str, agent_id: str, conversation_id: str | None, text: str, model: str = ""
) -> None:
    """Create the thread's system message or rewrite it with `text`: one statement."""
    sql, params = thread_system_message_upsert(
        organization_id=organization_id,
        agent_id=agent_id,
        conversation_id=conversation_id,
        text=text,
        model=model,
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


__all__ = [
    "THREAD_SYSTEM_MESSAGE",
    "save_thread_system_message",
    "thread_system_message_id",
    "thread_system_message_upsert",
    "with_thread_system_message",
    "without_thread_system_message",
]
