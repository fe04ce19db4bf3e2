"""Crash recovery: runs whose executor died end as failed, runs whose task was lost are enqueued again.

A RUNNING run whose conversation lock is free has no live executor (apps.agents.locks): it is marked
failed with its stream closed, within one recovery period of the crash, and the agent accepts the next
message. Its input messages stay (they were committed before it started); what its finished steps
produced stays too. A CREATED run older than a grace period whose task is gone is enqueued again
(execution is idempotent). A worker that is stopped (SIGTERM) hands its runs still going after
WORKER_SHUTDOWN_TIMEOUT back instead (`hand_back_runs`, apps.agents.worker_shutdown): they are resumed
elsewhere from their last stored step rather than failed.

"Whose task is gone": every task of a run is sent by `enqueue_run`, which sets the run's task marker in
Redis; a task that defers (an earlier run of its conversation is unfinished) sets it again each time, so
the marker lives as long as the task does and expires TASK_MARKER_TTL after it is gone. Recovery leaves
runs with a marker alone, so a conversation held by a long run, with N runs queued behind it, costs N
tasks in all (each deferring with backoff, apps.agents.tasks), not N more every pass; a run enqueued
again whose task is lost once more waits twice as long before the next time (`requeue_delay`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from celery import current_app
from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.agents.locks import conversation_is_locked
from apps.agents.models import Run, StopReason
from apps.observability import tracing
from apps.streams.events import end_stream
from apps.streams.redis_client import get_redis

logger = logging.getLogger(__name__)

LOST_TASK_GRACE: timedelta = timedelta(seconds=settings.RUN_LOST_TASK_GRACE)
"""How old a queued run must be before recovery looks at its task marker (RUN_LOST_TASK_GRACE, 60 s)."""
TASK_MARKER_TTL: int = settings.RUN_TASK_MARKER_TTL
"""Seconds a run's task marker lives once set (RUN_TASK_MARKER_TTL, 120 s): far more than a deferring task
waits between two tries. A task lost before any worker took it is enqueued again within
max(TASK_MARKER_TTL, LOST_TASK_GRACE) + one recovery period (RUN_RECOVERY_INTERVAL) of its send."""
REQUEUE_MAX_DELAY = 1800
"""The longest, in seconds, recovery waits before enqueueing one run again (the backoff's cap)."""
REQUEUE_COUNT_TTL = 24 * 3600
WORKER_LOST = "The worker executing this run stopped (crashed or was killed); the run did not finish."
DATABASE_RESTARTED = (
    "The database restarted while this run was executing, which ended its worker's session; "
    "the run did not finish. Send the message again."
)


def fail_orphaned_runs(*, agent_id: str | None = None, exclude_run_id: str | None = None) -> list[str]:
    """Mark RUNNING runs without a live executor as failed (but `exclude_run_id`). Returns their ids."""
    running = Run.objects.unscoped().filter(status=Run.Status.RUNNING)
    if agent_id is not None:
        running = running.filter(agent_id=agent_id)
    if exclude_run_id is not None:
        running = running.exclude(id=exclude_run_id)
    failed = []
    restarted_at = None
    for run in running.only("id", "agent_id", "conversation_id", "started_at"):
        if conversation_is_locked(run.agent_id, run.conversation_id):
            continue
        if restarted_at is None:
            restarted_at = database_started_at()
        updated = (
            Run.objects.unscoped()
            .filter(id=run.id, status=Run.Status.RUNNING)
            .update(
                status=Run.Status.FAILED,
                stop_reason=StopReason.ERROR,
                completed_at=timezone.now(),
                error={"message": lost_reason(run, restarted_at)},
            )
        )
        if updated:
            # As the stream's newest writer: the run's executor, if it comes back, appends nothing more.
            end_stream(run.id, status=Run.Status.FAILED, stop_reason=StopReason.ERROR, fence=True)
            logger.warning("agents.run_orphaned", extra={"run_id": run.id})
            failed.append(run.id)
    return failed


def database_started_at() -> datetime:
    """When the PostgreSQL server started (its postmaster): a run started before it lost its session."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_postmaster_start_time()")
        return cursor.fetchone()[0]


def lost_reason(run: Run, restarted_at: datetime | None) -> str:
    """Why the run's executor went away, as far as the database can tell: a database restart since the run
    started ended every session (the worker may well be alive), else the worker itself stopped."""
    if restarted_at is not None and run.started_at is not None and run.started_at < restarted_at:
        return DATABASE_RESTARTED
    return WORKER_LOST


def hand_back_runs(run_ids: list[str]) -> list[str]:
    """Put the `running` runs among `run_ids` back to `created` and send their task again, for another
    worker to resume from their last stored step; returns the ids handed back.

    Only for the process executing them, while it still holds their conversations' locks, right before it
    exits (apps.agents.worker_shutdown): the lock keeps every other executor out until then, so the
    conversation's next run cannot go first, and the run is never `running` without a live executor.
    Once `created`, the run's lease no longer admits the old executor's writes (agents 0012): it stores
    nothing more, and the run's next claim gives it a new lease."""
    handed = []
    rows = (
        Run.objects.unscoped()
        .filter(id__in=run_ids, status=Run.Status.RUNNING)
        .values_list("id", "agent_id", "conversation_id")
    )
    for run_id, agent_id, conversation_id in rows:
        updated = (
            Run.objects.unscoped()
            .filter(id=run_id, status=Run.Status.RUNNING)
            .update(status=Run.Status.CREATED)
        )
        if updated:
            enqueue_run(run_id, agent_id, conversation_id)
            logger.warning("agents.run_handed_back", extra={"run_id": run_id})
            handed.append(run_id)
    return handed


def stale_created_runs() -> list[str]:
    cutoff = timezone.now() - LOST_TASK_GRACE
    return list(
        Run.objects.unscoped()
        .filter(status=Run.Status.CREATED, created_at__lt=cutoff)
        .values_list("id", flat=True)
    )


def task_marker_key(run_id: str) -> str:
    return f"run-task:{run_id}"


def requeue_count_key(run_id: str) -> str:
    return f"run-requeues:{run_id}"


def enqueue_run(
    run_id: str,
    agent_id: str | None = None,
    conversation_id: str | None = None,
    *,
    marker_ttl: int = TASK_MARKER_TTL,
) -> None:
    """Send the task that executes the run (`agents.execute_run`), then set its marker. With agent_id
    (and conversation_id) the worker takes the conversation's lock without reading the run.

    The marker comes second so that its round trip overlaps the worker's pickup instead of delaying it
    (a send is on the path to the run's first token). Nothing reads it that soon: crash recovery checks
    only runs older than RUN_LOST_TASK_GRACE, and a sender that dies in between leaves a run whose task is
    queued but unmarked, which recovery enqueues again (a second delivery of a claimed run is a no-op)."""
    args = [run_id] if agent_id is None else [run_id, agent_id, conversation_id]
    with tracing.quiet():  # when exporting: the publish's span, without one of its own for the LPUSH
        current_app.send_task("agents.execute_run", args=args)
    note_task(run_id, ttl=marker_ttl)


def note_task(run_id: str, *, ttl: int = TASK_MARKER_TTL) -> int:
    """Mark the run as having a task, queued or deferred, for `ttl` seconds more (one round trip).
    Returns the run's count of task messages so far (sends and deferrals), which the marker keeps."""
    key = task_marker_key(run_id)
    pipe = get_redis().pipeline(transaction=False)
    pipe.incr(key)
    pipe.expire(key, ttl)
    return int(pipe.execute()[0])


def requeue_lost_tasks() -> list[str]:
    """Enqueue again the stale CREATED runs whose task marker expired (their task is gone); returns their
    ids. The n-th time a run is enqueued again its marker lives requeue_delay(n), so a run that keeps
    waiting is enqueued again ever more rarely."""
    stale = stale_created_runs()
    if not stale:
        return []
    redis = get_redis()
    pipe = redis.pipeline(transaction=False)
    for run_id in stale:
        pipe.exists(task_marker_key(run_id))
    has_task = pipe.execute()
    requeued = []
    for run_id, pending in zip(stale, has_task, strict=True):
        if pending:
            continue
        pipe = redis.pipeline(transaction=False)
        pipe.incr(requeue_count_key(run_id))
        pipe.expire(requeue_count_key(run_id), REQUEUE_COUNT_TTL)
        count = int(pipe.execute()[0])
        enqueue_run(run_id, marker_ttl=requeue_delay(count))
        logger.warning("agents.run_requeued", extra={"run_id": run_id, "requeues": count})
        requeued.append(run_id)
    return requeued


def requeue_delay(count: int) -> int:
    """Seconds before a run enqueued again for the `count`-th time may be enqueued again: TASK_MARKER_TTL,
    doubling each time, at most REQUEUE_MAX_DELAY."""
    return min(REQUEUE_MAX_DELAY, TASK_MARKER_TTL * 2 ** min(max(count, 1) - 1, 16))
