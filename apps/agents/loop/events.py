"""Where the loop reports what happens, as it happens. The workers issue relays these through Redis."""

from __future__ import annotations

from typing import Any, Protocol


class EventSink(Protocol):
    def emit(self, event: dict[str, Any]) -> None: ...


class NullSink:
    def emit(self, event: dict[str, Any]) -> None:
        return None


class ListSink:
    """Collects events in memory (tests, the in-process executor)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)
