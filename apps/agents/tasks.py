"""Celery entry points: ids in, one call, nothing else. Behaviour lives in the modules they call."""

from __future__ import annotations

from celery import Task, shared_task

from apps.agents.loop.runner import RunDeferred, execute_run_streamed
from apps.agents.recovery import fail_orphaned_runs, stale_created_runs
from apps.agents.sleeptime import create_sleeptime_run

DEFER_SECONDS = 0.25


@shared_task(
    bind=True,
    name="agents.execute_run",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=1800,
    time_limit=1900,
    max_retries=None,
)
def execute_run_task(
    self: Task, run_id: str, agent_id: str | None = None, conversation_id: str | None = None
) -> None:
    """Run an agent turn, streaming its events to Redis. Idempotent: a claimed run is left alone.
    While an earlier run of the same conversation is unfinished, try again shortly (keeps order).
    agent_id/conversation_id: the run's (a send passes them; the run is read when they are absent)."""
    try:
        execute_run_streamed(run_id, agent_id=agent_id, conversation_id=conversation_id)
    except RunDeferred as exc:
        raise self.retry(countdown=DEFER_SECONDS) from exc


@shared_task(name="agents.recover_runs", acks_late=True, time_limit=120)
def recover_runs_task() -> None:
    """Periodic (beat): fail runs whose worker died; enqueue again runs whose task was lost."""
    fail_orphaned_runs()
    for run_id in stale_created_runs():
        execute_run_task.delay(run_id)


@shared_task(name="agents.sleeptime", acks_late=True, time_limit=600)
def sleeptime_task(primary_agent_id: str) -> None:
    """Give the primary's recent messages to its sleeptime agent, as a run of that agent."""
    run = create_sleeptime_run(primary_agent_id)
    if run is not None:
        execute_run_task.delay(run.id)
