"""A run's in-context messages, fetched from the database only when this process has not seen them.

A stored message's content never changes: the loop appends new messages, no code path edits or deletes
one (an agent's or organisation's deletion removes all of theirs) and the API refuses edits with a 405, as
Letta does. The one exception, a thread's stored system message (apps.agents.system_messages), is never in
a `message_ids` list (agent_update strips it), so it is never loaded here. What does change is not read
from kept messages: recall's embedding columns (not loaded here), and run/step ids set to NULL when a run
or step is deleted (the loop compares run ids only for its own run's input). So a process keeps the
messages it has loaded, by id, and each run fetches only the ones it has not seen yet, usually the input
and output of the previous run. A feature that edits messages must give them new ids or drop them here.
Loading every in-context message through the ORM cost ~7 ms at 200 messages and ~17 ms at 600 per
run (bench/RESULTS.md).

The kept objects are shared by the runs of this process and must be treated as read-only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from django.conf import settings

from apps.agents.models import Message
from apps.core.actor import Actor
from apps.core.db import fetch_instances

_kept: OrderedDict[str, Message] = OrderedDict()
_lock = threading.Lock()


MESSAGES_SQL = (
    f"SELECT {{columns}} FROM {Message._meta.db_table} AS message "
    "WHERE message.id = ANY(%s) AND message.organization_id = %s"
)
MESSAGE_ALIAS = "message"
MESSAGE_EXCLUDE = frozenset({"embedding"})  # recall's, never part of a prompt


def in_context_messages(actor: Actor, ids: list[str], *, keep: bool = True) -> list[Message]:
    """The actor's messages with these ids, in this order (ids of missing messages are skipped).

    keep=False neither reads nor fills the process's store (the web process's context viewer)."""
    pending = InContext(actor, ids, keep=keep)
    fetched = (
        fetch_instances(Message, MESSAGES_SQL, pending.params(), alias=MESSAGE_ALIAS, exclude=MESSAGE_EXCLUDE)
        if pending.missing
        else []
    )
    return pending.complete(fetched)


class InContext:
    """in_context_messages in two halves, for a caller that reads the missing messages with other reads
    (a run's load): what the process keeps, then `complete` with the rows of MESSAGES_SQL for `params()`."""

    def __init__(self, actor: Actor, ids: list[str], *, keep: bool = True) -> None:
        self.actor, self.ids = actor, ids
        self.limit = settings.MESSAGE_CACHE_SIZE if keep else 0
        self.found: dict[str, Message] = {}
        if self.limit:
            with _lock:
                for message_id in ids:
                    message = _kept.get(message_id)
                    if message is not None and message.organization_id == actor.organization_id:
                        self.found[message_id] = message
                        _kept.move_to_end(message_id)
        self.missing = [message_id for message_id in ids if message_id not in self.found]

    def params(self) -> list[object]:
        return [self.missing, self.actor.organization_id]

    def complete(self, fetched: list[Message]) -> list[Message]:
        self.found.update((message.id, message) for message in fetched)
        if self.limit and fetched:
            with _lock:
                for message in fetched:
                    _kept[message.id] = message
                while len(_kept) > self.limit:
                    _kept.popitem(last=False)
        return [self.found[message_id] for message_id in self.ids if message_id in self.found]


def forget_all() -> None:
    """Empty this process's store (tests)."""
    with _lock:
        _kept.clear()
