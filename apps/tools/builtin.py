"""Letta's built-in tools: their signatures and docstrings (from which the schemas are generated) and
which of them each agent type gets. The bodies never run; the agent layer executes built-ins in-process
(apps.agents.tool_execution), because they read and write the agent's own memory.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from functools import cache
from typing import Any, Literal

from apps.tools.schema import generate_schema


def send_message(agent_state: Any, message: str) -> None:
    """Sends a message to the human user.

    Args:
        message (str): Message contents. All unicode (including emojis) are supported.
    """


def conversation_search(
    agent_state: Any,
    query: str | None = None,
    roles: list[Literal["assistant", "user", "tool"]] | None = None,
    limit: int | None = None,
    start_date: str | None = None,
    end_date: str | None = None,
) -> str:
    """Search prior conversation history (recall memory) by text and by meaning, newest context first.

    Args:
        query (str): What to look for; matched by keywords and by meaning. Omit to list by date only.
        roles (list): Only messages from these roles (assistant, user, tool).
        limit (int): Maximum number of results (default 10).
        start_date (str): Only messages on or after this date (ISO 8601, e.g. 2025-01-31), inclusive.
        end_date (str): Only messages on or before this date (ISO 8601), inclusive.

    Returns:
        str: The matching messages with their timestamps and roles.
    """


def archival_memory_insert(agent_state: Any, content: str, tags: list[str] | None = None) -> None:
    """Add information to long-term archival memory, to be found later with archival_memory_search.

    Args:
        content (str): The text to remember. Write it so it makes sense when read on its own later.
        tags (list): Optional tags to categorise the memory (e.g. ["project", "preference"]).
    """


def archival_memory_search(
    agent_state: Any,
    query: str,
    tags: list[str] | None = None,
    tag_match_mode: Literal["any", "all"] = "any",
    top_k: int | None = None,
    start_datetime: str | None = None,
    end_datetime: str | None = None,
) -> str:
    """Search archival memory by meaning (semantic similarity), optionally filtered by tags and dates.

    Args:
        query (str): What to look for.
        tags (list): Only passages with these tags.
        tag_match_mode (str): "any" (at least one tag matches) or "all" (every tag matches).
        top_k (int): Maximum number of results (default 10).
        start_datetime (str): Only passages created at or after this time (ISO 8601).
        end_datetime (str): Only passages created at or before this time (ISO 8601).

    Returns:
        str: The matching passages with their ids, timestamps, content and tags.
    """


def core_memory_append(agent_state: Any, label: str, content: str) -> str | None:
    """Append to the contents of a core memory block.

    Args:
        label (str): The label of the memory block to edit, e.g. human or persona.
        content (str): Content to append to the block. All unicode (including emojis) are supported.

    Returns:
        str: The new value of the block.
    """


def core_memory_replace(agent_state: Any, label: str, old_content: str, new_content: str) -> str | None:
    """Replace the contents of a core memory block. To delete text, use an empty string for new_content.

    Args:
        label (str): The label of the memory block to edit.
        old_content (str): The exact text to replace.
        new_content (str): The text to put in its place.

    Returns:
        str: The new value of the block.
    """


def memory_replace(agent_state: Any, label: str, old_string: str, new_string: str) -> str:
    """Replace one exact occurrence of a string in a memory block. Do not include line numbers.

    Args:
        label (str): The label of the memory block to edit.
        old_string (str): The text to replace; it must appear exactly once in the block.
        new_string (str): The new text (an empty string deletes old_string).

    Returns:
        str: Confirmation with the edited block.
    """


def memory_insert(agent_state: Any, label: str, new_string: str, insert_line: int = -1) -> str:
    """Insert text into a memory block at a given line. Do not include line numbers.

    Args:
        label (str): The label of the memory block to edit.
        new_string (str): The text to insert.
        insert_line (int): Insert after this line (0 inserts at the start, -1 appends at the end).

    Returns:
        str: Confirmation with the edited block.
    """


def memory_rethink(agent_state: Any, label: str, new_memory: str) -> str:
    """Rewrite a whole memory block, to reorganise, consolidate or deduplicate it. Creates it if missing.

    Args:
        label (str): The label of the memory block to rewrite.
        new_memory (str): The complete new contents of the block.

    Returns:
        str: Confirmation.
    """


def memory_finish_edits(agent_state: Any) -> None:
    """Call when you have finished editing memory."""


BUILTIN_TOOLS: dict[str, tuple[str, Callable[..., Any]]] = {
    "send_message": ("letta_core", send_message),
    "conversation_search": ("letta_core", conversation_search),
    "archival_memory_insert": ("letta_core", archival_memory_insert),
    "archival_memory_search": ("letta_core", archival_memory_search),
    "core_memory_append": ("letta_memory_core", core_memory_append),
    "core_memory_replace": ("letta_memory_core", core_memory_replace),
    "memory_replace": ("letta_sleeptime_core", memory_replace),
    "memory_insert": ("letta_sleeptime_core", memory_insert),
    "memory_rethink": ("letta_sleeptime_core", memory_rethink),
    "memory_finish_edits": ("letta_sleeptime_core", memory_finish_edits),
}

BASE_TOOLS_BY_AGENT_TYPE: dict[str, tuple[str, ...]] = {
    "letta_v1_agent": ("conversation_search", "memory_insert", "memory_replace"),
    "memgpt_v2_agent": ("send_message", "conversation_search", "memory_insert", "memory_replace"),
    "memgpt_agent": ("send_message", "conversation_search", "core_memory_append", "core_memory_replace"),
    "sleeptime_agent": ("memory_replace", "memory_insert", "memory_rethink", "memory_finish_edits"),
    "react_agent": (),
    "workflow_agent": (),
}
SLEEPTIME_PRIMARY_TOOLS = ("send_message", "conversation_search", "archival_memory_search")


def base_tool_names(agent_type: str, *, enable_sleeptime: bool = False) -> tuple[str, ...]:
    """The built-ins `include_base_tools=true` attaches (Letta's table, letta_api.md section 7.1)."""
    if enable_sleeptime and agent_type != "sleeptime_agent":
        return SLEEPTIME_PRIMARY_TOOLS
    return BASE_TOOLS_BY_AGENT_TYPE.get(agent_type, BASE_TOOLS_BY_AGENT_TYPE["memgpt_agent"])


@cache
def builtin_definition(name: str) -> dict[str, Any]:
    """Tool fields for a built-in: type, description, source and the JSON schema from its docstring."""
    tool_type, function = BUILTIN_TOOLS[name]
    source = textwrap.dedent(inspect.getsource(function))
    schema = generate_schema(source, name=name)
    return {
        "tool_type": tool_type,
        "description": schema["description"],
        "source_code": source,
        "json_schema": schema,
    }
