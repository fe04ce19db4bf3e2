"""Celery entry points: ids in, one call, nothing else. Behaviour lives in apps.agents.loop.runner."""

from __future__ import annotations

from celery import shared_task

from apps.agents.loop.runner import execute_run_streamed


@shared_task(
    name="agents.execute_run",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=1800,
    time_limit=1900,
)
def execute_run_task(run_id: str) -> None:
    """Run an agent turn, streaming its events to Redis. Idempotent: a claimed run is left alone."""
    execute_run_streamed(run_id)
