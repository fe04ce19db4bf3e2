"""The ADE's archive pages (list, create, an archive's passages, adding, searching and deleting them,
deleting the archive), through Django's test client. Who may change an archive is also driven for every
role by test_role_matrix.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from apps.accounts.models import Organization, User
from apps.agents.services import agent_attach_archive, agent_create
from apps.core.actor import Actor, Role
from apps.memory import services
from apps.memory.models import Archive, Passage

EMBEDDING = "openai/text-embedding-small-384"  # the scripted LLM's 384-dimension model
HTMX: dict[str, Any] = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def archive(actor: Actor) -> Archive:
    """An archive without an embedding model: its passages are found by text match."""
    archive = services.archive_create(actor=actor, name="field notes", description="What we saw")
    services.archive_passages_create(
        actor=actor,
        archive_id=archive.id,
        passages=[
            services.PassageSpec(text="The heron nests by the north pond.", tags=["birds"]),
            services.PassageSpec(text="Bring boots in March."),
        ],
    )
    return archive


@pytest.fixture
def member(org: Organization, make_user: Callable[..., User]) -> User:
    return make_user(org, role=Role.MEMBER, username="mallory")


def _texts(archive: Archive) -> set[str]:
    return set(Passage.objects.unscoped().filter(archive_id=archive.id).values_list("text", flat=True))


def test_the_list_shows_the_organisations_archives_with_their_use(
    owner_client: Client, actor: Actor, archive: Archive, other_org_actor: Actor
) -> None:
    agent = agent_create(actor=actor, name="Naturalist", model="openai/gpt-4o-mini")
    agent_attach_archive(actor=actor, agent_id=agent.id, archive_id=archive.id)
    services.archive_create(actor=other_org_actor, name="their secrets")

    body = owner_client.get(reverse("ade:archive-list")).content.decode()

    assert 'data-archive-name="field notes"' in body
    assert "their secrets" not in body
    row = body[body.index('data-archive-name="field notes"') :]
    assert '<td class="right nowrap" data-testid="archive-passage-count">2</td>' in row
    assert '<td class="right nowrap" data-testid="archive-agent-count">1</td>' in row


def test_an_archive_is_created_with_an_embedding_model(owner_client: Client, actor: Actor, llm: Any) -> None:
    response = owner_client.post(
        reverse("ade:archive-create"),
        {"name": "papers", "description": "Reading list", "embedding": EMBEDDING},
        **HTMX,
    )

    assert response.status_code == 204, response.content
    archive = Archive.objects.for_actor(actor).get(name="papers")
    assert response["HX-Redirect"] == reverse("ade:archive-detail", args=[archive.id])
    assert (archive.embedding, archive.description) == (EMBEDDING, "Reading list")


def test_a_blank_name_is_refused_and_nothing_is_created(owner_client: Client, actor: Actor) -> None:
    response = owner_client.post(reverse("ade:archive-create"), {"name": "  ", "embedding": ""})

    assert response.status_code == 422
    assert 'data-testid="archive-name-error"' in response.content.decode()
    assert not Archive.objects.for_actor(actor).exists()


def test_a_passage_is_added_and_listed_newest_first(owner_client: Client, archive: Archive) -> None:
    response = owner_client.post(
        reverse("ade:archive-passage-add", args=[archive.id]),
        {"text": "Swifts arrive in May.", "tags": "birds, spring"},
        **HTMX,
    )

    body = response.content.decode()
    assert response.status_code == 200, body
    assert "Passage added." in body
    assert body.index("Swifts arrive in May.") < body.index("Bring boots in March.")
    assert "birds, spring" in body
    assert Passage.objects.unscoped().get(text="Swifts arrive in May.").tags == ["birds", "spring"]


def test_an_empty_passage_is_refused_with_a_message(owner_client: Client, archive: Archive) -> None:
    response = owner_client.post(
        reverse("ade:archive-passage-add", args=[archive.id]), {"text": "  "}, **HTMX
    )

    assert response.status_code == 422
    assert "Write the passage&#x27;s text." in response.content.decode()
    assert len(_texts(archive)) == 2


def test_search_finds_passages_by_text_match_without_an_embedding_model(
    owner_client: Client, archive: Archive
) -> None:
    response = owner_client.get(reverse("ade:archive-search", args=[archive.id]), {"q": "heron pond"}, **HTMX)

    body = response.content.decode()
    assert response.status_code == 200
    assert body.count('data-testid="archive-hit"') == 1
    assert "The heron nests by the north pond." in body
    missing = owner_client.get(reverse("ade:archive-search", args=[archive.id]), {"q": "penguin"}, **HTMX)
    assert 'data-testid="archive-no-hits"' in missing.content.decode()


def test_search_ranks_by_meaning_with_the_archives_model(
    owner_client: Client, actor: Actor, llm: Any
) -> None:
    archive = services.archive_create(actor=actor, name="embedded", embedding_handle=EMBEDDING)
    specs = [services.PassageSpec(text=text) for text in ("tea at four", "boots in March", "the heron")]
    services.archive_passages_create(actor=actor, archive_id=archive.id, passages=specs)

    response = owner_client.get(reverse("ade:archive-search", args=[archive.id]), {"q": "the heron"}, **HTMX)

    body = response.content.decode()
    assert response.status_code == 200, body
    assert body.count('data-testid="archive-hit"') == 3
    first_hit = body[body.index('data-testid="archive-hit"') :]
    assert first_hit.index("the heron") < first_hit.index("tea at four")  # the same text ranks first


def test_a_passage_and_then_the_archive_are_deleted(owner_client: Client, archive: Archive) -> None:
    passage = Passage.objects.unscoped().get(text="Bring boots in March.")

    response = owner_client.post(reverse("ade:archive-passage-delete", args=[archive.id, passage.id]), **HTMX)
    assert response.status_code == 200
    assert _texts(archive) == {"The heron nests by the north pond."}

    response = owner_client.post(reverse("ade:archive-delete", args=[archive.id]), **HTMX)
    assert response.status_code == 204
    assert response["HX-Redirect"] == reverse("ade:archive-list")
    assert not Archive.objects.unscoped().filter(id=archive.id).exists()


def test_a_passage_of_another_archive_is_refused(
    owner_client: Client, actor: Actor, archive: Archive
) -> None:
    other = services.archive_create(actor=actor, name="other")
    passage = Passage.objects.unscoped().get(text="Bring boots in March.")

    response = owner_client.post(reverse("ade:archive-passage-delete", args=[other.id, passage.id]), **HTMX)

    assert response.status_code == 400
    assert len(_texts(archive)) == 2


def test_a_member_reads_and_searches_but_cannot_change_anothers_archive(
    client: Client, member: User, archive: Archive
) -> None:
    client.force_login(member)

    page = client.get(reverse("ade:archive-detail", args=[archive.id])).content.decode()
    assert 'data-testid="archive-read-only"' in page
    assert 'data-testid="passage-form"' not in page
    assert 'data-testid="delete-passage"' not in page
    assert 'data-testid="archive-danger-zone"' not in page
    search = client.get(reverse("ade:archive-search", args=[archive.id]), {"q": "boots"}, **HTMX)
    assert 'data-testid="archive-hit"' in search.content.decode()

    added = client.post(reverse("ade:archive-passage-add", args=[archive.id]), {"text": "mine"}, **HTMX)
    deleted = client.post(reverse("ade:archive-delete", args=[archive.id]), **HTMX)

    assert (added.status_code, deleted.status_code) == (403, 403)
    assert len(_texts(archive)) == 2
    assert Archive.objects.unscoped().filter(id=archive.id).exists()


@pytest.mark.parametrize(
    ("name", "method"),
    [
        ("ade:archive-detail", "get"),
        ("ade:archive-search", "get"),
        ("ade:archive-passage-add", "post"),
        ("ade:archive-delete", "post"),
    ],
)
def test_another_organisations_archive_is_not_found(
    name: str, method: str, other_org_actor: Actor, client: Client, user: User
) -> None:
    theirs = services.archive_create(actor=other_org_actor, name="theirs")
    services.archive_passages_create(
        actor=other_org_actor, archive_id=theirs.id, passages=[services.PassageSpec(text="secret plan")]
    )
    client.force_login(user)

    response = getattr(client, method)(reverse(name, args=[theirs.id]), {"q": "secret", "text": "x"})

    assert response.status_code == 404
    assert "secret plan" not in response.content.decode()
    assert Passage.objects.unscoped().filter(archive_id=theirs.id).count() == 1
