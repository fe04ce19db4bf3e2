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

from pydantic import BaseModel, Field

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


def memory(
    agent_state: Any,
    command: str,
    path: str | None = None,
    file_text: str | None = None,
    description: str | None = None,
    old_string: str | None = None,
    new_string: str | None = None,
    insert_line: int | None = None,
    insert_text: str | None = None,
    old_path: str | None = None,
    new_path: str | None = None,
) -> str | None:
    """Work on memory blocks as if they were files under /memories/ (create, edit, insert, delete, rename).

    Args:
        command (str): One of "create", "str_replace", "insert", "delete" or "rename".
        path (str): The block, as /memories/<label> (create, str_replace, insert, delete).
        file_text (str): The contents of a new block (create).
        description (str): What the block is for (create, rename).
        old_string (str): The exact text to replace (str_replace).
        new_string (str): The text to put in its place (str_replace).
        insert_line (int): Insert after this line (insert).
        insert_text (str): The text to insert (insert).
        old_path (str): The block to rename, as /memories/<label> (rename).
        new_path (str): Its new path, as /memories/<label> (rename).

    Returns:
        str: What the command did.
    """


def memory_apply_patch(agent_state: Any, label: str, patch: str) -> str:
    """Edit memory blocks with a simplified unified diff (lines starting with " ", "-" or "+", optional "@@").
    All or nothing: if any hunk does not match, no block changes.

    Several blocks at once: headers "*** Add Block: <label>" (an optional "Description: ..." line, then "+"
    lines), "*** Delete Block: <label>", "*** Update Block: <label>" and "*** Move to: <new label>".
    Do not include line numbers.

    Args:
        label (str): The block to patch; an empty string when the patch uses "***" headers.
        patch (str): The patch to apply.

    Returns:
        str: Confirmation, or what did not apply.
    """


def load_skill(agent_state: Any, name: str) -> str:
    """Load one of your skills into your context: returns its full instructions. Your skills are listed,
    with a one-line description each, in <available_skills>; load one when a task needs it.

    Args:
        name (str): The skill's name as listed in <available_skills>, e.g. "pdf".

    Returns:
        str: The skill's full text.
    """
    raise NotImplementedError("run in-process by apps.agents.builtin_tools")


def send_message_to_agent_and_wait_for_reply(agent_state: Any, message: str, other_agent_id: str) -> str:
    """Send a message to another agent of your organisation and wait (a limited time) for its reply.

    Args:
        message (str): The message for the other agent; it is told that it comes from you.
        other_agent_id (str): The id of the agent to send it to.

    Returns:
        str: The other agent's reply, as JSON: {"agent_id": ..., "response": [what it said]}.
    """


def send_message_to_agents_matching_tags(
    agent_state: Any, message: str, match_all: list[str], match_some: list[str]
) -> list[str]:
    """Send a message to every other agent of your organisation that has all the tags in match_all and at
    least one in match_some (an empty list puts no condition), and gather their replies.

    Args:
        message (str): The message for the agents; they are told that it comes from you.
        match_all (list): Tags an agent must all have.
        match_some (list): Tags of which an agent must have at least one.

    Returns:
        list: One entry per agent, as JSON: {"agent_id": ..., "response": [what it said]} or
            {"agent_id": ..., "error": why it did not reply}.
    """


def send_message_to_agent_async(agent_state: Any, message: str, other_agent_id: str) -> str:
    """Send a message to another agent of your organisation without waiting for its reply.

    Args:
        message (str): The message for the other agent; it is told that it comes from you.
        other_agent_id (str): The id of the agent to send it to.

    Returns:
        str: Confirmation that the message was sent.
    """


def rethink_user_memory(agent_state: Any, new_memory: str) -> None:
    """Rewrite the main agent's memory block, keeping what is still true and adding what is new.

    Args:
        new_memory (str): The whole new contents of the block.
    """


def finish_rethinking_memory(agent_state: Any) -> None:
    """Call when you have finished rethinking memory."""


class MemoryChunk(BaseModel):
    """A run of evicted conversation lines and what they say."""

    start_index: int = Field(..., description="Zero-based index of the first evicted line of the chunk.")
    end_index: int = Field(..., description="Zero-based index of its last evicted line (inclusive).")
    context: str = Field(..., description="One to three sentences on what the chunk says, for later search.")


def store_memories(agent_state: Any, chunks: list[MemoryChunk]) -> None:
    """Keep dialogue that is about to leave the context window, as chunks to be found later.

    Args:
        chunks (list): The chunks of evicted lines, each with a short synopsis.
    """


def search_memory(
    agent_state: Any,
    convo_keyword_queries: list[str] | None,
    start_minutes_ago: int | None,
    end_minutes_ago: int | None,
) -> str | None:
    """Search long-term and earlier conversation memory for what the visible context lacks.

    Args:
        convo_keyword_queries (list): Extra keywords (an order id, a place); null when none fit.
        start_minutes_ago (int): Newer end of the time window, in minutes ago; null for none.
        end_minutes_ago (int): Older end of the time window, in minutes ago; null for none.

    Returns:
        str: The matching memories.
    """


def run_code(agent_state: Any, code: str, language: Literal["python", "js", "ts", "r", "java"]) -> str:
    """Run code in a sandbox.

    Args:
        code (str): The code to run.
        language (str): Its language: python, js, ts, r or java.

    Returns:
        str: The output, stdout, stderr and errors.
    """


def run_code_with_tools(agent_state: Any, code: str) -> str:
    """Run Python code that can call this agent's tools as functions.

    Args:
        code (str): The Python code to run.

    Returns:
        str: The output, stdout, stderr and errors.
    """


def web_search(
    agent_state: Any,
    query: str,
    num_results: int = 10,
    category: Literal[
        "company",
        "research paper",
        "news",
        "pdf",
        "github",
        "tweet",
        "personal site",
        "linkedin profile",
        "financial report",
    ]
    | None = None,
    include_text: bool = False,
    include_domains: list[str] | None = None,
    exclude_domains: list[str] | None = None,
    start_published_date: str | None = None,
    end_published_date: str | None = None,
    user_location: str | None = None,
) -> str:
    """Search the web.

    Args:
        query (str): What to search for.
        num_results (int): How many results (1-100; default 10).
        category (str): Only this kind of content.
        include_text (bool): Include each page's full text (default false: summaries and highlights).
        include_domains (list): Only results from these domains.
        exclude_domains (list): No results from these domains.
        start_published_date (str): Only content published after this date (ISO 8601).
        end_published_date (str): Only content published before this date (ISO 8601).
        user_location (str): Two-letter country code for local results, e.g. "US".

    Returns:
        str: The results as JSON: title, URL, content, highlights and summary.
    """


def fetch_webpage(agent_state: Any, url: str) -> str:
    """Fetch a web page as markdown text.

    Args:
        url (str): The page's URL.

    Returns:
        str: The page's content.
    """


class FileOpenRequest(BaseModel):
    """One file to open, optionally a range of its lines."""

    file_name: str = Field(description="The file, as <folder name>/<file name>.")
    offset: int | None = Field(default=None, description="First line to show (0-indexed); default the start.")
    length: int | None = Field(default=None, description="How many lines to show; default to the end.")


def open_files(agent_state: Any, file_requests: list[FileOpenRequest], close_all_others: bool = False) -> str:
    """Open files into the files section of memory (at most 5 open at once; the least recently used closes).

    Args:
        file_requests (list): The files to open, each with an optional range of lines.
        close_all_others (bool): Close every other open file first.

    Returns:
        str: Which files were opened and closed.
    """


def grep_files(
    agent_state: Any,
    pattern: str,
    include: str | None = None,
    context_lines: int | None = 1,
    offset: int | None = None,
) -> str:
    """Search the attached folders' files for a keyword or regular expression, 20 matches per page.

    Args:
        pattern (str): The keyword or regular expression.
        include (str): Only files whose name matches this keyword or regular expression.
        context_lines (int): Lines of context before and after each match (default 1).
        offset (int): Matches to skip, to see the next page (the answer says which offset is next).

    Returns:
        str: The number of matches, the files that have them and the current page of matches.
    """


def semantic_search_files(agent_state: Any, query: str, limit: int = 5) -> str:
    """Search the attached folders' files by meaning rather than exact words.

    Args:
        query (str): What to look for.
        limit (int): Most results to return (default 5).

    Returns:
        str: The matching passages and their files.
    """


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
    "memory": ("letta_memory_core", memory),
    "memory_apply_patch": ("letta_memory_core", memory_apply_patch),
    "load_skill": ("letta_memory_core", load_skill),
    "send_message_to_agent_and_wait_for_reply": (
        "letta_multi_agent_core",
        send_message_to_agent_and_wait_for_reply,
    ),
    "send_message_to_agents_matching_tags": ("letta_multi_agent_core", send_message_to_agents_matching_tags),
    "send_message_to_agent_async": ("letta_multi_agent_core", send_message_to_agent_async),
    "store_memories": ("letta_voice_sleeptime_core", store_memories),
    "rethink_user_memory": ("letta_voice_sleeptime_core", rethink_user_memory),
    "finish_rethinking_memory": ("letta_voice_sleeptime_core", finish_rethinking_memory),
    "search_memory": ("letta_voice_sleeptime_core", search_memory),
    "run_code": ("letta_builtin", run_code),
    "run_code_with_tools": ("letta_builtin", run_code_with_tools),
    "web_search": ("letta_builtin", web_search),
    "fetch_webpage": ("letta_builtin", fetch_webpage),
    "open_files": ("letta_files_core", open_files),
    "grep_files": ("letta_files_core", grep_files),
    "semantic_search_files": ("letta_files_core", semantic_search_files),
}
"""Letta's whole base tool set (LETTA_TOOL_SET of letta/constants.py), each with its tool type, and this
server's SERVER_TOOLS."""
SERVER_TOOLS = frozenset({"load_skill"})
"""Built-ins that Letta does not have: Letta's server has no tool that loads a skill (its skills are files a
client such as Letta Code reads from its memory directory), so `load_skill` does that here."""

_ARGUMENT_MODELS: dict[str, tuple[type[BaseModel], ...]] = {
    "store_memories": (MemoryChunk,),
    "open_files": (FileOpenRequest,),
}
"""The pydantic models a built-in's parameters name: their source goes before the function's, so the
schema generator (which reads source, never imports it) can describe the nested objects."""

BASE_TOOLS_BY_AGENT_TYPE: dict[str, tuple[str, ...]] = {
    "letta_v1_agent": ("conversation_search", "memory_insert", "memory_replace"),
    "memgpt_v2_agent": ("send_message", "conversation_search", "memory_insert", "memory_replace"),
    "memgpt_agent": ("send_message", "conversation_search", "core_memory_append", "core_memory_replace"),
    "sleeptime_agent": ("memory_replace", "memory_insert", "memory_rethink", "memory_finish_edits"),
    "react_agent": (),
    "workflow_agent": (),
}
SLEEPTIME_PRIMARY_TOOLS = ("send_message", "conversation_search", "archival_memory_search")
MULTI_AGENT_TOOLS = (
    "send_message_to_agent_and_wait_for_reply",
    "send_message_to_agents_matching_tags",
    "send_message_to_agent_async",
)
"""What CreateAgent's `include_multi_agent_tools` attaches (Letta's MULTI_AGENT_TOOLS)."""


def base_tool_names(agent_type: str, *, enable_sleeptime: bool = False) -> tuple[str, ...]:
    """The built-ins `include_base_tools=true` attaches (Letta's table, letta_api.md section 7.1)."""
    if enable_sleeptime and agent_type != "sleeptime_agent":
        return SLEEPTIME_PRIMARY_TOOLS
    return BASE_TOOLS_BY_AGENT_TYPE.get(agent_type, BASE_TOOLS_BY_AGENT_TYPE["memgpt_agent"])


@cache
def builtin_definition(name: str) -> dict[str, Any]:
    """Tool fields for a built-in: type, description, source and the JSON schema from its docstring."""
    tool_type, function = BUILTIN_TOOLS[name]
    parts = [*_ARGUMENT_MODELS.get(name, ()), function]
    source = "\n\n".join(textwrap.dedent(inspect.getsource(part)) for part in parts)
    schema = generate_schema(source, name=name)
    return {
        "tool_type": tool_type,
        "description": schema["description"],
        "source_code": source,
        "json_schema": schema,
    }
