"""Ingestion of one uploaded file: parse (bounded, in the parser jail), chunk by tokens, embed in batches with
the folder's model, then make the file live; the Celery task `folders.ingest_file` calls `ingest_file`.
A file that arrives with its text (an imported agent file's) skips the parse: `folders.index_file` calls
`index_file`.

Status moves pending -> parsing -> embedding -> completed, or -> error with the reason, and each move is
committed as it happens, so a client polling the file sees it. The claim (pending -> parsing) is a
conditional update: a redelivered task finds the file claimed and leaves it. Chunks are written batch by
batch as they are embedded (a large file's vectors never sit in memory together), but searches read only
completed files, and a failure deletes the file's chunks, so a file is never half indexed. A replacement
(duplicate_handling=replace) takes the place of the file it replaces in one transaction at the end: its
agents' windows move to the new text, the old file and its chunks go. The provider is never called inside
a transaction.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import transaction

from apps.agents.models import Agent
from apps.core.actor import Actor
from apps.core.errors import DomainError
from apps.folders import recovery, rendering, selectors
from apps.folders.isolation import parse_bounded
from apps.folders.models import AgentFile, FileChunk, FileContent, FileMetadata, FileStatus, Folder
from apps.folders.parsing import ParseFailed
from apps.folders.services import attach_files
from apps.llm.chunking import split_by_tokens
from apps.llm.embeddings import embed
from apps.memory.archival import embedding_target

logger = logging.getLogger(__name__)


class FileGone(Exception):
    """The file was deleted while it was being ingested."""


def ingest_file(file_id: str) -> None:
    """Take a pending file to completed (or error). Idempotent: a file that is not pending is left alone.
    The file's lease (apps.folders.recovery) is held from before the claim until the file is final."""
    if not recovery.take_lease(file_id):
        return
    try:
        claimed = (
            FileMetadata.objects.unscoped()
            .filter(id=file_id, processing_status=FileStatus.PENDING)
            .update(processing_status=FileStatus.PARSING)
        )
        if claimed:
            _ingest_claimed(file_id)
    finally:
        recovery.drop_lease(file_id)


def _ingest_claimed(file_id: str) -> None:
    file = FileMetadata.objects.unscoped().select_related("folder").get(id=file_id)
    actor = Actor.system(file.organization_id)
    started = time.monotonic()
    try:
        _ingest(actor, file)
    except FileGone:
        return
    except (ParseFailed, DomainError) as exc:
        _fail(file, exc.reason if isinstance(exc, ParseFailed) else exc.message)
    except Exception as exc:
        logger.exception("folders.ingest_failed", extra={"file_id": file_id})
        _fail(file, f"Ingestion failed unexpectedly ({type(exc).__name__}); the server log has the details")
        return
    logger.info(
        "folders.ingested",
        extra={"file_id": file_id, "seconds": round(time.monotonic() - started, 3), "bytes": file.file_size},
    )


def _ingest(actor: Actor, file: FileMetadata) -> None:
    raw = FileContent.objects.unscoped().filter(file_id=file.id).values_list("raw", flat=True).first()
    if raw is None:
        raise ParseFailed("The upload is no longer stored; upload the file again")
    text = parse_bounded(bytes(raw), file.file_type, timeout=settings.FOLDER_PARSE_TIMEOUT)
    if not text.strip():
        raise ParseFailed(
            "No text could be extracted from the file (a scanned PDF needs OCR, which is not done)"
        )
    chunks = split_by_tokens(text, chunk_tokens=file.folder.embedding_chunk_size)
    FileContent.objects.unscoped().filter(file_id=file.id).update(text=text)
    _embed(actor, file, text, chunks)


def _embed(actor: Actor, file: FileMetadata, text: str, chunks: list[str]) -> None:
    """Embed the file's chunks batch by batch, then make it live (the step after parsing)."""
    folder = file.folder
    _set(file, processing_status=FileStatus.EMBEDDING, total_chunks=len(chunks), chunks_embedded=0)
    target = embedding_target(actor=actor, embedding_handle=folder.embedding)
    size = max(1, int(getattr(settings, "LLM_EMBEDDING_BATCH_SIZE", 100)))
    for start in range(0, len(chunks), size):
        batch = chunks[start : start + size]
        vectors = embed(target, batch, batch_size=size)
        dimension = len(vectors[0])
        _check_dimension(folder, dimension)
        with transaction.atomic():
            if not FileMetadata.objects.unscoped().select_for_update().filter(id=file.id).exists():
                raise FileGone
            FileChunk.objects.for_actor(actor).bulk_create(
                [
                    FileChunk(
                        organization_id=actor.organization_id,
                        file_id=file.id,
                        folder_id=folder.id,
                        chunk_index=start + offset,
                        text=chunk,
                        embedding=vector,
                        embedding_dim=dimension,
                    )
                    for offset, (chunk, vector) in enumerate(zip(batch, vectors, strict=True))
                ]
            )
            _set(file, chunks_embedded=start + len(batch))
    _complete(actor, file, text)


def _check_dimension(folder: Folder, dimension: int) -> None:
    """Record the folder's dimension on its first vectors; refuse vectors of another size later."""
    if folder.embedding_dim is None:
        Folder.objects.unscoped().filter(id=folder.id, embedding_dim__isnull=True).update(
            embedding_dim=dimension
        )
        folder.refresh_from_db(fields=["embedding_dim"])
    if folder.embedding_dim != dimension:
        raise ParseFailed(
            f"'{folder.embedding}' produced {dimension}-dimensional embeddings; the folder holds "
            f"{folder.embedding_dim}-dimensional ones"
        )


def _set(file: FileMetadata, **fields: Any) -> None:
    """Move the file's status (committed at once, so it is visible) and renew its lease; raises FileGone
    if it was deleted, or failed meanwhile (recovery took it for lost: nothing more may be written)."""
    taken = FileMetadata.objects.unscoped().filter(id=file.id).exclude(processing_status=FileStatus.ERROR)
    if not taken.update(**fields):
        raise FileGone
    recovery.renew_lease(file.id)
    for name, value in fields.items():
        setattr(file, name, value)


@transaction.atomic
def _complete(actor: Actor, file: FileMetadata, text: str) -> None:
    locked = (
        FileMetadata.objects.unscoped()
        .select_for_update()
        .select_related("folder")
        .filter(id=file.id)
        .first()
    )
    if locked is None or locked.processing_status == FileStatus.ERROR:  # deleted, or failed as lost
        raise FileGone
    if locked.replaces_id is not None:
        _take_the_place_of(actor, locked, text)
    FileMetadata.objects.unscoped().filter(id=file.id).update(processing_status=FileStatus.COMPLETED)
    FileContent.objects.unscoped().filter(file_id=file.id).update(raw=None)
    locked.processing_status = FileStatus.COMPLETED
    for agent in Agent.objects.for_actor(actor).filter(folders__id=locked.folder_id).order_by("id"):
        if not AgentFile.objects.for_actor(actor).filter(agent_id=agent.id, file_id=locked.id).exists():
            attach_files(actor=actor, agent=agent, files=[locked])


def _take_the_place_of(actor: Actor, new: FileMetadata, text: str) -> None:
    """The replacement becomes the file: agents' states move to it (open windows re-read from its text at
    the same lines), the old file (and its chunks) is deleted. In the caller's transaction."""
    old_id = new.replaces_id
    old = FileMetadata.objects.unscoped().select_for_update().filter(id=old_id).first()
    if old is not None:
        strategy = selectors.line_strategy(new)
        states = AgentFile.objects.for_actor(actor).select_for_update(of=("self",)).select_related("agent")
        for state in states.filter(file_id=old.id):
            limits = selectors.agent_file_limits(state.agent)
            state.file_id = new.id
            if state.is_open:
                start = state.start_line - 1 if state.start_line else None
                try:
                    window = rendering.view(
                        text, strategy, file_name=state.file_name, start=start, end=state.end_line
                    )
                except rendering.RangeError:
                    window = rendering.view(text, strategy, file_name=state.file_name)
                    state.start_line = state.end_line = None
                state.visible_content = rendering.within_limit(window, limits.per_file_char_limit)
            state.save()
        FileMetadata.objects.unscoped().filter(id=old.id).update(file_name=old.id)
    FileMetadata.objects.unscoped().filter(id=new.id).update(replaces=None)
    FileMetadata.objects.unscoped().filter(replaces_id=old_id).exclude(id=new.id).delete()
    if old is not None:
        FileMetadata.objects.unscoped().filter(id=old.id).delete()
    new.replaces_id = None


def _fail(file: FileMetadata, reason: str) -> None:
    """Status error with the reason; the file's chunks are deleted, its upload let go."""
    with transaction.atomic():
        FileChunk.objects.unscoped().filter(file_id=file.id).delete()
        FileMetadata.objects.unscoped().filter(id=file.id).update(
            processing_status=FileStatus.ERROR, error_message=reason[:4000]
        )
        FileContent.objects.unscoped().filter(file_id=file.id).update(raw=None)
    logger.info("folders.ingest_error", extra={"file_id": file.id, "reason": reason[:200]})


# --- files that come with their text (agent files) ---------------------------------------------------------


def index_file(file_id: str) -> None:
    """Chunk and embed a file whose text is already stored (an imported agent file's), then make it live:
    ingest_file without the parse step, with its statuses, failures and lease. Idempotent: only a file
    still `parsing` with no upload waiting is claimed (an upload being parsed has one)."""
    if not recovery.take_lease(file_id):
        return
    try:
        claimed = (
            FileMetadata.objects.unscoped()
            .filter(id=file_id, processing_status=FileStatus.PARSING, content__raw__isnull=True)
            .update(processing_status=FileStatus.EMBEDDING)
        )
        if claimed:
            _index_claimed(file_id)
    finally:
        recovery.drop_lease(file_id)


def _index_claimed(file_id: str) -> None:
    file = FileMetadata.objects.unscoped().select_related("folder").get(id=file_id)
    actor = Actor.system(file.organization_id)
    text = FileContent.objects.unscoped().filter(file_id=file.id).values_list("text", flat=True).first() or ""
    try:
        if not text.strip():
            raise ParseFailed("The file has no text; upload it again")
        _embed(actor, file, text, split_by_tokens(text, chunk_tokens=file.folder.embedding_chunk_size))
    except FileGone:
        return
    except (ParseFailed, DomainError) as exc:
        _fail(file, exc.reason if isinstance(exc, ParseFailed) else exc.message)
    except Exception as exc:
        logger.exception("folders.index_failed", extra={"file_id": file_id})
        _fail(file, f"Indexing failed unexpectedly ({type(exc).__name__}); the server log has the details")
        return
    logger.info("folders.indexed", extra={"file_id": file_id, "chars": len(text)})
