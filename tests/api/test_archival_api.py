from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.agents.models import Agent
from apps.agents.services import agent_create
from apps.core.actor import Actor
from apps.memory.models import Archive, Passage

EMBEDDING = "openai/text-embedding-small-384"  # the scripted server answers 384-dimensional vectors


@pytest.fixture
def agent(actor: Actor, llm) -> Agent:
    return agent_create(
        actor=actor,
        name="Archivist",
        model="openai/gpt-4o-mini",
        embedding=EMBEDDING,
        include_base_tools=False,
    )


@pytest.fixture
def client(actor: Actor, api_client_for) -> APIClient:
    return api_client_for(actor)


def insert(client: APIClient, agent: Agent, text: str, tags: list[str] | None = None) -> dict:
    body = {"text": text} | ({"tags": tags} if tags is not None else {})
    response = client.post(f"/v1/agents/{agent.id}/archival-memory", body, format="json")
    assert response.status_code == 200, response.content
    [passage] = response.json()
    return passage


# --- insert ------------------------------------------------------------------------------------------


def test_insert_returns_the_created_passage(actor, agent, client):
    response = client.post(
        f"/v1/agents/{agent.id}/archival-memory", {"text": "Sam likes tea", "tags": ["food"]}, format="json"
    )

    assert response.status_code == 200
    [passage] = response.json()
    archive = Archive.objects.for_actor(actor).get(agents=agent)
    assert passage["id"].startswith("passage-")
    assert (passage["text"], passage["tags"], passage["archive_id"]) == (
        "Sam likes tea",
        ["food"],
        archive.id,
    )
    assert len(passage["embedding"]) == 384
    assert passage["embedding_config"]["handle"] == EMBEDDING
    assert passage["embedding_config"]["embedding_dim"] == 384
    assert passage["created_by_id"] == actor.user_id
    assert Passage.objects.for_actor(actor).get(id=passage["id"]).text == "Sam likes tea"


def test_insert_without_an_embedding_model_stores_the_text_without_a_vector(actor, client, llm):
    agent = agent_create(actor=actor, name="NoEmbedding", include_base_tools=False)

    response = client.post(
        f"/v1/agents/{agent.id}/archival-memory", {"text": "Sam likes tea", "tags": ["food"]}, format="json"
    )

    assert response.status_code == 200, response.content
    [passage] = response.json()
    archive = Archive.objects.for_actor(actor).get(agents=agent)
    assert (passage["text"], passage["tags"], passage["archive_id"]) == (
        "Sam likes tea",
        ["food"],
        archive.id,
    )
    assert (passage["embedding"], passage["embedding_config"]) == (None, None)
    assert (archive.embedding, archive.embedding_dim) == ("", None)
    stored = Passage.objects.for_actor(actor).get(id=passage["id"])
    assert (stored.embedding, stored.embedding_dim) == (None, None)
    assert llm.requests("/v1/embeddings") == []


def test_insert_of_blank_text_is_400(agent, client):
    response = client.post(f"/v1/agents/{agent.id}/archival-memory", {"text": "  "}, format="json")

    assert response.status_code == 400
    assert response.json()["detail"] == "Archival memory content must be non-empty text."


def test_insert_without_text_is_422(agent, client):
    response = client.post(f"/v1/agents/{agent.id}/archival-memory", {"tags": ["x"]}, format="json")

    assert response.status_code == 422
    assert "text" in response.json()["detail"]


# --- list --------------------------------------------------------------------------------------------


def test_list_is_oldest_first_by_default_and_filters_by_text(agent, client):
    first = insert(client, agent, "Sam likes tea")
    second = insert(client, agent, "Sam hikes on Sundays")

    listed = client.get(f"/v1/agents/{agent.id}/archival-memory").json()
    newest_first = client.get(f"/v1/agents/{agent.id}/archival-memory", {"ascending": "false"}).json()
    searched = client.get(f"/v1/agents/{agent.id}/archival-memory", {"search": "HIKES"}).json()

    assert [p["id"] for p in listed] == [first["id"], second["id"]]
    assert [p["id"] for p in newest_first] == [second["id"], first["id"]]
    assert [p["id"] for p in searched] == [second["id"]]
    assert len(listed[0]["embedding"]) == 384


def test_list_pagination_honours_after_until_an_empty_page(agent, client):
    ids = [insert(client, agent, f"fact number {i}")["id"] for i in range(3)]

    seen, after = [], None
    for _ in range(5):
        query = {"limit": 2} | ({"after": after} if after else {})
        page = client.get(f"/v1/agents/{agent.id}/archival-memory", query).json()
        if not page:
            break
        seen += [p["id"] for p in page]
        after = page[-1]["id"]

    assert seen == ids


def test_list_of_an_agent_without_archival_memory_is_empty(actor, client):
    agent = agent_create(actor=actor, name="Empty", include_base_tools=False)

    response = client.get(f"/v1/agents/{agent.id}/archival-memory")

    assert (response.status_code, response.json()) == (200, [])


def test_list_costs_a_fixed_number_of_queries(agent, client, django_assert_num_queries):
    for i in range(3):
        insert(client, agent, f"fact number {i}")

    with django_assert_num_queries(6):  # key with membership, agent (+ blocks, tools), archives, page
        client.get(f"/v1/agents/{agent.id}/archival-memory")


# --- search ------------------------------------------------------------------------------------------


def test_search_ranks_by_meaning_and_returns_letta_results(agent, client):
    hiking = insert(client, agent, "Sam loves hiking in the Alps", tags=["hobby"])
    insert(client, agent, "The cat is named Tom", tags=["pets"])

    response = client.get(f"/v1/agents/{agent.id}/archival-memory/search", {"query": "hiking trips"})

    body = response.json()
    assert response.status_code == 200
    assert body["count"] == 2
    assert body["results"][0]["id"] == hiking["id"]
    assert body["results"][0]["content"] == "Sam loves hiking in the Alps"
    assert body["results"][0]["tags"] == ["hobby"]
    assert body["results"][0]["timestamp"].endswith("+00:00")


def test_search_filters_by_tags_top_k_and_dates(agent, client):
    insert(client, agent, "Sam loves hiking", tags=["hobby", "outdoor"])
    insert(client, agent, "Sam plays chess", tags=["hobby"])
    url = f"/v1/agents/{agent.id}/archival-memory/search"
    tomorrow = (timezone.now() + timedelta(days=1)).date().isoformat()

    any_tag = client.get(url, {"query": "Sam", "tags": ["outdoor", "hobby"]}).json()
    all_tags = client.get(url, {"query": "Sam", "tags": ["outdoor", "hobby"], "tag_match_mode": "all"}).json()
    top_one = client.get(url, {"query": "Sam", "top_k": 1}).json()
    future = client.get(url, {"query": "Sam", "start_datetime": tomorrow}).json()

    assert any_tag["count"] == 2
    assert [r["content"] for r in all_tags["results"]] == ["Sam loves hiking"]
    assert top_one["count"] == 1
    assert future == {"results": [], "count": 0}


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({}, "query"),
        ({"query": "x", "tag_match_mode": "some"}, "tag_match_mode"),
        ({"query": "x", "top_k": 0}, "top_k"),
    ],
)
def test_bad_search_parameters_are_422(agent, client, query, field):
    response = client.get(f"/v1/agents/{agent.id}/archival-memory/search", query)

    assert response.status_code == 422
    assert field in response.json()["detail"]


def test_a_bad_date_is_400(agent, client):
    response = client.get(
        f"/v1/agents/{agent.id}/archival-memory/search", {"query": "x", "start_datetime": "last tuesday"}
    )

    assert response.status_code == 400
    assert response.json()["detail"].startswith("Invalid start_datetime 'last tuesday'")


def test_without_an_embedding_model_search_is_a_text_match_of_every_word(actor, client, llm):
    agent = agent_create(actor=actor, name="NoEmbedding", include_base_tools=False)
    tea = insert(client, agent, "Sam likes green TEA", tags=["food"])
    insert(client, agent, "Sam hikes on Sundays", tags=["hobby"])
    url = f"/v1/agents/{agent.id}/archival-memory/search"

    both_words = client.get(url, {"query": "tea sam"}).json()
    one_word_missing = client.get(url, {"query": "tea coffee"}).json()
    by_tag = client.get(url, {"query": "Sam", "tags": ["hobby"]}).json()

    assert [r["id"] for r in both_words["results"]] == [tea["id"]]
    assert both_words["results"][0]["content"] == "Sam likes green TEA"
    assert one_word_missing == {"results": [], "count": 0}
    assert [r["content"] for r in by_tag["results"]] == ["Sam hikes on Sundays"]
    assert llm.requests("/v1/embeddings") == []


def test_without_an_embedding_model_passages_are_listed_and_deleted(actor, client, llm):
    agent = agent_create(actor=actor, name="NoEmbedding", include_base_tools=False)
    first = insert(client, agent, "Sam likes tea")
    second = insert(client, agent, "Sam hikes")

    listed = client.get(f"/v1/agents/{agent.id}/archival-memory").json()
    deleted = client.delete(f"/v1/agents/{agent.id}/archival-memory/{first['id']}")

    assert [p["id"] for p in listed] == [first["id"], second["id"]]
    assert deleted.status_code == 200
    assert list(Passage.objects.for_actor(actor).values_list("id", flat=True)) == [second["id"]]


def test_search_before_any_insert_is_empty(agent, client):
    response = client.get(f"/v1/agents/{agent.id}/archival-memory/search", {"query": "x"})

    assert response.json() == {"results": [], "count": 0}


# --- delete ------------------------------------------------------------------------------------------


def test_delete_removes_the_passage(actor, agent, client):
    passage = insert(client, agent, "Sam likes tea")

    response = client.delete(f"/v1/agents/{agent.id}/archival-memory/{passage['id']}")

    assert response.status_code == 200
    assert response.json() == {"message": f"Memory id={passage['id']} successfully deleted"}
    assert not Passage.objects.for_actor(actor).filter(id=passage["id"]).exists()


def test_delete_of_another_agents_passage_is_404(actor, agent, client):
    passage = insert(client, agent, "Sam likes tea")
    other = agent_create(actor=actor, name="Other", embedding=EMBEDDING, include_base_tools=False)

    response = client.delete(f"/v1/agents/{other.id}/archival-memory/{passage['id']}")

    assert response.status_code == 404
    assert response.json()["detail"] == f"Passage with id '{passage['id']}' not found"
    assert Passage.objects.for_actor(actor).filter(id=passage["id"]).exists()


# --- tenancy and authentication ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", "/v1/agents/{agent}/archival-memory", None),
        ("post", "/v1/agents/{agent}/archival-memory", {"text": "planted"}),
        ("get", "/v1/agents/{agent}/archival-memory/search?query=tea", None),
        ("delete", "/v1/agents/{agent}/archival-memory/{passage}", None),
    ],
)
def test_another_organisation_gets_404_and_changes_nothing(
    actor, other_org_actor, agent, client, api_client_for, method, path, body
):
    passage = insert(client, agent, "Sam likes tea")

    response = getattr(api_client_for(other_org_actor), method)(
        path.format(agent=agent.id, passage=passage["id"]), body, format="json"
    )

    assert response.status_code == 404
    assert response.json()["detail"] == f"Agent with id '{agent.id}' not found"
    assert list(Passage.objects.for_actor(actor).values_list("text", flat=True)) == ["Sam likes tea"]
    assert not Passage.objects.for_actor(other_org_actor).exists()


def test_an_unknown_agent_is_404(client, db):
    response = client.get("/v1/agents/agent-00000000-0000-4000-8000-000000000000/archival-memory")

    assert response.status_code == 404


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/v1/agents/agent-1/archival-memory"),
        ("post", "/v1/agents/agent-1/archival-memory"),
        ("get", "/v1/agents/agent-1/archival-memory/search"),
        ("delete", "/v1/agents/agent-1/archival-memory/passage-1"),
    ],
)
@pytest.mark.django_db
def test_requests_without_a_key_are_401(method, path):
    response = getattr(APIClient(), method)(path, {"text": "x"}, format="json")

    assert response.status_code == 401
    assert not Passage.objects.unscoped().exists()
