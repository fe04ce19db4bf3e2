"""What an agent sees of files: numbered windows of lines (Letta's LineChunker) and the `<directories>`
section of its system message (Letta's Memory._render_directories_common). Pure: no Django, no I/O.

Lines: code keeps its indentation (trailing spaces dropped), structured data and plain text are stripped,
Markdown is cut into sentences; empty lines are dropped in all of them, as Letta does, so line numbers are
those of this view, shown 1-indexed as "N: text" under a "[Viewing ...]" header.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import quoteattr

TRUNCATED_WARNING = "# NOTE: This block is truncated, use functions to view the full content."
_SENTENCES = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


class RangeError(ValueError):
    """A window outside the file (offset past its end, or an empty range)."""


def content_lines(text: str, strategy: str) -> list[str]:
    """The file's lines as numbered views count them (`strategy`: parsing.FileType.lines)."""
    if not text:
        return []
    if strategy == "documentation":
        sentences = (" ".join(s.split()) for s in _SENTENCES.split(text.strip()))
        return [s for s in sentences if s]
    if strategy == "code":
        return [line.rstrip() for line in text.splitlines() if line.strip()]
    return [line.strip() for line in text.splitlines() if line.strip()]


def view(
    text: str, strategy: str, *, file_name: str, start: int | None = None, end: int | None = None
) -> str:
    """Lines start..end (0-indexed, end exclusive; None: from the start / to the end) numbered from 1,
    under a header saying which part of how many lines this is. Raises RangeError for a start past the
    last line or a range that is empty."""
    lines = content_lines(text, strategy)
    unit = "sentences" if strategy == "documentation" else "lines"
    total = len(lines)
    if start is not None and end is not None and start >= end:
        raise RangeError(f"Invalid range: start ({start}) must be less than end ({end})")
    if start is not None and start >= total:
        raise RangeError(
            f"File {file_name} has only {total} {unit}, but requested offset {start + 1} is out of range"
        )
    first = max(0, start or 0)
    last = total if end is None else min(end, total)
    numbered = [f"{number}: {line}" for number, line in enumerate(lines[first:last], start=first + 1)]
    if start is not None and end is not None:
        header = f"[Viewing {unit} {first + 1} to {end} (out of {total} {unit})]"
    elif start is not None:
        header = f"[Viewing {unit} {first + 1} to end (out of {total} {unit})]"
    else:
        header = f"[Viewing file start (out of {total} {unit})]"
    return "\n".join([header, *numbered])


def within_limit(visible: str | None, limit: int) -> str:
    """The visible window as the prompt shows it: cut to `limit` characters with Letta's warning."""
    value = visible or ""
    if len(value) <= limit:
        return value
    warning = f"...[TRUNCATED]\n{TRUNCATED_WARNING}"
    return value[: max(0, limit - len(warning))] + warning


@dataclass(frozen=True, slots=True)
class FileView:
    name: str  # "<folder>/<file>"
    is_open: bool
    visible: str  # already within the limit; "" when closed
    limit: int


@dataclass(frozen=True, slots=True)
class DirectoryView:
    name: str
    description: str
    instructions: str
    files: Sequence[FileView]


def render_directories(directories: Sequence[DirectoryView], *, max_files_open: int) -> str:
    """`<directories>`: the open-file limits, then each attached folder with its files, open ones with
    their window (Letta's layout); "" when no folder is attached."""
    if not directories:
        return ""
    current = sum(1 for d in directories for f in d.files if f.is_open and f.visible)
    out = [
        "<directories>",
        "<file_limits>",
        f"- current_files_open={current}",
        f"- max_files_open={max_files_open}",
        "</file_limits>",
    ]
    for directory in directories:
        out.append(f"<directory name={quoteattr(directory.name)}>")
        if directory.description:
            out.append(f"<description>{directory.description}</description>")
        if directory.instructions:
            out.append(f"<instructions>{directory.instructions}</instructions>")
        for file in directory.files:
            status = "open" if file.is_open and file.visible else "closed"
            out.append(f"<file status={quoteattr(status)} name={quoteattr(file.name)}>")
            out.append("<metadata>")
            out.append("- read_only=true")
            out.append(f"- chars_current={len(file.visible)}")
            out.append(f"- chars_limit={file.limit}")
            out.append("</metadata>")
            if status == "open":
                out += ["<value>", file.visible, "</value>"]
            out.append("</file>")
        out.append("</directory>")
    out.append("</directories>")
    return "\n".join(out)
