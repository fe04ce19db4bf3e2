"""Every model is manageable in the admin; a staff user who is not a superuser sees only their organisations."""

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.urls import reverse

from apps.accounts.models import Invitation, Membership
from apps.accounts.services import api_key_create
from apps.agents.models import (
    AgentSecret,
    AgentTool,
    Conversation,
    Group,
    GroupMember,
    GroupTurn,
    GroupTurnRun,
    Run,
    Step,
)
from apps.core.actor import Role
from apps.identities.services import identity_create
from apps.memory import services as memory_services
from apps.memory.models import AgentBlock, ArchiveStats, ArchiveTag, Block, BlockHistory
from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable
from apps.tools.models import MCPServer
from tests.factories import (
    AgentFactory,
    MessageFactory,
    PassageFactory,
    ProviderFactory,
    ToolFactory,
    UserFactory,
)


@pytest.fixture
def populated(actor, org, user):
    """At least one real row of every registered model, in `org`."""
    agent = AgentFactory(organization=org)
    block = memory_services.block_create(actor=actor, label="human", value="Name: Sam")
    memory_services.block_attach_to_agent(actor=actor, agent_id=agent.id, block=block)
    run = Run.all_objects.create(organization=org, agent=agent)
    Step.all_objects.create(organization=org, agent=agent, run=run, model="gpt-4o-mini")
    from apps.observability.models import RunTrace

    RunTrace.all_objects.create(organization=org, run=run, trace_id="0" * 32, spans=[], span_count=0)
    Conversation.all_objects.create(organization=org, agent=agent)
    MessageFactory(organization=org, agent=agent)
    PassageFactory(organization=org, embedding=[0.1] * 384, embedding_dim=384)
    ToolFactory(organization=org)
    ProviderFactory(organization=org, api_key="sk-provider-plaintext")
    from apps.llm.models import LlmCall, LlmRecordPolicy

    LlmCall.all_objects.create(organization=org, run_id=run.id, agent_id=agent.id, model="gpt-4o-mini")
    LlmRecordPolicy.all_objects.create(organization=org, retention_days=7)
    config = SandboxConfig.all_objects.create(organization=org)
    SandboxEnvironmentVariable.all_objects.create(
        organization=org, sandbox_config=config, key="TOKEN", value="env-plain"
    )
    AgentSecret.all_objects.create(organization=org, agent=agent, key="SECRET", value="agent-plain")
    MCPServer.all_objects.create(
        organization=org,
        server_name="files",
        server_type=MCPServer.Type.STDIO,
        command="python",
        env_json='{"TOKEN": "mcp-plain"}',
    )
    api_key_create(actor=actor, user=user, name="ci")
    Invitation.all_objects.create(
        organization=org, token_hash=Invitation.hash_token("token"), created_by=user
    )
    identity_create(
        actor=actor,
        identifier_key="user-42",
        name="Sam",
        identity_type="user",
        agent_ids=[agent.id],
        block_ids=[block.id],
    )
    from apps.folders.models import AgentFile, AgentFileSettings, FileChunk, FileContent, FileMetadata, Folder

    folder = Folder.all_objects.create(
        organization=org, name="handbook", embedding="openai/text-embedding-3-small"
    )
    file = FileMetadata.all_objects.create(
        organization=org,
        folder=folder,
        file_name="notes.txt",
        original_file_name="notes.txt",
        file_type="text/plain",
        file_size=5,
        processing_status="completed",
    )
    FileContent.all_objects.create(organization=org, file=file, text="hello")
    FileChunk.all_objects.create(
        organization=org,
        file=file,
        folder=folder,
        chunk_index=0,
        text="hello",
        embedding=[0.1] * 384,
        embedding_dim=384,
    )
    folder.agents.add(agent)
    AgentFile.all_objects.create(
        organization=org, agent=agent, file=file, folder=folder, file_name="handbook/notes.txt", is_open=True
    )
    AgentFileSettings.all_objects.create(organization=org, agent=agent, max_files_open=3)
    group = Group.all_objects.create(organization=org, manager_type="round_robin", description="team")
    GroupMember.objects.create(group=group, agent=agent, position=0)
    turn = GroupTurn.all_objects.create(organization=org, group=group, current_run=run)
    GroupTurnRun.objects.create(turn=turn, run=run, position=0)
    git_agent = AgentFactory(organization=org, tags=[memory_services.GIT_MEMORY_TAG])
    memory_services.git_commit_log(actor=actor, agent=git_agent)  # its repository, objects and a commit
    return agent


def registered_models():
    return [model for model in admin.site._registry if model._meta.app_label != "auth"]


def first_pk(model):
    manager = getattr(model, "all_objects", model._default_manager)
    return manager.order_by("pk").values_list("pk", flat=True).first()


def test_every_registered_model_has_a_changelist_and_change_page_with_real_rows(client, user, populated):
    user.is_staff = user.is_superuser = True
    user.save()
    client.force_login(user)

    for model in registered_models():
        meta = model._meta
        listing = client.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
        change = client.get(
            reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[first_pk(model)])
        )
        assert (meta.label, listing.status_code, change.status_code) == (meta.label, 200, 200)


def test_the_admin_covers_every_model_of_the_platform():
    from django.apps import apps

    inlines_only = {AgentBlock, AgentTool}  # edited as inlines of the agent
    inlines_only |= {ArchiveStats, ArchiveTag}  # shown (read-only) as inlines of the archive
    inlines_only |= {GroupMember, GroupTurnRun}  # shown (read-only) as inlines of the group and its turns

    ours = {m for m in apps.get_models() if m.__module__.startswith("apps.")} - inlines_only

    assert ours - set(admin.site._registry) == set()


def test_secrets_never_appear_in_admin_pages(client, user, populated):
    user.is_staff = user.is_superuser = True
    user.save()
    client.force_login(user)
    pages = [
        reverse("admin:llm_provider_change", args=[first_pk(ProviderFactory._meta.model)]),
        reverse(
            "admin:sandbox_sandboxenvironmentvariable_change", args=[first_pk(SandboxEnvironmentVariable)]
        ),
        reverse("admin:agents_agent_change", args=[populated.id]),
        reverse("admin:tools_mcpserver_change", args=[first_pk(MCPServer)]),
    ]

    html = "".join(client.get(page).content.decode() for page in pages)

    assert "sk-provider-plaintext" not in html
    assert "env-plain" not in html
    assert "agent-plain" not in html
    assert "mcp-plain" not in html


@pytest.fixture
def staff_member(org):
    staff = UserFactory(is_staff=True)
    Membership.objects.create(user=staff, organization=org, role=Role.ADMIN)
    staff.user_permissions.set(Permission.objects.all())
    return staff


def test_staff_who_are_not_superusers_see_only_their_organisation(client, staff_member, org, other_org):
    mine = AgentFactory(organization=org, name="mine")
    theirs = AgentFactory(organization=other_org, name="theirs")
    client.force_login(staff_member)

    listing = client.get(reverse("admin:agents_agent_changelist")).content.decode()
    own_page = client.get(reverse("admin:agents_agent_change", args=[mine.id]))
    other_page = client.get(reverse("admin:agents_agent_change", args=[theirs.id]))

    assert mine.id in listing
    assert theirs.id not in listing
    assert own_page.status_code == 200
    assert other_page.status_code == 302  # the admin's "does not exist" redirect: nothing of it is shown
    assert theirs.name not in client.get(other_page.url).content.decode()


def test_staff_cannot_delete_another_organisations_row(client, staff_member, other_org):
    theirs = AgentFactory(organization=other_org)
    client.force_login(staff_member)

    client.post(reverse("admin:agents_agent_delete", args=[theirs.id]), {"post": "yes"})

    assert type(theirs).all_objects.filter(id=theirs.id).exists()


def test_block_edits_in_the_admin_go_through_the_service_and_are_recorded(client, user, actor, org):
    user.is_staff = user.is_superuser = True
    user.save()
    block = memory_services.block_create(actor=actor, label="human", value="old", limit=50)
    client.force_login(user)
    url = reverse("admin:memory_block_change", args=[block.id])
    form = {
        "organization": org.id,
        "label": "human",
        "value": "new",
        "limit": 50,
        "description": "",
        "template_name": "",
        "metadata": "{}",
        "tags": "",
        "history-TOTAL_FORMS": 1,
        "history-INITIAL_FORMS": 1,
        "history-MIN_NUM_FORMS": 0,
        "history-MAX_NUM_FORMS": 1000,
        "history-0-id": BlockHistory.all_objects.get(block=block).id,
        "history-0-block": block.id,
    }

    response = client.post(url, form)

    assert response.status_code == 302
    block.refresh_from_db()
    assert (block.value, block.version) == ("new", 2)
    assert BlockHistory.all_objects.filter(
        block=block, version=2, actor_type="user", actor_id=user.id
    ).exists()


def test_an_over_limit_value_in_the_admin_shows_a_clear_error(client, user, actor, org):
    user.is_staff = user.is_superuser = True
    user.save()
    client.force_login(user)

    response = client.post(
        reverse("admin:memory_block_add"),
        {
            "organization": org.id,
            "label": "human",
            "value": "x" * 11,
            "limit": 10,
            "description": "",
            "template_name": "",
            "metadata": "{}",
            "tags": "",
            "history-TOTAL_FORMS": 0,
            "history-INITIAL_FORMS": 0,
            "history-MIN_NUM_FORMS": 0,
            "history-MAX_NUM_FORMS": 1000,
        },
    )

    assert response.status_code == 200
    assert "longer than its limit" in response.content.decode()
    assert Block.all_objects.count() == 0


def test_the_admin_refuses_a_provider_url_the_outbound_guard_refuses(org, admin_client):
    from apps.llm.models import Provider

    form = {
        "organization": org.id,
        "name": "metadata",
        "provider_type": "openai_compatible",
        "api_key": "",
        "base_url": "http://169.254.169.254/v1",
    }

    response = admin_client.post(reverse("admin:llm_provider_add"), form)

    assert response.status_code == 200
    assert "169.254.169.254" in response.content.decode()
    assert not Provider.all_objects.filter(organization=org).exists()


def test_the_admin_refuses_an_mcp_server_with_a_metadata_header(org, admin_client):
    form = {
        "organization": org.id,
        "server_name": "remote",
        "server_type": "streamable_http",
        "server_url": "https://mcp.example.com/mcp",
        "command": "",
        "args": "[]",
        "env_json": "",
        "auth_header": "",
        "auth_token": "",
        "custom_headers_json": '{"Metadata-Flavor": "Google"}',
    }

    response = admin_client.post(reverse("admin:tools_mcpserver_add"), form)

    assert response.status_code == 200
    assert "Metadata-Flavor" in response.content.decode()
    assert not MCPServer.all_objects.filter(organization=org).exists()


def pages_not_shown(client):
    """(model, changelist status, change page status) of every registered model whose pages are not 200."""
    statuses = []
    for model in registered_models():
        meta = model._meta
        listing = client.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
        change = client.get(
            reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[first_pk(model)])
        )
        if (listing.status_code, change.status_code) != (200, 200):
            statuses.append((meta.label, listing.status_code, change.status_code))
    return statuses


@pytest.mark.parametrize(
    ("role", "hidden"),
    [
        (Role.ADMIN, [("accounts.Invitation", 403, 403)]),  # owners' business
        (
            Role.MEMBER,
            [
                ("accounts.ApiKey", 200, 302),  # the owner's key: not listed, "does not exist"
                ("accounts.Invitation", 403, 403),
            ],
        ),
    ],
)
def test_staff_users_of_each_role_open_the_pages_their_role_shows(client, org, populated, role, hidden):
    staff = UserFactory(is_staff=True)
    Membership.objects.create(user=staff, organization=org, role=role)
    staff.user_permissions.set(Permission.objects.all())
    client.force_login(staff)

    assert sorted(pages_not_shown(client)) == hidden
