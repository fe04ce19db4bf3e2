"""The ADE's organisation settings: LLM providers, API keys, members and roles, the no-provider banner."""

from __future__ import annotations

import pytest
from django.db import connection
from rest_framework.test import APIClient

from apps.accounts.models import ApiKey, Invitation, Membership, User
from apps.accounts.services import api_key_create
from apps.core.actor import Actor, Role
from apps.llm.handles import resolve_model
from apps.llm.models import Provider
from apps.llm.selectors import llm_configured
from tests.factories import MembershipFactory

HTMX = {"HTTP_HX_REQUEST": "true"}
SECRET = "sk-proj-very-secret-0123456789-QXZW"  # a tail no hex id on a page can contain


@pytest.fixture
def no_deployment_llm(settings):
    """A deployment without OPENAI_*/ANTHROPIC_API_KEY/OLLAMA_BASE_URL: only organisation providers count."""
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = ""
    settings.ANTHROPIC_API_KEY = ""
    settings.OLLAMA_BASE_URL = ""
    return settings


def client_for(user: User):
    from django.test import Client

    c = Client()
    c.force_login(user)
    return c


def add_provider(client, **fields):
    data = {"provider_type": "openai", "name": "openai", "api_key": SECRET, "base_url": ""} | fields
    return client.post("/settings/providers/", data, **HTMX)


# --- pages ------------------------------------------------------------------------------------------


def test_settings_opens_on_the_providers_tab(owner_client):
    response = owner_client.get("/settings/")

    assert response.status_code == 302
    assert response["Location"] == "/settings/providers/"


@pytest.mark.parametrize(
    ("path", "heading"),
    [
        ("/settings/providers/", "Add a provider"),
        ("/settings/api-keys/", "Create key"),
        ("/settings/members/", "Invite a member"),
    ],
)
def test_each_settings_tab_renders_with_its_tabs(owner_client, path, heading):
    response = owner_client.get(path)

    body = response.content.decode()
    assert response.status_code == 200
    assert heading in body
    assert 'aria-current="page"' in body
    for tab in ("LLM providers", "API keys", "Members"):
        assert tab in body


def test_settings_need_a_signed_in_user(client, db):
    response = client.get("/settings/providers/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


# --- the no-provider banner ---------------------------------------------------------------------------


def test_banner_says_no_provider_is_configured_and_links_to_the_providers_page(
    owner_client, no_deployment_llm
):
    body = owner_client.get("/settings/members/").content.decode()

    assert 'data-testid="no-provider-banner"' in body
    assert "No LLM provider is configured" in body
    assert 'href="/settings/providers/"' in body


def test_adding_a_provider_removes_the_banner_in_the_same_response(owner_client, actor, no_deployment_llm):
    assert llm_configured(actor=actor) is False

    response = add_provider(owner_client)

    body = response.content.decode()
    assert response.status_code == 200
    assert 'id="no-provider-banner-slot" hx-swap-oob="true"' in body
    assert "No LLM provider is configured" not in body
    assert llm_configured(actor=actor) is True


def test_a_deployment_key_counts_as_configured(owner_client, actor, no_deployment_llm):
    no_deployment_llm.ANTHROPIC_API_KEY = "sk-ant-x"

    body = owner_client.get("/settings/providers/").content.decode()

    assert llm_configured(actor=actor) is True
    assert "No LLM provider is configured" not in body
    assert '<span class="tag">anthropic</span>' in body


def test_an_incomplete_provider_does_not_count(actor, no_deployment_llm):
    Provider.objects.for_actor(actor).create(name="claude", provider_type="anthropic")  # as the admin could

    assert llm_configured(actor=actor) is False


def test_another_organisations_provider_does_not_count(actor, other_org_actor, no_deployment_llm):
    Provider.objects.for_actor(other_org_actor).create(name="openai", provider_type="openai", api_key=SECRET)

    assert llm_configured(actor=actor) is False


def test_members_are_told_to_ask_an_owner(client, org, make_user, no_deployment_llm):
    client.force_login(make_user(org, role=Role.MEMBER))

    body = client.get("/settings/providers/").content.decode()

    assert "Ask an owner or admin to add one" in body


# --- LLM providers ------------------------------------------------------------------------------------


def test_adding_a_provider_lists_it_without_the_key_and_stores_the_key_encrypted(owner_client, actor):
    response = add_provider(owner_client, name="work-openai")

    body = response.content.decode()
    assert response.status_code == 200
    assert "Provider &#x27;work-openai&#x27; added" in body
    assert 'data-provider="work-openai"' in body
    assert 'data-testid="key-set"' in body
    assert SECRET not in body
    assert SECRET[-4:] not in body
    with connection.cursor() as cursor:
        cursor.execute("SELECT api_key FROM llm_provider WHERE name = %s", ["work-openai"])
        (stored,) = cursor.fetchone()
    assert stored.startswith("fernet:")
    assert SECRET not in stored
    # ... and agents can use it: the handle resolves to the organisation's key.
    assert resolve_model("work-openai/gpt-4o-mini", organization_id=actor.organization_id).api_key == SECRET


def test_the_key_is_in_no_page_after_it_was_added(owner_client):
    add_provider(owner_client)

    for path in ("/settings/providers/", "/settings/api-keys/", "/settings/members/", "/tools/", "/agents/"):
        response = owner_client.get(path)
        assert response.status_code == 200, path
        assert SECRET not in response.content.decode(), path


def test_an_ollama_url_is_enough_and_shown(owner_client, actor, settings):
    settings.OUTBOUND_ALLOW = ["gpu-box:11434"]  # a private model server, opened by the operator
    response = add_provider(
        owner_client, provider_type="ollama", name="ollama", api_key="", base_url="http://gpu-box:11434"
    )

    body = response.content.decode()
    assert response.status_code == 200
    assert "http://gpu-box:11434" in body
    assert (
        resolve_model("ollama/llama3.2", organization_id=actor.organization_id).api_base
        == "http://gpu-box:11434/v1"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"provider_type": "anthropic", "name": "anthropic", "api_key": ""},
            "Anthropic providers need an API key.",
        ),
        (
            {"provider_type": "openai_compatible", "name": "vllm", "api_key": SECRET},
            "providers need a base URL",
        ),
        ({"name": "my/openai"}, "without &#x27;/&#x27;"),
        ({"base_url": "ftp://example.com"}, "must be an http:// or https:// URL"),
        ({"provider_type": "bedrock"}, "Choose a provider type"),
    ],
)
def test_a_refused_provider_says_why_and_never_echoes_the_key(owner_client, fields, message):
    response = add_provider(owner_client, **fields)

    body = response.content.decode()
    assert response.status_code == 422
    assert message in body
    assert SECRET not in body
    assert Provider.objects.unscoped().count() == 0


def test_a_second_provider_of_the_same_name_is_refused(owner_client):
    add_provider(owner_client)

    response = add_provider(owner_client, api_key="sk-another-key-000000")

    assert response.status_code == 422
    assert "already has a provider named &#x27;openai&#x27;" in response.content.decode()


def test_deleting_a_provider(owner_client, actor):
    add_provider(owner_client, name="gone")
    provider = Provider.objects.for_actor(actor).get(name="gone")

    response = owner_client.post(f"/settings/providers/{provider.id}/delete/", **HTMX)

    assert response.status_code == 200
    assert "Provider &#x27;gone&#x27; deleted." in response.content.decode()
    assert not Provider.objects.for_actor(actor).exists()


def test_members_see_providers_but_cannot_add_or_delete_them(client, org, actor, make_user):
    Provider.objects.for_actor(actor).create(name="openai", provider_type="openai", api_key=SECRET)
    provider = Provider.objects.for_actor(actor).get()
    client.force_login(make_user(org, role=Role.MEMBER))

    page = client.get("/settings/providers/").content.decode()
    created = add_provider(client, name="mine")
    deleted = client.post(f"/settings/providers/{provider.id}/delete/", **HTMX)

    assert 'data-provider="openai"' in page
    assert "Add a provider" not in page
    assert SECRET not in page
    assert created.status_code == 403
    assert deleted.status_code == 403
    assert "only owners and admins may add or delete LLM providers" in deleted.content.decode()
    assert list(Provider.objects.for_actor(actor).values_list("name", flat=True)) == ["openai"]


def test_admins_manage_providers(client, org, actor, make_user):
    client.force_login(make_user(org, role=Role.ADMIN))

    response = add_provider(client)

    assert response.status_code == 200
    assert Provider.objects.for_actor(actor).filter(name="openai").exists()


def test_another_organisations_provider_is_not_found(owner_client, other_org_actor):
    theirs = Provider.objects.for_actor(other_org_actor).create(
        name="openai", provider_type="openai", api_key=SECRET
    )

    response = owner_client.post(f"/settings/providers/{theirs.id}/delete/", **HTMX)

    assert response.status_code == 404
    assert Provider.objects.for_actor(other_org_actor).exists()


def test_without_javascript_adding_a_provider_redirects_back_with_a_message(owner_client):
    response = owner_client.post(
        "/settings/providers/", {"provider_type": "openai", "name": "openai", "api_key": SECRET}, follow=True
    )

    body = response.content.decode()
    assert response.redirect_chain == [("/settings/providers/", 302)]
    assert "Provider &#x27;openai&#x27; added" in body
    assert SECRET not in body


# --- API keys -----------------------------------------------------------------------------------------


def test_a_new_api_key_is_shown_once_and_works(owner_client, user, actor):
    response = owner_client.post("/settings/api-keys/", {"name": "CI"}, **HTMX)

    body = response.content.decode()
    key = ApiKey.objects.for_actor(actor).get(name="CI")
    raw = body.split('data-testid="new-api-key">', 1)[1].split("<", 1)[0]
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    assert raw.startswith(key.prefix)
    assert len(raw) > 30
    assert "it will not be shown again" in body
    # Never again: the page lists the key by its prefix only.
    later = owner_client.get("/settings/api-keys/").content.decode()
    assert raw not in later
    assert f"{key.prefix}…" in later
    # The key works against the API.
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get("/v1/tools/").status_code == 200


def test_a_key_needs_a_name(owner_client, actor):
    response = owner_client.post("/settings/api-keys/", {"name": "  "}, **HTMX)

    assert response.status_code == 422
    assert "Give the key a name" in response.content.decode()
    assert not ApiKey.objects.for_actor(actor).exists()


def test_revoking_a_key_stops_it(owner_client, user, actor):
    created = api_key_create(actor=actor, user=user, name="laptop")

    response = owner_client.post(f"/settings/api-keys/{created.api_key.id}/revoke/", **HTMX)

    body = response.content.decode()
    assert response.status_code == 200
    assert "revoked: requests with it are now refused" in body
    assert '<span class="badge err"' in body
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {created.raw_key}")
    assert api.get("/v1/tools/").status_code == 401


def test_members_see_and_revoke_only_their_own_keys(client, org, user, actor, make_user):
    member = make_user(org, role=Role.MEMBER, username="mia")
    member_actor = Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER)
    owners_key = api_key_create(actor=actor, user=user, name="owner key").api_key
    own_key = api_key_create(actor=member_actor, user=member, name="mia key").api_key
    client.force_login(member)

    page = client.get("/settings/api-keys/").content.decode()
    other = client.post(f"/settings/api-keys/{owners_key.id}/revoke/", **HTMX)
    own = client.post(f"/settings/api-keys/{own_key.id}/revoke/", **HTMX)

    assert "mia key" in page
    assert "owner key" not in page
    assert other.status_code == 404
    assert own.status_code == 200
    assert ApiKey.objects.for_actor(actor).get(id=owners_key.id).revoked_at is None
    assert ApiKey.objects.for_actor(actor).get(id=own_key.id).revoked_at is not None


def test_owners_see_and_revoke_every_key_of_the_organisation(owner_client, org, make_user):
    member = make_user(org, role=Role.MEMBER, username="mia")
    member_actor = Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER)
    key = api_key_create(actor=member_actor, user=member, name="mia key").api_key

    page = owner_client.get("/settings/api-keys/").content.decode()
    response = owner_client.post(f"/settings/api-keys/{key.id}/revoke/", **HTMX)

    assert "mia key" in page
    assert "<td>mia</td>" in page  # listed with its owner
    assert response.status_code == 200
    assert ApiKey.objects.for_actor(member_actor).get(id=key.id).revoked_at is not None


def test_another_organisations_key_is_not_found(owner_client, other_org_actor, other_user):
    theirs = api_key_create(actor=other_org_actor, user=other_user, name="theirs").api_key

    page = owner_client.get("/settings/api-keys/").content.decode()
    response = owner_client.post(f"/settings/api-keys/{theirs.id}/revoke/", **HTMX)

    assert "theirs" not in page
    assert response.status_code == 404
    assert ApiKey.objects.for_actor(other_org_actor).get(id=theirs.id).revoked_at is None


# --- members and roles ----------------------------------------------------------------------------------


def test_members_page_lists_members_with_their_roles(owner_client, org, make_user):
    make_user(org, role=Role.ADMIN, username="ada")

    body = owner_client.get("/settings/members/").content.decode()

    assert 'data-member="alice"' in body
    assert 'data-member="ada"' in body
    assert '<option value="admin" selected>' in body


def test_changing_a_role(owner_client, org, make_user):
    mia = make_user(org, role=Role.MEMBER, username="mia")
    membership = Membership.objects.get(user=mia, organization=org)

    response = owner_client.post(f"/settings/members/{membership.id}/role/", {"role": "admin"}, **HTMX)

    assert response.status_code == 200
    assert "mia is now admin." in response.content.decode()
    membership.refresh_from_db()
    assert membership.role == Role.ADMIN


def test_the_last_owner_can_be_neither_demoted_nor_removed(owner_client, org, user):
    membership = Membership.objects.get(user=user, organization=org)

    demoted = owner_client.post(f"/settings/members/{membership.id}/role/", {"role": "member"}, **HTMX)
    removed = owner_client.post(f"/settings/members/{membership.id}/remove/", **HTMX)

    assert demoted.status_code == 422
    assert (
        "alice is the last owner of this organization: make another member an owner first."
        in demoted.content.decode()
    )
    assert removed.status_code == 422
    assert "last owner" in removed.content.decode()
    membership.refresh_from_db()
    assert membership.role == Role.OWNER


def test_an_owner_can_step_down_when_another_owner_exists(owner_client, org, user, make_user):
    make_user(org, role=Role.OWNER, username="olga")
    membership = Membership.objects.get(user=user, organization=org)

    response = owner_client.post(f"/settings/members/{membership.id}/role/", {"role": "admin"}, **HTMX)

    assert response.status_code == 200
    assert response["HX-Refresh"] == "true"  # the page shows what an admin may do now
    membership.refresh_from_db()
    assert membership.role == Role.ADMIN


def test_removing_a_member_revokes_their_keys(owner_client, org, make_user):
    mia = make_user(org, role=Role.MEMBER, username="mia")
    mia_actor = Actor(organization_id=org.id, user_id=mia.id, role=Role.MEMBER)
    key = api_key_create(actor=mia_actor, user=mia, name="mia key").api_key
    membership = Membership.objects.get(user=mia, organization=org)

    response = owner_client.post(f"/settings/members/{membership.id}/remove/", **HTMX)

    assert response.status_code == 200
    assert "mia removed from the organization." in response.content.decode()
    assert not Membership.objects.filter(user=mia, organization=org).exists()
    assert ApiKey.objects.for_actor(mia_actor).get(id=key.id).revoked_at is not None


@pytest.mark.parametrize("role", [Role.ADMIN, Role.MEMBER])
def test_only_owners_change_members(client, org, user, make_user, role):
    client.force_login(make_user(org, role=role, username="notowner"))
    target = Membership.objects.get(user=user, organization=org)

    page = client.get("/settings/members/").content.decode()
    invited = client.post("/settings/members/invitations/", {"role": "owner"}, **HTMX)
    changed = client.post(f"/settings/members/{target.id}/role/", {"role": "member"}, **HTMX)
    removed = client.post(f"/settings/members/{target.id}/remove/", **HTMX)

    assert "Invite a member" not in page
    assert 'data-member="alice"' in page
    assert [invited.status_code, changed.status_code, removed.status_code] == [403, 403, 403]
    assert "only owners may invite, add or remove members, change roles" in changed.content.decode()
    assert not Invitation.objects.for_org(org.id).exists()
    target.refresh_from_db()
    assert target.role == Role.OWNER


def test_another_organisations_membership_is_not_found(owner_client, other_org, other_user):
    theirs = Membership.objects.get(user=other_user, organization=other_org)

    page = owner_client.get("/settings/members/").content.decode()
    changed = owner_client.post(f"/settings/members/{theirs.id}/role/", {"role": "member"}, **HTMX)
    removed = owner_client.post(f"/settings/members/{theirs.id}/remove/", **HTMX)

    assert 'data-member="bob"' not in page
    assert changed.status_code == 404
    assert removed.status_code == 404
    theirs.refresh_from_db()
    assert theirs.role == Role.OWNER


def test_the_session_organisation_decides_which_members_are_shown(client, org, other_org, user, other_user):
    MembershipFactory(organization=other_org, role=Role.OWNER, user=user)
    client.force_login(user)
    session = client.session
    session["organization_id"] = other_org.id
    session.save()

    body = client.get("/settings/members/").content.decode()

    assert "Globex" in body
    assert 'data-member="bob"' in body
