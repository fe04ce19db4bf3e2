"""A worker that dies while it ingests a file: the file ends as `error` saying so, with nothing of it
indexed, instead of showing `parsing` or `embedding` for ever; a live worker is left alone, and a
worker that comes back after its file was failed writes nothing. A file whose task was lost is queued
again."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from apps.folders import ingest, recovery, services
from apps.folders.models import FileChunk, FileContent, FileMetadata, FileStatus
from apps.folders.tasks import recover_files_task
from apps.streams.redis_client import get_redis
from tests.folders import documents
from tests.folders.conftest import EMBEDDING

worker_threads = pytest.mark.django_db(transaction=True)


def stored_file(actor, folder, text: bytes = documents.TEXT, name: str = "notes.txt") -> FileMetadata:
    """A pending upload, stored as file_upload stores one, with no task sent for it."""
    file = FileMetadata.objects.for_actor(actor).create(
        folder=folder,
        file_name=name,
        original_file_name=name,
        file_type="text/plain",
        file_size=len(text),
        processing_status=FileStatus.PENDING,
    )
    FileContent.objects.for_actor(actor).create(file=file, raw=text)
    return file


def imported_file(actor, folder, text: str) -> FileMetadata:
    """A file of an imported agent file: its text stored, waiting for its index task."""
    file = FileMetadata.objects.for_actor(actor).create(
        folder=folder,
        file_name="imported.txt",
        original_file_name="imported.txt",
        file_type="text/plain",
        file_size=len(text),
        processing_status=FileStatus.PARSING,
    )
    FileContent.objects.for_actor(actor).create(file=file, text=text)
    return file


def status_of(file: FileMetadata) -> tuple[str, str]:
    file.refresh_from_db()
    return file.processing_status, file.error_message


@pytest.fixture
def folder(actor, llm):
    return services.folder_create(actor=actor, name="handbook", embedding_handle=EMBEDDING)


@pytest.fixture
def held_embedding(monkeypatch):
    """Ingestion's embedding call waits until the test lets it go: a worker in the middle of a file."""
    reached, release = threading.Event(), threading.Event()
    real = ingest.embed

    def held(target, texts, **kwargs):
        reached.set()
        assert release.wait(30)
        return real(target, texts, **kwargs)

    monkeypatch.setattr(ingest, "embed", held)
    return reached, release


def in_a_worker(file_id: str) -> threading.Thread:
    def work() -> None:
        try:
            ingest.ingest_file(file_id)
        finally:
            connection.close()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def test_a_file_whose_worker_died_is_failed_with_nothing_indexed(actor, folder):
    file = stored_file(actor, folder)
    assert recovery.take_lease(file.id)  # a worker took it...
    FileMetadata.objects.unscoped().filter(id=file.id).update(processing_status=FileStatus.EMBEDDING)
    FileChunk.objects.for_actor(actor).create(
        file=file, folder=folder, chunk_index=0, text="half", embedding=[0.0] * 384, embedding_dim=384
    )
    get_redis().delete(recovery.lease_key(file.id))  # ...and died: its lease lapsed

    recover_files_task()
    ingest.ingest_file(file.id)  # the task, delivered again, does not bring it back

    assert status_of(file) == ("error", recovery.WORKER_LOST)
    assert not FileChunk.objects.unscoped().filter(file_id=file.id).exists()
    assert FileContent.objects.unscoped().get(file_id=file.id).raw is None


@worker_threads
def test_a_file_a_live_worker_holds_is_left_alone_and_completes(actor, folder, held_embedding):
    reached, release = held_embedding
    file = stored_file(actor, folder)

    thread = in_a_worker(file.id)
    assert reached.wait(30)
    failed = recovery.fail_interrupted_files()
    during = status_of(file)
    release.set()
    thread.join(30)

    assert failed == []
    assert during == ("embedding", "")
    assert status_of(file) == ("completed", "")
    assert not get_redis().exists(recovery.lease_key(file.id))  # dropped once final


@worker_threads
def test_a_worker_that_comes_back_after_its_file_was_failed_writes_nothing(actor, folder, held_embedding):
    reached, release = held_embedding
    file = stored_file(actor, folder)

    thread = in_a_worker(file.id)
    assert reached.wait(30)
    get_redis().delete(recovery.lease_key(file.id))  # stalled longer than its lease
    failed = recovery.fail_interrupted_files()
    release.set()
    thread.join(30)

    assert failed == [file.id]
    assert status_of(file) == ("error", recovery.WORKER_LOST)
    assert not FileChunk.objects.unscoped().filter(file_id=file.id).exists()


def test_an_imported_file_waiting_for_its_index_task_is_not_taken_for_lost(actor, folder):
    file = imported_file(actor, folder, "hello")

    assert recovery.fail_interrupted_files() == []
    assert status_of(file) == ("parsing", "")


def test_a_second_worker_given_the_same_file_leaves_it_to_the_first(actor, folder):
    file = stored_file(actor, folder)
    assert recovery.take_lease(file.id)  # the first worker, between its lease and its claim

    ingest.ingest_file(file.id)

    assert status_of(file) == ("pending", "")
    assert get_redis().exists(recovery.lease_key(file.id))  # the first one's lease is untouched


def waited(file: FileMetadata, seconds: float) -> None:
    """As if the file had been waiting for its task for `seconds`."""
    FileMetadata.objects.unscoped().filter(id=file.id).update(
        updated_at=timezone.now() - timedelta(seconds=seconds)
    )


def wait_for_status(file: FileMetadata, wanted: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while (status := status_of(file)[0]) != wanted and time.monotonic() < deadline:
        time.sleep(0.2)
    return status


@worker_threads
def test_a_file_whose_task_was_lost_is_queued_again_and_ingested(actor, folder, celery_worker, settings):
    settings.FOLDER_REQUEUE_AFTER = 300
    lost = stored_file(actor, folder)  # stored, and its task never reached a worker
    waited(lost, 301)
    fresh = stored_file(actor, folder, name="fresh.txt")  # its task may still be on its way
    waited(fresh, 30)

    requeued = recovery.requeue_waiting_files()

    assert requeued == [lost.id]
    assert wait_for_status(lost, "completed") == "completed"
    assert FileChunk.objects.unscoped().filter(file_id=lost.id).exists()
    assert status_of(fresh) == ("pending", "")
    assert recovery.requeue_waiting_files() == []  # sent once per FOLDER_REQUEUE_AFTER, not every tick


@worker_threads
def test_an_imported_file_whose_index_task_was_lost_is_indexed_and_a_held_one_is_left_alone(
    actor, folder, celery_worker, settings
):
    settings.FOLDER_REQUEUE_AFTER = 300
    imported = imported_file(actor, folder, "hello from an agent file")
    waited(imported, 400)
    held = stored_file(actor, folder, name="held.txt")
    waited(held, 400)
    assert recovery.take_lease(held.id)  # a worker has it, between its lease and its claim

    recover_files_task()

    assert wait_for_status(imported, "completed") == "completed"
    assert status_of(held) == ("pending", "")
