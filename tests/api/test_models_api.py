"""/v1/models/ and /v1/models/embedding: the handles an organisation can use, from its providers and the
deployment's environment. Only loopback servers are contacted."""

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from apps.agents import selectors as agent_selectors
from apps.agents.services import agent_create
from apps.llm.models import Provider
from tests.factories import ProviderFactory
from tests.support.outbound import loopback_only


@pytest.fixture(autouse=True)
def _no_environment_providers(settings) -> None:
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = ""
    settings.ANTHROPIC_API_KEY = ""
    settings.OLLAMA_BASE_URL = ""


@pytest.fixture
def refused_url() -> str:
    """A loopback URL nothing listens on: connections are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A loopback server that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def handles(response) -> list[str]:
    return [m["handle"] for m in response.json()]


def test_no_provider_means_no_models(actor, api_client_for):
    client = api_client_for(actor)

    assert client.get("/v1/models/").json() == []
    assert client.get("/v1/models/embedding").json() == []


def test_an_openai_key_lists_the_known_openai_models(actor, api_client_for, settings):
    settings.OPENAI_API_KEY = "sk-test"
    client = api_client_for(actor)

    chat = client.get("/v1/models/")
    embedding = client.get("/v1/models/embedding")

    assert handles(chat) == [f"openai/{name}" for name in agent_selectors.KNOWN_OPENAI_CHAT_MODELS]
    mini = chat.json()[0]
    assert mini == {
        "handle": "openai/gpt-4o-mini",
        "model": "gpt-4o-mini",
        "name": "gpt-4o-mini",
        "display_name": "gpt-4o-mini",
        "model_endpoint_type": "openai",
        "model_endpoint": "https://api.openai.com/v1",
        "provider_type": "openai",
        "provider_name": "openai",
        "provider_category": "base",
        "context_window": 32768,
        "max_context_window": 128000,
        "model_type": "llm",
    }
    assert [(m["handle"], m["embedding_dim"]) for m in embedding.json()] == [
        ("openai/text-embedding-3-small", 1536),
        ("openai/text-embedding-3-large", 3072),
        ("openai/text-embedding-ada-002", 1536),
    ]
    assert embedding.json()[0]["model_type"] == "embedding"
    assert embedding.json()[0]["embedding_endpoint_type"] == "openai"


def test_an_openai_compatible_server_is_asked_for_its_models(actor, api_client_for, llm):
    client = api_client_for(actor)

    chat = client.get("/v1/models/")
    embedding = client.get("/v1/models/embedding")

    assert handles(chat) == ["openai/scripted-chat"]
    assert chat.json()[0]["context_window"] == 32768
    assert [(m["handle"], m["embedding_dim"]) for m in embedding.json()] == [
        ("openai/text-embedding-3-small", 1536),
        ("openai/text-embedding-small-384", None),
    ]


def test_a_server_that_refuses_connections_contributes_nothing(actor, api_client_for, settings, refused_url):
    settings.OPENAI_API_KEY = "sk-test"
    settings.OPENAI_BASE_URL = refused_url
    settings.ANTHROPIC_API_KEY = "sk-ant-test"

    response = api_client_for(actor).get("/v1/models/")

    assert response.status_code == 200
    assert handles(response) == [f"anthropic/{n}" for n in agent_selectors.KNOWN_ANTHROPIC_CHAT_MODELS]


def test_a_server_that_never_answers_is_given_up_on_quickly(
    actor, api_client_for, settings, silent_url, monkeypatch
):
    monkeypatch.setattr(agent_selectors, "MODEL_LIST_TIMEOUT", 0.3)
    settings.OLLAMA_BASE_URL = silent_url.removesuffix("/v1")
    client = api_client_for(actor)

    started = time.monotonic()
    response = client.get("/v1/models/")
    elapsed = time.monotonic() - started

    assert response.json() == []
    assert elapsed < 2


def test_anthropic_models_and_no_anthropic_embeddings(actor, api_client_for, settings):
    settings.ANTHROPIC_API_KEY = "sk-ant-test"
    client = api_client_for(actor)

    chat = client.get("/v1/models/").json()

    assert [m["handle"] for m in chat] == [
        f"anthropic/{n}" for n in agent_selectors.KNOWN_ANTHROPIC_CHAT_MODELS
    ]
    assert {(m["provider_type"], m["model_endpoint_type"], m["max_context_window"]) for m in chat} == {
        ("anthropic", "anthropic", 200000)
    }
    assert client.get("/v1/models/embedding").json() == []


def test_the_organisations_providers_are_listed_and_shadow_the_environment(
    actor, other_org_actor, api_client_for, settings, llm
):
    ProviderFactory(organization_id=actor.organization_id, name="openai", provider_type=Provider.Type.OPENAI)
    ProviderFactory(
        organization_id=actor.organization_id,
        name="local",
        provider_type=Provider.Type.OPENAI_COMPATIBLE,
        api_key="",
        base_url=settings.OPENAI_BASE_URL,
    )
    client = api_client_for(actor)

    chat = client.get("/v1/models/").json()

    assert [m["handle"] for m in chat] == [
        "local/scripted-chat",
        *(f"openai/{n}" for n in agent_selectors.KNOWN_OPENAI_CHAT_MODELS),
    ]
    assert {m["provider_category"] for m in chat} == {"byok"}
    assert chat[0]["provider_type"] == "openai"
    assert handles(api_client_for(other_org_actor).get("/v1/models/")) == ["openai/scripted-chat"]


def test_a_provider_missing_what_it_needs_lists_nothing(actor, api_client_for):
    ProviderFactory(
        organization_id=actor.organization_id, name="claude", provider_type="anthropic", api_key=""
    )

    assert api_client_for(actor).get("/v1/models/").json() == []


def test_models_can_be_filtered_by_provider(actor, api_client_for, settings):
    settings.OPENAI_API_KEY = "sk-test"
    settings.ANTHROPIC_API_KEY = "sk-ant-test"
    ProviderFactory(organization_id=actor.organization_id, name="mine", provider_type=Provider.Type.ANTHROPIC)
    client = api_client_for(actor)

    def providers(query):
        return sorted({m["provider_name"] for m in client.get("/v1/models/", query).json()})

    assert providers({"provider_name": "anthropic"}) == ["anthropic"]
    assert providers({"provider_type": "anthropic"}) == ["anthropic", "mine"]
    assert providers({"provider_category": "byok"}) == ["mine"]
    assert providers({"provider_category": ["base", "byok"]}) == ["anthropic", "mine", "openai"]


def test_the_embedding_route_is_not_mistaken_for_anything_else(actor, api_client_for, settings):
    settings.OPENAI_API_KEY = "sk-test"
    client = api_client_for(actor)

    slash = client.get("/v1/models/embedding/")
    plain = client.get("/v1/models")

    assert {m["model_type"] for m in slash.json()} == {"embedding"}
    assert {m["model_type"] for m in plain.json()} == {"llm"}


# --- no deployment hostname reaches a tenant ------------------------------------------------------------------


def test_models_and_agent_state_never_show_the_deployments_llm_host(actor, api_client_for, llm, settings):
    """The deployment's OPENAI_BASE_URL (the scripted server on 127.0.0.1) is internal: its model_endpoint
    is null wherever a tenant reads it (Letta's field stays, optional)."""
    client = api_client_for(actor)
    agent = agent_create(
        actor=actor, name="a", model="openai/scripted-chat", embedding="openai/text-embedding-3-small"
    )

    models = client.get("/v1/models/")
    embeddings = client.get("/v1/models/embedding")
    state = client.get(f"/v1/agents/{agent.id}")
    states = client.get("/v1/agents/")

    assert [(m["handle"], m["model_endpoint"]) for m in models.json()] == [("openai/scripted-chat", None)]
    assert {m["embedding_endpoint"] for m in embeddings.json()} == {None}
    assert state.json()["llm_config"]["model_endpoint"] is None
    assert state.json()["embedding_config"]["embedding_endpoint"] is None
    host = urlsplit(settings.OPENAI_BASE_URL).netloc
    for response in (models, embeddings, state, states):
        assert response.status_code == 200
        assert host not in response.content.decode()


def test_an_organisations_own_url_is_shown_to_it_without_credentials(
    actor, api_client_for, llm, monkeypatch, refused_url
):
    loopback_only(monkeypatch)
    with_credentials = refused_url.replace("http://", "http://user:s3cret@")
    ProviderFactory(
        organization_id=actor.organization_id,
        name="local",
        provider_type=Provider.Type.OPENAI_COMPATIBLE,
        api_key="",
        base_url=with_credentials,
    )
    agent = agent_create(actor=actor, name="a", model="local/qwen", embedding="openai/text-embedding-3-small")

    state = api_client_for(actor).get(f"/v1/agents/{agent.id}")

    assert state.json()["llm_config"]["model_endpoint"] == refused_url
    assert "s3cret" not in state.content.decode()


def test_a_stored_private_provider_url_is_never_listed_from(actor, api_client_for):
    # A row stored before the outbound guard (or by hand): listing its models must not connect to it.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        ProviderFactory(
            organization_id=actor.organization_id,
            name="inside",
            provider_type=Provider.Type.OPENAI_COMPATIBLE,
            api_key="",
            base_url=f"http://127.0.0.1:{listener.getsockname()[1]}/v1",
        )

        chat = api_client_for(actor).get("/v1/models/")
        with pytest.raises(TimeoutError):
            listener.accept()

    assert chat.status_code == 200
    assert not [m for m in chat.json() if m["handle"].startswith("inside/")]
