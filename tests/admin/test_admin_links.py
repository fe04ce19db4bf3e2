"""What the admin links stays in one organisation: user pickers list the organisation's members, an agent
takes only its own organisation's blocks, tools and archives, and the database refuses the rest."""

from html import unescape

import pytest
from django.contrib.auth.models import Permission
from django.db import IntegrityError, transaction
from django.urls import reverse

from apps.accounts.models import ApiKey, Membership
from apps.agents.models import AgentTool, Conversation
from apps.core.actor import Role
from apps.memory.models import AgentBlock
from tests.admin.html_form import form_data, select_options
from tests.factories import AgentFactory, ArchiveFactory, BlockFactory, ToolFactory, UserFactory


def text(response) -> str:
    return unescape(response.content.decode())


@pytest.fixture
def two_org_owner(org, other_org):
    """A staff user (not a superuser) who owns both organisations."""
    staff = UserFactory(username="olga", is_staff=True)
    for organization in (org, other_org):
        Membership.objects.create(user=staff, organization=organization, role=Role.OWNER)
    staff.user_permissions.set(Permission.objects.all())
    return staff


@pytest.fixture
def superuser(org):
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    Membership.objects.create(user=root, organization=org, role=Role.OWNER)
    return root


# --- user pickers ---------------------------------------------------------------------------------------


def test_the_key_user_picker_lists_only_members_of_the_editors_organisations(
    client, user, other_user, make_user, org
):
    carol = make_user(org, username="carol")
    user.is_staff = True
    user.save()
    user.user_permissions.set(Permission.objects.all())
    client.force_login(user)

    html = client.get(reverse("admin:accounts_apikey_add")).content.decode()

    assert sorted(select_options(html, "apikey_form", "user")) == sorted([user.id, carol.id])


def test_a_stored_rows_user_picker_lists_only_its_organisations_members_even_for_a_superuser(
    client, superuser, user, other_user, org
):
    conversation = Conversation.all_objects.create(organization=org, agent=AgentFactory(organization=org))
    client.force_login(superuser)

    html = client.get(reverse("admin:agents_conversation_change", args=[conversation.id])).content.decode()

    assert sorted(select_options(html, "conversation_form", "created_by")) == sorted([user.id, superuser.id])


def test_a_key_for_someone_outside_its_organisation_is_refused_also_for_a_superuser(
    client, superuser, org, other_user
):
    client.force_login(superuser)

    response = client.post(
        reverse("admin:accounts_apikey_add"), {"organization": org.id, "user": other_user.id, "name": "x"}
    )

    assert response.status_code == 200
    assert "'bob' is not a member of this api key's organization." in text(response)
    assert not ApiKey.all_objects.filter(user=other_user).exists()


# --- an agent's blocks, tools and archives ----------------------------------------------------------------


def agent_form_with(client, agent, prefix: str, field: str, value: str):
    """The agent's change form as rendered, with one inline row (`prefix`) added that names `value`."""
    data = form_data(
        client.get(reverse("admin:agents_agent_change", args=[agent.id])).content.decode(), "agent_form"
    )
    index = int(data[f"{prefix}-TOTAL_FORMS"][0])
    data[f"{prefix}-TOTAL_FORMS"] = [str(index + 1)]
    data[f"{prefix}-{index}-{field}"] = [value]
    data[f"{prefix}-{index}-agent"] = [agent.id]
    return data


def test_the_agent_form_refuses_a_block_of_another_organisation(client, two_org_owner, org, other_org):
    agent = AgentFactory(organization=org)
    foreign = BlockFactory(organization=other_org, label="human")
    client.force_login(two_org_owner)

    response = client.post(
        reverse("admin:agents_agent_change", args=[agent.id]),
        agent_form_with(client, agent, "block_attachments", "block", foreign.id),
    )

    assert response.status_code == 200
    assert f"Block 'human ({foreign.id})' belongs to another organization than this agent" in text(response)
    assert not AgentBlock.objects.filter(agent=agent).exists()


def test_the_agent_form_refuses_a_tool_of_another_organisation(client, two_org_owner, org, other_org):
    agent = AgentFactory(organization=org)
    foreign = ToolFactory(organization=other_org, name="exfiltrate")
    client.force_login(two_org_owner)

    response = client.post(
        reverse("admin:agents_agent_change", args=[agent.id]),
        agent_form_with(client, agent, "tool_attachments", "tool", foreign.id),
    )

    assert response.status_code == 200
    assert "Tool 'exfiltrate' belongs to another organization than this agent" in text(response)
    assert not AgentTool.objects.filter(agent=agent).exists()


def test_the_agent_form_refuses_an_archive_of_another_organisation(client, two_org_owner, org, other_org):
    agent = AgentFactory(organization=org)
    foreign = ArchiveFactory(organization=other_org, name="their notes")
    client.force_login(two_org_owner)
    url = reverse("admin:agents_agent_change", args=[agent.id])
    data = form_data(client.get(url).content.decode(), "agent_form")
    data["archives"] = [foreign.id]

    response = client.post(url, data)

    assert response.status_code == 200
    assert "Archive 'their notes' belongs to another organization than this agent" in text(response)
    assert not agent.archives.exists()


def test_the_agent_form_attaches_a_block_of_the_agents_organisation(client, two_org_owner, org):
    agent = AgentFactory(organization=org)
    block = BlockFactory(organization=org, label="human")
    client.force_login(two_org_owner)

    response = client.post(
        reverse("admin:agents_agent_change", args=[agent.id]),
        agent_form_with(client, agent, "block_attachments", "block", block.id),
    )

    assert response.status_code == 302
    assert list(AgentBlock.objects.filter(agent=agent).values_list("block_id", "block_label")) == [
        (block.id, "human")
    ]


def test_a_member_cannot_attach_a_block_someone_else_created_to_their_agent(client, org, user, make_user):
    member = make_user(org, role=Role.MEMBER, username="mia", is_staff=True)
    member.user_permissions.set(Permission.objects.all())
    agent = AgentFactory(organization=org, created_by=member)
    block = BlockFactory(organization=org, label="human", created_by=user)
    client.force_login(member)

    response = client.post(
        reverse("admin:agents_agent_change", args=[agent.id]),
        agent_form_with(client, agent, "block_attachments", "block", block.id),
    )

    assert response.status_code == 200
    assert (
        "only its creator, an owner or an admin may modify or delete a block, attach it to an agent"
        in text(response)
    )
    assert not AgentBlock.objects.filter(agent=agent).exists()


# --- the database -----------------------------------------------------------------------------------------

CROSS_ORG_LINKS = {
    "block": lambda agent, other: AgentBlock.objects.create(
        agent=agent, block=BlockFactory(organization=other), block_label="human"
    ),
    "tool": lambda agent, other: AgentTool.objects.create(agent=agent, tool=ToolFactory(organization=other)),
    "archive": lambda agent, other: agent.archives.add(ArchiveFactory(organization=other)),
}


@pytest.mark.parametrize("kind", CROSS_ORG_LINKS)
def test_the_database_refuses_a_link_between_organisations(kind, org, other_org):
    agent = AgentFactory(organization=org)

    with (
        pytest.raises(IntegrityError, match="belongs to another organization than agent"),
        transaction.atomic(),
    ):
        CROSS_ORG_LINKS[kind](agent, other_org)

    counts = (agent.block_attachments.count(), agent.tool_attachments.count(), agent.archives.count())
    assert counts == (0, 0, 0)


def test_the_database_refuses_moving_a_link_to_another_organisations_tool(org, other_org):
    agent = AgentFactory(organization=org)
    link = AgentTool.objects.create(agent=agent, tool=ToolFactory(organization=org, name="mine"))
    foreign = ToolFactory(organization=other_org)

    with (
        pytest.raises(IntegrityError, match="belongs to another organization than agent"),
        transaction.atomic(),
    ):
        AgentTool.objects.filter(id=link.id).update(tool=foreign)

    link.refresh_from_db()
    assert link.tool.name == "mine"


def test_the_database_accepts_links_within_one_organisation(org):
    agent = AgentFactory(organization=org)

    CROSS_ORG_LINKS["block"](agent, org)
    CROSS_ORG_LINKS["tool"](agent, org)
    CROSS_ORG_LINKS["archive"](agent, org)

    counts = (agent.block_attachments.count(), agent.tool_attachments.count(), agent.archives.count())
    assert counts == (1, 1, 1)
