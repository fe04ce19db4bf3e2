"""Crash recovery: runs whose executor died end as failed, runs whose task was lost are enqueued again.

A RUNNING run whose conversation lock is free has no live executor (apps.agents.locks): it is marked
failed with its stream closed, within one recovery period of the crash, and the agent accepts the next
message. Its input messages stay (they were committed before it started); what its finished steps
produced stays too. A CREATED run older than a grace period is enqueued again (execution is idempotent).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.utils import timezone

from apps.agents.locks import conversation_is_locked
from apps.agents.models import Run, StopReason
from apps.streams.events import end_stream

logger = logging.getLogger(__name__)

LOST_TASK_GRACE = timedelta(seconds=60)
WORKER_LOST = "The worker executing this run stopped (crashed or was killed); the run did not finish."


def fail_orphaned_runs(*, agent_id: str | None = None, exclude_run_id: str | None = None) -> list[str]:
    """Mark RUNNING runs without a live executor as failed (but `exclude_run_id`). Returns their ids."""
    running = Run.objects.unscoped().filter(status=Run.Status.RUNNING)
    if agent_id is not None:
        running = running.filter(agent_id=agent_id)
    if exclude_run_id is not None:
        running = running.exclude(id=exclude_run_id)
    failed = []
    for run in running.only("id", "agent_id", "conversation_id"):
        if conversation_is_locked(run.agent_id, run.conversation_id):
            continue
        updated = (
            Run.objects.unscoped()
            .filter(id=run.id, status=Run.Status.RUNNING)
            .update(
                status=Run.Status.FAILED,
                stop_reason=StopReason.ERROR,
                completed_at=timezone.now(),
                error={"message": WORKER_LOST},
            )
        )
        if updated:
            end_stream(run.id, status=Run.Status.FAILED, stop_reason=StopReason.ERROR)
            logger.warning("agents.run_orphaned", extra={"run_id": run.id})
            failed.append(run.id)
    return failed


def stale_created_runs() -> list[str]:
    cutoff = timezone.now() - LOST_TASK_GRACE
    return list(
        Run.objects.unscoped()
        .filter(status=Run.Status.CREATED, created_at__lt=cutoff)
        .values_list("id", flat=True)
    )
