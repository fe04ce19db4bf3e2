"""Agent-loop fixtures: a scripted OpenAI-compatible server the loop reaches through litellm and HTTP."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from apps.agents.loop.events import ListSink
from apps.agents.models import Agent
from apps.agents.services import BlockSpec, MessageIn, agent_create, agent_send_message
from apps.core.actor import Actor
from tests.support.scripted_llm import ScriptedLLM, ScriptedLLMServer


@pytest.fixture(scope="session")
def scripted_server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer(strict=True) as server:
        yield server


@pytest.fixture
def llm(scripted_server: ScriptedLLMServer, settings) -> Iterator[ScriptedLLM]:  # type: ignore[no-untyped-def]
    """The scripted LLM, reset, with the deployment's OpenAI settings pointing at it and fast retries."""
    settings.OPENAI_API_KEY = "sk-test"
    settings.OPENAI_BASE_URL = scripted_server.url
    settings.LLM_MAX_ATTEMPTS = 3
    settings.LLM_RETRY_BASE_DELAY = 0.001
    settings.LLM_RETRY_MAX_DELAY = 0.01
    settings.LLM_REQUEST_TIMEOUT = 10.0
    client = scripted_server.client()
    client.reset(config=True)
    client.configure(strict=True)
    yield client
    client.reset(config=True)


@pytest.fixture
def make_agent(actor: Actor, llm: ScriptedLLM) -> Callable[..., Agent]:
    def make(**kwargs: Any) -> Agent:
        kwargs.setdefault("name", "Assistant")
        kwargs.setdefault("model", "openai/gpt-4o-mini")
        kwargs.setdefault("embedding", "openai/text-embedding-3-small")
        kwargs.setdefault(
            "memory_blocks",
            [
                BlockSpec(label="human", value="Name: unknown", limit=2000),
                BlockSpec(label="persona", value="I am a helpful assistant.", limit=2000),
            ],
        )
        return agent_create(actor=actor, **kwargs)

    return make


@pytest.fixture
def send(actor: Actor) -> Callable[..., Any]:
    """Send as the user and run the turn now; returns (TurnResult, events)."""

    def do(agent: Agent, text: str | None = None, **inputs: Any) -> Any:
        sink = ListSink()
        if text is not None:
            inputs["messages"] = [MessageIn(content=text)]
        result = agent_send_message(actor=actor, agent_id=agent.id, sink=sink, **inputs)
        result.events = sink.events
        return result

    return do
