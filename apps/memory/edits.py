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

memory_apply_patch edits several blocks, so it is not in MEMORY_TOOL_NAMES: parse_memory_patch
reads Letta's patch format into operations and memory_apply_hunks applies one block's diff; the
executor (apps.agents.builtin_tools) plans every operation before it writes any.
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
_PATCH_LINE_NUMBER = re.compile(r"^[ +-][ \t]*\d+→")  # a diff line carrying a displayed line number


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


# --- memory_apply_patch ---------------------------------------------------------------------------------

PATCH_HEADERS = ("*** Add Block:", "*** Delete Block:", "*** Update Block:", "*** Move to:")
"""Letta's multi-block headers; a patch with none of them edits the one block named by `label`."""


@dataclass(frozen=True, slots=True)
class PatchOperation:
    """One step of a memory patch, in patch order. `kind` is add, delete, update or move; `text` is an
    update's diff body or an added block's content; `new_label` is a move's target."""

    kind: str
    label: str
    text: str = ""
    description: str = ""
    new_label: str = ""


def is_extended_patch(patch: str) -> bool:
    """Does the patch use the multi-block "***" headers (else it edits the block named by `label`)?"""
    return any(line.startswith(PATCH_HEADERS) for line in str(patch).splitlines())


def parse_memory_patch(label: str, patch: str) -> list[PatchOperation]:
    """The operations of a memory_apply_patch call, in order (Letta's format; see the tool's docstring).

    Raises MemoryEditError for a malformed patch: line numbers, a header without a label, a move that
    follows no block, or no operation at all. Nothing here reads or writes a block."""
    patch = _require_text("patch", patch)
    _refuse_line_numbers("patch", patch)
    if any(_PATCH_LINE_NUMBER.match(line) for line in patch.split("\n")):
        raise MemoryEditError(
            "patch contains a line-number prefix (such as '+3→ '). "
            "Line numbers are display-only; pass only the block's own text."
        )
    lines = patch.splitlines()
    if not is_extended_patch(patch):
        if not (label or "").strip():
            raise MemoryEditError(
                "label is empty and the patch has no '*** Update Block: <label>' header: "
                "name the block to patch, or use the '***' headers."
            )
        return [PatchOperation("update", label, text=patch)]

    operations: list[PatchOperation] = []
    current: dict[str, object] | None = None
    last_label: str | None = None

    def flush() -> None:
        nonlocal current
        if current is not None:
            body = current["lines"]
            assert isinstance(body, list)
            text = "\n".join(body)
            if current["kind"] == "add":
                text = text.rstrip("\n")
            operations.append(
                PatchOperation(
                    str(current["kind"]), str(current["label"]), text, str(current.get("description", ""))
                )
            )
            current = None

    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        header = next((h for h in PATCH_HEADERS if line.startswith(h)), None)
        if header is not None:
            target = line[len(header) :].strip()
            if not target:
                raise MemoryEditError(f"'{header}' must be followed by a block label, e.g. '{header} human'.")
            flush()
            if header == "*** Move to:":
                if last_label is None:
                    raise MemoryEditError(
                        "'*** Move to:' must follow an '*** Add Block:', '*** Update Block:' or "
                        "'*** Delete Block:' header naming the block to rename."
                    )
                previous = operations[-1] if operations else None
                if (
                    previous
                    and previous.kind == "update"
                    and previous.label == last_label
                    and not previous.text.strip()
                ):
                    operations.pop()  # "*** Update Block: a" then "*** Move to: b" with no hunk: a pure rename
                operations.append(PatchOperation("move", last_label, new_label=target))
            elif header == "*** Delete Block:":
                operations.append(PatchOperation("delete", target))
            else:
                current = {
                    "kind": "add" if header == "*** Add Block:" else "update",
                    "label": target,
                    "lines": [],
                }
                if (
                    header == "*** Add Block:"
                    and index < len(lines)
                    and lines[index].startswith("Description:")
                ):
                    current["description"] = lines[index].split(":", 1)[1].strip()
                    index += 1
            last_label = target
            continue
        if current is None:
            continue  # text before the first header (e.g. a leading "@@") carries no edit
        body = current["lines"]
        assert isinstance(body, list)
        if current["kind"] == "add":
            if line.startswith("+"):
                body.append(line[1:].expandtabs())
            elif not line.strip():
                body.append("")
        else:
            body.append(line)
    flush()
    if not operations:
        raise MemoryEditError(
            "The patch has no operations: use '*** Add Block:', '*** Delete Block:' or '*** Update Block:'."
        )
    return operations


def memory_apply_hunks(block: BlockView, diff: str) -> str:
    """`block`'s value with the diff's hunks applied in order, each to the result of the one before.

    Hunks are separated by "@@" lines; " " lines are context, "-" lines are removed, "+" lines added,
    a blank line is an empty context line, "---"/"+++" headers and other lines are ignored. A hunk's
    context and removed lines must match exactly one place; a hunk with only "+" lines appends. Raises
    MemoryEditError (read-only, no hunk, a hunk that matches nowhere or in several places, over the
    limit) and then nothing of the patch applies."""
    _check_writable(block)
    hunks: list[list[str]] = []
    hunk: list[str] = []
    for line in diff.splitlines():
        # Tabs expand after the " "/"-"/"+" marker is taken off, so they line up as in the block.
        line = line[:1] + line[1:].expandtabs()
        if line.startswith(("---", "+++", "*** ")):
            continue
        if line.startswith("@@"):
            if hunk:
                hunks.append(hunk)
            hunk = []
        elif line[:1] in (" ", "-", "+"):
            hunk.append(line)
        elif not line.strip():
            hunk.append(" ")
    if hunk:
        hunks.append(hunk)
    if not hunks:
        raise MemoryEditError(
            f"The patch for memory block '{block.label}' has no hunk: every line of a hunk must start "
            "with ' ' (context), '-' (remove) or '+' (add)."
        )
    lines = block.value.expandtabs().split("\n")
    for number, hunk in enumerate(hunks, start=1):
        expected = [line[1:] for line in hunk if line[0] in " -"]
        replacement = [line[1:] for line in hunk if line[0] in " +"]
        if not expected:
            lines = lines + replacement
            continue
        width = len(expected)
        matches = [i for i in range(len(lines) - width + 1) if lines[i : i + width] == expected]
        if not matches:
            sample = "\n".join(expected[:4])
            raise MemoryEditError(
                f"The patch was not applied: hunk {number} does not match memory block '{block.label}'. "
                "Its context and '-' lines must be the block's current lines exactly (including "
                f"whitespace). The hunk expects:\n{sample}"
            )
        if len(matches) > 1:
            raise MemoryEditError(
                f"The patch was not applied: hunk {number} matches {len(matches)} places in memory block "
                f"'{block.label}'. Add surrounding context lines to make it unique."
            )
        start = matches[0]
        lines = lines[:start] + replacement + lines[start + width :]
    return _checked(block, "\n".join(lines))


def memory_patch_new_block(label: str, content: str, limit: int) -> str:
    """The value of a block a patch adds (`*** Add Block:`), checked against the limit it will get."""
    _refuse_line_numbers("patch", content)
    return _checked(BlockView(label=label, value="", limit=limit), content)


def check_patch_target(block: BlockView) -> None:
    """A patch may delete or rename a block only if it could edit it."""
    _check_writable(block)


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
