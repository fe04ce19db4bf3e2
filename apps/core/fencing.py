"""The run this thread executes now, for writes made below the agent loop that must be fenced by its lease.

The loop's own writes carry the run's lease explicitly (apps.agents.loop.store). A write made deeper down
on the run's behalf (a memory tool's block write, apps.memory.services) has no run in its signature: it
reads the held run from here and adds `agents_require_run_lease` (agents 0012) to its own statement, so an
executor that lost its run (failed by recovery, or claimed by another executor while it was cut off) has
that write refused by the database too, at no extra statement.

The process also keeps the set of runs its threads execute now, nested inline runs included (a
wait-for-reply message, a group speaker): a worker told to stop hands them all back
(apps.agents.worker_shutdown), not only the ones its task queue knows of.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class HeldRun:
    run_id: str
    lease: str


_held: ContextVar[HeldRun | None] = ContextVar("held_run", default=None)
_executing: dict[str, int] = {}
_executing_lock = threading.Lock()


@contextmanager
def holding(run_id: str, lease: str) -> Iterator[HeldRun]:
    """While the block runs, this thread executes `run_id` under `lease` (nested: the innermost wins)."""
    held = HeldRun(run_id, lease)
    token = _held.set(held)
    with _executing_lock:
        _executing[run_id] = _executing.get(run_id, 0) + 1
    try:
        yield held
    finally:
        with _executing_lock:
            left = _executing.get(run_id, 1) - 1
            if left:
                _executing[run_id] = left
            else:
                _executing.pop(run_id, None)
        _held.reset(token)


def held_run() -> HeldRun | None:
    return _held.get()


def executing_run_ids() -> list[str]:
    """Every run some thread of this process executes now."""
    with _executing_lock:
        return sorted(_executing)


def lease_condition() -> tuple[str, list[Any]]:
    """An SQL condition (with its params) that refuses the statement unless the held run is still held
    under its lease; ("", []) outside a run (an API write: the caller's own, not an executor's)."""
    held = _held.get()
    if held is None or not held.lease:
        return "", []
    return "agents_require_run_lease(%s, %s)", [held.run_id, held.lease]
