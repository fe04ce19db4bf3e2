"""Folders in a real browser: two files picked at once go up with a progress bar each, are listed and
ingested by the real Celery worker until `completed`, while the table polls itself; dropped files the
server refuses say why, each with the service's message; and in an agent's workspace a folder is attached
and its file closed and opened again by hand."""

from __future__ import annotations

import pytest
from django.conf import settings
from playwright.sync_api import FilePayload, expect

from apps.agents.services import BlockSpec, agent_create
from apps.core.errors import DomainError
from apps.folders import services
from apps.folders.models import AgentFile, FileMetadata
from tests.ade.browser.conftest import Ade, htmx_settled
from tests.folders.conftest import wait_for_status

EMBEDDING = "openai/text-embedding-small-384"  # the scripted LLM's 384-dimension model
NOTES = b"Tea is served at four in the library.\nBring your own cup.\n"
GUIDE = b"# Guide\n\nThe handbook explains where the tea is kept.\n\n## Rules\n\nWash your cup.\n"

DROP = """([huge, size]) => {
    const zone = document.querySelector("[data-testid=drop-zone]");
    const data = new DataTransfer();
    data.items.add(new File([new Uint8Array(size)], huge, {type: "text/plain"}));
    data.items.add(new File([new Uint8Array([0, 1, 2])], "tool.bin", {type: "application/octet-stream"}));
    zone.dispatchEvent(new DragEvent("drop", {dataTransfer: data, bubbles: true, cancelable: true}));
}"""


def _refusal(size: int) -> str:
    """What the service says of a file of this size."""
    with pytest.raises(DomainError) as refused:
        services.check_file_size(size)
    return refused.value.message


def test_pick_two_files_watch_them_upload_and_ingest_and_see_dropped_files_refused(
    ade: Ade, screenshot
) -> None:
    folder = services.folder_create(
        actor=ade.actor, name="handbook", description="Team docs", embedding_handle=EMBEDDING
    )
    page = ade.page
    page.goto(ade.url("/folders/"))
    expect(page.locator("nav.mainnav a.active")).to_have_text("Folders")
    page.get_by_role("link", name="handbook", exact=True).click()
    expect(page.get_by_test_id("folder-title")).to_have_text("handbook")
    expect(page.get_by_test_id("no-files")).to_be_visible()

    page.get_by_test_id("upload-input").set_input_files(
        [
            FilePayload(name="notes.txt", mimeType="text/plain", buffer=NOTES),
            FilePayload(name="guide.md", mimeType="text/markdown", buffer=GUIDE),
        ]
    )

    expect(page.get_by_test_id("upload-item")).to_have_count(2)
    for name in ("notes.txt", "guide.md"):
        item = page.locator(f'[data-testid=upload-item][data-file-name="{name}"]')
        expect(item).to_have_attribute("data-state", "done")
        expect(item.get_by_test_id("upload-progress")).to_have_js_property("value", 100)
        expect(item.get_by_test_id("upload-status")).to_have_text("done")
        expect(item.get_by_test_id("upload-message")).to_have_text("Uploaded: ingesting.")
    expect(page.get_by_test_id("file-row")).to_have_count(2)
    screenshot(page, "folder-uploaded")
    for name in ("notes.txt", "guide.md"):
        status = page.locator(f'[data-testid=file-row][data-file-name="{name}"] [data-testid=file-status]')
        expect(status).to_have_text("completed", timeout=60_000)  # the worker ingested it; the table polled
    expect(page.get_by_test_id("folder-files")).not_to_have_attribute("data-polling", "")  # polling stopped
    files = FileMetadata.objects.for_actor(ade.actor).filter(folder=folder).order_by("file_name")
    assert [(f.file_name, f.processing_status) for f in files] == [
        ("guide.md", "completed"),
        ("notes.txt", "completed"),
    ]
    for file in files:
        chunks = page.locator(
            f'[data-testid=file-row][data-file-name="{file.file_name}"] [data-testid=file-chunks]'
        )
        expect(chunks).to_have_text(str(file.total_chunks))
    screenshot(page, "folder-ingested")

    size = settings.FOLDER_FILE_MAX_BYTES + 1
    page.evaluate(DROP, ["huge.txt", size])

    huge = page.locator('[data-testid=upload-item][data-file-name="huge.txt"]')
    expect(huge).to_have_attribute("data-state", "error")
    expect(huge.get_by_test_id("upload-message")).to_have_text(_refusal(size))
    expect(huge.get_by_test_id("upload-progress")).to_have_js_property("value", 0)  # never sent
    binary = page.locator('[data-testid=upload-item][data-file-name="tool.bin"]')
    expect(binary).to_have_attribute("data-state", "error")
    expect(binary.get_by_test_id("upload-message")).to_have_text(
        "Unsupported file type: application/octet-stream (filename: tool.bin). Supported types: PDF, DOCX, "
        "text (.txt, .md), JSON, CSV, HTML, XML, YAML and source code files."
    )
    expect(binary.get_by_test_id("upload-message")).to_have_attribute("role", "alert")
    expect(page.get_by_test_id("file-row")).to_have_count(2)
    assert FileMetadata.objects.for_actor(ade.actor).filter(folder=folder).count() == 2
    screenshot(page, "folder-refusals")

    page.goto(ade.url("/folders/"))
    row = page.locator('[data-testid=folder-row][data-folder-name="handbook"]')
    expect(row.get_by_test_id("folder-file-count")).to_have_text("2")
    expect(row.get_by_test_id("folder-size")).to_have_text(f"{len(NOTES) + len(GUIDE)}\xa0bytes")


def test_attach_a_folder_in_the_workspace_and_close_and_open_its_file(ade: Ade, screenshot) -> None:
    agent = agent_create(
        actor=ade.actor,
        name="Reader",
        model="openai/gpt-4o-mini",
        memory_blocks=[BlockSpec(label="human", value="Name: Ada", limit=2000)],
    )
    folder = services.folder_create(actor=ade.actor, name="handbook", embedding_handle=EMBEDDING)
    upload = services.file_upload(
        actor=ade.actor, folder_id=folder.id, filename="notes.txt", content_type="text/plain", data=NOTES
    )
    assert wait_for_status(upload.file.id).processing_status == "completed"
    page = ade.page
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(ade.url(f"/agents/{agent.id}/"))
    section = page.get_by_test_id("folders-section")
    section.locator("summary").click()
    expect(page.get_by_test_id("no-attached-folders")).to_be_visible()

    page.get_by_test_id("attach-folder").select_option(label="handbook")
    page.get_by_test_id("attach-folder-form").get_by_role("button", name="Attach").click()

    file = page.locator('[data-testid=agent-file][data-file-name="notes.txt"]')
    expect(file).to_have_attribute("data-open", "true")
    expect(page.get_by_test_id("folders-notice")).to_contain_text("Attached “handbook”")
    expect(page.get_by_test_id("open-count")).to_have_text("1")
    # The file tools came with the folder: the configuration column's tool list reloaded.
    expect(page.locator('[data-testid=attached-tool][data-tool-name="open_files"]')).to_be_visible()
    htmx_settled(page)
    screenshot(page, "workspace-folders")

    file.get_by_test_id("close-file").click()
    expect(file).to_have_attribute("data-open", "false")
    assert AgentFile.objects.for_actor(ade.actor).get(agent=agent).is_open is False
    htmx_settled(page)
    file.get_by_test_id("open-file").click()
    expect(file).to_have_attribute("data-open", "true")
    assert AgentFile.objects.for_actor(ade.actor).get(agent=agent).is_open is True

    assert (
        page.evaluate("document.documentElement.scrollHeight") <= 800
    )  # the page itself still never scrolls
