from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from apps.core.actor import Actor
from apps.folders import services
from apps.folders.ingest import ingest_file
from apps.folders.models import FileMetadata, Folder

EMBEDDING = "openai/text-embedding-small-384"  # the scripted LLM's 384-dimension embedding model
DOCX_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


@pytest.fixture
def folder(actor: Actor, llm: Any) -> Folder:
    return services.folder_create(actor=actor, name="handbook", embedding_handle=EMBEDDING)


@pytest.fixture
def upload(actor: Actor, django_capture_on_commit_callbacks: Any) -> Callable[..., FileMetadata]:
    """Upload through the service and ingest in this process (the on-commit enqueue is held back), so a
    test in one transaction sees every step. Returns the file as stored after ingestion."""

    def do(
        folder: Folder,
        filename: str,
        data: bytes,
        *,
        content_type: str | None = None,
        ingest: bool = True,
        as_actor: Actor | None = None,
        **kwargs: Any,
    ) -> FileMetadata:
        with django_capture_on_commit_callbacks(execute=False):
            result = services.file_upload(
                actor=as_actor or actor,
                folder_id=folder.id,
                filename=filename,
                content_type=content_type,
                data=data,
                **kwargs,
            )
        if ingest and not result.skipped:
            ingest_file(result.file.id)
        return FileMetadata.objects.unscoped().get(id=result.file.id)

    return do


def wait_for_status(file_id: str, *, timeout: float = 60.0) -> FileMetadata:
    """Poll until the worker has finished with the file (completed or error)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        file = FileMetadata.objects.unscoped().get(id=file_id)
        if file.processing_status in ("completed", "error"):
            return file
        time.sleep(0.1)
    raise AssertionError(f"file {file_id} still {file.processing_status} after {timeout} s")
