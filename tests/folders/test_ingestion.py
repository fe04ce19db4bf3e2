"""Ingestion of uploads: every format parsed, chunked by tokens and embedded; failures reported with nothing
left indexed; duplicate handling, the size limit and the quota; the real worker runs the task."""

from __future__ import annotations

import pytest

from apps.folders import ingest, services
from apps.folders.errors import DuplicateFile, FileTooLarge, UnsupportedFileType
from apps.folders.models import FileChunk, FileContent, FileMetadata
from apps.llm.errors import LLMApiError
from tests.folders import documents
from tests.folders.conftest import DOCX_TYPE, wait_for_status

FORMATS = {
    "notes.txt": (documents.TEXT, None, "pears"),
    "readme.md": (documents.MARKDOWN, "text/markdown", "codename"),
    "data.json": (documents.JSON, "application/json", "aurora"),
    "cities.csv": (documents.CSV, "text/csv", "Lisbon"),
    "page.html": (documents.HTML, "text/html", "fewer crashes"),
    "report.pdf": (
        documents.pdf([["Quarterly report", "Revenue grew in Lisbon"], ["Page two: risks"]]),
        None,
        "Lisbon",
    ),
    "memo.docx": (
        documents.docx("Memo", ["The aurora launch is on Friday."], [["owner", "Sam"]]),
        DOCX_TYPE,
        "owner | Sam",
    ),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_is_parsed_chunked_and_embedded(name, folder, upload):
    data, content_type, expected = FORMATS[name]

    file = upload(folder, name, data, content_type=content_type)

    chunks = list(FileChunk.objects.unscoped().filter(file_id=file.id).order_by("chunk_index"))
    content = FileContent.objects.unscoped().get(file_id=file.id)
    assert (file.processing_status, file.error_message) == ("completed", "")
    assert file.total_chunks == file.chunks_embedded == len(chunks) >= 1
    assert all(chunk.embedding_dim == 384 and len(chunk.embedding) == 384 for chunk in chunks)
    assert expected in content.text
    assert content.raw is None
    assert "<script>" not in content.text
    assert "alert" not in content.text


def test_html_keeps_text_not_markup(folder, upload):
    file = upload(folder, "page.html", documents.HTML)

    text = FileContent.objects.unscoped().get(file_id=file.id).text
    assert text == "# Release notes\nThe aurora build ships on Friday.\n- faster search\n- fewer crashes"


def test_a_long_text_is_chunked_by_tokens_with_overlap(actor, llm, upload):
    small = services.folder_create(
        actor=actor, name="small", embedding_handle="openai/text-embedding-small-384", embedding_chunk_size=60
    )
    lines = "\n".join(f"Fact {i}: the value of item {i} is {i * 7}." for i in range(100)).encode()

    file = upload(small, "facts.txt", lines)

    chunks = [c.text for c in FileChunk.objects.unscoped().filter(file_id=file.id).order_by("chunk_index")]
    assert len(chunks) == file.total_chunks > 5
    assert chunks[0].startswith("Fact 0:")
    assert chunks[1].split("\n")[0] in chunks[0]  # the next chunk starts inside the previous one
    assert "Fact 99:" in chunks[-1]


def test_a_broken_pdf_reports_why_and_leaves_nothing(folder, upload):
    file = upload(folder, "broken.pdf", b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 9 0 R\ngarbage")

    assert file.processing_status == "error"
    assert file.error_message.startswith("The PDF could not be read")
    assert not FileChunk.objects.unscoped().filter(file_id=file.id).exists()
    assert FileContent.objects.unscoped().get(file_id=file.id).raw is None


def test_a_file_that_is_not_a_pdf_says_so(folder, upload):
    file = upload(folder, "fake.pdf", b"hello, I am text")

    assert (file.processing_status, file.error_message) == (
        "error",
        "The file is not a PDF (it does not start with %PDF)",
    )


def test_a_zip_bomb_docx_is_refused_before_it_inflates(folder, upload):
    file = upload(folder, "bomb.docx", documents.zip_bomb_docx())

    assert file.processing_status == "error"
    assert "would inflate to" in file.error_message


def test_a_pdf_without_text_is_an_error_not_an_empty_file(folder, upload):
    file = upload(folder, "scan.pdf", documents.pdf([[]]))

    assert file.processing_status == "error"
    assert file.error_message.startswith("No text could be extracted")


def test_parsing_past_its_deadline_is_stopped(folder, upload, settings):
    settings.FOLDER_PARSE_TIMEOUT = 0.001

    file = upload(folder, "report.pdf", documents.pdf([["Quarterly report"]]))

    assert (file.processing_status, file.error_message) == (
        "error",
        "Parsing took longer than 0.001 seconds (FOLDER_PARSE_TIMEOUT)",
    )


def test_an_embedding_failure_midway_deletes_the_chunks_already_stored(
    actor, folder, upload, settings, monkeypatch
):
    settings.LLM_EMBEDDING_BATCH_SIZE = 2
    real_embed = ingest.embed
    calls = []

    def flaky(target, texts, **kwargs):
        calls.append(len(texts))
        if len(calls) == 2:
            raise LLMApiError(
                "the provider answered HTTP 502", status=502, provider_message="bad gateway", attempts=1
            )
        return real_embed(target, texts, **kwargs)

    monkeypatch.setattr(ingest, "embed", flaky)
    small = services.folder_create(
        actor=actor, name="tiny", embedding_handle=folder.embedding, embedding_chunk_size=8
    )

    file = upload(small, "notes.txt", documents.TEXT * 3)

    assert calls[:2] == [2, 2]
    assert (file.processing_status, file.error_message) == ("error", "the provider answered HTTP 502")
    assert not FileChunk.objects.unscoped().filter(file_id=file.id).exists()


def test_an_unsupported_type_is_refused(actor, folder):
    with pytest.raises(UnsupportedFileType) as refused:
        services.file_upload(
            actor=actor,
            folder_id=folder.id,
            filename="tool.exe",
            content_type="application/x-msdownload",
            data=b"MZ",
        )

    assert "Unsupported file type: application/x-msdownload (filename: tool.exe)" in refused.value.message
    assert not FileMetadata.objects.for_actor(actor).exists()


def test_duplicates_are_suffixed_skipped_or_refused(folder, upload):
    first = upload(folder, "notes.txt", documents.TEXT)
    second = upload(folder, "notes.txt", documents.TEXT)
    third = upload(folder, "notes.txt", documents.TEXT, duplicate_handling="suffix")
    skipped = upload(folder, "notes.txt", b"other", duplicate_handling="skip")

    with pytest.raises(DuplicateFile):
        upload(folder, "notes.txt", documents.TEXT, duplicate_handling="error")
    assert [first.file_name, second.file_name, third.file_name] == [
        "notes.txt",
        "notes_(1).txt",
        "notes_(2).txt",
    ]
    assert skipped.id == first.id
    assert FileMetadata.objects.unscoped().filter(folder_id=folder.id).count() == 3


def test_a_custom_name_replaces_the_uploaded_one(folder, upload):
    file = upload(folder, "../../etc/passwd.txt", documents.TEXT, name="Guide.md")

    assert (file.file_name, file.original_file_name, file.file_type) == ("Guide.md", "Guide.md", "text/plain")


def test_the_uploaded_name_loses_its_directories(folder, upload):
    file = upload(folder, "../../etc/notes.txt", documents.TEXT)

    assert file.file_name == "notes.txt"


def test_a_file_past_the_size_limit_is_refused(actor, folder, settings):
    settings.FOLDER_FILE_MAX_BYTES = 10

    with pytest.raises(FileTooLarge) as refused:
        services.file_upload(
            actor=actor, folder_id=folder.id, filename="a.txt", content_type=None, data=b"x" * 11
        )

    assert refused.value.message.startswith("The file is 11 bytes; files may be at most 10 bytes")
    assert "FOLDER_FILE_MAX_BYTES" in refused.value.message


def test_the_organisation_quota_counts_every_file(actor, folder, upload, settings):
    settings.FOLDER_STORAGE_QUOTA_BYTES = len(documents.TEXT) * 2
    upload(folder, "a.txt", documents.TEXT, ingest=False)
    upload(folder, "b.txt", documents.TEXT, ingest=False)

    with pytest.raises(FileTooLarge) as refused:
        upload(folder, "c.txt", b"x", ingest=False)

    assert "storage quota" in refused.value.message
    assert "FOLDER_STORAGE_QUOTA_BYTES" in refused.value.message
    assert FileMetadata.objects.for_actor(actor).count() == 2


def test_a_replacement_takes_the_place_of_the_old_file_only_once_ingested(actor, folder, upload):
    old = upload(folder, "notes.txt", b"Old line about apples.\n")
    old_chunks = set(FileChunk.objects.unscoped().filter(file_id=old.id).values_list("id", flat=True))

    new = upload(
        folder, "notes.txt", b"New line about bananas.\n", duplicate_handling="replace", ingest=False
    )

    assert FileMetadata.objects.unscoped().get(id=old.id).processing_status == "completed"
    assert set(FileChunk.objects.unscoped().filter(file_id=old.id).values_list("id", flat=True)) == old_chunks
    assert (new.file_name, new.replaces_id, new.processing_status) == ("notes.txt", old.id, "pending")

    ingest.ingest_file(new.id)

    live = FileMetadata.objects.unscoped().get(folder_id=folder.id)
    assert (live.id, live.file_name, live.replaces_id, live.processing_status) == (
        new.id,
        "notes.txt",
        None,
        "completed",
    )
    assert not FileChunk.objects.unscoped().filter(id__in=old_chunks).exists()
    assert FileContent.objects.unscoped().get(file_id=new.id).text == "New line about bananas.\n"


def test_a_failed_replacement_leaves_the_old_file_in_service(folder, upload):
    old = upload(folder, "report.pdf", documents.pdf([["Good report"]]))

    failed = upload(folder, "report.pdf", b"%PDF-1.4 broken", duplicate_handling="replace")

    assert FileMetadata.objects.unscoped().get(id=old.id).processing_status == "completed"
    assert (failed.processing_status, failed.replaces_id) == ("error", old.id)


def test_ingesting_twice_does_nothing_the_second_time(folder, upload):
    file = upload(folder, "notes.txt", documents.TEXT)
    count = FileChunk.objects.unscoped().filter(file_id=file.id).count()

    ingest.ingest_file(file.id)

    assert FileChunk.objects.unscoped().filter(file_id=file.id).count() == count


@pytest.mark.django_db(transaction=True)
def test_the_worker_ingests_an_upload_and_the_status_is_visible_meanwhile(actor, llm, celery_worker):
    folder = services.folder_create(
        actor=actor, name="docs", embedding_handle="openai/text-embedding-small-384"
    )
    pdf = documents.pdf([[f"Line {i} of the worker test." for i in range(40)]])

    result = services.file_upload(
        actor=actor, folder_id=folder.id, filename="worker.pdf", content_type="application/pdf", data=pdf
    )

    assert result.file.processing_status == "pending"
    done = wait_for_status(result.file.id)
    assert (done.processing_status, done.error_message) == ("completed", "")
    assert (
        done.total_chunks
        == done.chunks_embedded
        == FileChunk.objects.unscoped().filter(file_id=done.id).count()
    )
