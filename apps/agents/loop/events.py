"""Where the loop reports what happens, as it happens. The workers issue relays these through Redis."""

from __future__ import annotations

from typing import Any, Protocol


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
