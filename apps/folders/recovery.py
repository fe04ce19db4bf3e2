"""Crash recovery for ingestion: a file whose worker died ends as `error` with the reason, nothing of it
indexed, instead of showing `parsing` or `embedding` for ever.

A worker that takes a file (ingest_file, index_file) first sets the file's lease in Redis, then claims it;
it renews the lease at every status move and embedding batch and drops it when the file is final. The
lease outlives the longest step between two renewals (a parse, at most FOLDER_PARSE_TIMEOUT; one
embedding call, at most LLM_CALL_DEADLINE). A file being parsed or embedded without a lease has no live
worker: `fail_interrupted_files` (the periodic `folders.recover_files`) fails it and deletes its chunks,
as apps.agents.recovery fails a run whose worker died. A worker that comes back after that (a stall
longer than its lease) finds the file failed and stops without writing.

An imported file waiting for its index task (`parsing`, no upload stored) is not taken yet and is left
alone by that. A file whose task never arrives (a broker that lost the message: Redis restarted without
its data) would wait for ever: `requeue_waiting_files` sends the task again for an upload still
`pending`, or an import still waiting, FOLDER_REQUEUE_AFTER seconds after it was queued, with no worker
holding it; both tasks are idempotent, so a late original is a no-op.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.folders.models import FileChunk, FileContent, FileMetadata, FileStatus
from apps.streams.redis_client import get_redis

logger = logging.getLogger(__name__)

LEASE_MARGIN_SECONDS = 60
WORKER_LOST = (
    "Ingestion stopped: the worker processing this file stopped (crashed or was killed). Upload it again."
)


def lease_seconds() -> int:
    longest_step = max(float(settings.FOLDER_PARSE_TIMEOUT), float(settings.LLM_CALL_DEADLINE))
    return int(longest_step) + LEASE_MARGIN_SECONDS


def lease_key(file_id: str) -> str:
    return f"folders:ingesting:{file_id}"


def take_lease(file_id: str) -> bool:
    """Set the file's lease unless someone holds it (then False: another worker has the file)."""
    return bool(get_redis().set(lease_key(file_id), "1", nx=True, ex=lease_seconds()))


def renew_lease(file_id: str) -> None:
    get_redis().set(lease_key(file_id), "1", ex=lease_seconds())


def drop_lease(file_id: str) -> None:
    get_redis().delete(lease_key(file_id))


def fail_interrupted_files() -> list[str]:
    """Fail the files a worker had taken and no live worker holds. Returns their ids."""
    taken = (
        FileMetadata.objects.unscoped()
        .filter(processing_status__in=(FileStatus.PARSING, FileStatus.EMBEDDING))
        .exclude(processing_status=FileStatus.PARSING, content__raw__isnull=True)  # imported, not taken yet
        .values_list("id", flat=True)
    )
    ids = list(taken)
    if not ids:
        return []
    held = get_redis().mget([lease_key(file_id) for file_id in ids])
    failed = []
    for file_id, lease in zip(ids, held, strict=True):
        if lease is not None:
            continue
        with transaction.atomic():
            updated = (
                FileMetadata.objects.unscoped()
                .filter(id=file_id, processing_status__in=(FileStatus.PARSING, FileStatus.EMBEDDING))
                .update(processing_status=FileStatus.ERROR, error_message=WORKER_LOST)
            )
            if updated:
                FileChunk.objects.unscoped().filter(file_id=file_id).delete()
                FileContent.objects.unscoped().filter(file_id=file_id).update(raw=None)
        if updated:
            logger.warning("folders.ingest_orphaned", extra={"file_id": file_id})
            failed.append(file_id)
    return failed


def requeue_waiting_files() -> list[str]:
    """Send again the task of each file that has waited for it longer than FOLDER_REQUEUE_AFTER with no
    worker on it: `folders.ingest_file` for a pending upload, `folders.index_file` for an imported file.
    Each is sent at most once per FOLDER_REQUEUE_AFTER (its `updated_at` is moved). Returns their ids."""
    from apps.folders.services import enqueue_indexing, enqueue_ingestion  # above recovery

    cutoff = timezone.now() - timedelta(seconds=float(settings.FOLDER_REQUEUE_AFTER))
    waiting = (
        FileMetadata.objects.unscoped()
        .filter(updated_at__lt=cutoff)
        .filter(
            Q(processing_status=FileStatus.PENDING)
            | Q(processing_status=FileStatus.PARSING, content__raw__isnull=True)
        )
        .values_list("id", "processing_status")
    )
    rows = list(waiting)
    if not rows:
        return []
    held = get_redis().mget([lease_key(file_id) for file_id, _ in rows])
    requeued = []
    for (file_id, status), lease in zip(rows, held, strict=True):
        if lease is not None:
            continue
        moved = (
            FileMetadata.objects.unscoped()
            .filter(id=file_id, processing_status=status, updated_at__lt=cutoff)
            .update(updated_at=timezone.now())
        )
        if not moved:  # taken or changed meanwhile
            continue
        (enqueue_ingestion if status == FileStatus.PENDING else enqueue_indexing)(file_id)
        logger.warning("folders.ingest_requeued", extra={"file_id": file_id, "status": status})
        requeued.append(file_id)
    return requeued
