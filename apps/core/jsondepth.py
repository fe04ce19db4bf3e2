"""How deep JSON nests: one walk for request bodies (apps.api.parsers) and agent files."""

from __future__ import annotations

from typing import Any


def nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` deep (`[]` and `{}` are 1). Level by level, no
    recursion: linear in the number of arrays and objects."""
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [
            child
            for container in level
            for child in (container.values() if isinstance(container, dict) else container)
            if isinstance(child, dict | list)
        ]
    return False
