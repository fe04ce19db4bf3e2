"""The ADE's git view of an agent's memory: the switch (the tag), the clone URL and the commits."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.accounts.models import User
from apps.agents.models import Agent
from apps.agents.services import BlockSpec, agent_create
from apps.core.actor import Actor, Role
from apps.memory.models import Block
from apps.memory.services import GIT_MEMORY_TAG

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent(actor: Actor) -> Agent:
    return agent_create(
        actor=actor,
        name="Helper",
        model="openai/gpt-4o-mini",
        embedding="openai/text-embedding-3-small",
        memory_blocks=[BlockSpec(label="human", value="Name: Sam", limit=2000)],
    )


def test_enabling_git_memory_tags_the_agent_and_lists_its_commits(client: Client, user: User, agent):
    client.force_login(user)

    enabled = client.post(f"/agents/{agent.id}/git/", {"enabled": "on"})
    page = client.get(f"/agents/{agent.id}/git/")

    agent.refresh_from_db()
    html = page.content.decode()
    assert enabled.status_code == 302
    assert GIT_MEMORY_TAG in agent.tags
    assert list(
        Block.objects.unscoped().filter(agent_attachments__agent=agent).values_list("label", flat=True)
    ) == ["system/human"]
    assert f"git clone http://testserver/v1/git/{agent.id}/state.git" in html
    assert html.count('data-testid="git-commit"') == 2
    assert "Rename human to system/human" in html
    assert "Create human" in html
    assert user.username in html


def test_disabling_removes_only_the_tag(client: Client, user: User, agent):
    client.force_login(user)
    client.post(f"/agents/{agent.id}/git/", {"enabled": "on"})

    client.post(f"/agents/{agent.id}/git/", {})
    page = client.get(f"/agents/{agent.id}/git/")

    agent.refresh_from_db()
    assert GIT_MEMORY_TAG not in agent.tags
    assert 'data-testid="git-memory-clone"' not in page.content.decode()


def test_a_member_who_did_not_create_the_agent_cannot_switch_it(client: Client, org, agent, make_user):
    member = make_user(org, role=Role.MEMBER)
    client.force_login(member)

    response = client.post(f"/agents/{agent.id}/git/", {"enabled": "on"})

    agent.refresh_from_db()
    assert response.status_code == 403
    assert GIT_MEMORY_TAG not in agent.tags


def test_another_organisations_agent_is_not_found(client: Client, other_user: User, agent):
    client.force_login(other_user)

    response = client.get(f"/agents/{agent.id}/git/")

    assert response.status_code == 404


def test_the_memory_column_links_to_the_git_view(client: Client, user: User, agent):
    client.force_login(user)

    page = client.get(f"/agents/{agent.id}/")

    assert f'href="/agents/{agent.id}/git/"' in page.content.decode()
