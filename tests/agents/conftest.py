"""Agent-loop fixtures: a scripted OpenAI-compatible server the loop reaches through litellm and HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from apps.agents.loop.events import ListSink
from apps.agents.models import Agent
from apps.agents.services import BlockSpec, MessageIn, agent_create, agent_send_message
from apps.core.actor import Actor
from tests.support.scripted_llm import ScriptedLLM


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
