"""The official Letta SDK (letta-client, unpatched) against a live server: archives, their passages,
attaching them to agents, /v1/passages/search, and archival memory without an embedding model."""

from collections.abc import Iterator

import pytest
from django.db import connections
from letta_client import BadRequestError, Letta, NotFoundError, PermissionDeniedError

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.models import Agent
from apps.agents.services import agent_create
from apps.core.actor import Actor, Role
from apps.memory.models import Archive, Passage

pytestmark = pytest.mark.django_db(transaction=True)

EMBEDDING = "openai/text-embedding-small-384"


@pytest.fixture(autouse=True)
def _no_persistent_connections_in_server_threads() -> Iterator[None]:
    """The live server answers each request in a new thread: without this each would keep a session
    open, and the test database could not be dropped."""
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


def sdk_for(live_server, actor: Actor) -> Letta:
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk").raw_key
    return Letta(base_url=live_server.url, api_key=key, max_retries=0, timeout=20)


@pytest.fixture
def client(live_server, actor: Actor, llm) -> Letta:
    """The SDK as a user would build it; `llm` serves the embeddings."""
    return sdk_for(live_server, actor)


def new_agent(actor: Actor, name: str, embedding: str = EMBEDDING) -> Agent:
    return agent_create(
        actor=actor, name=name, model="openai/gpt-4o-mini", embedding=embedding, include_base_tools=False
    )


def test_archive_lifecycle_through_the_sdk(client, actor):
    created = client.archives.create(name="Research", description="Papers", embedding=EMBEDDING)

    fetched = client.archives.retrieve(created.id)
    updated = client.archives.update(created.id, name="Research notes")
    listed = client.archives.list(name="Research notes")
    client.archives.delete(created.id)

    assert created.id.startswith("archive-")
    assert (created.name, created.description, created.vector_db_provider) == ("Research", "Papers", "native")
    assert created.embedding_config.handle == EMBEDDING
    assert created.created_by_id == actor.user_id
    assert fetched.id == created.id
    assert (updated.name, updated.description) == ("Research notes", "Papers")
    assert [a.id for a in listed.items] == [created.id]
    assert not Archive.objects.for_actor(actor).exists()
    with pytest.raises(NotFoundError):
        client.archives.retrieve(created.id)


def test_auto_pagination_of_archives_stops(client):
    ids = [client.archives.create(name=f"archive {i}").id for i in range(5)]

    seen = [archive.id for archive in client.archives.list(limit=2, order="asc")]

    assert seen == ids


def test_archive_passages_through_the_sdk(client, actor, llm):
    archive = client.archives.create(name="Research", embedding=EMBEDDING)

    one = client.archives.passages.create(
        archive.id, text="Sam loves hiking", tags=["hobby"], metadata={"source": "chat"}
    )
    many = client.archives.passages.create_many(
        archive.id, passages=[{"text": "Sam plays chess"}, {"text": "The cat is Tom", "tags": ["pets"]}]
    )
    client.archives.passages.delete(one.id, archive_id=archive.id)

    assert (one.text, one.tags, one.metadata, one.archive_id) == (
        "Sam loves hiking",
        ["hobby"],
        {"source": "chat"},
        archive.id,
    )
    assert len(one.embedding) == 384
    assert [(p.text, p.tags) for p in many] == [("Sam plays chess", []), ("The cat is Tom", ["pets"])]
    assert sorted(Passage.objects.for_actor(actor).values_list("text", flat=True)) == [
        "Sam plays chess",
        "The cat is Tom",
    ]
    with pytest.raises(NotFoundError):
        client.archives.passages.delete(one.id, archive_id=archive.id)


def test_a_shared_archive_attached_to_two_agents_through_the_sdk(client, actor):
    ada, bob = new_agent(actor, "Ada"), new_agent(actor, "Bob")
    archive = client.archives.create(name="Team", embedding=EMBEDDING)
    client.archives.passages.create(archive.id, text="The wifi password is on the fridge", tags=["office"])

    attached = client.agents.archives.attach(archive.id, agent_id=ada.id)
    client.agents.archives.attach(archive.id, agent_id=bob.id)
    by_ada = client.agents.passages.search(ada.id, query="wifi password")
    by_bob = client.passages.search(agent_id=bob.id, query="wifi password", tags=["office"])
    of_bob = client.archives.list(agent_id=bob.id)
    detached = client.agents.archives.detach(archive.id, agent_id=bob.id)
    after = client.passages.search(agent_id=bob.id, query="wifi password")

    assert (attached, detached) == (None, None)
    assert [r.content for r in by_ada.results] == ["The wifi password is on the fridge"]
    assert [r.passage.text for r in by_bob] == ["The wifi password is on the fridge"]
    assert by_bob[0].score > 0
    assert [a.id for a in of_bob.items] == [archive.id]
    assert after == []


def test_passage_search_filters_by_archive_tags_and_dates(client):
    archive = client.archives.create(name="Diary", embedding=EMBEDDING)
    client.archives.passages.create_many(
        archive.id,
        passages=[
            {
                "text": "hiking in january",
                "tags": ["outdoor", "winter"],
                "created_at": "2025-01-15T09:00:00Z",
            },
            {"text": "hiking in march", "tags": ["outdoor"], "created_at": "2025-03-15T09:00:00Z"},
            {"text": "reading in march", "tags": ["indoor"], "created_at": "2025-03-20T09:00:00Z"},
        ],
    )

    any_tag = client.passages.search(archive_id=archive.id, query="hiking", tags=["winter", "indoor"])
    all_tags = client.passages.search(
        archive_id=archive.id, query="hiking", tags=["outdoor", "winter"], tag_match_mode="all"
    )
    in_march = client.passages.search(
        archive_id=archive.id,
        query="hiking",
        start_date="2025-03-01T00:00:00Z",
        end_date="2025-03-31T00:00:00Z",
    )
    top_one = client.passages.search(archive_id=archive.id, query="hiking january", limit=1)

    assert sorted(r.passage.text for r in any_tag) == ["hiking in january", "reading in march"]
    assert [r.passage.text for r in all_tags] == ["hiking in january"]
    assert sorted(r.passage.text for r in in_march) == ["hiking in march", "reading in march"]
    assert [r.passage.text for r in top_one] == ["hiking in january"]


def test_archival_memory_without_an_embedding_model_through_the_sdk(client, actor, llm):
    agent = new_agent(actor, "Plain", embedding="")

    [tea] = client.agents.passages.create(agent.id, text="Sam likes green tea", tags=["food"])
    client.agents.passages.create(agent.id, text="Sam hikes on Sundays")
    listed = client.agents.passages.list(agent.id)
    found = client.agents.passages.search(agent.id, query="green tea")
    across = client.passages.search(agent_id=agent.id, query="SAM TEA")
    client.agents.passages.delete(tea.id, agent_id=agent.id)
    remaining = client.agents.passages.list(agent.id)

    assert (tea.embedding, tea.embedding_config) == (None, None)
    assert [p.text for p in listed] == ["Sam likes green tea", "Sam hikes on Sundays"]
    assert [r.content for r in found.results] == ["Sam likes green tea"]
    assert [(r.passage.text, r.score, r.metadata) for r in across] == [
        ("Sam likes green tea", 1.0, {"match": "text"})
    ]
    assert [p.text for p in remaining] == ["Sam hikes on Sundays"]
    assert llm.requests("/v1/embeddings") == []


def test_sdk_errors_for_archives(client, live_server, actor, org, make_user):
    archive = client.archives.create(name="Owners")
    member = make_user(org, role=Role.MEMBER, username="mia")
    as_member = sdk_for(live_server, Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER))
    other = client.archives.create(name="Other")
    passage = client.archives.passages.create(archive.id, text="kept")

    with pytest.raises(PermissionDeniedError) as refused:
        as_member.archives.update(archive.id, name="mine now")
    with pytest.raises(BadRequestError) as wrong_archive:
        client.archives.passages.delete(passage.id, archive_id=other.id)

    assert refused.value.body["detail"].startswith("Not allowed (archive 'Owners')")
    assert wrong_archive.value.body["detail"] == f"Passage {passage.id} does not belong to archive {other.id}"
    assert Archive.objects.for_actor(actor).get(id=archive.id).name == "Owners"
    assert Passage.objects.for_actor(actor).filter(id=passage.id).exists()
