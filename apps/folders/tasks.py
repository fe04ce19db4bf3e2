"""Celery entry points: ids in, one call, nothing else. Behaviour lives in apps.folders.ingest."""

from __future__ import annotations

from celery import shared_task

from apps.folders.ingest import index_file, ingest_file
from apps.folders.recovery import fail_interrupted_files, requeue_waiting_files


@shared_task(name="folders.ingest_file", acks_late=True, reject_on_worker_lost=True, time_limit=3600)
def ingest_file_task(file_id: str) -> None:
    """Parse, chunk and embed an uploaded file. Idempotent: a file that is not pending is left alone."""
    ingest_file(file_id)


@shared_task(name="folders.index_file", acks_late=True, reject_on_worker_lost=True, time_limit=3600)
def index_file_task(file_id: str) -> None:
    """Chunk and embed a file that came with its text (agent-file import). Idempotent, as ingest_file_task."""
    index_file(file_id)


@shared_task(name="folders.recover_files", acks_late=True, time_limit=120)
def recover_files_task() -> None:
    """Periodic (beat): fail the files whose ingesting worker died, and queue again the files whose task
    never arrived (apps.folders.recovery)."""
    fail_interrupted_files()
    requeue_waiting_files()
