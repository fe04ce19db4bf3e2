"""Celery entry points: ids in, one call, nothing else. Behaviour lives in the modules they call."""

from __future__ import annotations

from celery import Task, shared_task
from django.db import InterfaceError, OperationalError

from apps.agents.group_turns import recover_stalled_turns
from apps.agents.loop.runner import RunDeferred, execute_run_streamed
from apps.agents.recovery import enqueue_run, fail_orphaned_runs, note_task, requeue_lost_tasks
from apps.agents.sleeptime import create_sleeptime_run

DEFER_SECONDS = 0.25
DEFER_MAX_SECONDS = 10.0
DATABASE_RETRIES = 8
"""Tries again of a run whose database went away (about 45 s of backoff) before crash recovery takes it."""


def defer_countdown(retries: int) -> float:
    """Seconds before a deferred run's task tries again: 0.25 s, doubling with each try, at most 10 s.

    Waiting costs nothing in order: the worker that finishes a run enqueues the next run of its
    conversation at once (execute_run_streamed). What the backoff saves is a task every 250 ms for each
    run queued behind one that takes long (up to RUN_DEADLINE)."""
    return min(DEFER_MAX_SECONDS, DEFER_SECONDS * 2 ** min(retries, 10))


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
    self: Task,
    run_id: str,
    agent_id: str | None = None,
    conversation_id: str | None = None,
    database_retries: int = 0,
) -> None:
    """Run an agent turn, streaming its events to Redis. Idempotent: a claimed run is left alone.
    While an earlier run of the same conversation is unfinished, try again later (keeps order), with
    backoff; the run's task marker says meanwhile that it has a task (apps.agents.recovery).
    agent_id/conversation_id: the run's (a send passes them; the run is read when they are absent).

    A database that goes away under the run (even its failure could not be written) makes the task try
    again, with the same backoff, once it may be back: a claim the restart lost (its commit does not wait
    for the disk, apps.agents.loop.store.claim_run) left the run `created`, and this runs it within
    seconds instead of at recovery's lost-task pass (minutes). A claim that survived makes the try a no-op
    and recovery fails that run as orphaned, as before."""
    try:
        execute_run_streamed(run_id, agent_id=agent_id, conversation_id=conversation_id)
    except RunDeferred as exc:
        note_task(run_id)
        raise self.retry(countdown=defer_countdown(self.request.retries)) from exc
    except (OperationalError, InterfaceError) as exc:
        if database_retries >= DATABASE_RETRIES:
            raise
        note_task(run_id)
        raise self.retry(
            countdown=defer_countdown(database_retries + 1),
            kwargs={**(self.request.kwargs or {}), "database_retries": database_retries + 1},
        ) from exc


@shared_task(name="agents.recover_runs", acks_late=True, time_limit=120)
def recover_runs_task() -> None:
    """Periodic (beat): fail runs whose worker died; enqueue again runs whose task was lost."""
    fail_orphaned_runs()
    requeue_lost_tasks()
    recover_stalled_turns()  # group turns whose advance task was lost


@shared_task(name="agents.sleeptime", acks_late=True, time_limit=600)
def sleeptime_task(primary_agent_id: str) -> None:
    """Give the primary's recent messages to its sleeptime agent, as a run of that agent."""
    run = create_sleeptime_run(primary_agent_id)
    if run is not None:
        enqueue_run(run.id)
