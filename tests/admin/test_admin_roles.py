"""The admin's rights are the staff user's membership role (apps/core/permissions.py), row by row; people
are managed by superusers, and by owners only for people who belong to nothing but their organisations."""

from html import unescape

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from apps.accounts.models import ApiKey, Membership
from apps.accounts.services import api_key_create
from apps.core.actor import Actor, Role
from apps.tools.models import MCPServer
from tests.admin.html_form import form_data
from tests.factories import AgentFactory, BlockFactory, ToolFactory, UserFactory


def text(response) -> str:
    return unescape(response.content.decode())


@pytest.fixture
def make_staff(org):
    """A staff user (not a superuser) with every Django model permission, so only the role decides."""

    def make(role: Role, *, organizations=None, **kwargs):
        staff = UserFactory(is_staff=True, **kwargs)
        for organization in organizations or [org]:
            Membership.objects.create(user=staff, organization=organization, role=role)
        staff.user_permissions.set(Permission.objects.all())
        return staff

    return make


@pytest.fixture
def staff_owner(user):
    """alice, the organisation's owner, as a staff user who is not a superuser."""
    user.is_staff = True
    user.save()
    user.user_permissions.set(Permission.objects.all())
    return user


@pytest.fixture
def superuser(org):
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    Membership.objects.create(user=root, organization=org, role=Role.OWNER)
    return root


def add_key(client, org, user, name="minted"):
    return client.post(
        reverse("admin:accounts_apikey_add"), {"organization": org.id, "user": user.id, "name": name}
    )


# --- API keys -------------------------------------------------------------------------------------------


def test_a_member_cannot_mint_a_key_for_the_owner_and_the_page_says_why(client, make_staff, org, user):
    client.force_login(make_staff(Role.MEMBER))

    response = add_key(client, org, user)

    assert response.status_code == 200
    assert "Not allowed (a key for 'alice'): only owners may create an API key for someone else." in text(
        response
    )
    assert not ApiKey.all_objects.filter(user=user).exists()


def test_an_admin_cannot_mint_a_key_for_the_owner(client, make_staff, org, user):
    client.force_login(make_staff(Role.ADMIN))

    response = add_key(client, org, user)

    assert response.status_code == 200
    assert "only owners may create an API key for someone else" in text(response)
    assert not ApiKey.all_objects.filter(user=user).exists()


def test_a_member_mints_their_own_key_and_sees_it_once(client, make_staff, org):
    member = make_staff(Role.MEMBER)
    client.force_login(member)

    response = add_key(client, org, member, name="mine")

    assert response.status_code == 302
    assert "API key (shown once, copy it now): sk-let-" in text(client.get(response.url))
    assert list(ApiKey.all_objects.filter(user=member).values_list("name", flat=True)) == ["mine"]


def test_an_owner_mints_a_key_for_a_member(client, staff_owner, org, make_user):
    carol = make_user(org, role=Role.MEMBER, username="carol")
    client.force_login(staff_owner)

    response = add_key(client, org, carol, name="for carol")

    assert response.status_code == 302
    assert list(ApiKey.all_objects.filter(user=carol).values_list("name", flat=True)) == ["for carol"]


def test_a_member_sees_and_revokes_only_their_own_keys(client, make_staff, org, user, actor):
    member = make_staff(Role.MEMBER)
    theirs = api_key_create(actor=actor, user=user, name="owner-key").api_key
    mine = api_key_create(
        actor=Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER), user=member, name="my-key"
    ).api_key
    client.force_login(member)

    listing = text(client.get(reverse("admin:accounts_apikey_changelist")))
    client.post(
        reverse("admin:accounts_apikey_changelist"),
        {"action": "revoke_keys", "_selected_action": [theirs.id, mine.id]},
    )

    assert "my-key" in listing
    assert "owner-key" not in listing
    theirs.refresh_from_db()
    mine.refresh_from_db()
    assert (theirs.revoked_at is None, mine.revoked_at is None) == (True, False)


# --- people ---------------------------------------------------------------------------------------------


def test_a_member_cannot_change_the_superusers_password(client, make_staff, superuser):
    client.force_login(make_staff(Role.MEMBER))
    url = reverse("admin:auth_user_password_change", args=[superuser.id])

    page = client.get(url)
    response = client.post(url, {"password1": "Taken-0ver-pw!", "password2": "Taken-0ver-pw!"})

    assert (page.status_code, response.status_code) == (403, 403)
    superuser.refresh_from_db()
    assert superuser.check_password("pw-for-tests-1")


def test_an_owner_who_is_not_a_superuser_cannot_change_a_staff_users_password_or_details(
    client, staff_owner, make_staff
):
    colleague = make_staff(Role.MEMBER, email="colleague@example.com")
    client.force_login(staff_owner)

    password = client.post(
        reverse("admin:auth_user_password_change", args=[colleague.id]),
        {"password1": "Taken-0ver-pw!", "password2": "Taken-0ver-pw!"},
    )
    change = client.post(
        reverse("admin:accounts_user_change", args=[colleague.id]),
        {"username": colleague.username, "email": "owned@example.com"},
    )

    assert (password.status_code, change.status_code) == (403, 403)
    colleague.refresh_from_db()
    assert colleague.check_password("pw-for-tests-1")
    assert colleague.email == "colleague@example.com"


def test_an_owner_edits_a_member_of_only_their_organisation_but_cannot_make_them_staff(
    client, staff_owner, org, make_user
):
    carol = make_user(org, role=Role.MEMBER, username="carol")
    client.force_login(staff_owner)
    url = reverse("admin:accounts_user_change", args=[carol.id])
    data = form_data(client.get(url).content.decode(), "user_form")
    data.update(email=["carol@acme.example"], is_staff=["on"], is_superuser=["on"])

    response = client.post(url, data)

    assert response.status_code == 302
    carol.refresh_from_db()
    assert (carol.email, carol.is_staff, carol.is_superuser) == ("carol@acme.example", False, False)


def test_an_owner_cannot_edit_someone_who_also_belongs_to_another_organisation(
    client, staff_owner, org, other_org, make_user
):
    dave = make_user(org, role=Role.MEMBER, username="dave", email="dave@example.com")
    Membership.objects.create(user=dave, organization=other_org, role=Role.MEMBER)
    client.force_login(staff_owner)

    change = client.post(
        reverse("admin:accounts_user_change", args=[dave.id]), {"username": "dave", "email": "x@example.com"}
    )
    password = client.post(
        reverse("admin:auth_user_password_change", args=[dave.id]),
        {"password1": "Taken-0ver-pw!", "password2": "Taken-0ver-pw!"},
    )

    assert (change.status_code, password.status_code) == (403, 403)
    dave.refresh_from_db()
    assert dave.email == "dave@example.com"
    assert dave.check_password("pw-for-tests-1")


def test_the_user_list_shows_only_people_who_share_an_organisation(
    client, make_staff, org, other_user, make_user
):
    make_user(org, username="carol")
    client.force_login(make_staff(Role.MEMBER, username="mallory"))

    listing = text(client.get(reverse("admin:accounts_user_changelist")))

    assert "carol" in listing
    assert other_user.username not in listing


# --- members and roles ----------------------------------------------------------------------------------


def test_a_member_cannot_make_themselves_owner(client, make_staff, org):
    member = make_staff(Role.MEMBER)
    membership = Membership.objects.get(user=member, organization=org)
    client.force_login(member)

    response = client.post(
        reverse("admin:accounts_membership_change", args=[membership.id]), {"role": "owner"}
    )

    assert response.status_code == 403
    membership.refresh_from_db()
    assert membership.role == Role.MEMBER


def test_the_last_owner_cannot_be_demoted_and_the_page_says_why(client, staff_owner, org):
    membership = Membership.objects.get(user=staff_owner, organization=org)
    client.force_login(staff_owner)

    response = client.post(
        reverse("admin:accounts_membership_change", args=[membership.id]), {"role": "member"}, follow=True
    )

    assert "Alice is the last owner of this organization: make another member an owner first." in text(
        response
    )
    assert "was changed successfully" not in text(response)
    membership.refresh_from_db()
    assert membership.role == Role.OWNER


def test_an_owner_changes_a_members_role(client, staff_owner, org, make_user):
    carol = make_user(org, role=Role.MEMBER, username="carol")
    membership = Membership.objects.get(user=carol, organization=org)
    client.force_login(staff_owner)

    response = client.post(
        reverse("admin:accounts_membership_change", args=[membership.id]), {"role": "admin"}
    )

    assert response.status_code == 302
    membership.refresh_from_db()
    assert membership.role == Role.ADMIN


# --- agents, providers, MCP servers -----------------------------------------------------------------------


def test_a_member_cannot_change_an_agent_someone_else_created_but_changes_their_own(
    client, make_staff, org, user
):
    member = make_staff(Role.MEMBER)
    theirs = AgentFactory(organization=org, name="owners agent", created_by=user)
    mine = AgentFactory(organization=org, name="my agent", created_by=member)
    client.force_login(member)
    mine_url = reverse("admin:agents_agent_change", args=[mine.id])
    data = form_data(client.get(mine_url).content.decode(), "agent_form")
    data["name"] = ["renamed mine"]

    refused = client.post(reverse("admin:agents_agent_change", args=[theirs.id]), {"name": "renamed theirs"})
    accepted = client.post(mine_url, data)

    assert (refused.status_code, accepted.status_code) == (403, 302)
    theirs.refresh_from_db()
    mine.refresh_from_db()
    assert (theirs.name, mine.name) == ("owners agent", "renamed mine")


def test_a_member_adds_no_provider_mcp_server_or_sandbox_config(client, make_staff):
    client.force_login(make_staff(Role.MEMBER))

    pages = ["admin:llm_provider_add", "admin:tools_mcpserver_add", "admin:sandbox_sandboxconfig_add"]

    assert [client.get(reverse(page)).status_code for page in pages] == [403, 403, 403]


def test_an_admin_changes_the_organisations_mcp_server_and_a_member_only_sees_it(
    client, make_staff, org, settings
):
    settings.MCP_STDIO_COMMANDS = ["python"]
    server = MCPServer.all_objects.create(
        organization=org, server_name="files", server_type=MCPServer.Type.STDIO, command="python"
    )
    url = reverse("admin:tools_mcpserver_change", args=[server.id])
    client.force_login(make_staff(Role.ADMIN))
    data = form_data(client.get(url).content.decode(), "mcpserver_form")
    data["server_name"] = ["renamed"]
    client.force_login(make_staff(Role.MEMBER))

    member_page = client.get(url)
    member_post = client.post(url, data)
    client.force_login(make_staff(Role.ADMIN))
    admin_post = client.post(url, data)

    assert (member_page.status_code, member_post.status_code, admin_post.status_code) == (200, 403, 302)
    assert "mcpserver_form" in member_page.content.decode()
    server.refresh_from_db()
    assert server.server_name == "renamed"


@pytest.mark.parametrize(
    ("factory", "url_name", "field"),
    [
        (BlockFactory, "admin:memory_block_change", "label"),
        (ToolFactory, "admin:tools_tool_change", "name"),
        (AgentFactory, "admin:agents_agent_change", "name"),
    ],
)
def test_a_member_sees_rows_someone_else_created_read_only(
    client, make_staff, org, user, factory, url_name, field
):
    row = factory(organization=org, created_by=user)
    before = getattr(row, field)
    client.force_login(make_staff(Role.MEMBER))
    url = reverse(url_name, args=[row.id])

    page = client.get(url)
    response = client.post(url, {field: "renamed"})

    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()  # no Save button: the page is read-only
    assert response.status_code == 403
    row.refresh_from_db()
    assert getattr(row, field) == before


def test_an_owner_who_is_not_a_superuser_cannot_raise_the_organisations_step_limit(client, staff_owner, org):
    client.force_login(staff_owner)

    response = client.post(
        reverse("admin:accounts_organization_change", args=[org.id]),
        {"name": org.name, "allow_local_sandbox": "on", "max_steps_limit": "100000"},
    )

    assert response.status_code == 403
    org.refresh_from_db()
    assert org.max_steps_limit is None


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("memory_mb", "999999", "must be at most"),
        ("timeout_seconds", "0", "must be at least 1"),
        ("cpus", "64", "must be at most"),
    ],
)
def test_the_admins_sandbox_config_form_keeps_the_platforms_limits(
    client, make_staff, org, field, value, error
):
    from apps.sandbox.models import SandboxConfig

    client.force_login(make_staff(Role.ADMIN))
    config = SandboxConfig.all_objects.create(organization=org)
    url = reverse("admin:sandbox_sandboxconfig_change", args=[config.pk])
    data = form_data(client.get(url).content.decode(), "sandboxconfig_form")

    response = client.post(url, {**data, field: [value]})

    assert response.status_code == 200  # the form again, with the error on the field
    assert error in response.content.decode()
    config.refresh_from_db()
    assert str(getattr(config, field)) != value
