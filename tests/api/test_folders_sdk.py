"""The official Letta SDK (letta-client 1.12.1, unpatched) against a live server and a real worker: every
folders method it has (folders CRUD; folders.files upload/list/retrieve/delete; folders.agents.list;
agents.folders attach/detach/list; agents.files list/open/close/close_all)."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from django.db import connections
from letta_client import BadRequestError, Letta, NotFoundError

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.services import agent_create
from apps.core.actor import Actor
from tests.folders import documents
from tests.folders.conftest import wait_for_status

pytestmark = pytest.mark.django_db(transaction=True)

EMBEDDING = "openai/text-embedding-small-384"


@pytest.fixture(autouse=True)
def _no_persistent_connections_in_server_threads() -> Iterator[None]:
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


@pytest.fixture
def client(live_server, actor: Actor, llm, celery_worker) -> Letta:
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk").raw_key
    return Letta(base_url=live_server.url, api_key=key, max_retries=0, timeout=30)


def upload(client: Letta, folder_id: str, filename: str, data: bytes, **kwargs: object):
    file = client.folders.files.upload(folder_id, file=(filename, io.BytesIO(data)), **kwargs)
    wait_for_status(file.id)
    return file


def test_folder_methods_through_the_sdk(client):
    created = client.folders.create(
        name="handbook", description="Docs", instructions="Cite them", embedding=EMBEDDING
    )

    fetched = client.folders.retrieve(created.id)
    updated = client.folders.update(created.id, name="manual")
    listed = list(client.folders.list())
    client.folders.delete(created.id)

    assert created.id.startswith("source-")
    assert (created.name, created.description, created.instructions) == ("handbook", "Docs", "Cite them")
    assert created.embedding_config.handle == EMBEDDING
    assert fetched.id == created.id
    assert updated.name == "manual"
    assert [f.name for f in listed] == ["manual"]
    with pytest.raises(NotFoundError):
        client.folders.retrieve(created.id)


def test_a_folder_without_an_embedding_model_is_a_400(client):
    with pytest.raises(BadRequestError):
        client.folders.create(name="no-model")


def test_file_methods_through_the_sdk(client):
    folder = client.folders.create(name="handbook", embedding=EMBEDDING)

    pdf = upload(client, folder.id, "report.pdf", documents.pdf([["Revenue grew in Lisbon"]]))
    docx = upload(client, folder.id, "memo.docx", documents.docx("Memo", ["Ship on Friday"]))
    again = client.folders.files.upload(
        folder.id, file=("report.pdf", io.BytesIO(b"x")), duplicate_handling="skip"
    )
    renamed = upload(client, folder.id, "notes.txt", documents.TEXT, name="guide.txt")
    files = list(client.folders.files.list(folder.id))
    fetched = client.folders.files.retrieve(pdf.id, folder_id=folder.id, include_content=True)
    client.folders.files.delete(docx.id, folder_id=folder.id)

    assert pdf.processing_status == "pending"
    assert pdf.file_name == "handbook/report.pdf"
    assert again.id == pdf.id
    assert renamed.original_file_name == "guide.txt"
    assert sorted((f.file_name, f.processing_status) for f in files) == [
        ("guide.txt", "completed"),
        ("memo.docx", "completed"),
        ("report.pdf", "completed"),
    ]
    assert fetched.content == "Revenue grew in Lisbon"
    assert fetched.total_chunks == fetched.chunks_embedded == 1
    assert sorted(f.file_name for f in client.folders.files.list(folder.id)) == ["guide.txt", "report.pdf"]


def test_a_broken_pdf_is_reported_through_the_sdk(client):
    folder = client.folders.create(name="handbook", embedding=EMBEDDING)

    broken = upload(client, folder.id, "broken.pdf", b"%PDF-1.4 nothing else")

    fetched = client.folders.files.retrieve(broken.id, folder_id=folder.id)
    assert fetched.processing_status == "error"
    assert fetched.error_message.startswith("The PDF could not be read")


def test_agent_folder_and_file_methods_through_the_sdk(client, actor):
    folder = client.folders.create(name="handbook", embedding=EMBEDDING)
    first = upload(client, folder.id, "a.txt", b"alpha\n")
    second = upload(client, folder.id, "b.txt", b"beta\n")
    agent = agent_create(actor=actor, name="reader", model="openai/gpt-4o-mini", include_base_tools=False)

    attached = client.agents.folders.attach(folder.id, agent_id=agent.id)
    folders = list(client.agents.folders.list(agent.id))
    agent_ids = client.folders.agents.list(folder.id)
    files = list(client.agents.files.list(agent.id))
    client.agents.files.close(first.id, agent_id=agent.id)
    open_now = [f.file_name for f in client.agents.files.list(agent.id, is_open=True)]
    closed_for_room = client.agents.files.open(first.id, agent_id=agent.id)
    closed = client.agents.files.close_all(agent.id)
    client.agents.folders.detach(folder.id, agent_id=agent.id)

    assert attached is None  # Letta answers null to 1.x clients
    assert [f.id for f in folders] == [folder.id]
    assert list(agent_ids) == [agent.id]
    assert sorted((f.file_name, f.is_open, f.folder_name) for f in files) == [
        ("handbook/a.txt", True, "handbook"),
        ("handbook/b.txt", True, "handbook"),
    ]
    assert open_now == ["handbook/b.txt"]
    assert closed_for_room == []
    assert sorted(closed) == ["handbook/a.txt", "handbook/b.txt"]
    assert list(client.agents.files.list(agent.id)) == []
    assert list(client.agents.folders.list(agent.id)) == []
    assert second.id != first.id


def test_an_agent_created_with_folder_ids_through_the_sdk(client):
    folder = client.folders.create(name="handbook", embedding=EMBEDDING)

    agent = client.agents.create(
        name="reader",
        model="openai/gpt-4o-mini",
        folder_ids=[folder.id],
        max_files_open=2,
        include_base_tools=False,
    )

    assert [s.id for s in agent.sources] == [folder.id]
    assert agent.max_files_open == 2
    assert {t.name for t in agent.tools} == {"open_files", "grep_files", "semantic_search_files"}
