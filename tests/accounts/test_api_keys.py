import io

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from apps.accounts.errors import AuthenticationFailed
from apps.accounts.models import ApiKey, Membership, Organization, User
from apps.accounts.services import api_key_authenticate, api_key_create, api_key_revoke, hash_api_key
from apps.core.actor import Actor, Role
from tests.factories import MembershipFactory


def test_only_a_hash_and_a_prefix_of_a_key_are_stored(actor, user):
    created = api_key_create(actor=actor, user=user, name="ci")

    stored = ApiKey.objects.for_actor(actor).get(id=created.api_key.id)
    assert created.raw_key.startswith("sk-let-")
    assert stored.key_hash == hash_api_key(created.raw_key)
    assert stored.prefix == created.raw_key[:12]
    assert created.raw_key not in {stored.key_hash, stored.prefix, stored.name}


def test_a_key_resolves_to_its_user_and_organisation(actor, user):
    created = api_key_create(actor=actor, user=user, name="ci")

    resolved_user, resolved_actor = api_key_authenticate(raw_key=created.raw_key)

    assert resolved_user == user
    assert (resolved_actor.organization_id, resolved_actor.user_id) == (actor.organization_id, user.id)
    assert ApiKey.objects.for_actor(actor).get(id=created.api_key.id).last_used_at is not None


def test_a_revoked_key_no_longer_authenticates(actor, user):
    created = api_key_create(actor=actor, user=user, name="ci")
    api_key_revoke(actor=actor, api_key_id=created.api_key.id)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created.raw_key}")

    response = client.get("/v1/blocks/")

    assert response.status_code == 401
    with pytest.raises(AuthenticationFailed):
        api_key_authenticate(raw_key=created.raw_key)


def test_a_key_carries_its_users_role_in_the_keys_organisation(actor, org, other_org):
    member = MembershipFactory(organization=org, role=Role.MEMBER, user__username="carol").user
    MembershipFactory(organization=other_org, role=Role.OWNER, user=member)
    created = api_key_create(actor=actor, user=member, name="carol's key")

    resolved_user, resolved_actor = api_key_authenticate(raw_key=created.raw_key)

    assert (resolved_user.id, resolved_user.username) == (member.id, "carol")
    assert resolved_actor == Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER)


def test_a_deactivated_users_key_no_longer_authenticates(actor, user):
    created = api_key_create(actor=actor, user=user, name="ci")
    User.objects.filter(id=user.id).update(is_active=False)

    with pytest.raises(AuthenticationFailed, match="Invalid or revoked"):
        api_key_authenticate(raw_key=created.raw_key)


def test_a_key_of_a_user_removed_from_its_organisation_no_longer_authenticates(actor, org, user):
    created = api_key_create(actor=actor, user=user, name="ci")
    Membership.objects.filter(user=user, organization=org).delete()

    with pytest.raises(AuthenticationFailed, match="no longer a member"):
        api_key_authenticate(raw_key=created.raw_key)


def test_an_unknown_key_does_not_authenticate(db):
    with pytest.raises(AuthenticationFailed, match="Invalid or revoked"):
        api_key_authenticate(raw_key="sk-let-not-a-key")


def test_another_organisation_cannot_revoke_a_key(actor, user, other_org_actor):
    created = api_key_create(actor=actor, user=user, name="ci")

    with pytest.raises(Exception, match="not found"):
        api_key_revoke(actor=other_org_actor, api_key_id=created.api_key.id)

    assert ApiKey.objects.for_actor(actor).get(id=created.api_key.id).revoked_at is None


def test_bootstrap_creates_org_admin_and_the_exact_key_once(db, monkeypatch):
    monkeypatch.setenv("BOOTSTRAP_API_KEY", "sk-let-bootstrap-key-for-tests")
    monkeypatch.setenv("DJANGO_SUPERUSER_USERNAME", "root")
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "a-good-password-1")
    first, second = io.StringIO(), io.StringIO()

    call_command("bootstrap_platform", stdout=first)
    call_command("bootstrap_platform", stdout=second)

    assert Organization.objects.count() == 1
    admin = User.objects.get(username="root")
    assert admin.is_superuser
    assert admin.check_password("a-good-password-1")
    assert "sk-let-bootstrap-key-for-tests" in first.getvalue()
    assert "sk-let-bootstrap-key-for-tests" not in second.getvalue()
    assert ApiKey.objects.unscoped().count() == 1
    user, _ = api_key_authenticate(raw_key="sk-let-bootstrap-key-for-tests")
    assert user == admin


def test_bootstrap_without_settings_generates_a_password_and_a_key_shown_once(db, monkeypatch):
    for name in ("BOOTSTRAP_API_KEY", "DJANGO_SUPERUSER_USERNAME", "DJANGO_SUPERUSER_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    out = io.StringIO()

    call_command("bootstrap_platform", stdout=out)

    text = out.getvalue()
    raw_key = text.split("store it now): ")[1].split()[0]
    password = text.split("password (shown once): ")[1].split()[0]
    assert User.objects.get(username="admin").check_password(password)
    assert api_key_authenticate(raw_key=raw_key)[0].username == "admin"
