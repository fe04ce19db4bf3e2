"""The workspace page itself: three columns for the agent, the no-provider notice, tenancy."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

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


def test_partials_do_not_load_the_organisation_switcher(
    client: Client, user: User, actor: Actor, llm: Any
) -> None:
    """Only full pages show the switcher; an HTMX partial reads the memberships once, for the actor."""
    client.force_login(user)
    agent = _agent(actor)

    def membership_queries(url: str, **headers: str) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url, **headers).status_code == 200
        return sum('"accounts_membership"' in q["sql"] for q in queries.captured_queries)

    assert membership_queries(f"/agents/{agent.id}/") == 2  # the actor, then the switcher
    assert (
        membership_queries(reverse("ade:conversation-column", args=[agent.id]), HTTP_HX_REQUEST="true") == 1
    )
