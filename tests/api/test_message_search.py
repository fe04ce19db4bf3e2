"""POST /v1/messages/search (the SDK's messages.search): keywords, meaning or both, across the
organisation's agents, as Letta's search result items."""

from __future__ import annotations

from typing import Any

import pytest

from apps.agents.models import Message
from tests.agents.test_recall import HANDLE, embedded, embeddings, llm_server  # noqa: F401  (fixtures)
from tests.api.test_agents_sdk import _no_persistent_connections_in_server_threads, sdk_for  # noqa: F401
from tests.factories import AgentFactory, MessageFactory


def say(agent, text: str, role: str = Message.Role.USER) -> Message:
    return MessageFactory(
        organization=agent.organization,
        agent=agent,
        role=role,
        text=text,
        content=[{"type": "text", "text": text}],
    )


def search(client: Any, **body: Any) -> Any:
    return client.post("/v1/messages/search", body, format="json")


@pytest.fixture
def agents(org, embeddings):  # noqa: F811
    return AgentFactory(organization=org, embedding=HANDLE), AgentFactory(organization=org, embedding="")


def test_keywords_find_messages_of_every_agent_of_the_organisation(actor, agents, api_client_for):
    semantic, text_only = agents
    say(semantic, "We hiked the Alps in June")
    say(text_only, "Hiking boots need breaking in", Message.Role.ASSISTANT)
    say(text_only, "Unrelated note about taxes")

    response = search(api_client_for(actor), query="hiking", search_mode="fts")

    assert response.status_code == 200, response.content
    found = {(item["agent_id"], item["message_type"]) for item in response.json()}
    assert found == {(semantic.id, "user_message"), (text_only.id, "assistant_message")}
    assert all(item["message_id"].startswith("message-") and item["created_at"] for item in response.json())


def test_vector_search_finds_by_meaning_with_the_agents_embedding_model(actor, agents, api_client_for):
    semantic, _ = agents
    hit, miss = say(semantic, "mountain trail hiking"), say(semantic, "quarterly tax forms")
    embedded(actor, semantic, hit, miss)

    response = search(api_client_for(actor), query="hiking trail", search_mode="vector", limit=1)

    assert [item["message_id"] for item in response.json()] == [hit.id]


def test_filters_by_agent_and_refuses_bad_input(actor, agents, api_client_for, other_org_actor):
    semantic, text_only = agents
    say(semantic, "hiking in June")
    say(text_only, "hiking in July")
    client = api_client_for(actor)

    one_agent = search(client, query="hiking", search_mode="fts", agent_id=text_only.id)
    blank = search(client, query="   ")
    bad_mode = search(client, query="x", search_mode="psychic")
    elsewhere = search(
        api_client_for(other_org_actor), query="hiking", search_mode="fts", agent_id=semantic.id
    )

    assert [item["content"] for item in one_agent.json()] == ["hiking in July"]
    assert (blank.status_code, bad_mode.status_code) == (422, 422)
    assert elsewhere.status_code == 404


def test_another_organisation_finds_nothing(actor, agents, api_client_for, other_org_actor):
    say(agents[0], "hiking secrets")

    response = search(api_client_for(other_org_actor), query="hiking", search_mode="fts")

    assert response.json() == []


@pytest.mark.django_db(transaction=True)
def test_the_sdk_searches(live_server, actor, agents):
    say(agents[1], "hiking in the rain")

    results = sdk_for(live_server, actor).messages.search(query="hiking", search_mode="fts")

    assert [(r.message_type, r.content) for r in results] == [("user_message", "hiking in the rain")]
