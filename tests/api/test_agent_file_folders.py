"""Agent files with folders and files (Letta's `sources`, `files`, `files_agents`) through the API: export
carries the agent's folders, their files' parsed text and its open files; import recreates them as new
folders, indexes the text without parsing it again (the real worker), attaches them and reopens the files
the agent had open; broken references, oversized files and a full quota are refused and leave nothing."""

from __future__ import annotations

import copy
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connections
from letta_client import Letta
from rest_framework.test import APIClient

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.models import Agent
from apps.core.actor import Actor, Role
from apps.folders import ingest
from apps.folders.models import AgentFile, FileChunk, FileContent, FileMetadata, Folder
from tests.folders import documents
from tests.folders.conftest import wait_for_status
from tests.support.scripted_llm import text, tool_call, tool_calls

EMBEDDING = "openai/text-embedding-small-384"
FILE_TOOLS = {"open_files", "grep_files", "semantic_search_files"}
NOTES = documents.TEXT.decode()
GUIDE = "# Guide\n\nThe aurora build ships on Friday. Search got faster.\n"


def create_folder(client: APIClient, name: str = "handbook") -> dict[str, Any]:
    response = client.post(
        "/v1/folders/",
        {"name": name, "embedding": EMBEDDING, "description": "Team docs", "instructions": "Cite them"},
        format="json",
    )
    assert response.status_code == 200, response.content
    return response.json()


def upload(client: APIClient, folder_id: str, name: str, data: bytes) -> dict[str, Any]:
    response = client.post(
        f"/v1/folders/{folder_id}/upload",
        {"file": SimpleUploadedFile(name, data, content_type="text/plain")},
        format="multipart",
    )
    assert response.status_code == 200, response.content
    return response.json()


def create_agent(client: APIClient, name: str = "Reader") -> str:
    response = client.post(
        "/v1/agents/",
        {"name": name, "model": "openai/gpt-4o-mini", "embedding": EMBEDDING, "include_base_tools": False},
        format="json",
    )
    assert response.status_code == 200, response.content
    return response.json()["id"]


def export(client: APIClient, agent_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/agents/{agent_id}/export")
    assert response.status_code == 200, response.content
    return json.loads(response.content)


def import_file(client: APIClient, document: dict[str, Any], **fields: str) -> Any:
    upload = SimpleUploadedFile("agent.af", json.dumps(document).encode(), content_type="application/json")
    return client.post("/v1/agents/import", {"file": upload, **fields}, format="multipart")


def system(request: dict[str, Any]) -> str:
    return request["messages"][0]["content"]


def tool_result(request: dict[str, Any]) -> dict[str, Any]:
    return json.loads([m for m in request["messages"] if m["role"] == "tool"][-1]["content"])


def folder_parts(document: dict[str, Any]) -> dict[str, Any]:
    [agent] = document["agents"]
    keys = ("source_ids", "files_agents", "max_files_open", "per_file_view_window_char_limit")
    return {
        "sources": document["sources"],
        "files": document["files"],
        **{key: agent[key] for key in keys},
    }


def files_of(actor: Actor, folder: Folder) -> list[FileMetadata]:
    return list(FileMetadata.objects.for_actor(actor).filter(folder=folder).order_by("file_name"))


# --- through the worker: export, import, index, use --------------------------------------------------------


@pytest.fixture
def reader(actor, api_client_for, llm, celery_worker, send):
    """An agent with the folder "handbook" (two files, ingested by the worker) attached; notes.txt open at
    its second line (opened by the agent itself), guide.md closed."""
    client = api_client_for(actor)
    folder = create_folder(client)
    for name, data in (("notes.txt", documents.TEXT), ("guide.md", GUIDE.encode())):
        assert (
            wait_for_status(upload(client, folder["id"], name, data)["id"]).processing_status == "completed"
        )
    agent_id = create_agent(client)
    assert client.patch(f"/v1/agents/{agent_id}/folders/attach/{folder['id']}").status_code == 200
    guide = FileMetadata.objects.for_actor(actor).get(file_name="guide.md")
    assert client.patch(f"/v1/agents/{agent_id}/files/{guide.id}/close").status_code == 200
    llm.push(
        tool_calls(
            tool_call(
                "open_files",
                {"file_requests": [{"file_name": "handbook/notes.txt", "offset": 1, "length": 1}]},
            )
        ),
        text("Opened."),
    )
    send(Agent.objects.for_actor(actor).get(id=agent_id), "Open the second line of the notes")
    return agent_id


@pytest.mark.django_db(transaction=True)
def test_export_carries_sources_files_with_their_text_and_the_open_files(actor, api_client_for, reader):
    document = export(api_client_for(actor), reader)

    [agent] = document["agents"]
    [source] = document["sources"]
    assert agent["source_ids"] == ["source-0"]
    assert {t["name"] for t in document["tools"]} >= FILE_TOOLS
    assert {k: source[k] for k in ("id", "name", "description", "instructions", "metadata")} == {
        "id": "source-0",
        "name": "handbook",
        "description": "Team docs",
        "instructions": "Cite them",
        "metadata": None,
    }
    assert (source["embedding_config"]["handle"], source["embedding_config"]["embedding_chunk_size"]) == (
        EMBEDDING,
        300,
    )
    assert source["embedding_config"]["embedding_dim"] == 384
    assert [
        (
            f["id"],
            f["source_id"],
            f["file_name"],
            f["original_file_name"],
            f["processing_status"],
            f["content"],
        )
        for f in document["files"]
    ] == [
        ("file-0", "source-0", "handbook/guide.md", "guide.md", "completed", GUIDE),
        ("file-1", "source-0", "handbook/notes.txt", "notes.txt", "completed", NOTES),
    ]
    assert [f["file_size"] for f in document["files"]] == [len(GUIDE), len(NOTES)]
    assert [
        (
            s["id"],
            s["agent_id"],
            s["file_id"],
            s["source_id"],
            s["file_name"],
            s["is_open"],
            s["visible_content"],
        )
        for s in agent["files_agents"]
    ] == [
        ("file_agent-0", "agent-0", "file-0", "source-0", "handbook/guide.md", False, None),
        (
            "file_agent-1",
            "agent-0",
            "file-1",
            "source-0",
            "handbook/notes.txt",
            True,
            "[Viewing lines 2 to 2 (out of 3 lines)]\n2: Line two about pears.",
        ),
    ]
    assert (agent["files_agents"][1]["start_line"], agent["files_agents"][1]["end_line"]) == (2, 2)
    assert (agent["max_files_open"], agent["per_file_view_window_char_limit"]) == (10, 25_000)


@pytest.mark.django_db(transaction=True)
def test_import_into_the_same_organisation_makes_a_working_copy_of_the_folder(
    actor, api_client_for, reader, llm, send
):
    """Letta's test_export_import_agent_with_files (tests/test_sdk_client.py), and what it leaves unchecked:
    the new folder, its indexed files, the reopened window in the next prompt, grep_files on the copy."""
    client = api_client_for(actor)
    document = export(client, reader)

    response = import_file(client, document, override_embedding_handle=EMBEDDING)

    assert response.status_code == 200, response.content
    assert response.json()["refused"] == []
    [new_id] = response.json()["agent_ids"]
    imported = Agent.objects.for_actor(actor).get(id=new_id)
    original_folder = Folder.objects.for_actor(actor).get(name="handbook")
    [folder] = imported.folders.all()
    assert re.fullmatch(r"handbook_[0-9a-f]{8}", folder.name)  # Letta's suffix for a name that is taken
    assert (folder.description, folder.instructions, folder.embedding) == (
        "Team docs",
        "Cite them",
        EMBEDDING,
    )
    assert folder.id != original_folder.id
    files = [wait_for_status(f.id) for f in files_of(actor, folder)]
    assert [(f.file_name, f.processing_status, f.error_message) for f in files] == [
        ("guide.md", "completed", ""),
        ("notes.txt", "completed", ""),
    ]
    for file in files:
        chunks = FileChunk.objects.for_actor(actor).filter(file=file)
        assert file.total_chunks == file.chunks_embedded == chunks.count() >= 1
        assert set(chunks.values_list("embedding_dim", flat=True)) == {384}
        assert FileContent.objects.for_actor(actor).get(file=file).raw is None  # never an upload to parse
    assert [
        c.text for c in FileChunk.objects.for_actor(actor).filter(file__file_name="notes.txt", folder=folder)
    ] == [NOTES.strip()]
    states = {
        s.file.file_name: s
        for s in AgentFile.objects.for_actor(actor).filter(agent=imported).select_related("file")
    }
    assert {name: (s.is_open, s.start_line, s.end_line) for name, s in states.items()} == {
        "guide.md": (False, None, None),
        "notes.txt": (True, 2, 2),
    }
    assert (
        states["notes.txt"].visible_content
        == "[Viewing lines 2 to 2 (out of 3 lines)]\n2: Line two about pears."
    )
    assert set(imported.tools.values_list("name", flat=True)) >= FILE_TOOLS
    assert imported.name == "Reader_copy"

    llm.push(tool_calls(tool_call("grep_files", {"pattern": "plums", "context_lines": 0})), text("Plums."))
    send(imported, "What about plums?")

    first, second = llm.chat_requests()[-2:]
    prompt = system(first)
    assert f'<directory name="{folder.name}">' in prompt
    assert f'<file status="open" name="{folder.name}/notes.txt">' in prompt
    assert "[Viewing lines 2 to 2 (out of 3 lines)]\n2: Line two about pears." in prompt
    assert f'<file status="closed" name="{folder.name}/guide.md">' in prompt
    grep = tool_result(second)
    assert grep["status"] == "OK"
    assert f"=== {folder.name}/notes.txt:3 ===\n> 3: Line three about plums." in grep["message"]


@pytest.mark.django_db(transaction=True)
def test_import_into_another_organisation_gives_it_the_same_folder_and_files(
    actor, other_org_actor, api_client_for, reader
):
    document = export(api_client_for(actor), reader)
    theirs = api_client_for(other_org_actor)

    response = import_file(theirs, document, append_copy_suffix="false")

    assert response.status_code == 200, response.content
    [new_id] = response.json()["agent_ids"]
    imported = Agent.objects.for_actor(other_org_actor).get(id=new_id)
    [folder] = imported.folders.all()
    assert (folder.name, folder.organization_id) == ("handbook", other_org_actor.organization_id)
    assert [wait_for_status(f.id).processing_status for f in files_of(other_org_actor, folder)] == [
        "completed",
        "completed",
    ]
    assert Folder.objects.for_actor(actor).count() == 1
    # Out again from the other organisation, the folders, files and open files read as they went in.
    assert folder_parts(export(theirs, new_id)) == folder_parts(document)


@pytest.fixture
def sdk(live_server, actor, llm, celery_worker) -> Iterator[Letta]:
    """The official SDK against a live server (whose threads must not keep connections past the test)."""
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk").raw_key
    yield Letta(base_url=live_server.url, api_key=key, max_retries=0, timeout=30)
    db_settings["CONN_MAX_AGE"] = saved


@pytest.mark.django_db(transaction=True)
def test_export_import_agent_with_files_through_the_sdk(sdk, actor):
    """Letta's test_export_import_agent_with_files as it is written there, with this server's models."""
    folder = sdk.folders.create(name="test_export_folder", embedding=EMBEDDING)
    for name, data in (("test.txt", documents.TEXT), ("test.md", documents.MARKDOWN)):
        wait_for_status(sdk.folders.files.upload(folder.id, file=(name, io.BytesIO(data))).id)
    assert len(list(sdk.folders.files.list(folder.id, limit=10))) == 2
    temp_agent = sdk.agents.create(
        memory_blocks=[{"label": "human", "value": "username: sarah"}],
        model="openai/gpt-4o-mini",
        embedding=EMBEDDING,
    )
    sdk.agents.folders.attach(folder.id, agent_id=temp_agent.id)

    serialized = json.loads(sdk.agents.export_file(temp_agent.id, use_legacy_format=False))
    result = sdk.agents.import_file(
        file=io.BytesIO(json.dumps(serialized).encode()),
        append_copy_suffix=True,
        override_existing_tools=True,
        override_embedding_handle=EMBEDDING,
    )

    assert len(serialized["agents"]) == 1
    assert [s["name"] for s in serialized["sources"]] == ["test_export_folder"]
    assert sorted(f["content"] for f in serialized["files"]) == sorted(
        [documents.TEXT.decode(), documents.MARKDOWN.decode()]
    )
    assert len(serialized["agents"][0]["files_agents"]) == 2
    [imported_id] = result.agent_ids
    imported = sdk.agents.retrieve(imported_id, include=["agent.sources"])
    assert imported.name == f"{temp_agent.name}_copy"
    [source] = imported.sources
    assert source.name.startswith("test_export_folder_")
    files = [wait_for_status(f.id) for f in sdk.folders.files.list(source.id)]
    assert [f.processing_status for f in files] == ["completed", "completed"]
    assert {f.file_name for f in sdk.agents.files.list(imported_id, is_open=True)} == {
        f"{source.name}/test.md",
        f"{source.name}/test.txt",
    }


# --- refused files -------------------------------------------------------------------------------------------


def letta_file() -> dict[str, Any]:
    """An agent file as Letta writes one with a folder: file names prefixed with the folder's, the agent's
    sources in `source_ids`, its files in `files_agents` with their window."""
    return {
        "agents": [
            {
                "id": "agent-0",
                "name": "reader",
                "system": "You read.",
                "llm_config": {"handle": "openai/gpt-4o-mini", "context_window": 128000},
                "embedding_config": {"handle": EMBEDDING, "embedding_dim": 384},
                "tool_ids": [],
                "block_ids": [],
                "include_base_tools": False,
                "source_ids": ["source-0"],
                "max_files_open": 2,
                "per_file_view_window_char_limit": 5000,
                "in_context_message_ids": [],
                "messages": [],
                "files_agents": [
                    {
                        "id": f"file_agent-{i}",
                        "agent_id": "agent-0",
                        "file_id": f"file-{i}",
                        "source_id": "source-0",
                        "file_name": f"letta docs/{name}",
                        "is_open": True,
                        "visible_content": "whatever Letta showed",
                        "last_accessed_at": f"2025-01-0{i + 1}T10:00:00Z",
                        "start_line": None,
                        "end_line": None,
                    }
                    for i, name in enumerate(("a.txt", "report.pdf", "c.txt"))
                ],
                "group_ids": [],
            }
        ],
        "groups": [],
        "blocks": [],
        "tools": [],
        "mcp_servers": [],
        "sources": [
            {
                "id": "source-0",
                "name": "letta docs",
                "description": "From Letta",
                "instructions": None,
                "metadata": {"team": "x"},
                "embedding_config": {
                    "embedding_endpoint_type": "openai",
                    "embedding_model": "text-embedding-small-384",
                    "embedding_dim": 384,
                    "embedding_chunk_size": 100,
                },
            }
        ],
        "files": [
            {
                "id": "file-0",
                "source_id": "source-0",
                "file_name": "letta docs/a.txt",
                "original_file_name": "a.txt",
                "file_type": "text/plain",
                "file_size": 12,
                "processing_status": "completed",
                "content": "Alpha line.\n",
            },
            {
                "id": "file-1",
                "source_id": "source-0",
                "file_name": "letta docs/report.pdf",
                "original_file_name": "report.pdf",
                "file_type": "application/pdf",
                "file_size": 4000,
                "processing_status": "completed",
                "content": "Revenue grew in Lisbon.",  # what Letta parsed; there is no PDF to parse here
            },
            {
                "id": "file-2",
                "source_id": "source-0",
                "file_name": "letta docs/c.txt",
                "original_file_name": "c.txt",
                "file_type": "text/plain",
                "file_size": 10,
                "processing_status": "completed",
                "content": "Gamma line.\n",
            },
            {
                "id": "file-3",
                "source_id": "source-0",
                "file_name": "letta docs/empty.txt",
                "processing_status": "error",
                "content": None,
            },
        ],
        "metadata": {"revision_id": "5b804970e6a0"},
    }


def test_a_letta_written_file_with_a_folder_imports_and_indexes_without_parsing(
    actor, api_client_for, llm, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = import_file(api_client_for(actor), letta_file())

    assert response.status_code == 200, response.content
    imported = Agent.objects.for_actor(actor).get(id=response.json()["agent_ids"][0])
    [folder] = imported.folders.all()
    assert (folder.name, folder.description, folder.metadata) == ("letta docs", "From Letta", {"team": "x"})
    assert (folder.embedding, folder.embedding_chunk_size) == (EMBEDDING, 100)
    files = {f.file_name: f for f in files_of(actor, folder)}
    assert {name: (f.processing_status, f.file_type) for name, f in files.items()} == {
        "a.txt": ("parsing", "text/plain"),
        "c.txt": ("parsing", "text/plain"),
        "empty.txt": ("error", "text/plain"),
        "report.pdf": ("parsing", "application/pdf"),
    }
    assert files["empty.txt"].error_message == "The agent file carried no text for this file; upload it again"
    assert len(callbacks) == 3  # the three files with text are queued for indexing, after commit
    for name in ("a.txt", "report.pdf", "c.txt"):
        ingest.index_file(files[name].id)
    ingest.index_file(files["a.txt"].id)  # a second delivery finds it indexed and leaves it
    assert [c.text for c in FileChunk.objects.for_actor(actor).filter(file=files["report.pdf"])] == [
        "Revenue grew in Lisbon."
    ]
    assert FileChunk.objects.for_actor(actor).filter(file=files["a.txt"]).count() == 1
    assert {FileMetadata.objects.for_actor(actor).get(id=f.id).processing_status for f in files.values()} == {
        "completed",
        "error",
    }
    states = {s.file_name: s for s in AgentFile.objects.for_actor(actor).filter(agent=imported)}
    # max_files_open=2: the two most recently used stay open, at the start of the text imported here.
    assert {name: s.is_open for name, s in states.items()} == {
        "letta docs/a.txt": False,
        "letta docs/report.pdf": True,
        "letta docs/c.txt": True,
    }
    assert (
        states["letta docs/c.txt"].visible_content == "[Viewing file start (out of 1 lines)]\n1: Gamma line."
    )
    assert states["letta docs/c.txt"].last_accessed_at.isoformat() == "2025-01-03T10:00:00+00:00"
    limits = client_state(api_client_for(actor), imported.id)
    assert limits == (2, 5000)


def client_state(client: APIClient, agent_id: str) -> tuple[int, int]:
    state = client.get(f"/v1/agents/{agent_id}").json()
    return state["max_files_open"], state["per_file_view_window_char_limit"]


def broken(change: Any) -> dict[str, Any]:
    document = copy.deepcopy(letta_file())
    change(document)
    return document


@pytest.mark.parametrize(
    ("document", "detail"),
    [
        (
            broken(lambda d: d["files"][0].update(source_id="source-9")),
            "Invalid agent file: file file-0 references unknown source source-9",
        ),
        (
            broken(lambda d: d["agents"][0].update(source_ids=["source-0", "source-7"])),
            "Invalid agent file: agent agent-0 references unknown source source-7",
        ),
        (
            broken(lambda d: d["agents"][0]["files_agents"][0].update(file_id="file-8")),
            "Invalid agent file: agent agent-0 file_agent file_agent-0 references unknown file file-8",
        ),
        (
            broken(lambda d: d["agents"][0]["files_agents"][1].update(source_id="source-5")),
            "Invalid agent file: agent agent-0 file_agent file_agent-1 references unknown source source-5",
        ),
        (
            broken(lambda d: d["agents"][0]["files_agents"][2].update(agent_id="agent-3")),
            "Invalid agent file: agent agent-0 file_agent file_agent-2 belongs to agent agent-3",
        ),
        (
            broken(lambda d: d["files"].append({**d["files"][0]})),
            "Invalid agent file: duplicate files ids: file-0",
        ),
    ],
)
def test_a_file_with_a_broken_reference_is_refused_and_creates_nothing(
    actor, api_client_for, llm, document, detail
):
    response = import_file(api_client_for(actor), document)

    assert (response.status_code, response.json()["detail"]) == (400, detail)
    assert not Agent.objects.for_actor(actor).exists()
    assert not Folder.objects.for_actor(actor).exists()
    assert not FileMetadata.objects.for_actor(actor).exists()


def test_an_oversized_file_is_refused_and_nothing_is_created(actor, api_client_for, llm, settings):
    settings.FOLDER_FILE_MAX_BYTES = 1000
    document = letta_file()  # report.pdf says 4000 bytes: its upload was larger than this server takes

    response = import_file(api_client_for(actor), document)

    assert response.status_code == 413
    assert response.json()["detail"].startswith(
        "Cannot import file file-1 ('letta docs/report.pdf') of the agent file: The file is 4,000 bytes; "
        "files may be at most 1,000 bytes"
    )
    assert not Agent.objects.for_actor(actor).exists()
    assert not Folder.objects.for_actor(actor).exists()
    assert not FileMetadata.objects.for_actor(actor).exists()


def test_text_larger_than_the_size_it_claims_counts_for_its_length(actor, api_client_for, llm, settings):
    settings.FOLDER_FILE_MAX_BYTES = 1000
    document = letta_file()
    document["files"][1]["file_size"] = 10
    document["files"][0].update(file_size=1, content="x" * 1001)

    response = import_file(api_client_for(actor), document)

    assert response.status_code == 413
    assert "The file is 1,001 bytes" in response.json()["detail"]
    assert not Folder.objects.for_actor(actor).exists()


def test_an_import_past_the_storage_quota_is_refused_and_nothing_is_created(
    actor, api_client_for, llm, settings
):
    settings.FOLDER_STORAGE_QUOTA_BYTES = 4010  # a.txt (12) fits, report.pdf (4000) does not

    response = import_file(api_client_for(actor), letta_file())

    assert response.status_code == 413
    detail = response.json()["detail"]
    assert detail.startswith("Cannot import file file-1 ('letta docs/report.pdf') of the agent file: Storing")
    assert "FOLDER_STORAGE_QUOTA_BYTES" in detail
    assert not Agent.objects.for_actor(actor).exists()
    assert not Folder.objects.for_actor(actor).exists()
    assert not FileMetadata.objects.for_actor(actor).exists()


def test_a_member_imports_a_file_with_folders_as_their_own(org, api_client_for, make_user, llm):
    member = make_user(org, role=Role.MEMBER)
    actor = Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER)

    response = import_file(api_client_for(actor), letta_file())

    assert response.status_code == 200, response.content
    assert response.json()["refused"] == []
    folder = Folder.objects.for_actor(actor).get()
    assert folder.created_by_id == member.id
    assert {f.created_by_id for f in FileMetadata.objects.for_actor(actor)} == {member.id}


def test_a_file_without_folders_imports_as_before(actor, api_client_for, llm):
    document = letta_file()
    document["agents"][0].update(source_ids=[], files_agents=[], max_files_open=None)
    document.update(sources=[], files=[])

    response = import_file(api_client_for(actor), document)

    assert response.status_code == 200, response.content
    imported = Agent.objects.for_actor(actor).get(id=response.json()["agent_ids"][0])
    assert not imported.folders.exists()
    assert not set(imported.tools.values_list("name", flat=True)) & FILE_TOOLS
