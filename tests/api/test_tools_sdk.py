"""The official Letta SDK (letta-client, unpatched) against a live server: tools, archival memory, agent files."""

import json

import pytest
from letta_client import BadRequestError, Letta, NotFoundError

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.models import Agent, Run
from apps.agents.services import BlockSpec, agent_create
from apps.core.actor import Actor
from apps.tools.models import Tool
from tests.api.test_agent_file import without_volatile

pytestmark = pytest.mark.django_db(transaction=True)

WEATHER_SOURCE = '''
def get_weather(city: str, unit: str = "celsius") -> str:
    """Tell the weather in a city.

    Args:
        city (str): The city.
        unit (str): celsius or fahrenheit.
    """
    return f"Sunny in {city}"
'''


@pytest.fixture
def client(live_server, actor: Actor, llm) -> Letta:
    """The SDK as a user would build it; `llm` points embeddings at the scripted server."""
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk").raw_key
    return Letta(base_url=live_server.url, api_key=key, max_retries=0)


@pytest.fixture
def agent(actor: Actor, llm) -> Agent:
    return agent_create(
        actor=actor,
        name="SDK agent",
        model="openai/gpt-4o-mini",
        embedding="openai/text-embedding-small-384",
        memory_blocks=[BlockSpec(label="human", value="Name: Sam", limit=1000)],
    )


def test_tool_lifecycle_through_the_sdk(client, actor):
    created = client.tools.upsert(source_code=WEATHER_SOURCE, tags=["weather"])

    fetched = client.tools.retrieve(created.id)
    listed = client.tools.list(name="get_weather")
    updated = client.tools.update(created.id, description="Weather, briefly.", metadata={"owner": "sam"})
    found = client.tools.search(query="weather city")
    client.tools.delete(created.id)

    assert (created.name, created.tool_type, created.tags) == ("get_weather", "custom", ["weather"])
    assert created.json_schema["parameters"]["required"] == ["city"]
    assert fetched.source_code == WEATHER_SOURCE
    assert [t.id for t in listed.items] == [created.id]
    assert (updated.description, updated.metadata) == ("Weather, briefly.", {"owner": "sam"})
    assert found[0].tool.id == created.id
    assert not Tool.objects.for_actor(actor).filter(id=created.id).exists()
    with pytest.raises(NotFoundError):
        client.tools.retrieve(created.id)


def test_a_bad_docstring_raises_bad_request_with_the_reason(client):
    source = WEATHER_SOURCE.replace("        unit (str): celsius or fahrenheit.\n", "")

    with pytest.raises(BadRequestError) as error:
        client.tools.create(source_code=source)

    assert error.value.body["detail"] == (
        "parameter 'unit' of tool 'get_weather' is not described in the docstring's Args section"
    )


def test_auto_pagination_of_tools_stops(client):
    for name in ("alpha", "beta", "gamma"):
        client.tools.create(source_code=WEATHER_SOURCE.replace("get_weather", name))

    names = [t.name for t in client.tools.list(limit=2, tool_types=["custom"])]

    assert sorted(names) == ["alpha", "beta", "gamma"]


def test_archival_memory_through_the_sdk(client, agent):
    [hiking] = client.agents.passages.create(agent.id, text="Sam loves hiking in the Alps", tags=["hobby"])
    client.agents.passages.create(agent.id, text="The cat is named Tom")

    listed = client.agents.passages.list(agent.id)
    found = client.agents.passages.search(agent.id, query="hiking trips", top_k=1)
    client.agents.passages.delete(hiking.id, agent_id=agent.id)
    remaining = client.agents.passages.list(agent.id)

    assert hiking.text == "Sam loves hiking in the Alps"
    assert len(hiking.embedding) == 384
    assert [p.text for p in listed] == ["Sam loves hiking in the Alps", "The cat is named Tom"]
    assert (found.count, found.results[0].id, found.results[0].tags) == (1, hiking.id, ["hobby"])
    assert [p.text for p in remaining] == ["The cat is named Tom"]


def test_tool_approval_through_the_sdk(client, actor, agent):
    result = client.agents.tools.update_approval(
        "memory_insert", agent_id=agent.id, body_requires_approval=True
    )

    assert result is None
    assert Agent.objects.for_actor(actor).get(id=agent.id).tool_rules == [
        {"type": "requires_approval", "tool_name": "memory_insert"}
    ]


def test_export_and_import_through_the_sdk(client, actor, agent):
    client.tools.upsert(source_code=WEATHER_SOURCE)
    exported = client.agents.export_file(agent.id)

    imported = client.agents.import_file(
        file=("agent.af", exported.encode(), "application/json"), append_copy_suffix=False
    )

    [new_id] = imported.agent_ids
    again = client.agents.export_file(new_id)
    first, second = json.loads(exported), json.loads(again)
    assert isinstance(exported, str)
    assert first["agents"][0]["name"] == "SDK agent"
    assert without_volatile(second) == without_volatile(first)
    assert Agent.objects.for_actor(actor).count() == 2


# --- issue 18: running an agent's tool, a block's agents, a run's trace, health -------------------------


def test_running_an_agents_tool_through_the_sdk(client, actor, agent, settings):
    settings.SANDBOX_BACKEND = "local"
    tool = client.tools.upsert(source_code=WEATHER_SOURCE)
    client.agents.tools.attach(tool.id, agent_id=agent.id)

    result = client.agents.tools.run("get_weather", agent_id=agent.id, args={"city": "Oslo"})
    with pytest.raises(NotFoundError) as missing:
        client.agents.tools.run("no_such_tool", agent_id=agent.id, args={})

    assert (result.status, result.func_return, result.stderr) == ("success", "Sunny in Oslo", [])
    assert (
        missing.value.body["detail"] == f"Tool 'no_such_tool' not found or not attached to agent '{agent.id}'"
    )


def test_listing_a_blocks_agents_through_the_sdk(client, actor, agent):
    [block] = client.agents.blocks.list(agent_id=agent.id).items

    agents = client.blocks.agents.list(block.id)

    assert [a.id for a in agents.items] == [agent.id]
    assert agents.items[0].name == "SDK agent"


def test_a_runs_trace_through_the_sdk(client, actor, agent):
    run = Run.all_objects.create(organization_id=actor.organization_id, agent=agent)

    spans = client.runs.trace.retrieve(run.id, limit=50)

    assert spans == []


def test_health_through_the_sdk_reports_the_letta_api_version(client):
    health = client.health()

    assert (health.status, health.version) == ("ok", "0.16.7")
