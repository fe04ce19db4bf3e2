"""/v1/archives, their passages, attaching them to agents and /v1/passages/search, through the API: shapes,
filters, pagination, search with and without embedding models, tenancy and the role matrix."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.agents.models import Agent
from apps.agents.services import agent_create
from apps.core.actor import Actor, Role
from apps.core.permissions import Action, allows
from apps.memory import archival
from apps.memory.models import Archive, Passage
from tests.support.migrations import migrated_from
from tests.support.scripted_llm import text, tool_call, tool_calls

EMBEDDING = "openai/text-embedding-small-384"  # the scripted server answers 384-dimensional vectors
AGENT_MODEL = "openai/gpt-4o-mini"


@pytest.fixture
def client(actor: Actor, api_client_for) -> APIClient:
    return api_client_for(actor)


def new_agent(actor: Actor, name: str = "Archivist", embedding: str = EMBEDDING) -> Agent:
    return agent_create(
        actor=actor, name=name, model=AGENT_MODEL, embedding=embedding, include_base_tools=False
    )


def create_archive(client: APIClient, name: str = "Research", **body: Any) -> dict:
    response = client.post("/v1/archives/", {"name": name, **body}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def add_passage(client: APIClient, archive_id: str, content: str, **body: Any) -> dict:
    response = client.post(f"/v1/archives/{archive_id}/passages", {"text": content, **body}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def attach(client: APIClient, agent: Agent, archive_id: str) -> None:
    response = client.patch(f"/v1/agents/{agent.id}/archives/attach/{archive_id}")
    assert response.status_code == 200, response.content


def search(client: APIClient, **body: Any) -> list[dict]:
    response = client.post("/v1/passages/search", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def texts(results: list[dict]) -> list[str]:
    return [result["passage"]["text"] for result in results]


# --- create, retrieve, modify, delete -------------------------------------------------------------------


def test_create_returns_lettas_archive_with_its_embedding_model(actor, client, llm):
    archive = create_archive(
        client, "Research", description="Papers", embedding="openai/text-embedding-3-small"
    )

    stored = Archive.objects.for_actor(actor).get(id=archive["id"])
    assert archive["id"].startswith("archive-")
    assert (archive["name"], archive["description"], archive["vector_db_provider"]) == (
        "Research",
        "Papers",
        "native",
    )
    assert archive["embedding_config"]["handle"] == "openai/text-embedding-3-small"
    assert archive["embedding_config"]["embedding_dim"] == 1536
    assert (archive["organization_id"], archive["created_by_id"]) == (actor.organization_id, actor.user_id)
    assert archive["metadata"] == {}
    assert (stored.name, stored.embedding, stored.created_by_id) == (
        "Research",
        "openai/text-embedding-3-small",
        actor.user_id,
    )
    assert llm.requests("/v1/embeddings") == []


def test_a_models_dimension_unknown_at_creation_is_learned_from_the_first_passage(client, llm):
    archive = create_archive(client, "Research", embedding=EMBEDDING)
    add_passage(client, archive["id"], "first")

    fetched = client.get(f"/v1/archives/{archive['id']}").json()

    assert archive["embedding_config"]["embedding_dim"] is None
    assert fetched["embedding_config"]["embedding_dim"] == 384


def test_create_without_an_embedding_model_makes_a_text_search_archive(actor, client):
    archive = create_archive(client, "Notes")

    assert (archive["embedding_config"], archive["description"]) == (None, None)
    assert Archive.objects.for_actor(actor).get(id=archive["id"]).embedding == ""


def test_create_takes_the_deprecated_embedding_config_handle(client, llm):
    config = {"embedding_endpoint_type": "openai", "embedding_model": "text-embedding-small-384"}

    archive = create_archive(client, "Old style", embedding_config=config)

    assert archive["embedding_config"]["handle"] == EMBEDDING


def test_create_with_an_unknown_embedding_model_is_400_and_creates_nothing(actor, client):
    response = client.post("/v1/archives/", {"name": "x", "embedding": "nowhere/model"}, format="json")

    assert response.status_code == 400
    assert response.json()["detail"].startswith(archival.ARCHIVAL_NEEDS_EMBEDDING)
    assert not Archive.objects.for_actor(actor).exists()


def test_create_without_a_name_is_422(actor, client):
    response = client.post("/v1/archives/", {"description": "nameless"}, format="json")

    assert response.status_code == 422
    assert "name" in response.json()["detail"]
    assert not Archive.objects.for_actor(actor).exists()


def test_retrieve_modify_and_delete(actor, client):
    archive = create_archive(client, "Drafts", description="old")
    add_passage(client, archive["id"], "a draft")

    fetched = client.get(f"/v1/archives/{archive['id']}").json()
    renamed = client.patch(f"/v1/archives/{archive['id']}", {"name": "Final"}, format="json").json()
    described = client.patch(f"/v1/archives/{archive['id']}", {"description": "new"}, format="json").json()
    deleted = client.delete(f"/v1/archives/{archive['id']}")
    missing = client.get(f"/v1/archives/{archive['id']}")

    assert fetched == archive
    assert (renamed["name"], renamed["description"]) == ("Final", "old")
    assert (described["name"], described["description"]) == ("Final", "new")
    assert (deleted.status_code, deleted.content) == (204, b"")
    assert missing.status_code == 404
    assert missing.json()["detail"] == f"Archive with id '{archive['id']}' not found"
    assert not Passage.objects.for_actor(actor).exists()


def test_deleting_an_attached_archive_leaves_the_agent_without_it(actor, client, llm):
    agent = new_agent(actor)
    archive = create_archive(client, "Shared")
    attach(client, agent, archive["id"])

    client.delete(f"/v1/archives/{archive['id']}")

    assert Agent.objects.for_actor(actor).filter(id=agent.id).exists()
    assert list(agent.archives.all()) == []


# --- list: filters and pagination -----------------------------------------------------------------------


def test_list_is_newest_first_and_filters_by_name_and_agent(actor, client, llm):
    agent = new_agent(actor)
    first = create_archive(client, "Alpha")
    second = create_archive(client, "Beta")
    third = create_archive(client, "Alpha")
    attach(client, agent, second["id"])

    everything = client.get("/v1/archives/").json()
    oldest_first = client.get("/v1/archives/", {"order": "asc"}).json()
    named = client.get("/v1/archives/", {"name": "Alpha"}).json()
    of_agent = client.get("/v1/archives/", {"agent_id": agent.id}).json()

    assert [a["id"] for a in everything] == [third["id"], second["id"], first["id"]]
    assert [a["id"] for a in oldest_first] == [first["id"], second["id"], third["id"]]
    assert [a["id"] for a in named] == [third["id"], first["id"]]
    assert [a["id"] for a in of_agent] == [second["id"]]


def test_list_pages_with_after_and_before_until_an_empty_page(client):
    ids = [create_archive(client, f"archive {i}")["id"] for i in range(5)]

    seen, after = [], None
    for _ in range(6):
        page = client.get("/v1/archives/", {"limit": 2, "order": "asc"} | ({"after": after} if after else {}))
        if not page.json():
            break
        seen += [a["id"] for a in page.json()]
        after = page.json()[-1]["id"]
    before = client.get("/v1/archives/", {"before": ids[2], "order": "asc"}).json()

    assert seen == ids
    assert [a["id"] for a in before] == ids[:2]


def test_list_with_another_organisations_agent_is_404(client, other_org_actor, llm):
    foreign = new_agent(other_org_actor)

    response = client.get("/v1/archives/", {"agent_id": foreign.id})

    assert response.status_code == 404
    assert response.json()["detail"] == f"Agent with id '{foreign.id}' not found"


def test_a_bad_order_by_is_422(client):
    response = client.get("/v1/archives/", {"order_by": "name"})

    assert response.status_code == 422


def test_list_costs_a_fixed_number_of_queries(client, django_assert_num_queries):
    for i in range(3):
        create_archive(client, f"archive {i}")

    with django_assert_num_queries(2):  # key with membership, page
        response = client.get("/v1/archives/")

    assert len(response.json()) == 3


def test_the_agents_of_an_archive_are_listed(actor, client, llm):
    ada, bob = new_agent(actor, "Ada"), new_agent(actor, "Bob")
    new_agent(actor, "Cy")
    archive = create_archive(client, "Shared")
    attach(client, ada, archive["id"])
    attach(client, bob, archive["id"])

    response = client.get(f"/v1/archives/{archive['id']}/agents", {"order": "asc"})

    assert response.status_code == 200
    assert [a["name"] for a in response.json()] == ["Ada", "Bob"]


# --- passages -------------------------------------------------------------------------------------------


def test_a_passage_is_embedded_with_the_archives_model_and_keeps_its_metadata(actor, client, llm):
    archive = create_archive(client, "Research", embedding=EMBEDDING)

    passage = add_passage(
        client,
        archive["id"],
        "Sam loves hiking",
        tags=["hobby"],
        metadata={"source": "chat"},
        created_at="2025-01-31T10:00:00+00:00",
    )

    stored = Passage.objects.for_actor(actor).get(id=passage["id"])
    assert (passage["text"], passage["tags"], passage["metadata"]) == (
        "Sam loves hiking",
        ["hobby"],
        {"source": "chat"},
    )
    assert passage["archive_id"] == archive["id"]
    assert len(passage["embedding"]) == 384
    assert passage["embedding_config"]["handle"] == EMBEDDING
    assert passage["created_at"].startswith("2025-01-31T10:00:00")
    assert passage["created_by_id"] == actor.user_id
    assert (stored.embedding_dim, stored.created_at) == (384, datetime(2025, 1, 31, 10, tzinfo=UTC))
    assert [r["body"]["input"] for r in llm.requests("/v1/embeddings")] == [["Sam loves hiking"]]


def test_a_passage_of_an_archive_without_a_model_has_no_vector(actor, client, llm):
    archive = create_archive(client, "Notes")

    passage = add_passage(client, archive["id"], "Sam likes tea")

    assert (passage["embedding"], passage["embedding_config"]) == (None, None)
    assert Passage.objects.for_actor(actor).get(id=passage["id"]).embedding_dim is None
    assert llm.requests("/v1/embeddings") == []


def test_a_batch_is_embedded_in_one_request_each_passage_with_its_own_tags(actor, client, llm):
    archive = create_archive(client, "Research", embedding=EMBEDDING)
    body = {"passages": [{"text": "one", "tags": ["a"]}, {"text": "two", "metadata": {"n": 2}}]}

    response = client.post(f"/v1/archives/{archive['id']}/passages/batch", body, format="json")

    assert response.status_code == 200, response.content
    assert [(p["text"], p["tags"], p["metadata"]) for p in response.json()] == [
        ("one", ["a"], {}),
        ("two", [], {"n": 2}),
    ]
    assert [r["body"]["input"] for r in llm.requests("/v1/embeddings")] == [["one", "two"]]
    assert Passage.objects.for_actor(actor).filter(archive_id=archive["id"]).count() == 2


def test_an_empty_batch_stores_nothing(actor, client):
    archive = create_archive(client, "Notes")

    response = client.post(f"/v1/archives/{archive['id']}/passages/batch", {"passages": []}, format="json")

    assert (response.status_code, response.json()) == (200, [])
    assert not Passage.objects.for_actor(actor).exists()


def test_a_batch_with_one_blank_text_stores_none(actor, client):
    archive = create_archive(client, "Notes")
    body = {"passages": [{"text": "fine"}, {"text": "  "}]}

    response = client.post(f"/v1/archives/{archive['id']}/passages/batch", body, format="json")

    assert response.status_code == 400
    assert response.json()["detail"] == "Archival memory content must be non-empty text."
    assert not Passage.objects.for_actor(actor).exists()


def test_delete_a_passage(actor, client):
    archive = create_archive(client, "Notes")
    passage = add_passage(client, archive["id"], "forget me")

    response = client.delete(f"/v1/archives/{archive['id']}/passages/{passage['id']}")
    again = client.delete(f"/v1/archives/{archive['id']}/passages/{passage['id']}")

    assert (response.status_code, response.content) == (204, b"")
    assert again.status_code == 404
    assert again.json()["detail"] == f"Passage with id '{passage['id']}' not found"
    assert not Passage.objects.for_actor(actor).exists()


def test_deleting_a_passage_through_another_archive_is_400_and_keeps_it(actor, client):
    archive, other = create_archive(client, "Mine"), create_archive(client, "Other")
    passage = add_passage(client, archive["id"], "keep me")

    response = client.delete(f"/v1/archives/{other['id']}/passages/{passage['id']}")

    assert response.status_code == 400
    assert response.json()["detail"] == f"Passage {passage['id']} does not belong to archive {other['id']}"
    assert Passage.objects.for_actor(actor).filter(id=passage["id"]).exists()


# --- attaching to agents --------------------------------------------------------------------------------


def test_an_archive_attached_to_two_agents_is_searched_by_both(actor, client, llm):
    ada, bob = new_agent(actor, "Ada"), new_agent(actor, "Bob", embedding="")
    archive = create_archive(client, "Team", embedding=EMBEDDING)
    add_passage(client, archive["id"], "The office wifi password is on the fridge")

    attach(client, ada, archive["id"])
    attach(client, bob, archive["id"])
    attach(client, bob, archive["id"])  # twice: a no-op
    by_ada = client.get(f"/v1/agents/{ada.id}/archival-memory/search", {"query": "wifi password"}).json()
    by_bob = search(client, agent_id=bob.id, query="wifi password")

    assert [r["content"] for r in by_ada["results"]] == ["The office wifi password is on the fridge"]
    assert texts(by_bob) == ["The office wifi password is on the fridge"]
    assert by_bob[0]["metadata"] == {"match": "vector"}
    assert list(bob.archives.values_list("id", flat=True)) == [archive["id"]]


def test_attach_and_detach_answer_null_and_detach_stops_the_search(actor, client, llm):
    agent = new_agent(actor)
    archive = create_archive(client, "Team")
    add_passage(client, archive["id"], "standup at nine")

    attached = client.patch(f"/v1/agents/{agent.id}/archives/attach/{archive['id']}")
    found = search(client, agent_id=agent.id, query="standup")
    detached = client.patch(f"/v1/agents/{agent.id}/archives/detach/{archive['id']}")
    again = client.patch(f"/v1/agents/{agent.id}/archives/detach/{archive['id']}")
    after = search(client, agent_id=agent.id, query="standup")

    assert (attached.status_code, attached.content) == (200, b"null")
    assert texts(found) == ["standup at nine"]
    assert (detached.status_code, detached.json(), again.status_code) == (200, None, 200)
    assert after == []
    assert Passage.objects.for_actor(actor).count() == 1


def test_an_agents_inserts_go_to_the_archive_attached_first(actor, client, llm):
    agent = new_agent(actor)
    shared = create_archive(client, "Shared", embedding=EMBEDDING)
    attach(client, agent, shared["id"])

    response = client.post(f"/v1/agents/{agent.id}/archival-memory", {"text": "noted"}, format="json")

    assert response.json()[0]["archive_id"] == shared["id"]
    assert Archive.objects.for_actor(actor).count() == 1


def test_an_agents_own_archive_belongs_to_the_agents_creator(actor, client, llm):
    agent = new_agent(actor)
    client.post(f"/v1/agents/{agent.id}/archival-memory", {"text": "noted"}, format="json")

    [archive] = client.get("/v1/archives/", {"agent_id": agent.id}).json()

    assert (archive["name"], archive["created_by_id"]) == ("Archivist's archive", actor.user_id)


# --- /v1/passages/search --------------------------------------------------------------------------------


@pytest.fixture
def notes(client, llm) -> dict:
    """An embedded archive with three dated, tagged passages."""
    archive = create_archive(client, "Notes", embedding=EMBEDDING)
    for content, tags, day in [
        ("Sam loves hiking in the Alps", ["hobby", "outdoor"], 1),
        ("Sam plays chess on Sundays", ["hobby"], 10),
        ("The cat is named Tom", ["pets"], 20),
    ]:
        add_passage(client, archive["id"], content, tags=tags, created_at=f"2025-03-{day:02d}T12:00:00Z")
    return archive


def test_search_ranks_by_meaning_and_returns_passages_with_scores(client, notes):
    results = search(client, archive_id=notes["id"], query="hiking mountains", limit=2)

    assert texts(results)[0] == "Sam loves hiking in the Alps"
    assert len(results) == 2
    assert results[0]["score"] > results[1]["score"]
    assert results[0]["passage"]["archive_id"] == notes["id"]
    assert results[0]["passage"]["embedding_config"]["handle"] == EMBEDDING


def test_search_filters_by_tags_any_and_all(client, notes):
    any_tag = search(client, archive_id=notes["id"], query="Sam", tags=["outdoor", "pets"])
    all_tags = search(
        client, archive_id=notes["id"], query="Sam", tags=["hobby", "outdoor"], tag_match_mode="all"
    )

    assert sorted(texts(any_tag)) == ["Sam loves hiking in the Alps", "The cat is named Tom"]
    assert texts(all_tags) == ["Sam loves hiking in the Alps"]


def test_search_filters_by_dates_inclusively(client, notes):
    results = search(
        client,
        archive_id=notes["id"],
        query="Sam",
        start_date="2025-03-10T12:00:00Z",
        end_date="2025-03-20T12:00:00Z",
    )

    assert sorted(texts(results)) == ["Sam plays chess on Sundays", "The cat is named Tom"]


def test_search_without_a_query_lists_the_filtered_passages_oldest_first(client, notes, llm):
    results = search(client, archive_id=notes["id"], tags=["hobby"])

    assert texts(results) == ["Sam loves hiking in the Alps", "Sam plays chess on Sundays"]
    assert [(r["score"], r["metadata"]) for r in results] == [(0.0, {"match": "filter"})] * 2
    assert len(llm.requests("/v1/embeddings")) == 3  # the three inserts; no query was embedded


def test_search_of_the_whole_organisation_covers_every_archive(client, notes):
    other = create_archive(client, "Other")
    add_passage(client, other["id"], "Sam sold the bike")

    results = search(client, query="Sam")

    assert sorted(texts(results)) == [
        "Sam loves hiking in the Alps",
        "Sam plays chess on Sundays",
        "Sam sold the bike",
        "The cat is named Tom",
    ]


def test_a_text_match_ranks_before_similar_passages(client, notes):
    """An agent with an embedded archive and a text-only one: the text match (no vector to compare) is
    scored 1.0, ahead of cosine similarities."""
    text_only = create_archive(client, "Loose notes")
    add_passage(client, text_only["id"], "Tom the cat likes tuna")
    add_passage(client, text_only["id"], "Tom sleeps all day")

    results = search(client, query="cat tom", limit=3)

    assert texts(results)[0] == "Tom the cat likes tuna"
    assert (results[0]["score"], results[0]["metadata"]) == (1.0, {"match": "text"})
    assert [r["metadata"]["match"] for r in results[1:]] == ["vector", "vector"]
    assert "Tom sleeps all day" not in texts(results)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": "x", "limit": 0}, "limit"),
        ({"query": "x", "limit": 101}, "limit"),
        ({"query": "x", "tag_match_mode": "some"}, "tag_match_mode"),
        ({"query": "x", "start_date": "last tuesday"}, "start_date"),
    ],
)
def test_bad_search_parameters_are_422(client, body, field):
    response = client.post("/v1/passages/search", body, format="json")

    assert response.status_code == 422
    assert field in response.json()["detail"]


# --- tenancy and authentication -------------------------------------------------------------------------


@pytest.fixture
def foreign(actor, other_org_actor, api_client_for, llm) -> dict[str, Any]:
    """Our archive with a passage, our agent, and the other organisation's client and own agent."""
    ours = api_client_for(actor)
    archive = create_archive(ours, "Ours")
    passage = add_passage(ours, archive["id"], "our secret")
    return {
        "archive": archive["id"],
        "passage": passage["id"],
        "agent": new_agent(actor).id,
        "their_agent": new_agent(other_org_actor, "Theirs").id,
        "client": api_client_for(other_org_actor),
    }


@pytest.mark.parametrize(
    ("method", "path", "body", "missing"),
    [
        ("get", "/v1/archives/{archive}", None, "archive"),
        ("patch", "/v1/archives/{archive}", {"name": "stolen"}, "archive"),
        ("delete", "/v1/archives/{archive}", None, "archive"),
        ("get", "/v1/archives/{archive}/agents", None, "archive"),
        ("post", "/v1/archives/{archive}/passages", {"text": "planted"}, "archive"),
        ("post", "/v1/archives/{archive}/passages/batch", {"passages": [{"text": "planted"}]}, "archive"),
        ("delete", "/v1/archives/{archive}/passages/{passage}", None, "archive"),
        ("patch", "/v1/agents/{their_agent}/archives/attach/{archive}", None, "archive"),
        ("patch", "/v1/agents/{agent}/archives/attach/{archive}", None, "agent"),
        ("patch", "/v1/agents/{agent}/archives/detach/{archive}", None, "agent"),
        ("post", "/v1/passages/search", {"archive_id": "{archive}", "query": "secret"}, "archive"),
        ("post", "/v1/passages/search", {"agent_id": "{agent}", "query": "secret"}, "agent"),
    ],
)
def test_another_organisation_gets_404_and_changes_nothing(actor, foreign, method, path, body, missing):
    ids = {key: value for key, value in foreign.items() if key != "client"}
    body = {k: v.format(**ids) if isinstance(v, str) else v for k, v in (body or {}).items()}

    response = getattr(foreign["client"], method)(path.format(**ids), body, format="json")

    assert response.status_code == 404
    label = "Archive" if missing == "archive" else "Agent"
    assert response.json()["detail"] == f"{label} with id '{ids[missing]}' not found"
    archive = Archive.objects.for_actor(actor).get(id=foreign["archive"])
    assert archive.name == "Ours"
    assert list(archive.passages.values_list("text", flat=True)) == ["our secret"]
    assert list(archive.agents.all()) == []


def test_the_whole_organisation_search_never_reaches_another_organisation(foreign):
    assert search(foreign["client"], query="secret") == []
    assert foreign["client"].get("/v1/archives/").json() == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/v1/archives/"),
        ("post", "/v1/archives/"),
        ("get", "/v1/archives/archive-1"),
        ("post", "/v1/archives/archive-1/passages"),
        ("post", "/v1/archives/archive-1/passages/batch"),
        ("delete", "/v1/archives/archive-1/passages/passage-1"),
        ("patch", "/v1/agents/agent-1/archives/attach/archive-1"),
        ("post", "/v1/passages/search"),
    ],
)
@pytest.mark.django_db
def test_requests_without_a_key_are_401(method, path):
    response = getattr(APIClient(), method)(path, {"name": "x", "text": "x"}, format="json")

    assert response.status_code == 401
    assert not Archive.objects.unscoped().exists()


# --- the role matrix ------------------------------------------------------------------------------------

ROLES = ("owner", "admin", "creator", "member")


@dataclass
class World:
    """One organisation: its people, and the agent and archive the member called "creator" made."""

    actors: dict[str, Actor]
    agent: Agent
    archive: Archive
    extra: dict[str, Any] = field(default_factory=dict)


@pytest.fixture
def world(org, make_user) -> World:
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
    agent = agent_create(actor=creator, name="Creators", model=AGENT_MODEL, include_base_tools=False)
    archive = archival.archive_create(actor=creator, name="Creators archive")
    return World(actors=actors, agent=agent, archive=archive)


def _archive(world: World) -> Archive:
    return Archive.objects.unscoped().get(id=world.archive.id)


def _attached(world: World) -> bool:
    return Archive.agents.through.objects.filter(
        agent_id=world.agent.id, archive_id=world.archive.id
    ).exists()


def _with_passage(world: World) -> None:
    world.extra["passage"] = Passage.objects.unscoped().create(
        organization_id=world.archive.organization_id, archive=world.archive, text="a fact"
    )


def _with_attachment(world: World) -> None:
    Archive.agents.through.objects.create(agent_id=world.agent.id, archive_id=world.archive.id)


@dataclass(frozen=True)
class Case:
    name: str
    action: Action
    act: Callable[[APIClient, World], Any]
    changed: Callable[[World], bool]
    prepare: Callable[[World], None] = lambda world: None
    by_creator: bool = True


CASES = [
    Case(
        "create an archive",
        Action.ARCHIVE_CREATE,
        lambda c, w: c.post("/v1/archives/", {"name": "fresh"}, format="json"),
        lambda w: Archive.objects.unscoped().filter(name="fresh").exists(),
        by_creator=False,
    ),
    Case(
        "modify an archive",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.patch(f"/v1/archives/{w.archive.id}", {"name": "renamed"}, format="json"),
        lambda w: _archive(w).name == "renamed",
    ),
    Case(
        "delete an archive",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.delete(f"/v1/archives/{w.archive.id}"),
        lambda w: not Archive.objects.unscoped().filter(id=w.archive.id).exists(),
    ),
    Case(
        "add a passage",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.post(f"/v1/archives/{w.archive.id}/passages", {"text": "planted"}, format="json"),
        lambda w: Passage.objects.unscoped().filter(text="planted").exists(),
    ),
    Case(
        "add passages in a batch",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.post(
            f"/v1/archives/{w.archive.id}/passages/batch", {"passages": [{"text": "planted"}]}, format="json"
        ),
        lambda w: Passage.objects.unscoped().filter(text="planted").exists(),
    ),
    Case(
        "delete a passage",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.delete(f"/v1/archives/{w.archive.id}/passages/{w.extra['passage'].id}"),
        lambda w: not Passage.objects.unscoped().filter(id=w.extra["passage"].id).exists(),
        prepare=_with_passage,
    ),
    Case(
        "attach an archive",
        Action.ARCHIVE_WRITE,  # and AGENT_CONFIGURE: both are the creator's here
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}/archives/attach/{w.archive.id}"),
        _attached,
    ),
    Case(
        "detach an archive",
        Action.ARCHIVE_WRITE,
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}/archives/detach/{w.archive.id}"),
        lambda w: not _attached(w),
        prepare=_with_attachment,
    ),
]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_api_does_what_the_matrix_says(case: Case, role: str, world: World, api_client_for: Any) -> None:
    case.prepare(world)
    actor = world.actors[role]
    creator_id = world.actors["creator"].user_id if case.by_creator else None
    expected = allows(actor, case.action, creator_id=creator_id)

    response = case.act(api_client_for(actor), world)

    if expected:
        assert response.status_code in (200, 204), response.content
        assert case.changed(world) is True
    else:
        assert response.status_code == 403, response.content
        assert response.json()["detail"].startswith("Not allowed"), response.json()
        assert not case.changed(world)


def test_attaching_ones_archive_to_someone_elses_agent_is_refused(world, api_client_for):
    member = world.actors["member"]
    archive = archival.archive_create(actor=member, name="Members archive")

    response = api_client_for(member).patch(f"/v1/agents/{world.agent.id}/archives/attach/{archive.id}")

    assert response.status_code == 403
    assert response.json()["detail"].startswith("Not allowed (agent 'Creators')")
    assert list(world.agent.archives.all()) == []


def test_attaching_someone_elses_archive_to_ones_agent_is_refused(world, api_client_for):
    archive = archival.archive_create(actor=world.actors["admin"], name="Admins archive")

    response = api_client_for(world.actors["creator"]).patch(
        f"/v1/agents/{world.agent.id}/archives/attach/{archive.id}"
    )

    assert response.status_code == 403
    assert response.json()["detail"].startswith("Not allowed (archive 'Admins archive')")
    assert list(world.agent.archives.all()) == []


def test_the_archive_an_agent_made_itself_is_its_creators(world, api_client_for):
    """The agent's first archival insert (a tool call, run as the system) creates its archive: the agent's
    creator may still manage it; another member may not."""
    system = Actor.system(world.agent.organization_id)
    archive = archival.agent_archive(actor=system, agent_id=world.agent.id, embedding_handle="")

    by_creator = api_client_for(world.actors["creator"]).patch(
        f"/v1/archives/{archive.id}", {"description": "mine"}, format="json"
    )
    by_member = api_client_for(world.actors["member"]).delete(f"/v1/archives/{archive.id}")

    assert by_creator.status_code == 200
    assert by_member.status_code == 403
    assert Archive.objects.unscoped().get(id=archive.id).description == "mine"


# --- the agent's own tools, without an embedding model --------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_agent_without_an_embedding_model_remembers_and_finds_by_text(actor, client, llm, celery_worker):
    agent = agent_create(
        actor=actor,
        name="Plain",
        model=AGENT_MODEL,
        embedding="",
        include_base_tools=False,
        tools=["archival_memory_insert", "archival_memory_search"],
    )
    llm.push(
        tool_calls(tool_call("archival_memory_insert", {"content": "Sam likes green tea", "tags": ["food"]})),
        tool_calls(tool_call("archival_memory_search", {"query": "GREEN tea"})),
        text("You like green tea."),
    )

    response = client.post(
        f"/v1/agents/{agent.id}/messages",
        {"messages": [{"role": "user", "content": "What do I drink?"}]},
        format="json",
    )

    assert response.status_code == 200, response.content
    returns = [m for m in response.json()["messages"] if m["message_type"] == "tool_return_message"]
    assert [m["status"] for m in returns] == ["success", "success"]
    [found] = json.loads(returns[1]["tool_return"])
    assert (found["content"], found["tags"]) == ("Sam likes green tea", ["food"])
    stored = Passage.objects.for_actor(actor).get()
    assert (stored.text, stored.embedding_dim) == ("Sam likes green tea", None)
    assert llm.requests("/v1/embeddings") == []


@pytest.mark.django_db(transaction=True)
def test_an_archive_made_before_creators_were_recorded_becomes_its_agents_creators(world, api_client_for):
    """Migration memory 0005: an agent's archive is its agent's creator's; a loose one is nobody's."""
    with migrated_from([("memory", "0004_agentblock_same_organization")]) as (old_apps, forward):
        OldArchive = old_apps.get_model("memory", "Archive")
        org_id = world.agent.organization_id
        agents_own = OldArchive._default_manager.create(organization_id=org_id, name="Agent's own")
        loose = OldArchive._default_manager.create(organization_id=org_id, name="Loose")
        Archive.agents.through.objects.create(agent_id=world.agent.id, archive_id=agents_own.id)
        forward([("memory", "0005_archive_created_by")])

    creator = api_client_for(world.actors["creator"])
    renamed = creator.patch(f"/v1/archives/{agents_own.id}", {"name": "Still mine"}, format="json")
    refused = creator.patch(f"/v1/archives/{loose.id}", {"name": "Mine too?"}, format="json")

    assert renamed.status_code == 200
    assert renamed.json()["created_by_id"] == world.actors["creator"].user_id
    assert refused.status_code == 403
    assert Archive.objects.unscoped().get(id=loose.id).created_by_id is None
