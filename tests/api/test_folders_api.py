"""/v1/folders, /v1/sources and an agent's folders and files through DRF's APIClient: shapes, uploads as the
SDK sends them (multipart, query parameters), errors, other organisations, and agents created with folders."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.agents.models import Agent
from apps.folders import services
from apps.folders.ingest import ingest_file
from apps.folders.models import AgentFile, FileMetadata, Folder
from tests.api.test_messages_api import new_agent
from tests.folders import documents

EMBEDDING = "openai/text-embedding-small-384"


@pytest.fixture
def client(actor, api_client_for, llm):
    return api_client_for(actor)


def create_folder(client: Any, name: str = "handbook", **body: Any) -> dict[str, Any]:
    response = client.post("/v1/folders/", {"name": name, "embedding": EMBEDDING, **body}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def upload(
    client: Any, folder_id: str, name: str, data: bytes, query: str = "", content_type: str = "text/plain"
) -> Any:
    return client.post(
        f"/v1/folders/{folder_id}/upload{query}",
        {"file": SimpleUploadedFile(name, data, content_type=content_type)},
        format="multipart",
    )


def uploaded(client: Any, folder_id: str, name: str, data: bytes, **kwargs: Any) -> dict[str, Any]:
    """Upload and ingest in this process (the worker's task is never sent from a test transaction)."""
    response = upload(client, folder_id, name, data, **kwargs)
    assert response.status_code == 200, response.content
    ingest_file(response.json()["id"])
    return response.json()


def test_folder_crud_count_and_shape(client, actor):
    created = create_folder(
        client, description="Team docs", instructions="Read before answering", metadata={"k": 1}
    )

    listed = client.get("/v1/folders/").json()
    fetched = client.get(f"/v1/folders/{created['id']}").json()
    modified = client.patch(
        f"/v1/folders/{created['id']}", {"name": "manual", "description": "All docs"}, format="json"
    )
    count = client.get("/v1/folders/count").json()
    deleted = client.delete(f"/v1/folders/{created['id']}")

    assert created["id"].startswith("source-")
    assert {
        k: created[k] for k in ("name", "description", "instructions", "metadata", "vector_db_provider")
    } == {
        "name": "handbook",
        "description": "Team docs",
        "instructions": "Read before answering",
        "metadata": {"k": 1},
        "vector_db_provider": "native",
    }
    assert created["embedding_config"]["handle"] == EMBEDDING
    assert created["embedding_config"]["embedding_chunk_size"] == 300
    assert created["organization_id"] == actor.organization_id
    assert [f["id"] for f in listed] == [created["id"]]
    assert fetched == created
    assert (modified.status_code, modified.json()["name"], modified.json()["description"]) == (
        200,
        "manual",
        "All docs",
    )
    assert count == 1
    assert (deleted.status_code, deleted.content) == (200, b"null")
    assert not Folder.objects.for_actor(actor).exists()


def test_a_folder_needs_an_embedding_model_and_a_free_name(client):
    create_folder(client)

    missing = client.post("/v1/folders/", {"name": "other"}, format="json")
    taken = client.post("/v1/folders/", {"name": "handbook", "embedding": EMBEDDING}, format="json")

    assert (missing.status_code, missing.json()["detail"]) == (
        400,
        "Must specify either embedding or embedding_config in request",
    )
    assert (taken.status_code, taken.json()["detail"]) == (
        409,
        "A folder named 'handbook' already exists in this organization",
    )


def test_the_legacy_embedding_config_names_the_model(client):
    response = client.post(
        "/v1/folders/",
        {
            "name": "legacy",
            "embedding_config": {
                "embedding_endpoint_type": "openai",
                "embedding_model": "text-embedding-small-384",
                "embedding_chunk_size": 128,
            },
        },
        format="json",
    )

    assert response.status_code == 200, response.content
    assert response.json()["embedding_config"]["handle"] == EMBEDDING
    assert response.json()["embedding_config"]["embedding_chunk_size"] == 128


def test_the_list_filters_by_name_and_pages_oldest_first(client):
    ids = [create_folder(client, name)["id"] for name in ("a", "b", "c")]

    first = client.get("/v1/folders/", {"limit": 2}).json()
    rest = client.get("/v1/folders/", {"limit": 2, "after": first[-1]["id"]}).json()
    named = client.get("/v1/folders/", {"name": "b"}).json()

    assert [f["id"] for f in first + rest] == ids
    assert [f["name"] for f in named] == ["b"]


def test_an_upload_as_the_sdk_sends_it_is_pending_then_completed(client):
    folder = create_folder(client)

    response = upload(client, folder["id"], "notes.txt", documents.TEXT)
    ingest_file(response.json()["id"])
    listed = client.get(f"/v1/folders/{folder['id']}/files").json()
    with_content = client.get(
        f"/v1/folders/{folder['id']}/files/{response.json()['id']}", {"include_content": "true"}
    ).json()

    body = response.json()
    assert response.status_code == 200
    assert {
        k: body[k]
        for k in (
            "file_name",
            "original_file_name",
            "file_type",
            "file_size",
            "processing_status",
            "source_id",
        )
    } == {
        "file_name": "handbook/notes.txt",
        "original_file_name": "notes.txt",
        "file_type": "text/plain",
        "file_size": len(documents.TEXT),
        "processing_status": "pending",
        "source_id": folder["id"],
    }
    assert [(f["file_name"], f["processing_status"], f["total_chunks"], f["content"]) for f in listed] == [
        ("notes.txt", "completed", 1, None)
    ]
    assert with_content["content"] == documents.TEXT.decode()
    assert with_content["chunks_embedded"] == 1


def test_upload_duplicate_handling_and_a_custom_name(client):
    folder = create_folder(client)
    first = uploaded(client, folder["id"], "notes.txt", documents.TEXT)

    suffixed = upload(client, folder["id"], "notes.txt", documents.TEXT)
    skipped = upload(client, folder["id"], "notes.txt", b"x", query="?duplicate_handling=skip")
    refused = upload(client, folder["id"], "notes.txt", b"x", query="?duplicate_handling=error")
    named = upload(client, folder["id"], "notes.txt", b"x", query="?name=renamed.txt")

    assert suffixed.json()["file_name"] == "handbook/notes_(1).txt"
    assert (skipped.status_code, skipped.json()["id"], skipped["X-Upload-Result"]) == (
        200,
        first["id"],
        "skipped",
    )
    assert (refused.status_code, refused.json()["detail"]) == (
        400,
        "File 'notes.txt' already exists in folder 'handbook'",
    )
    assert named.json()["original_file_name"] == "renamed.txt"


def test_upload_replace_swaps_the_file_once_ingested(client, actor):
    folder = create_folder(client)
    old = uploaded(client, folder["id"], "notes.txt", b"old text\n")

    new = uploaded(client, folder["id"], "notes.txt", b"new text\n", query="?duplicate_handling=replace")

    files = client.get(f"/v1/folders/{folder['id']}/files", {"include_content": True}).json()
    assert [(f["id"], f["file_name"], f["content"]) for f in files] == [
        (new["id"], "notes.txt", "new text\n")
    ]
    assert not FileMetadata.objects.for_actor(actor).filter(id=old["id"]).exists()


def test_unsupported_and_oversized_uploads_are_refused_before_anything_is_stored(client, actor, settings):
    folder = create_folder(client)
    settings.FOLDER_FILE_MAX_BYTES = 100

    unsupported = upload(client, folder["id"], "tool.exe", b"MZ", content_type="application/x-msdownload")
    oversized = upload(client, folder["id"], "big.txt", b"x" * 101)

    assert unsupported.status_code == 415
    assert unsupported.json()["detail"].startswith(
        "Unsupported file type: application/x-msdownload (filename: tool.exe)"
    )
    assert oversized.status_code == 413
    assert "FOLDER_FILE_MAX_BYTES" in oversized.json()["detail"]
    assert not FileMetadata.objects.for_actor(actor).exists()


def test_the_media_type_is_guessed_from_the_name_when_the_client_sends_none_we_take(client):
    folder = create_folder(client)

    response = upload(
        client,
        folder["id"],
        "memo.docx",
        documents.docx("Memo", ["text"]),
        content_type="application/octet-stream",
    )

    assert (
        response.json()["file_type"]
        == "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    )


def test_deleting_a_file_answers_204_and_takes_it_from_agents(client, actor):
    folder = create_folder(client)
    file = uploaded(client, folder["id"], "notes.txt", documents.TEXT)
    agent = new_agent(actor)
    client.patch(f"/v1/agents/{agent.id}/folders/attach/{folder['id']}")

    response = client.delete(f"/v1/folders/{folder['id']}/{file['id']}")

    assert (response.status_code, response.content) == (204, b"")
    assert client.get(f"/v1/folders/{folder['id']}/files").json() == []
    assert not AgentFile.objects.for_actor(actor).exists()


def test_metadata_passages_and_agents_of_a_folder(client, actor):
    folder = create_folder(client)
    file = uploaded(client, folder["id"], "notes.txt", documents.TEXT)
    agent = new_agent(actor)
    client.patch(f"/v1/agents/{agent.id}/folders/attach/{folder['id']}")

    metadata = client.get("/v1/folders/metadata", {"include_detailed_per_source_metadata": "true"}).json()
    passages = client.get(f"/v1/folders/{folder['id']}/passages").json()
    agents = client.get(f"/v1/folders/{folder['id']}/agents").json()
    by_name = client.get("/v1/folders/name/handbook").json()

    assert metadata == {
        "total_sources": 1,
        "total_files": 1,
        "total_size": len(documents.TEXT),
        "sources": [
            {
                "source_id": folder["id"],
                "source_name": "handbook",
                "folder_id": folder["id"],
                "folder_name": "handbook",
                "file_count": 1,
                "total_size": len(documents.TEXT),
                "files": [
                    {"file_id": file["id"], "file_name": "notes.txt", "file_size": len(documents.TEXT)}
                ],
            }
        ],
    }
    assert [(p["file_id"], p["source_id"], p["text"]) for p in passages] == [
        (file["id"], folder["id"], documents.TEXT.decode().strip())
    ]
    assert agents == [agent.id]
    assert by_name == folder["id"]


def test_an_agents_folders_and_files_open_close_and_close_all(client, actor):
    folder = create_folder(client)
    a = uploaded(client, folder["id"], "a.txt", b"alpha\n")
    b = uploaded(client, folder["id"], "b.txt", b"beta\n")
    agent = new_agent(actor)

    attached = client.patch(
        f"/v1/agents/{agent.id}/folders/attach/{folder['id']}", HTTP_X_STAINLESS_PACKAGE_VERSION="1.12.1"
    )
    folders = client.get(f"/v1/agents/{agent.id}/folders").json()
    closed_a = client.patch(f"/v1/agents/{agent.id}/files/{a['id']}/close")
    open_files = client.get(f"/v1/agents/{agent.id}/files", {"is_open": "true"}).json()
    reopened = client.patch(f"/v1/agents/{agent.id}/files/{a['id']}/open").json()
    closed_all = client.patch(f"/v1/agents/{agent.id}/files/close-all").json()
    every_file = client.get(f"/v1/agents/{agent.id}/files").json()

    assert (attached.status_code, attached.content) == (200, b"null")
    assert [f["id"] for f in folders] == [folder["id"]]
    assert closed_a.json() == {"message": f"File id={a['id']} successfully closed"}
    assert [(f["file_name"], f["is_open"], f["folder_name"]) for f in open_files["files"]] == [
        ("handbook/b.txt", True, "handbook")
    ]
    assert open_files["files"][0]["visible_content"] == "[Viewing file start (out of 1 lines)]\n1: beta"
    assert (open_files["has_more"], open_files["next_cursor"]) == (False, open_files["files"][0]["id"])
    assert reopened == []
    assert sorted(closed_all) == ["handbook/a.txt", "handbook/b.txt"]
    assert {(f["file_id"], f["is_open"], f["visible_content"]) for f in every_file["files"]} == {
        (a["id"], False, None),
        (b["id"], False, None),
    }


def test_the_agent_state_shows_its_folders_and_file_limits(client, actor):
    folder = create_folder(client)
    agent = new_agent(actor)
    client.patch(f"/v1/agents/{agent.id}/folders/attach/{folder['id']}")

    state = client.get(f"/v1/agents/{agent.id}", {"include": "agent.sources"}).json()
    listed = client.get("/v1/agents/", {"include": "agent.sources"}).json()
    bare = client.get(f"/v1/agents/{agent.id}").json()

    assert [s["id"] for s in state["sources"]] == [folder["id"]]
    assert bare["sources"] == []  # a 1.x client asks for them, as on Letta
    # Letta's defaults for the 32,768-token window the loop gives an agent without a context_window_limit
    assert (state["max_files_open"], state["per_file_view_window_char_limit"]) == (10, 25_000)
    assert listed[0]["sources"][0]["name"] == "handbook"


def test_the_agent_state_shows_attached_files_as_memory_file_blocks(client, actor):
    folder = create_folder(client)
    a = uploaded(client, folder["id"], "a.txt", b"alpha\n")
    b = uploaded(client, folder["id"], "b.txt", b"beta\n")
    agent = new_agent(actor)
    client.patch(f"/v1/agents/{agent.id}/folders/attach/{folder['id']}")
    client.patch(f"/v1/agents/{agent.id}/files/{a['id']}/close")

    blocks = client.get(f"/v1/agents/{agent.id}", {"include": "agent.blocks"}).json()["memory"]["file_blocks"]
    listed = client.get("/v1/agents/", {"include": "agent.blocks"}).json()[0]["memory"]["file_blocks"]

    assert [(x["label"], x["file_id"], x["source_id"], x["is_open"], x["read_only"]) for x in blocks] == [
        ("handbook/a.txt", a["id"], folder["id"], False, True),
        ("handbook/b.txt", b["id"], folder["id"], True, True),
    ]
    assert [x["value"] for x in blocks] == ["", "[Viewing file start (out of 1 lines)]\n1: beta"]
    assert blocks[1]["limit"] == 25_000
    assert blocks[1]["last_accessed_at"].endswith("Z")
    assert listed == blocks


def test_agents_are_created_and_updated_with_folders_and_file_limits(client, actor):
    first = create_folder(client, "first")
    second = create_folder(client, "second")

    created = client.post(
        "/v1/agents/",
        {
            "name": "reader",
            "model": "openai/gpt-4o-mini",
            "folder_ids": [first["id"]],
            "source_ids": [second["id"]],
            "max_files_open": 3,
            "per_file_view_window_char_limit": 1234,
        },
        format="json",
    )
    agent_id = created.json()["id"]
    updated = client.patch(
        f"/v1/agents/{agent_id}", {"folder_ids": [second["id"]], "max_files_open": 4}, format="json"
    )

    assert created.status_code == 200, created.content
    assert [s["name"] for s in created.json()["sources"]] == ["first", "second"]
    assert (created.json()["max_files_open"], created.json()["per_file_view_window_char_limit"]) == (3, 1234)
    assert "grep_files" in {t["name"] for t in created.json()["tools"]}
    assert [s["name"] for s in updated.json()["sources"]] == ["second"]
    assert updated.json()["max_files_open"] == 4


def test_an_agent_with_an_unknown_folder_is_not_created(client, actor):
    response = client.post(
        "/v1/agents/",
        {"name": "reader", "model": "openai/gpt-4o-mini", "folder_ids": ["source-nope"]},
        format="json",
    )

    assert response.status_code == 404
    assert not Agent.objects.for_actor(actor).exists()


def test_the_deprecated_sources_paths_are_aliases(client, actor):
    created = client.post("/v1/sources/", {"name": "old", "embedding": EMBEDDING}, format="json").json()
    file = uploaded_source = client.post(
        f"/v1/sources/{created['id']}/upload",
        {"file": SimpleUploadedFile("n.txt", b"hello\n")},
        format="multipart",
    ).json()
    ingest_file(uploaded_source["id"])
    agent = new_agent(actor)

    attached = client.patch(
        f"/v1/agents/{agent.id}/sources/attach/{created['id']}", HTTP_X_STAINLESS_PACKAGE_VERSION="1.12.1"
    )
    sources = client.get(f"/v1/agents/{agent.id}/sources").json()
    metadata = client.get(f"/v1/sources/{created['id']}/files/{file['id']}").json()
    count = client.get("/v1/sources/count").json()
    deleted = client.delete(f"/v1/sources/{created['id']}/{file['id']}")

    assert attached.json()["id"] == agent.id  # the deprecated path answers the agent to every client
    assert [s["id"] for s in sources] == [created["id"]]
    assert (metadata["file_name"], count, deleted.status_code) == ("n.txt", 1, 204)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/v1/folders/{folder}"),
        ("patch", "/v1/folders/{folder}"),
        ("delete", "/v1/folders/{folder}"),
        ("get", "/v1/folders/{folder}/files"),
        ("get", "/v1/folders/{folder}/files/{file}"),
        ("delete", "/v1/folders/{folder}/{file}"),
        ("get", "/v1/folders/{folder}/agents"),
        ("get", "/v1/folders/{folder}/passages"),
        ("patch", "/v1/agents/{agent}/folders/attach/{folder}"),
        ("patch", "/v1/agents/{agent}/files/{file}/open"),
        ("get", "/v1/agents/{agent}/files"),
        ("get", "/v1/agents/{agent}/folders"),
    ],
)
def test_another_organisation_sees_nothing(method, path, client, actor, other_org_actor, api_client_for):
    folder = create_folder(client)
    file = uploaded(client, folder["id"], "notes.txt", documents.TEXT)
    agent = new_agent(actor)
    services.agent_attach_folder(actor=actor, agent_id=agent.id, folder_id=folder["id"])
    stranger = api_client_for(other_org_actor)

    response = getattr(stranger, method)(
        path.format(folder=folder["id"], file=file["id"], agent=agent.id), format="json"
    )

    assert response.status_code == 404
    assert Folder.objects.for_actor(actor).filter(id=folder["id"]).exists()
    assert stranger.get("/v1/folders/").json() == []
    assert stranger.get("/v1/folders/count").json() == 0


def test_the_other_organisations_agent_cannot_get_our_folder(client, other_org_actor, api_client_for):
    folder = create_folder(client)
    theirs = new_agent(other_org_actor)

    response = api_client_for(other_org_actor).patch(f"/v1/agents/{theirs.id}/folders/attach/{folder['id']}")

    assert response.status_code == 404
    assert not Folder.agents.through.objects.exists()


def test_without_a_key_it_is_401(db):
    from rest_framework.test import APIClient

    assert APIClient().get("/v1/folders/").status_code == 401
