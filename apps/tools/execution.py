"""What running a tool takes and gives, whichever executor runs it (in-process, sandbox, MCP, client)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from apps.core.actor import Actor

ToolStatus = Literal["success", "error"]
SandboxKind = Literal["in_process", "docker", "local", "mcp", "client"]


@dataclass(frozen=True)
class ToolContext:
    """Everything a tool may know about its caller. `actor` is the agent's organisation (system role)."""

    actor: Actor
    agent_id: str
    conversation_id: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    embedding_handle: str = ""
    timezone: str = "UTC"
    # The agent's memory Blocks as the run last read or wrote them: a memory edit starts from these (its
    # compare-and-set write catches a newer version) instead of reading the block again.
    blocks: tuple[Any, ...] = ()


@dataclass(frozen=True)
class ToolResult:
    status: ToolStatus
    return_value: str  # what the model reads, already cut to the tool's return limit
    stdout: tuple[str, ...] = ()
    stderr: tuple[str, ...] = ()
    sandbox: SandboxKind = "in_process"
    memory_changed: bool = False  # a core-memory block changed: the system message must be recompiled
    edited_block: Any = None  # the memory Block a core-memory edit wrote, so the loop need not reload them
    duration_ms: int | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @classmethod
    def ok(cls, value: object, **kwargs: object) -> ToolResult:
        return cls(status="success", return_value=stringify(value), **kwargs)  # type: ignore[arg-type]

    @classmethod
    def error(cls, message: str, **kwargs: object) -> ToolResult:
        return cls(status="error", return_value=message, **kwargs)  # type: ignore[arg-type]


def stringify(value: object) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def package_for_model(result: ToolResult, *, now: datetime) -> str:
    """The text the LLM sees as the tool message, in Letta's packaging: status, message, local time."""
    status = "OK" if result.status == "success" else "Failed"
    return json.dumps(
        {"status": status, "message": result.return_value, "time": now.strftime("%Y-%m-%d %I:%M:%S %p %Z%z")},
        ensure_ascii=False,
    )


def cut_to_limit(text: str, limit: int) -> str:
    """Cap a tool's return at its return_char_limit, saying so, instead of silently dropping text."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [NOTE: the function returned {len(text)} characters; cut to {limit}]"


def output_lines(text: str, limit: int) -> tuple[str, ...]:
    """A tool's stdout or stderr as kept in its tool return: cut to the tool's return limit like the
    return value (the sandbox already stopped it at SANDBOX_MAX_OUTPUT_BYTES), so one chatty call
    does not store megabytes in a message."""
    return tuple(cut_to_limit(text, limit).splitlines())
