"""The workspace page itself: three columns for the agent, the no-provider notice, tenancy."""

from __future__ import annotations

from typing import Any

from django.test import Client

from apps.accounts.models import User
from apps.agents.services import BlockSpec, agent_create
from apps.core.actor import Actor


def _agent(actor: Actor) -> Any:
    return agent_create(
        actor=actor,
        name="Helper",
        model="openai/gpt-4o-mini",
        memory_blocks=[BlockSpec(label="human", value="Name: Ada", limit=2000)],
    )


def test_the_workspace_shows_configuration_conversation_and_memory(
    client: Client, user: User, actor: Actor, llm: Any
) -> None:
    client.force_login(user)
    agent = _agent(actor)

    html = client.get(f"/agents/{agent.id}/").content.decode()

    for column in ("config-column", "conversation-column", "memory-column"):
        assert f'id="{column}"' in html
    assert "Name: Ada" in html  # the core memory block, in place
    assert 'data-testid="no-provider-banner"' not in html


def test_the_workspace_says_when_no_llm_provider_is_configured(
    client: Client, user: User, actor: Actor, settings: Any
) -> None:
    settings.OPENAI_API_KEY = settings.OPENAI_BASE_URL = ""
    settings.ANTHROPIC_API_KEY = settings.OLLAMA_BASE_URL = ""
    client.force_login(user)
    agent = _agent(actor)

    html = client.get(f"/agents/{agent.id}/").content.decode()

    assert 'data-testid="no-provider-banner"' in html
    assert "/settings/providers/" in html


def test_another_organisations_workspace_is_not_found(
    client: Client, user: User, other_org_actor: Actor, llm: Any
) -> None:
    client.force_login(user)
    theirs = _agent(other_org_actor)

    assert client.get(f"/agents/{theirs.id}/").status_code == 404


def test_signed_out_visitors_are_sent_to_sign_in(client: Client, actor: Actor, llm: Any) -> None:
    agent = _agent(actor)

    response = client.get(f"/agents/{agent.id}/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")
