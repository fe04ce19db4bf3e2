"""Compile the system message the model sees on every call, and the OpenAI-shaped request messages.

Pure (no Django, no I/O): the runner loads blocks and counts, then calls this. The layout follows
Letta's: the instructions, then `<memory_blocks>` (each block with its size and limit so the model can
manage it), then `<tool_usage_rules>`, then `<memory_metadata>` last. The metadata changes most often
(counts move as messages are evicted and passages stored), so keeping it at the end leaves the longest
stable prefix for providers' prompt caches; for the same reason the current *date* is shown, not the
time (Letta dropped the time after it busted caches on every request).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apps.memory.edits import LINE_NUMBER_WARNING, render_block_with_line_numbers

__all__ = [
    "CORE_MEMORY_PLACEHOLDER",
    "MEMORY_BLOCKS_INTRO",
    "NO_CORE_MEMORY_AGENT_TYPES",
    "TOOL_RULES_INTRO",
    "BlockSnapshot",
    "MemoryStats",
    "SystemSections",
    "ThreadIds",
    "build_llm_messages",
    "compile_system_message",
    "compile_system_sections",
    "is_skill_label",
    "render_available_skills",
    "render_git_memory",
    "render_memory_blocks",
    "render_memory_metadata",
    "render_tool_rules",
    "with_available_skills",
]

CORE_MEMORY_PLACEHOLDER = "{CORE_MEMORY}"
"""Where a system prompt may ask for the memory sections to go (older Letta prompts carry it);
without it they are appended after the prompt."""

NO_CORE_MEMORY_AGENT_TYPES = frozenset({"react_agent", "workflow_agent"})
"""Letta renders no memory blocks for these agent types (they have no memory tools)."""

MEMORY_BLOCKS_INTRO = "These memory blocks make up your core memory; they are always in your context:"

TOOL_RULES_INTRO = (
    "These rules constrain which tools you may call and in what order. "
    "Follow them on every call; one response may contain several tool calls."
)

_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


@dataclass(frozen=True, slots=True)
class BlockSnapshot:
    """One core-memory block as the prompt needs it; `limit` is in characters."""

    label: str
    description: str | None
    value: str
    limit: int
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """Counts about memory outside the context window, for the metadata section.

    `recall_message_count` is what Letta shows: messages stored in recall but no longer in
    context (all messages minus the in-context ones). `archival_tags` may come in any order.
    """

    last_memory_edit: datetime | None
    recall_message_count: int
    archival_passage_count: int
    archival_tags: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class ThreadIds:
    """Which thread a system message is for: the agent, and its conversation (None: its default one)."""

    agent_id: str
    conversation_id: str | None = None


@dataclass(frozen=True, slots=True)
class SystemSections:
    """The system message in parts, so the context-window bar can count each one.

    Empty strings mean "section absent". `render()` joins them exactly as the model sees them.
    """

    system_prompt: str
    memory_blocks: str
    tool_rules: str
    metadata: str
    directories: str = ""  # Letta's `<directories>`: attached folders and open files (apps.folders)

    def memory_text(self) -> str:
        """Everything below the instructions: blocks, tool rules, directories, metadata, separated by blank
        lines."""
        parts = (self.memory_blocks, self.tool_rules, self.directories, self.metadata)
        return "\n\n".join(part for part in parts if part)

    def render(self) -> str:
        """The full system message; `{CORE_MEMORY}` in the prompt is replaced, else memory is appended."""
        memory = self.memory_text()
        if CORE_MEMORY_PLACEHOLDER in self.system_prompt:
            return self.system_prompt.replace(CORE_MEMORY_PLACEHOLDER, memory)
        return "\n\n".join(part for part in (self.system_prompt.rstrip(), memory) if part)


def compile_system_sections(
    *,
    system_prompt: str,
    blocks: Sequence[BlockSnapshot],
    stats: MemoryStats,
    tool_rules_text: str,
    agent_type: str,
    show_line_numbers: bool,
    now: datetime,
    timezone: str,
    directories: str = "",
    thread: ThreadIds | None = None,
    git_enabled: bool = False,
) -> SystemSections:
    """Render each section of the system message; see `compile_system_message`. `directories` comes
    rendered (apps.folders renders Letta's `<directories>`). `git_enabled`: the agent keeps its memory as
    a git repository (tag `git-memory-enabled`), so its blocks render as Letta's memory file layout
    (render_git_memory)."""
    zone = _zone(timezone)
    if (agent_type or "").lower() in NO_CORE_MEMORY_AGENT_TYPES:
        memory_blocks = ""
    elif git_enabled:
        memory_blocks = render_git_memory(blocks)
    else:  # skills are listed in <available_skills>, not shown in full (see render_available_skills)
        memory_blocks = render_memory_blocks(
            [block for block in blocks if not is_skill_label(block.label)],
            show_line_numbers=show_line_numbers,
        )
    return SystemSections(
        system_prompt=system_prompt,
        memory_blocks=memory_blocks,
        tool_rules=render_tool_rules(tool_rules_text),
        metadata=render_memory_metadata(stats, now=now, zone=zone, thread=thread),
        directories=directories,
    )


def compile_system_message(
    *,
    system_prompt: str,
    blocks: Sequence[BlockSnapshot],
    stats: MemoryStats,
    tool_rules_text: str,
    agent_type: str,
    show_line_numbers: bool,
    now: datetime,
    timezone: str,
) -> str:
    """The system message: instructions, memory blocks, tool rules, memory metadata.

    Deterministic for a given input: blocks keep the given order, tags are sorted, dates are
    formatted without the process locale. `now` and `last_memory_edit` must be timezone-aware;
    an unknown `timezone` falls back to UTC rather than failing every step of the agent.
    """
    return compile_system_sections(
        system_prompt=system_prompt,
        blocks=blocks,
        stats=stats,
        tool_rules_text=tool_rules_text,
        agent_type=agent_type,
        show_line_numbers=show_line_numbers,
        now=now,
        timezone=timezone,
    ).render()


def build_llm_messages(
    system_message: str, in_context: Sequence[dict[str, object]]
) -> list[dict[str, object]]:
    """The chat request: the fresh system message, then the in-context messages (copied, not mutated).

    A leading stored system message is dropped: it is the previous compile of the same thing.
    """
    rest = list(in_context)
    if rest and rest[0].get("role") == "system":
        rest = rest[1:]
    return [{"role": "system", "content": system_message}, *(dict(message) for message in rest)]


def render_memory_blocks(blocks: Sequence[BlockSnapshot], *, show_line_numbers: bool) -> str:
    """`<memory_blocks>` with one element per block, or "" when there are none."""
    if not blocks:
        return ""
    rendered = "\n\n".join(_render_block(block, show_line_numbers=show_line_numbers) for block in blocks)
    return f"<memory_blocks>\n{MEMORY_BLOCKS_INTRO}\n\n{rendered}\n</memory_blocks>"


def render_tool_rules(tool_rules_text: str) -> str:
    """`<tool_usage_rules>` around the rules in plain English, or "" when there are none."""
    rules = tool_rules_text.strip()
    if not rules:
        return ""
    return f"<tool_usage_rules>\n{TOOL_RULES_INTRO}\n\n{rules}\n</tool_usage_rules>"


def render_memory_metadata(
    stats: MemoryStats, *, now: datetime, zone: ZoneInfo, thread: ThreadIds | None = None
) -> str:
    """`<memory_metadata>`: which agent and thread this is, today's date, last memory edit, and what lies
    outside the context.

    As in Letta, the ids come first (the conversation is "default" for the agent's own thread), the
    recall line is always there, the archival line only when passages exist, and the tag line only
    when tags exist. An unknown last edit is left out rather than guessed.
    """
    lines = ["<memory_metadata>"]
    if thread is not None:
        lines += [
            f"- AGENT_ID: {thread.agent_id}",
            f"- CONVERSATION_ID: {thread.conversation_id or 'default'}",
        ]
    lines.append(f"- Current date: {_long_date(_local(now, zone))}")
    if stats.last_memory_edit is not None:
        lines.append(f"- Memory blocks last modified: {_timestamp(_local(stats.last_memory_edit, zone))}")
    lines.append(
        f"- {stats.recall_message_count} earlier messages between you and the user are no longer in "
        "context but are kept in recall memory (search them with your tools)"
    )
    if stats.archival_passage_count > 0:
        lines.append(
            f"- {stats.archival_passage_count} memories you saved are in archival memory "
            "(search them with your tools)"
        )
    tags = sorted(set(stats.archival_tags))
    if tags:
        lines.append(f"- Archival memory tags: {', '.join(tags)}")
    lines.append("</memory_metadata>")
    return "\n".join(lines)


def _render_block(block: BlockSnapshot, *, show_line_numbers: bool) -> str:
    parts = [f"<{block.label}>"]
    if block.description:
        parts.append(f"<description>\n{block.description}\n</description>")
    metadata = ["<metadata>"]
    if block.read_only:
        metadata.append("- read_only=true")
    metadata += [f"- chars_current={len(block.value)}", f"- chars_limit={block.limit}", "</metadata>"]
    parts.append("\n".join(metadata))
    value = block.value
    if show_line_numbers:
        parts.append(f"<warning>\n{LINE_NUMBER_WARNING}\n</warning>")
        value = render_block_with_line_numbers(value)
    parts.append(f"<value>\n{value}\n</value>" if value else "<value>\n</value>")
    parts.append(f"</{block.label}>")
    return "\n".join(parts)


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def _local(moment: datetime, zone: ZoneInfo) -> datetime:
    if moment.tzinfo is None:
        raise ValueError("datetimes for the system message must be timezone-aware")
    return moment.astimezone(zone)


def _long_date(moment: datetime) -> str:
    """Letta's date format ("March 05, 2025"), spelled out here so the process locale cannot change it."""
    return f"{_MONTHS[moment.month - 1]} {moment.day:02d}, {moment.year}"


def _timestamp(moment: datetime) -> str:
    """Letta's timestamp format ("2025-03-05 09:15:00 AM CET+0100"), with a locale-free AM/PM."""
    meridiem = "AM" if moment.hour < 12 else "PM"
    return f"{moment:%Y-%m-%d %I:%M:%S} {meridiem} {moment:%Z%z}"


# --- skills -------------------------------------------------------------------------------------------

SKILL_BLOCK_PREFIX = "skills/"
"""Memory blocks labelled `skills/<name>` (or `skills/<name>/SKILL`) are the agent's own skills."""


def render_available_skills(
    skills: Sequence[tuple[str, str, str]], block_labels: Sequence[tuple[str, str]] = ()
) -> str:
    """Letta's `<available_skills>` section: the agent's skill blocks (`block_labels`: label and
    description) and the request's client skills (`skills`: name, description, location), first of a
    name wins, grouped by the folder that holds each skill, drawn as a tree with each skill's one-line
    description. Empty when there are none."""
    entries: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for label, description in block_labels:
        parts = label.split("/")
        if not label.startswith(SKILL_BLOCK_PREFIX) or len(parts) not in (2, 3):
            continue
        if (len(parts) == 3 and parts[2] != "SKILL") or not parts[1] or parts[1] in seen:
            continue
        seen.add(parts[1])
        entries.append((parts[1], description, f"${{MEMORY_DIR}}/skills/{parts[1]}/SKILL.md"))
    for name, description, location in skills:
        if name in seen:
            continue
        seen.add(name)
        entries.append((name, description, location.strip() or f"${{MEMORY_DIR}}/skills/{name}/SKILL.md"))
    if not entries:
        return ""
    by_root: dict[str, dict[str, object]] = {}
    for name, description, location in entries:
        root, relative = _skill_root(name, location)
        node = by_root.setdefault(root, {})
        parts = [part for part in relative.split("/") if part]
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            node = child if isinstance(child, dict) else {}
        if parts:
            node[parts[-1]] = _first_line(description)
    lines = ["<available_skills>"]
    for index, root in enumerate(sorted(by_root)):
        if index:
            lines.append("")
        lines.append(root)
        lines.extend(_tree_lines(by_root[root], ""))
    lines.append("</available_skills>")
    return "\n".join(lines)


def with_available_skills(system_message: str, skills_section: str) -> str:
    """The system message with the skills section after it (unchanged when there is none)."""
    if not skills_section:
        return system_message
    return system_message.rstrip("\n") + "\n\n" + skills_section


def _first_line(text: str) -> str:
    stripped = (text or "").strip()
    return stripped.split("\n", 1)[0].strip()


def _skill_root(name: str, location: str) -> tuple[str, str]:
    """Where a skill's folder lives and its path below it: `<root>/<name>/SKILL.md` gives (root,
    `<name>/SKILL.md`); any other location is its folder and its file name."""
    location = location.strip()
    if location.endswith("/SKILL.md"):
        folder = posixpath.dirname(location)
        if posixpath.basename(folder) == name.split("/")[-1]:
            root = posixpath.dirname(folder)
            return root, posixpath.relpath(location, root or ".")
    return posixpath.dirname(location), posixpath.basename(location)


def _tree_lines(node: dict[str, object], prefix: str) -> list[str]:
    folders = sorted(key for key, value in node.items() if isinstance(value, dict))
    files = sorted(key for key, value in node.items() if not isinstance(value, dict))
    ordered = [(key, True) for key in folders] + [(key, False) for key in files]
    lines: list[str] = []
    for index, (key, is_folder) in enumerate(ordered):
        last = index == len(ordered) - 1
        connector = "└── " if last else "├── "
        if is_folder:
            child = node[key]
            lines.append(f"{prefix}{connector}{key}/")
            lines.extend(
                _tree_lines(child if isinstance(child, dict) else {}, prefix + ("    " if last else "│   "))
            )
        else:
            description = str(node[key] or "")
            lines.append(f"{prefix}{connector}{key}" + (f" ({description})" if description else ""))
    return lines


def is_skill_label(label: str) -> bool:
    """Is a block with this label (or a file of one) a skill? Skills are listed, not rendered in full."""
    return label.startswith(SKILL_BLOCK_PREFIX)


# --- git memory (Letta's MemFS layout) ----------------------------------------------------------------

SYSTEM_BLOCK_PREFIX = "system/"
"""For a git-memory agent only blocks labelled `system/...` are in the prompt (the `system/` folder of its
repository); the others are files it loads when it needs them."""
PERSONA_LABEL = "system/persona"
MEMORY_DIR_NOTE = (
    "Reminder: each <projection> names the file in your memory repository that holds that memory."
)


def render_git_memory(blocks: Sequence[BlockSnapshot]) -> str:
    """The memory sections of a git-memory agent, in Letta's layout: `system/persona` as `<self>`, the other
    `system/` blocks as tags nested by their label's folders (the `system/` prefix dropped, so
    `system/human` is `<human>`), each with its file as `<projection>`, its description and its value,
    then `<external_projection>`: a tree of the other files (skills aside: they are listed in
    <available_skills>). No character counts, as in Letta. "" when the agent has no `system/` block."""
    system = [b for b in blocks if b.label.startswith(SYSTEM_BLOCK_PREFIX)]
    if not system:
        return ""
    out = [MEMORY_DIR_NOTE]
    persona = next((b for b in system if b.label == PERSONA_LABEL), None)
    if persona is not None:
        out.append(
            f"<self>\n<projection>$MEMORY_DIR/{PERSONA_LABEL}.md</projection>\n{persona.value.rstrip(chr(10))}\n</self>"
        )
    others = [b for b in system if b.label != PERSONA_LABEL]
    external = sorted(
        (
            b
            for b in blocks
            if b.label and not b.label.startswith(SYSTEM_BLOCK_PREFIX) and not is_skill_label(b.label)
        ),
        key=lambda b: b.label,
    )
    if not others and not external:
        return "\n\n".join(out)
    tree: dict[str, Any] = {}
    for block in others:
        parts = [part for part in block.label.removeprefix(SYSTEM_BLOCK_PREFIX).split("/") if part]
        if not parts:
            continue
        node = tree
        for part in parts[:-1]:
            child = node.get(part)
            node[part] = child = child if isinstance(child, dict) else {}
            node = child
        leaf = node.get(parts[-1])
        node[parts[-1]] = leaf = leaf if isinstance(leaf, dict) else {}
        leaf[_LEAF] = block
    lines = ["<memory>", *_nested_lines(tree, 0, [])]
    if external:
        files: dict[str, Any] = {}
        for block in external:
            parts = [part for part in block.label.strip().split("/") if part]
            if not parts:
                continue
            node = files
            for part in parts[:-1]:
                child = node.get(part)
                node[part] = child = child if isinstance(child, dict) else {}
                node = child
            node[f"{parts[-1]}.md"] = None
        lines += [
            "<external_projection>",
            "${MEMORY_DIR}/",
            *_file_tree_lines(files, ""),
            "</external_projection>",
        ]
    lines.append("</memory>")
    out.append("\n".join(lines))
    return "\n\n".join(out)


_LEAF = "\x00block"  # the block at a node of the nested tree (no label part can be this)


def _nested_lines(node: dict[str, Any], depth: int, path: list[str]) -> list[str]:
    pad = "  " * depth
    lines: list[str] = []
    for key in sorted(k for k in node if k != _LEAF):
        child = node[key]
        here = [*path, key]
        lines.append(f"{pad}<{key}>")
        block = child.get(_LEAF)
        if block is not None:
            lines.append(f"{pad}  <projection>$MEMORY_DIR/system/{'/'.join(here)}.md</projection>")
            description = (block.description or "").strip().rstrip("\n")
            if description:
                lines.append(f"{pad}  <description>{description}</description>")
            value = block.value.rstrip("\n")
            if value:
                lines.append(f"{pad}  {value}")
        lines += _nested_lines(child, depth + 1, here)
        lines.append(f"{pad}</{key}>")
    return lines


def _file_tree_lines(node: dict[str, Any], prefix: str) -> list[str]:
    folders = sorted(k for k, v in node.items() if isinstance(v, dict))
    files = sorted(k for k, v in node.items() if v is None)
    ordered = [(k, True) for k in folders] + [(k, False) for k in files]
    lines: list[str] = []
    for index, (key, is_folder) in enumerate(ordered):
        last = index == len(ordered) - 1
        lines.append(f"{prefix}{'└── ' if last else '├── '}{key}{'/' if is_folder else ''}")
        if is_folder:
            lines += _file_tree_lines(node[key], prefix + ("    " if last else "│   "))
    return lines
