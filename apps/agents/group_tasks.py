"""Celery entry point of group turns: ids in, one call, nothing else (apps.agents.group_turns drives)."""

from __future__ import annotations

from celery import Task, shared_task

from apps.agents.group_turns import Progress, advance
from apps.agents.tasks import defer_countdown


@shared_task(
    bind=True,
    name="agents.group_turn_advance",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=1800,
    time_limit=1900,
    max_retries=None,
)
def group_turn_advance_task(self: Task, turn_id: str) -> None:
    """One speaker of a group turn (its run executed in this thread); the next speaker is a task of its
    own. While the speaker's conversation is busy elsewhere, try again later, with backoff."""
    progress = advance(turn_id)
    if progress is Progress.CONTINUE:
        group_turn_advance_task.apply_async(args=[turn_id])
    elif progress is Progress.DEFER:
        raise self.retry(countdown=defer_countdown(self.request.retries))
