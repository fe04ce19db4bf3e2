"""Texts the loop injects into the conversation on its own: the compaction summary and the memory alert.

Pure helpers. The runner stores them as user-role messages (as Letta does) because not every
provider accepts a system message in the middle of a conversation; the leading note tells the
model they come from the system, not from the user.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "SYSTEM_NOTE_PREFIX",
    "memory_pressure_warning",
    "summary_from_message_text",
    "summary_message_text",
]

SYSTEM_NOTE_PREFIX = "[Automated system message, not shown to the user]"
SUMMARY_HEADING = "Summary of what was removed:\n"


def summary_message_text(summary: str, evicted_count: int, total_count: int) -> str:
    """What the model sees in place of the messages compaction removed.

    Like Letta's summary alert it says how many of how many messages were hidden and why, and adds
    that they are still in recall memory, because eviction never deletes anything.
    """
    if not 0 <= evicted_count <= total_count:
        raise ValueError(
            f"evicted_count must be between 0 and total_count, got {evicted_count} of {total_count}"
        )
    were, they = ("was", "It is") if evicted_count == 1 else ("were", "They are")
    return (
        f"{SYSTEM_NOTE_PREFIX} {_count(evicted_count, 'earlier message')} (of {total_count} in this "
        f"conversation) {were} removed from your context window to make room. {they} still stored in "
        "recall memory, where your tools can search.\n"
        f"{SUMMARY_HEADING}{summary.strip()}"
    )


def summary_from_message_text(text: str) -> str:
    """The model's summary inside a text `summary_message_text` made (the whole text if it is not one)."""
    _, heading, summary = text.partition(SUMMARY_HEADING)
    return summary if heading else text


def memory_pressure_warning(used_tokens: int, context_window: int, *, tool_names: Sequence[str] = ()) -> str:
    """The alert sent past the warning threshold: save what matters before old messages are summarised.

    `tool_names` are the agent's memory tools to mention (they differ by agent type); without them
    the alert speaks of "your memory tools". The user is not to be told, as in Letta.
    """
    if context_window <= 0:
        raise ValueError(f"context_window must be positive, got {context_window}")
    percent = used_tokens * 100 // context_window
    tools = f"your memory tools ({', '.join(tool_names)})" if tool_names else "your memory tools"
    return (
        f"{SYSTEM_NOTE_PREFIX} Your context window is {percent}% full ({used_tokens} of {context_window} "
        "tokens). The oldest messages will soon be summarised and removed from view. If they hold "
        "anything important about the user or yourself that is not yet in memory, save it now with "
        f"{tools}. Do not mention this alert to the user."
    )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
