"""The list filters Letta documents for agents and blocks, each doing what it says (none dropped)."""

from __future__ import annotations

from datetime import UTC, datetime

from apps.agents.models import Agent
from apps.agents.services import agent_attach_block
from apps.memory.services import block_create
from tests.api.test_messages_api import new_agent


def names(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [item.get("name") or item.get("label") for item in response.json()]


def test_agents_order_by_each_documented_key(actor, api_client_for):
    first, second, third = (new_agent(actor, name=n, memory_blocks=[]) for n in ("first", "second", "third"))
    Agent.objects.for_actor(actor).filter(id=first.id).update(
        last_run_completion=datetime(2026, 3, 1, tzinfo=UTC), updated_at=datetime(2026, 1, 1, tzinfo=UTC)
    )
    Agent.objects.for_actor(actor).filter(id=third.id).update(
        last_run_completion=datetime(2026, 2, 1, tzinfo=UTC), updated_at=datetime(2026, 2, 1, tzinfo=UTC)
    )
    Agent.objects.for_actor(actor).filter(id=second.id).update(updated_at=datetime(2026, 3, 1, tzinfo=UTC))
    client = api_client_for(actor)

    by_run = names(client.get("/v1/agents/", {"order_by": "last_run_completion", "order": "desc"}))
    by_update = names(client.get("/v1/agents/", {"order_by": "updated_at", "order": "asc"}))
    page = names(client.get("/v1/agents/", {"order_by": "last_run_completion", "order": "desc", "limit": 1}))
    next_page = client.get(
        "/v1/agents/",
        {"order_by": "last_run_completion", "order": "desc", "after": first.id, "limit": 1},
    )

    assert by_run == ["first", "third", "second"]  # never ran: last
    assert by_update == ["first", "third", "second"]
    assert (page, names(next_page)) == (["first"], ["third"])


def test_agents_refuse_cloud_filters_and_unknown_orders(actor, api_client_for):
    client = api_client_for(actor)

    project = client.get("/v1/agents/", {"project_id": "proj-1"})
    order = client.get("/v1/agents/", {"order_by": "name"})

    assert (project.status_code, order.status_code) == (422, 422)
    assert project.json()["detail"].startswith("project_id: not supported")


def test_blocks_filter_by_search_terms_counts_and_hidden(actor, api_client_for):
    notes = block_create(actor=actor, label="notes", value="Likes green tea", limit=100, description="Taste")
    block_create(actor=actor, label="persona", value="Helpful", limit=100)
    block_create(actor=actor, label="secret", value="tea", limit=100, hidden=True)
    agent = new_agent(actor, memory_blocks=[])
    agent_attach_block(actor=actor, agent_id=agent.id, block_id=notes.id)
    client = api_client_for(actor)

    assert names(client.get("/v1/blocks/", {"value_search": "TEA"})) == ["notes"]
    assert names(client.get("/v1/blocks/", {"label_search": "erso"})) == ["persona"]
    assert names(client.get("/v1/blocks/", {"description_search": "taste"})) == ["notes"]
    assert names(client.get("/v1/blocks/", {"connected_to_agents_count_gt": 0})) == ["notes"]
    assert names(client.get("/v1/blocks/", {"connected_to_agents_count_eq": [0], "order": "asc"})) == [
        "persona"
    ]
    assert sorted(
        names(client.get("/v1/blocks/", {"value_search": "tea", "show_hidden_blocks": "true"}))
    ) == [
        "notes",
        "secret",
    ]
    assert client.get("/v1/blocks/count", {"value_search": "tea"}).json() == 1
    assert client.get("/v1/blocks/", {"project_id": "p"}).status_code == 422


def test_hidden_agents_are_listed_and_counted_only_with_show_hidden_agents(actor, api_client_for):
    client = api_client_for(actor)
    client.post("/v1/agents/", {"name": "visible"}, format="json")
    client.post("/v1/agents/", {"name": "subagent", "hidden": True}, format="json")

    default = names(client.get("/v1/agents/"))
    shown = names(client.get("/v1/agents/", {"show_hidden_agents": "true"}))
    counted = client.get("/v1/agents/count").json()
    counted_all = client.get("/v1/agents/count", {"show_hidden_agents": "true"}).json()

    assert default == ["visible"]
    assert sorted(shown) == ["subagent", "visible"]
    assert (counted, counted_all) == (1, 2)
