"""Pure edit rules for core-memory blocks, one function per memory-editing tool.

The agent loop looks a tool up in MEMORY_TOOL_NAMES, calls it with the block's
current state and the model's arguments, and persists the returned value. Keeping
the rules free of Django lets them be tested exhaustively and reused by any caller
(tool executor, REST "preview", ADE) without touching the database.

Semantics follow Letta's core tool executor: appends join with a newline,
core_memory_replace replaces every occurrence, memory_replace needs exactly one,
memory_insert counts lines split on "\\n", and the memory_* tools expand tabs and
refuse the display-only line numbers. Unlike current Letta, the block's character
limit is enforced here (Letta dropped enforcement and keeps `limit` as metadata).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from apps.core.errors import DomainError

READ_ONLY_MESSAGE = "This block is read-only and cannot be edited."

# Shown above a line-numbered block; models sometimes echo it back into edits.
LINE_NUMBER_WARNING = (
    "# NOTE: Line numbers such as '1→ ' are shown only to help you edit. "
    "Never include line-number prefixes or this note in memory tool arguments."
)

# Letta numbers lines only for these agent types, and only on Anthropic models.
LINE_NUMBERED_AGENT_TYPES = frozenset({"letta_v1_agent", "memgpt_v2_agent", "sleeptime_agent"})

_ARROW_PREFIX = re.compile(r"^[ \t]*\d+→", re.MULTILINE)
_LINE_PREFIX = re.compile(r"^[ \t]*Line \d+: ", re.MULTILINE)
_INTEGER = re.compile(r"[+-]?\d+")


class MemoryEditError(DomainError):
    """An edit the model asked for cannot be applied; the message tells it how to retry."""

    code = "memory_edit_error"


@dataclass(frozen=True, slots=True)
class BlockView:
    """The parts of a block an edit rule needs; frozen so a failed edit can't leak changes."""

    label: str
    value: str
    limit: int
    read_only: bool = False


def core_memory_append(block: BlockView, content: str) -> str:
    """Add `content` on a new line; like Letta, an empty block gains a leading newline."""
    _check_writable(block)
    content = _require_text("content", content)
    return _checked(block, block.value + "\n" + content)


def core_memory_replace(block: BlockView, old_content: str, new_content: str) -> str:
    """Replace every exact occurrence of `old_content`; an empty `new_content` deletes it."""
    _check_writable(block)
    old_content = _require_text("old_content", old_content)
    new_content = _require_text("new_content", new_content)
    if old_content == "":
        raise MemoryEditError(
            "old_content must not be empty: quote the exact text to replace "
            "(use core_memory_append to add new text)."
        )
    if old_content not in block.value:
        raise MemoryEditError(
            f"Old content `{old_content}` was not found in memory block '{block.label}'. "
            "It must match the block's current text exactly, including case and whitespace."
        )
    return _checked(block, block.value.replace(old_content, new_content))


def memory_replace(block: BlockView, old_string: str, new_string: str) -> str:
    """Replace the single occurrence of `old_string`; ambiguity is an error, not a guess.

    Tabs are expanded (tab size 8) in the block and in both strings separately before
    matching, as Letta does, so the stored value comes back tab-free.
    """
    _check_writable(block)
    old_string = _require_text("old_string", old_string)
    new_string = _require_text("new_string", new_string)
    if old_string == "":
        raise MemoryEditError(
            "old_string must not be empty: quote the exact text to replace "
            "(use memory_insert to add new text)."
        )
    _refuse_line_numbers("old_string", old_string)
    _refuse_line_numbers("new_string", new_string)

    old_string = old_string.expandtabs()
    new_string = new_string.expandtabs()
    current = block.value.expandtabs()
    count = current.count(old_string)
    if count == 0:
        raise MemoryEditError(
            f"No replacement was performed: old_string `{old_string}` was found 0 times in memory "
            f"block '{block.label}'. It must appear verbatim (including whitespace) exactly once."
        )
    if count > 1:
        raise MemoryEditError(
            f"No replacement was performed: old_string `{old_string}` was found {count} times in memory "
            f"block '{block.label}' ({_lines_phrase(_occurrence_lines(current, old_string))}). "
            "It must appear exactly once; include more surrounding text to make it unique."
        )
    return _checked(block, current.replace(old_string, new_string, 1))


def memory_insert(block: BlockView, new_string: str, insert_line: int = -1) -> str:
    """Insert `new_string` as line(s) after line `insert_line` (0 = start, -1 = end).

    Lines are the block split on "\\n", so an empty block has one (empty) line and
    inserting at either end leaves a blank line beside the new text, as in Letta.
    """
    _check_writable(block)
    new_string = _require_text("new_string", new_string)
    _refuse_line_numbers("new_string", new_string)
    line = _require_int("insert_line", insert_line)

    lines = block.value.expandtabs().split("\n")
    n_lines = len(lines)
    if line == -1:
        line = n_lines
    elif not 0 <= line <= n_lines:
        raise MemoryEditError(
            f"Invalid insert_line {line}: memory block '{block.label}' has {_count(n_lines, 'line')}, "
            f"so insert_line must be between 0 and {n_lines} (0 inserts before the first line), "
            "or -1 to append at the end."
        )
    new_lines = new_string.expandtabs().split("\n")
    return _checked(block, "\n".join(lines[:line] + new_lines + lines[line:]))


def memory_rethink(block: BlockView, new_memory: str) -> str:
    """Replace the whole value; meant for reorganising, so no matching is involved.

    Letta creates the block when the label is missing; that needs storage, so the
    caller does it and then calls this with the fresh block.
    """
    _check_writable(block)
    new_memory = _require_text("new_memory", new_memory)
    _refuse_line_numbers("new_memory", new_memory)
    return _checked(block, new_memory)


def render_block_with_line_numbers(value: str) -> str:
    """Number each line as `N→ text` (from 1) for the line-numbered prompt layout.

    The result has no trailing newline; an empty value renders as an empty string.
    The prompt shows LINE_NUMBER_WARNING alongside so the model knows not to echo it.
    """
    if not value:
        return ""
    return "\n".join(f"{number}→ {line}" for number, line in enumerate(value.split("\n"), start=1))


def should_show_line_numbers(agent_type: str | None, model_endpoint_type: str | None) -> bool:
    """Letta only numbers lines for the memory_* agent types running on Anthropic models."""
    return (agent_type or "").lower() in LINE_NUMBERED_AGENT_TYPES and model_endpoint_type == "anthropic"


MEMORY_TOOL_NAMES: Mapping[str, Callable[..., str]] = MappingProxyType(
    {
        "core_memory_append": core_memory_append,
        "core_memory_replace": core_memory_replace,
        "memory_replace": memory_replace,
        "memory_insert": memory_insert,
        "memory_rethink": memory_rethink,
    }
)


def _check_writable(block: BlockView) -> None:
    if block.read_only:
        raise MemoryEditError(READ_ONLY_MESSAGE)


def _checked(block: BlockView, new_value: str) -> str:
    """Refuse (never truncate) a value over the limit, so the model decides what to drop.

    Strict even when the edit shrinks an over-limit block: storage enforces value <= limit.
    NUL characters are dropped first because Postgres text columns cannot store them.
    """
    new_value = new_value.replace("\x00", "")
    size = len(new_value)
    if size > block.limit:
        raise MemoryEditError(
            f"Edit failed: the new value of block '{block.label}' would be {size} characters, "
            f"over its limit of {block.limit}. Shorten or summarise the existing content first."
        )
    return new_value


def _require_text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise MemoryEditError(f"{name} must be a string, got {type(value).__name__}.")
    return value


def _require_int(name: str, value: object) -> int:
    """Accept an int or a digit string (models sometimes quote numbers); bools are not numbers."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value)
    raise MemoryEditError(
        f"{name} must be an integer line number (0 for the start, -1 for the end), got {value!r}."
    )


def _refuse_line_numbers(name: str, text: str) -> None:
    """Line numbers exist only in the prompt; text carrying them would never match or would corrupt."""
    if LINE_NUMBER_WARNING in text:
        raise MemoryEditError(
            f"{name} contains the line-number note shown above the block. "
            "That note is display-only; pass only the block's own text."
        )
    if _ARROW_PREFIX.search(text) or _LINE_PREFIX.search(text):
        raise MemoryEditError(
            f"{name} contains a line-number prefix (such as '3→ ' or 'Line 3: '). "
            "Line numbers are display-only; pass only the block's own text."
        )


def _occurrence_lines(text: str, needle: str) -> list[int]:
    """1-based lines where each non-overlapping occurrence starts (what str.count counts)."""
    lines: list[int] = []
    start = text.find(needle)
    while start != -1:
        line = text.count("\n", 0, start) + 1
        if not lines or lines[-1] != line:
            lines.append(line)
        start = text.find(needle, start + len(needle))
    return lines


def _lines_phrase(lines: list[int]) -> str:
    if len(lines) == 1:
        return f"on line {lines[0]}"
    return "on lines " + ", ".join(str(line) for line in lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
