"""Which relationships an AgentState carries, as Letta decides it: a 1.x client (the official SDK, a request
with no User-Agent) gets from the agents list and retrieve only what `include` asks for; a pre-1.0 client
gets everything unless it names `include_relationships`; the other AgentState lists only ever carry what
`include` asks for."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from apps.agents.services import BlockSpec, agent_create
from apps.identities.services import identity_create
from tests.factories import ToolFactory

SDK = {"HTTP_X_STAINLESS_PACKAGE_VERSION": "1.12.1", "HTTP_USER_AGENT": "Letta/Python 1.12.1"}
LEGACY = {"HTTP_USER_AGENT": "python-requests/2.32.3"}
RELATIONSHIPS = ("blocks", "tools", "sources", "tags", "identity_ids", "identities", "secrets")


@pytest.fixture
def client(actor, api_client_for) -> APIClient:
    return api_client_for(actor)


@pytest.fixture
def agent(actor):
    made = agent_create(
        actor=actor,
        name="Support",
        model="openai/gpt-4o-mini",
        memory_blocks=[BlockSpec(label="human", value="Name: Sam"), BlockSpec(label="persona", value="Kind")],
        tags=["support"],
        secrets_={"TOKEN": "s3cr3t"},
    )
    identity_create(actor=actor, identifier_key="sam", name="Sam", identity_type="user", agent_ids=[made.id])
    return made


def carried(state: dict) -> dict:
    return {name: state[name] for name in RELATIONSHIPS} | {"memory.blocks": state["memory"]["blocks"]}


def test_the_sdk_gets_only_the_agents_own_fields_unless_it_asks(client, agent):
    retrieved = client.get(f"/v1/agents/{agent.id}", **SDK).json()
    [listed] = client.get("/v1/agents/", **SDK).json()

    for state in (retrieved, listed):
        assert (state["id"], state["name"], state["model"]) == (agent.id, "Support", "openai/gpt-4o-mini")
        assert state["llm_config"]["model"] == "gpt-4o-mini"
        assert state["message_ids"]  # the agent's own columns are always there
        assert set(map(len, carried(state).values())) == {0}
        assert (state["managed_group"], state["pending_approval"]) == (None, None)


def test_a_request_with_no_user_agent_is_a_1x_client_as_on_letta(client, agent):
    state = client.get(f"/v1/agents/{agent.id}").json()
    tool_id = agent.tools.first().id
    detached = client.patch(f"/v1/agents/{agent.id}/tools/detach/{tool_id}")

    assert set(map(len, carried(state).values())) == {0}
    assert (detached.status_code, detached.content) == (200, b"null")  # as to the SDK
    assert not agent.tools.filter(id=tool_id).exists()


def test_include_names_what_the_sdk_gets(client, agent):
    state = client.get(
        f"/v1/agents/{agent.id}", {"include": ["agent.blocks", "agent.tools", "agent.identities"]}, **SDK
    ).json()

    assert sorted(b["label"] for b in state["blocks"]) == ["human", "persona"]
    assert state["memory"]["blocks"] == state["blocks"]
    assert sorted(t["name"] for t in state["tools"]) == [
        "conversation_search",
        "memory_insert",
        "memory_replace",
    ]
    assert state["tags"] == ["support"]  # the blocks bring the tags, as on Letta
    [identity] = state["identities"]
    assert (identity["identifier_key"], identity["agent_ids"]) == ("sam", [agent.id])
    assert state["identity_ids"] == [identity["id"]]
    assert (state["sources"], state["secrets"]) == ([], [])


def test_a_pre_1_0_client_gets_every_relationship_unless_it_names_some(client, agent):
    everything = client.get(f"/v1/agents/{agent.id}", **LEGACY).json()
    named = client.get(f"/v1/agents/{agent.id}", {"include_relationships": ["tools"]}, **LEGACY).json()

    assert len(everything["blocks"]) == 2
    assert len(everything["tools"]) == 3
    assert everything["tags"] == ["support"]
    assert [s["key"] for s in everything["secrets"]] == ["TOKEN"]
    assert [s["value"] for s in everything["secrets"]] == [None]
    assert len(everything["identities"]) == 1
    assert everything["pending_approval"] is None  # only ever with include=agent.pending_approval
    assert len(named["tools"]) == 3
    assert (named["blocks"], named["tags"], named["secrets"]) == ([], [], [])


def test_an_unknown_include_is_a_422_naming_it(client, agent):
    response = client.get(f"/v1/agents/{agent.id}", {"include": ["agent.everything"]}, **SDK)
    listed = client.get("/v1/agents/", {"include": "tools"}, **SDK)

    assert response.status_code == 422
    assert "include" in response.json()["detail"]
    assert listed.status_code == 422


def test_the_blocks_agents_carry_only_what_include_asks_even_for_a_pre_1_0_client(client, agent):
    block_id = agent.blocks.get(label="human").id

    [bare] = client.get(f"/v1/blocks/{block_id}/agents", **LEGACY).json()
    [asked] = client.get(f"/v1/blocks/{block_id}/agents", {"include": "agent.tools"}, **LEGACY).json()

    assert bare["id"] == agent.id
    assert set(map(len, carried(bare).values())) == {0}
    assert len(asked["tools"]) == 3


def test_a_bare_page_of_50_agents_costs_fewer_statements_than_a_full_one(actor, client):
    tool = ToolFactory(organization_id=actor.organization_id, name="lookup")
    for number in range(50):
        made = agent_create(
            actor=actor, name=f"a{number}", memory_blocks=[BlockSpec(label="human", value="x")]
        )
        made.tools.add(tool)

    client.get("/v1/tags/")  # the key's first use records it: not part of either page
    with CaptureQueriesContext(connection) as bare:
        bare_page = client.get("/v1/agents/", **SDK)
    with CaptureQueriesContext(connection) as full:
        full_page = client.get("/v1/agents/", **LEGACY)

    assert len(bare_page.json()) == len(full_page.json()) == 50
    assert len(bare_page.content) * 4 < len(full_page.content)
    # The key, the page (its file limits joined), the organisation's providers; in full also the blocks,
    # secrets, tools, identities, and the folders with the file blocks.
    assert (len(bare.captured_queries), len(full.captured_queries)) == (3, 8)


def test_an_agent_state_is_what_its_declared_fields_render(actor, agent, monkeypatch):
    """AgentStateOut builds its object directly (for speed); DRF's own rendering of the declared fields,
    which the OpenAPI schema describes, must give the same."""
    from rest_framework import serializers

    from apps.agents import selectors as agent_selectors
    from apps.api.serializers import agents as agent_serializers

    def rendered() -> dict:
        loaded = agent_selectors.agent_state_get(actor=actor, agent_id=agent.id)
        return agent_serializers.agent_state(loaded, actor=actor)

    direct = rendered()
    monkeypatch.setattr(
        agent_serializers.AgentStateOut, "to_representation", serializers.Serializer.to_representation
    )
    declared = rendered()

    assert direct == declared
    assert list(direct) == list(declared)  # the same order of keys too
    assert direct["blocks"]
    assert direct["tools"]
    assert direct["secrets"]
    assert direct["identities"]
