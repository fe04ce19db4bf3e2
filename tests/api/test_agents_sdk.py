"""The official Letta SDK (letta-client, unpatched) driving agents, core memory, tools, models and tags over
HTTP against pytest-django's live server. Only loopback is contacted."""

import socket
from collections.abc import Iterator

import pytest
from django.db import connections
from letta_client import Letta, NotFoundError, UnprocessableEntityError

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.models import Agent
from apps.agents.services import agent_create
from apps.llm.models import Provider
from tests.factories import ProviderFactory, ToolFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_persistent_connections_in_server_threads() -> Iterator[None]:
    """The live server answers each request in a new thread. With persistent connections (CONN_MAX_AGE)
    every such thread would leave a database session open, and the test database could not be dropped."""
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


def sdk_for(live_server, actor) -> Letta:
    raw_key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk").raw_key
    return Letta(base_url=live_server.url, api_key=raw_key, max_retries=0, timeout=20)


@pytest.fixture
def refused_openai(settings) -> None:
    """The deployment's OpenAI settings point at a loopback port that refuses connections."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.OPENAI_API_KEY = "sk-test"
    settings.OPENAI_BASE_URL = f"http://127.0.0.1:{port}/v1"
    settings.ANTHROPIC_API_KEY = ""
    settings.OLLAMA_BASE_URL = ""


def test_agent_lifecycle_through_the_sdk(live_server, actor, refused_openai):
    client = sdk_for(live_server, actor)

    agent = client.agents.create(
        name="Support",
        model="openai/gpt-4o-mini",
        embedding="openai/text-embedding-3-small",
        memory_blocks=[
            {"label": "human", "value": "Name: Sam", "limit": 5000},
            {"label": "persona", "value": "I am a helpful assistant."},
        ],
        tags=["support", "tier-1"],
        context_window_limit=16000,
    )
    fetched = client.agents.retrieve(agent.id, include=["agent.tags", "agent.blocks"])
    bare = client.agents.retrieve(agent.id)
    listed = list(client.agents.list(tags=["support"]))
    updated = client.agents.update(agent.id, description="Answers tickets", tags=["support"])

    assert agent.id.startswith("agent-")
    assert (agent.name, agent.agent_type, agent.model) == ("Support", "letta_v1_agent", "openai/gpt-4o-mini")
    assert agent.llm_config.model == "gpt-4o-mini"
    assert agent.llm_config.context_window == 16000
    assert agent.embedding_config.embedding_dim == 1536
    assert sorted(b.label for b in agent.memory.blocks) == ["human", "persona"]
    assert sorted(t.name for t in agent.tools) == ["conversation_search", "memory_insert", "memory_replace"]
    assert fetched.id == agent.id
    assert fetched.tags == ["support", "tier-1"]
    assert sorted(b.label for b in fetched.memory.blocks) == ["human", "persona"]
    assert (bare.tags, bare.blocks, bare.tools, bare.memory.blocks) == ([], [], [], [])  # not asked for
    assert [a.id for a in listed] == [agent.id]
    assert (updated.description, updated.tags) == ("Answers tickets", ["support"])


def test_core_memory_through_the_sdk(live_server, actor, refused_openai):
    client = sdk_for(live_server, actor)
    agent = client.agents.create(
        name="Memo",
        model="openai/gpt-4o-mini",
        memory_blocks=[{"label": "human", "value": "Name: Sam"}, {"label": "persona", "value": "Helpful"}],
    )

    labels = sorted(b.label for b in client.agents.blocks.list(agent.id))
    changed = client.agents.blocks.update("human", agent_id=agent.id, value="Name: Sam\nLikes tea")
    human = client.agents.blocks.retrieve("human", agent_id=agent.id)
    shared = client.blocks.create(label="project", value="Launch in May")
    attached = client.agents.blocks.attach(shared.id, agent_id=agent.id)
    detached = client.agents.blocks.detach(shared.id, agent_id=agent.id)

    assert labels == ["human", "persona"]
    assert changed.value == "Name: Sam\nLikes tea"
    assert human.value == "Name: Sam\nLikes tea"
    assert sorted(b.label for b in attached.blocks) == ["human", "persona", "project"]
    assert sorted(b.label for b in detached.blocks) == ["human", "persona"]


def test_tools_through_the_sdk(live_server, actor, refused_openai):
    client = sdk_for(live_server, actor)
    tool = ToolFactory(organization_id=actor.organization_id, name="lookup_order")
    agent = client.agents.create(name="Tooled", model="openai/gpt-4o-mini")

    attached = client.agents.tools.attach(tool.id, agent_id=agent.id)
    names = sorted(t.name for t in client.agents.tools.list(agent.id))
    detached = client.agents.tools.detach(tool.id, agent_id=agent.id)
    after = sorted(t.name for t in client.agents.tools.list(agent.id))

    assert attached is None  # Letta answers null to 1.x SDKs; the SDK types it Optional[AgentState]
    assert detached is None
    assert names == ["conversation_search", "lookup_order", "memory_insert", "memory_replace"]
    assert after == ["conversation_search", "memory_insert", "memory_replace"]


def test_models_and_tags_through_the_sdk(live_server, actor, refused_openai):
    ProviderFactory(
        organization_id=actor.organization_id, name="claude", provider_type=Provider.Type.ANTHROPIC
    )
    ProviderFactory(organization_id=actor.organization_id, name="oai", provider_type=Provider.Type.OPENAI)
    agent_create(actor=actor, name="Tagged", tags=["beta", "alpha"])
    client = sdk_for(live_server, actor)

    models = client.models.list()
    embeddings = client.models.embeddings.list()
    tags = client.tags.list()

    handles = [m.handle for m in models]
    assert "claude/claude-sonnet-4-5" in handles
    assert "oai/gpt-4o-mini" in handles
    assert not [h for h in handles if h.startswith("openai/")]  # its server refused: nothing listed
    assert {m.model_type for m in models} == {"llm"}
    assert [(e.handle, e.embedding_dim) for e in embeddings] == [
        ("oai/text-embedding-3-small", 1536),
        ("oai/text-embedding-3-large", 3072),
        ("oai/text-embedding-ada-002", 1536),
    ]
    assert tags == ["alpha", "beta"]


def test_delete_and_tenancy_through_the_sdk(live_server, actor, other_org_actor, refused_openai):
    client = sdk_for(live_server, actor)
    intruder = sdk_for(live_server, other_org_actor)
    agent = client.agents.create(name="Private", model="openai/gpt-4o-mini")

    with pytest.raises(NotFoundError) as excinfo:
        intruder.agents.retrieve(agent.id)
    with pytest.raises(NotFoundError):
        intruder.agents.update(agent.id, name="Hacked")
    with pytest.raises(NotFoundError):
        intruder.agents.delete(agent.id)
    with pytest.raises(NotFoundError):
        intruder.agents.blocks.list(agent.id)
    assert list(intruder.agents.list()) == []
    deleted = client.agents.delete(agent.id)

    assert excinfo.value.body == {
        "detail": f"Agent with id '{agent.id}' not found",
        "code": "agent_not_found",
    }
    assert deleted == {"message": f"Agent id={agent.id} successfully deleted"}
    assert not Agent.objects.for_actor(actor).filter(id=agent.id).exists()
    with pytest.raises(NotFoundError):
        client.agents.retrieve(agent.id)


def test_validation_errors_reach_the_sdk_as_422(live_server, actor, refused_openai):
    client = sdk_for(live_server, actor)

    with pytest.raises(UnprocessableEntityError) as excinfo:
        client.agents.create(name="x", agent_type="wizard")

    assert "agent_type" in excinfo.value.body["detail"]
