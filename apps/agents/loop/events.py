"""Where the loop reports what happens, as it happens. The workers issue relays these through Redis."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class UsageStatistics:
    """Letta's `usage_statistics` message: one builder for the stream's event, a LettaResponse's `usage`
    and /generate's."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    step_count: int = 0
    run_ids: tuple[str, ...] | None = None

    def event(self, *, details: bool = False) -> dict[str, Any]:
        """The message as JSON; `details` adds the fields Letta's LettaUsageStatistics also has, unknown here."""
        payload: dict[str, Any] = {
            "message_type": "usage_statistics",
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "step_count": self.step_count,
            "run_ids": list(self.run_ids) if self.run_ids is not None else None,
        }
        if details:
            payload |= {
                "cached_input_tokens": None,
                "cache_write_tokens": None,
                "reasoning_tokens": None,
                "context_tokens": None,
            }
        return payload


class EventSink(Protocol):
    def emit(self, event: dict[str, Any]) -> None: ...

    def emit_many(self, events: list[dict[str, Any]]) -> None:
        """Events produced together (one message's parts), in order: a stream appends them at once."""

    def finish(self, events: list[dict[str, Any]], *, status: str, stop_reason: str) -> None:
        """The run's last events, after its terminal state is committed; a stream also closes itself."""


class NullSink:
    def emit(self, event: dict[str, Any]) -> None:
        return None

    def emit_many(self, events: list[dict[str, Any]]) -> None:
        return None

    def finish(self, events: list[dict[str, Any]], *, status: str, stop_reason: str) -> None:
        return None


class ListSink:
    """Collects events in memory (tests, the in-process executor)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def emit_many(self, events: list[dict[str, Any]]) -> None:
        self.events.extend(events)

    def finish(self, events: list[dict[str, Any]], *, status: str, stop_reason: str) -> None:
        self.events.extend(events)
