"""The ADE's folder pages (list, create, a folder's files, uploads and their refusals, deleting) and the
workspace's Folders panel (attach, detach, open and close files), through Django's test client. Uploads
go through the view folders.js posts to; ingestion runs in this process (the worker's task is queued on
commit, which a test transaction never reaches)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from apps.accounts.models import Organization, User
from apps.agents.models import Agent, AgentTool
from apps.agents.selectors import embedding_model_list
from apps.agents.services import agent_create
from apps.core.actor import Actor, Role
from apps.folders import services
from apps.folders.ingest import ingest_file
from apps.folders.models import AgentFile, FileMetadata, Folder
from tests.folders import documents

EMBEDDING = "openai/text-embedding-small-384"  # the scripted LLM's 384-dimension model
HTMX = {"HTTP_HX_REQUEST": "true"}
XHR = {"HTTP_X_REQUESTED_WITH": "XMLHttpRequest"}  # what folders.js sends


@pytest.fixture
def folder(actor: Actor, llm: Any) -> Folder:
    return services.folder_create(
        actor=actor, name="handbook", description="Team docs", embedding_handle=EMBEDDING
    )


@pytest.fixture
def stored(django_capture_on_commit_callbacks: Any) -> Callable[..., FileMetadata]:
    """A file uploaded through the service, ingested here unless `ingest=False`; as stored afterwards."""

    def store(
        actor: Actor, folder: Folder, name: str, data: bytes, *, ingest: bool = True, **kwargs: Any
    ) -> FileMetadata:
        with django_capture_on_commit_callbacks(execute=False):
            result = services.file_upload(
                actor=actor, folder_id=folder.id, filename=name, content_type=None, data=data, **kwargs
            )
        if ingest:
            ingest_file(result.file.id)
        return FileMetadata.objects.unscoped().get(id=result.file.id)

    return store


@pytest.fixture
def member(org: Organization, make_user: Callable[..., User]) -> tuple[User, Actor]:
    user = make_user(org, role=Role.MEMBER, username="mallory")
    return user, Actor(organization_id=org.id, user_id=user.id, role=Role.MEMBER)


def _upload(client: Client, folder: Folder, *files: SimpleUploadedFile, **headers: Any) -> Any:
    return client.post(reverse("ade:folder-upload", args=[folder.id]), {"file": list(files)}, **headers)


def _txt(name: str = "notes.txt", text: str = "Tea is served at four.\n") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, text.encode(), content_type="text/plain")


def _files(folder: Folder) -> list[tuple[str, str]]:
    rows = FileMetadata.objects.unscoped().filter(folder_id=folder.id).order_by("created_at")
    return list(rows.values_list("file_name", "processing_status"))


# --- the list ----------------------------------------------------------------------------------------------


def test_the_list_shows_each_folder_with_its_description_file_count_and_size(
    owner_client, actor, other_org_actor, folder, stored
):
    stored(actor, folder, "a.txt", b"x" * 1500, ingest=False)
    stored(actor, folder, "b.md", b"y" * 548, ingest=False)
    services.folder_create(actor=actor, name="empty", embedding_handle=EMBEDDING)
    services.folder_create(actor=other_org_actor, name="theirs", embedding_handle=EMBEDDING)

    body = owner_client.get("/folders/").content.decode()

    assert '<a href="/folders/" class="active">Folders</a>' in body  # the nav link
    assert body.count('data-testid="folder-row"') == 2
    assert body.index('data-folder-name="empty"') < body.index('data-folder-name="handbook"')
    handbook = body[body.index('data-folder-name="handbook"') :]
    assert "Team docs" in handbook
    assert '<td class="right nowrap" data-testid="folder-file-count">2</td>' in handbook
    assert '<td class="right nowrap" data-testid="folder-size">2.0\xa0KB</td>' in handbook
    assert "theirs" not in body


def test_the_list_takes_the_same_queries_for_one_folder_or_many(owner_client, actor, folder, stored):
    stored(actor, folder, "a.txt", b"a", ingest=False)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert owner_client.get("/folders/").status_code == 200
        return len(captured.captured_queries)

    one = queries()
    for name in ("second", "third"):
        other = services.folder_create(actor=actor, name=name, embedding_handle=EMBEDDING)
        stored(actor, other, "b.txt", b"b", ingest=False)

    assert queries() == one


def test_an_empty_list_says_how_to_start(owner_client, llm):
    body = owner_client.get("/folders/").content.decode()

    assert 'data-testid="no-folders"' in body
    assert 'href="/folders/new/"' in body


# --- create ------------------------------------------------------------------------------------------------


def test_the_new_folder_form_picks_the_first_embedding_model_the_providers_list(owner_client, actor, llm):
    first = embedding_model_list(actor=actor)[0].handle

    body = owner_client.get("/folders/new/").content.decode()

    assert first == "openai/text-embedding-3-small"
    assert f'<option value="{first}" selected>{first}</option>' in body


def test_creating_a_folder_opens_its_page(owner_client, actor, user, llm):
    response = owner_client.post(
        "/folders/new/",
        {"name": "handbook", "description": "Team docs", "embedding": EMBEDDING, "embedding_other": ""},
        follow=True,
    )

    folder = Folder.objects.for_actor(actor).get()
    assert response.redirect_chain == [(f"/folders/{folder.id}/", 302)]
    assert (folder.name, folder.description, folder.embedding) == ("handbook", "Team docs", EMBEDDING)
    assert folder.created_by_id == user.id
    body = response.content.decode()
    assert "Folder “handbook” created." in body
    assert 'data-testid="no-files"' in body
    assert 'data-testid="drop-zone"' in body


def test_a_typed_embedding_handle_wins_over_the_picked_one(owner_client, actor, llm):
    owner_client.post(
        "/folders/new/",
        {"name": "typed", "embedding": "openai/text-embedding-3-small", "embedding_other": EMBEDDING},
    )

    assert Folder.objects.for_actor(actor).get().embedding == EMBEDDING


def test_a_taken_name_is_refused_next_to_the_field_and_the_form_kept(owner_client, actor, folder):
    response = owner_client.post(
        "/folders/new/", {"name": "handbook", "description": "again", "embedding": EMBEDDING}
    )

    body = response.content.decode()
    assert response.status_code == 422
    assert "A folder named &#x27;handbook&#x27; already exists in this organization" in body
    assert 'data-testid="folder-name-error"' in body
    assert ">again</textarea>" in body
    assert Folder.objects.for_actor(actor).count() == 1


def test_a_folder_needs_an_embedding_model(owner_client, actor, llm):
    response = owner_client.post("/folders/new/", {"name": "docs", "embedding": "", "embedding_other": ""})

    body = response.content.decode()
    assert response.status_code == 422
    assert "Must specify either embedding or embedding_config in request" in body
    assert '<div class="handle-picker invalid"' in body
    assert not Folder.objects.for_actor(actor).exists()


# --- a folder's page ---------------------------------------------------------------------------------------


def test_the_folder_page_lists_files_with_status_chunks_size_and_the_error_reason(
    owner_client, actor, folder, stored
):
    done = stored(actor, folder, "notes.txt", documents.TEXT)
    broken = stored(actor, folder, "broken.pdf", b"%PDF-1.4 not really")
    waiting = stored(actor, folder, "later.md", b"# Later\n", ingest=False)

    body = owner_client.get(f"/folders/{folder.id}/").content.decode()

    assert (done.processing_status, broken.processing_status, waiting.processing_status) == (
        "completed",
        "error",
        "pending",
    )
    assert (done.total_chunks or 0) > 0
    assert broken.error_message
    row = _row(body, "notes.txt")
    assert '<span class="badge status-completed ok" data-testid="file-status">completed</span>' in row
    assert f'<td class="right" data-testid="file-chunks">{done.total_chunks}</td>' in row
    assert f'data-testid="file-size">{len(documents.TEXT)}\xa0bytes</td>' in row
    assert f'<div class="field-error" data-testid="file-error">{broken.error_message}</div>' in _row(
        body, "broken.pdf"
    )
    assert 'data-testid="file-status">pending</span>' in _row(body, "later.md")
    assert body.count('data-testid="delete-file"') == 3
    assert "every 1s" in body  # one file is still pending: the table polls


def _row(body: str, file_name: str) -> str:
    start = body.index(f'data-file-name="{file_name}"')
    return body[start : body.index("</tr>", start)]


def test_the_files_table_stops_polling_once_every_file_is_final(owner_client, actor, folder, stored):
    pending = stored(actor, folder, "notes.txt", documents.TEXT, ingest=False)
    url = reverse("ade:folder-files", args=[folder.id])

    while_pending = owner_client.get(url, **HTMX).content.decode()
    ingest_file(pending.id)
    after = owner_client.get(url, **HTMX).content.decode()

    assert "every 1s" in while_pending
    assert "<html" not in while_pending  # the partial alone
    assert "every 1s" not in after
    assert 'data-testid="file-status">completed</span>' in after


# --- uploads -----------------------------------------------------------------------------------------------


def test_an_upload_is_stored_pending_and_its_ingestion_queued(
    owner_client, actor, folder, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as queued:
        response = _upload(owner_client, folder, _txt(), **XHR)

    body = response.content.decode()
    file = FileMetadata.objects.for_actor(actor).get(folder=folder)
    assert response.status_code == 200, body
    assert f'data-outcome="uploaded" data-file-id="{file.id}" data-file-name="notes.txt"' in body
    assert "Uploaded: ingesting." in body
    assert (file.file_name, file.file_type, file.file_size, file.processing_status) == (
        "notes.txt",
        "text/plain",
        23,
        "pending",
    )
    assert len(queued) == 1


def test_a_second_file_of_the_same_name_gets_a_suffix(owner_client, actor, folder, stored):
    stored(actor, folder, "notes.txt", b"first", ingest=False)

    body = _upload(owner_client, folder, _txt(), **XHR).content.decode()

    assert "Uploaded as “notes_(1).txt”: ingesting." in body
    assert [name for name, _ in _files(folder)] == ["notes.txt", "notes_(1).txt"]


def test_a_file_over_the_size_limit_is_refused_with_the_services_message(owner_client, folder, settings):
    settings.FOLDER_FILE_MAX_BYTES = 10

    response = _upload(owner_client, folder, _txt(), **XHR)

    assert response.status_code == 413
    assert (
        "The file is 23 bytes; files may be at most 10 bytes (0.0 MiB, the limit FOLDER_FILE_MAX_BYTES)"
        in response.content.decode()
    )
    assert _files(folder) == []


def test_the_size_check_answers_the_refusal_without_the_file(owner_client, folder, settings):
    settings.FOLDER_FILE_MAX_BYTES = 1024 * 1024
    url = reverse("ade:folder-upload", args=[folder.id])

    too_large = owner_client.post(f"{url}?size={30 * 1024 * 1024}&name=big.txt", **XHR)
    fits = owner_client.post(f"{url}?size=1000&name=small.txt", **XHR)

    assert too_large.status_code == 413
    assert (
        '<div class="msg msg-error" role="alert" data-outcome="refused" data-testid="upload-refused">'
        "The file is 31,457,280 bytes; files may be at most 1,048,576 bytes (1.0 MiB, the limit "
        "FOLDER_FILE_MAX_BYTES)</div>"
    ) in too_large.content.decode()
    assert fits.status_code == 204
    assert _files(folder) == []


def test_a_body_declared_past_the_limit_is_refused_before_it_is_read(owner_client, folder, settings):
    settings.FOLDER_FILE_MAX_BYTES = 1024
    declared = 1024 + 1024 * 1024 + 1  # one byte past the limit and the form's allowance

    response = _upload(owner_client, folder, _txt(), CONTENT_LENGTH=str(declared), **XHR)

    assert response.status_code == 413
    assert "The file is 1,025 bytes; files may be at most 1,024 bytes" in response.content.decode()
    assert _files(folder) == []


def test_a_file_past_the_storage_quota_is_refused_with_the_services_message(
    owner_client, actor, folder, stored, settings
):
    stored(actor, folder, "old.txt", b"z" * 20, ingest=False)
    settings.FOLDER_STORAGE_QUOTA_BYTES = 30

    response = _upload(owner_client, folder, _txt(), **XHR)

    assert response.status_code == 413
    assert (
        "Storing this file (23 bytes) would take the organization past its storage quota of 30 bytes "
        "(0.0 MiB, FOLDER_STORAGE_QUOTA_BYTES); 20 bytes are used. Delete files or folders to make room."
    ) in response.content.decode()
    assert _files(folder) == [("old.txt", "pending")]


def test_an_unsupported_file_type_is_refused_with_the_services_message(owner_client, folder):
    upload = SimpleUploadedFile("tool.bin", b"\x00\x01", content_type="application/octet-stream")

    response = _upload(owner_client, folder, upload, **XHR)

    assert response.status_code == 415
    assert (
        "Unsupported file type: application/octet-stream (filename: tool.bin). Supported types: PDF, DOCX, "
        "text (.txt, .md), JSON, CSV, HTML, XML, YAML and source code files."
    ) in response.content.decode()
    assert _files(folder) == []


def test_the_plain_form_uploads_every_picked_file_and_says_what_became_of_each(owner_client, folder):
    bad = SimpleUploadedFile("tool.bin", b"\x00", content_type="application/octet-stream")

    response = _upload(owner_client, folder, _txt("a.txt"), _txt("b.md", "# B\n"), bad, follow=True)

    body = response.content.decode()
    assert response.redirect_chain == [(f"/folders/{folder.id}/", 302)]
    assert "Uploaded “a.txt”: ingesting it now." in body
    assert "Uploaded “b.md”: ingesting it now." in body
    assert "tool.bin: Unsupported file type: application/octet-stream" in body
    assert _files(folder) == [("a.txt", "pending"), ("b.md", "pending")]


def test_an_upload_without_a_file_says_so(owner_client, folder):
    response = owner_client.post(reverse("ade:folder-upload", args=[folder.id]), {}, **XHR)

    assert response.status_code == 400
    assert "Choose one or more files to upload." in response.content.decode()


# --- deleting ----------------------------------------------------------------------------------------------


def test_deleting_a_file_answers_the_table_without_it(owner_client, actor, folder, stored):
    keep = stored(actor, folder, "keep.txt", b"keep", ingest=False)
    gone = stored(actor, folder, "gone.txt", b"gone", ingest=False)

    response = owner_client.post(reverse("ade:folder-file-delete", args=[folder.id, gone.id]), **HTMX)

    body = response.content.decode()
    assert response.status_code == 200
    assert "Deleted “gone.txt”." in body
    assert f'data-file-id="{keep.id}"' in body
    assert f'data-file-id="{gone.id}"' not in body
    assert _files(folder) == [("keep.txt", "pending")]


def test_deleting_a_folder_from_the_list_asks_first_then_removes_its_row(owner_client, actor, folder):
    confirm = owner_client.get(reverse("ade:folder-delete", args=[folder.id]), **HTMX).content.decode()
    response = owner_client.post(reverse("ade:folder-delete", args=[folder.id]), **HTMX)

    assert 'data-testid="confirm-delete-folder"' in confirm
    assert "Delete <strong>handbook</strong>?" in confirm
    assert response.status_code == 200
    assert "Deleted folder “handbook”." in response.content.decode()
    assert not Folder.objects.for_actor(actor).exists()


def test_deleting_a_folder_from_its_page_goes_back_to_the_list(owner_client, actor, folder):
    response = owner_client.post(reverse("ade:folder-delete", args=[folder.id]), follow=True)

    assert response.redirect_chain == [("/folders/", 302)]
    assert "Deleted folder “handbook”." in response.content.decode()
    assert not Folder.objects.for_actor(actor).exists()


# --- who may ---------------------------------------------------------------------------------------------


def test_a_member_sees_someone_elses_folder_read_only(client, member, actor, folder, stored):
    stored(actor, folder, "notes.txt", b"notes", ingest=False)
    client.force_login(member[0])

    folder_page = client.get(f"/folders/{folder.id}/").content.decode()
    folder_list = client.get("/folders/").content.decode()

    assert 'data-testid="folder-read-only"' in folder_page
    assert 'data-testid="drop-zone"' not in folder_page
    assert 'data-testid="delete-file"' not in folder_page
    assert 'data-testid="folder-danger-zone"' not in folder_page
    assert "ade/folders.js" not in folder_page
    assert 'data-testid="file-row"' in folder_page  # reading is for everyone
    assert 'data-testid="delete-folder"' not in folder_list


def test_a_member_may_not_upload_to_or_delete_from_someone_elses_folder(
    client, member, actor, folder, stored
):
    file = stored(actor, folder, "notes.txt", b"notes", ingest=False)
    client.force_login(member[0])
    refusal = (
        "Not allowed (folder &#x27;handbook&#x27;): only its creator, an owner or an admin may modify or delete "
        "an archive or a folder, attach or detach it, add or delete its passages or files."
    )

    upload = _upload(client, folder, _txt("mine.txt"), **XHR)
    file_delete = client.post(reverse("ade:folder-file-delete", args=[folder.id, file.id]), **HTMX)
    folder_delete = client.post(reverse("ade:folder-delete", args=[folder.id]), **HTMX)

    for response in (upload, file_delete, folder_delete):
        assert response.status_code == 403
        assert refusal in response.content.decode()
    assert folder_delete["HX-Retarget"] == "#flash"
    assert _files(folder) == [("notes.txt", "pending")]
    assert Folder.objects.for_actor(actor).filter(id=folder.id).exists()


def test_a_member_asking_to_upload_a_large_file_hears_the_refusal_first(client, member, folder, settings):
    settings.FOLDER_FILE_MAX_BYTES = 10
    client.force_login(member[0])

    response = client.post(f"{reverse('ade:folder-upload', args=[folder.id])}?size=1000&name=big.txt", **XHR)

    assert response.status_code == 403
    assert "Not allowed (folder &#x27;handbook&#x27;)" in response.content.decode()


def test_a_member_creates_uploads_to_and_deletes_their_own_folder(client, member, llm):
    user, actor = member
    client.force_login(user)

    client.post("/folders/new/", {"name": "mine", "embedding": EMBEDDING})
    folder = Folder.objects.for_actor(actor).get(name="mine")
    upload = _upload(client, folder, _txt(), **XHR)
    file = FileMetadata.objects.for_actor(actor).get(folder=folder)
    file_delete = client.post(reverse("ade:folder-file-delete", args=[folder.id, file.id]), **HTMX)
    folder_delete = client.post(reverse("ade:folder-delete", args=[folder.id]), **HTMX)

    assert folder.created_by_id == user.id
    assert (upload.status_code, file_delete.status_code, folder_delete.status_code) == (200, 200, 200)
    assert not Folder.objects.for_actor(actor).exists()


def test_another_organisations_folder_is_not_found(owner_client, actor, other_org_actor, llm, stored):
    theirs = services.folder_create(actor=other_org_actor, name="theirs", embedding_handle=EMBEDDING)
    file = stored(other_org_actor, theirs, "secret.txt", b"secret", ingest=False)
    agent = agent_create(actor=actor, name="Mine", model="openai/gpt-4o-mini")

    responses = [
        owner_client.get(f"/folders/{theirs.id}/"),
        owner_client.get(reverse("ade:folder-files", args=[theirs.id]), **HTMX),
        owner_client.get(reverse("ade:folder-row", args=[theirs.id]), **HTMX),
        _upload(owner_client, theirs, _txt(), **XHR),
        owner_client.post(reverse("ade:folder-file-delete", args=[theirs.id, file.id]), **HTMX),
        owner_client.post(reverse("ade:folder-delete", args=[theirs.id]), **HTMX),
        owner_client.post(
            reverse("ade:workspace-folder-attach", args=[agent.id]), {"folder": theirs.id}, **HTMX
        ),
    ]

    assert [r.status_code for r in responses] == [404] * len(responses)
    assert _files(theirs) == [("secret.txt", "pending")]
    assert not Folder.agents.through.objects.filter(agent_id=agent.id).exists()


def test_signed_out_visitors_are_sent_to_sign_in(client, folder):
    for url in ("/folders/", f"/folders/{folder.id}/"):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/?next=")


# --- the workspace's Folders panel -------------------------------------------------------------------------


@pytest.fixture
def agent(actor: Actor, llm: Any) -> Agent:
    return agent_create(actor=actor, name="Reader", model="openai/gpt-4o-mini")


def _state(agent: Agent, file: FileMetadata) -> bool:
    return AgentFile.objects.unscoped().get(agent=agent, file=file).is_open


def test_attach_a_folder_open_and_close_its_files_then_detach_it(owner_client, actor, agent, folder, stored):
    notes = stored(actor, folder, "notes.txt", documents.TEXT)
    guide = stored(actor, folder, "guide.md", b"# Guide\n\nRead me.\n")
    waiting = stored(actor, folder, "later.txt", b"later", ingest=False)
    page = owner_client.get(f"/agents/{agent.id}/").content.decode()
    base = f"/agents/{agent.id}/"
    workspace = owner_client.get(f"{base}folders/", **HTMX).content.decode()  # loaded when opened

    attach = owner_client.post(f"{base}folders/attach/", {"folder": folder.id}, **HTMX)
    attached = attach.content.decode()
    close = owner_client.post(f"{base}files/{notes.id}/close/", **HTMX).content.decode()
    notes_after_close = _state(agent, notes)
    owner_client.post(f"{base}files/{notes.id}/open/", **HTMX)
    notes_after_open = _state(agent, notes)
    close_all = owner_client.post(f"{base}files/close-all/", **HTMX)
    states_after_close_all = (_state(agent, notes), _state(agent, guide))
    detach = owner_client.post(f"{base}folders/{folder.id}/detach/", **HTMX)

    assert 'data-testid="folders-section"' in page
    assert 'data-testid="no-attached-folders"' not in page  # no folders yet: the section loads when opened
    assert 'data-testid="no-attached-folders"' in workspace
    assert '<option value="' + folder.id + '">handbook</option>' in workspace
    assert attach.status_code == 200
    assert json.loads(attach["HX-Trigger"]) == {"ade:agent-changed": {}}
    assert "Attached “handbook”: the agent has its files and the file tools." in attached
    assert 'data-folder-name="handbook"' in attached
    assert 'data-file-name="notes.txt" data-open="true"' in attached
    assert 'data-file-name="guide.md" data-open="true"' in attached
    assert 'data-file-name="later.txt" data-open="false"' in attached
    assert 'data-testid="file-state">pending</span>' in _item(attached, "later.txt")
    assert 'data-testid="open-file"' not in _item(attached, "later.txt")  # not ingested yet
    assert "every 2s" in attached  # it polls while later.txt is ingested
    assert f'hx-get="/agents/{agent.id}/config/tools/" hx-trigger="load"' in attached  # the tool list reloads
    assert 'data-testid="open-count">2</span>' in attached
    assert 'data-file-name="notes.txt" data-open="false"' in close
    assert 'data-testid="open-count">1</span>' in close
    assert (notes_after_close, notes_after_open) == (False, True)
    assert close_all.status_code == 200
    assert "Closed 2 files." in close_all.content.decode()
    assert states_after_close_all == (False, False)
    assert detach.status_code == 200
    assert "Detached “handbook”." in detach.content.decode()
    assert not AgentFile.objects.unscoped().filter(agent=agent).exists()
    assert not AgentTool.objects.filter(agent=agent, tool__name="open_files").exists()
    assert waiting.processing_status == "pending"


def _item(body: str, file_name: str) -> str:
    start = body.index(f'data-file-name="{file_name}"')
    return body[start : body.index("</li>", start)]


def test_the_workspace_shows_the_attached_folders_and_which_files_are_open(
    owner_client, actor, agent, folder, stored
):
    notes = stored(actor, folder, "notes.txt", documents.TEXT)
    services.agent_attach_folder(actor=actor, agent_id=agent.id, folder_id=folder.id)
    services.agent_file_close(actor=actor, agent_id=agent.id, file_id=notes.id)
    stored(actor, folder, "guide.md", b"# Guide\n")  # completed after the attach: open

    body = owner_client.get(f"/agents/{agent.id}/").content.decode()

    assert (
        '<details class="section mem-section" id="folders-section" data-testid="folders-section" open>'
        in body
    )
    assert 'data-file-name="notes.txt" data-open="false"' in body
    assert 'data-file-name="guide.md" data-open="true"' in body
    assert 'data-testid="attach-folder-form"' not in body  # no other folder to attach
    assert "every 2s" not in body


def test_attaching_without_choosing_a_folder_says_so(owner_client, agent, folder):
    response = owner_client.post(f"/agents/{agent.id}/folders/attach/", {"folder": ""}, **HTMX)

    assert response.status_code == 422
    assert "Choose a folder to attach." in response.content.decode()


def test_a_member_sees_someone_elses_agent_files_without_controls_and_is_refused(
    client, member, actor, agent, folder, stored
):
    notes = stored(actor, folder, "notes.txt", documents.TEXT)
    services.agent_attach_folder(actor=actor, agent_id=agent.id, folder_id=folder.id)
    client.force_login(member[0])

    panel = client.get(reverse("ade:workspace-folders", args=[agent.id]), **HTMX).content.decode()
    close = client.post(f"/agents/{agent.id}/files/{notes.id}/close/", **HTMX)
    detach = client.post(f"/agents/{agent.id}/folders/{folder.id}/detach/", **HTMX)

    assert 'data-file-name="notes.txt" data-open="true"' in panel
    for control in ("close-file", "open-file", "detach-folder", "attach-folder-form", "close-all-files"):
        assert f'data-testid="{control}"' not in panel
    for response in (close, detach):
        assert response.status_code == 403
        assert "Not allowed" in response.content.decode()
    assert _state(agent, notes) is True
    assert Folder.agents.through.objects.filter(agent_id=agent.id, folder_id=folder.id).exists()


def test_the_attach_list_offers_only_folders_the_viewer_may_attach(client, member, actor, llm):
    user, member_actor = member
    agent = agent_create(actor=member_actor, name="Members", model="openai/gpt-4o-mini")
    services.folder_create(actor=actor, name="owners", embedding_handle=EMBEDDING)
    mine = services.folder_create(actor=member_actor, name="mine", embedding_handle=EMBEDDING)
    client.force_login(user)

    panel = client.get(reverse("ade:workspace-folders", args=[agent.id]), **HTMX).content.decode()

    assert f'<option value="{mine.id}">mine</option>' in panel
    assert ">owners</option>" not in panel
