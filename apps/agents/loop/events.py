"""Where the loop reports what happens, as it happens, and the typed payloads it reports (one builder each
for what is not a stored message). The workers relay these through Redis."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from django.utils import timezone


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


@dataclass(frozen=True, slots=True)
class StopReasonEvent:
    """Letta's `stop_reason` message: why the run ended."""

    stop_reason: str

    def event(self) -> dict[str, Any]:
        return {"message_type": "stop_reason", "stop_reason": self.stop_reason}


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """A piece of a streamed LLM answer (the run's `delta` event, which the SSE relay turns into Letta's
    chunked messages): `kind` is reasoning, content or tool_call."""

    kind: str
    text: str
    tool_call_id: str | None
    tool_name: str | None
    step_id: str | None
    run_id: str
    message_id: str | None

    def event(self) -> dict[str, Any]:
        return {
            "message_type": "delta",
            "kind": self.kind,
            "text": self.text,
            "tool_call_id": self.tool_call_id,
            "tool_name": self.tool_name,
            "step_id": self.step_id,
            "run_id": self.run_id,
            "message_id": self.message_id,
        }


@dataclass(frozen=True, slots=True)
class CompactionStarted:
    """Letta's EventMessage announcing a compaction (sent when the request asks for compaction messages)."""

    trigger: str
    context_window: int
    context_token_estimate: int | None
    run_id: str

    def event(self) -> dict[str, Any]:
        return {
            "id": f"message-{uuid.uuid4()}",
            "date": timezone.now().isoformat(),
            "message_type": "event_message",
            "event_type": "compaction",
            "event_data": {
                "trigger": self.trigger,
                "context_token_estimate": self.context_token_estimate,
                "context_window": self.context_window,
            },
            "run_id": self.run_id,
            "step_id": None,
            "otid": None,
            "sender_id": None,
            "name": None,
            "is_err": None,
            "seq_id": None,
        }


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
