"""Who may write folders, as an owner, an admin, the member who created the folder (and the agent) and another
member: creating is everyone's (ARCHIVE_CREATE); changing a folder, uploading to it, deleting its files,
attaching and detaching it is its creator's, an owner's or an admin's (ARCHIVE_WRITE, with AGENT_CONFIGURE on
the agent); a refusal is a 403 that says who may, and changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.core.actor import Actor, Role
from apps.folders import services
from apps.folders.ingest import ingest_file
from apps.folders.models import AgentFile, FileMetadata, Folder
from tests.api.test_messages_api import new_agent

ROLES = ("owner", "admin", "creator", "member")
WRITERS = {"owner", "admin", "creator"}
EMBEDDING = "openai/text-embedding-small-384"


@dataclass
class World:
    actors: dict[str, Actor]
    folder: Folder
    file: FileMetadata
    agent: Any


@pytest.fixture
def world(org, make_user, llm, django_capture_on_commit_callbacks) -> World:
    actors = {}
    for name, role in (
        ("owner", Role.OWNER),
        ("admin", Role.ADMIN),
        ("creator", Role.MEMBER),
        ("member", Role.MEMBER),
    ):
        user = make_user(org, role=role, username=name)
        actors[name] = Actor(organization_id=org.id, user_id=user.id, role=role)
    creator = actors["creator"]
    folder = services.folder_create(actor=creator, name="handbook", embedding_handle=EMBEDDING)
    with django_capture_on_commit_callbacks(execute=False):
        file = services.file_upload(
            actor=creator, folder_id=folder.id, filename="notes.txt", content_type=None, data=b"hello\n"
        ).file
    ingest_file(file.id)
    agent = new_agent(creator)
    return World(actors=actors, folder=folder, file=file, agent=agent)


@dataclass(frozen=True)
class Case:
    name: str
    act: Callable[[Any, World], Any]
    changed: Callable[[World], bool]
    setup: Callable[[World], None] = lambda world: None


def _attached(world: World) -> bool:
    return Folder.agents.through.objects.filter(folder_id=world.folder.id, agent_id=world.agent.id).exists()


def _attach(world: World) -> None:
    services.agent_attach_folder(
        actor=world.actors["creator"], agent_id=world.agent.id, folder_id=world.folder.id
    )


CASES = [
    Case(
        "modify",
        lambda c, w: c.patch(f"/v1/folders/{w.folder.id}", {"description": "new"}, format="json"),
        lambda w: Folder.objects.unscoped().get(id=w.folder.id).description == "new",
    ),
    Case(
        "upload",
        lambda c, w: c.post(
            f"/v1/folders/{w.folder.id}/upload",
            {"file": SimpleUploadedFile("b.txt", b"b\n")},
            format="multipart",
        ),
        lambda w: FileMetadata.objects.unscoped().filter(folder_id=w.folder.id).count() == 2,
    ),
    Case(
        "delete a file",
        lambda c, w: c.delete(f"/v1/folders/{w.folder.id}/{w.file.id}"),
        lambda w: not FileMetadata.objects.unscoped().filter(id=w.file.id).exists(),
    ),
    Case(
        "attach",
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}/folders/attach/{w.folder.id}"),
        _attached,
    ),
    Case(
        "detach",
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}/folders/detach/{w.folder.id}"),
        lambda w: not _attached(w),
        setup=_attach,
    ),
    Case(
        "close the agent's files",
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}/files/close-all"),
        lambda w: not AgentFile.objects.unscoped().filter(agent_id=w.agent.id, is_open=True).exists(),
        setup=_attach,
    ),
    Case(
        "delete",
        lambda c, w: c.delete(f"/v1/folders/{w.folder.id}"),
        lambda w: not Folder.objects.unscoped().filter(id=w.folder.id).exists(),
    ),
]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_folder_writes_follow_the_matrix(case: Case, role: str, world: World, api_client_for: Any) -> None:
    case.setup(world)
    client = api_client_for(world.actors[role])

    response = case.act(client, world)

    if role in WRITERS:
        assert response.status_code in (200, 204), response.content
        assert case.changed(world)
    else:
        assert response.status_code == 403
        assert response.json()["detail"].startswith("Not allowed (")
        assert not case.changed(world)


@pytest.mark.parametrize("role", ROLES)
def test_every_member_creates_folders(role: str, world: World, api_client_for: Any) -> None:
    response = api_client_for(world.actors[role]).post(
        "/v1/folders/", {"name": f"{role}'s", "embedding": EMBEDDING}, format="json"
    )

    assert response.status_code == 200
    assert Folder.objects.unscoped().get(id=response.json()["id"]).created_by_id == world.actors[role].user_id
