from __future__ import annotations

from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Organization, User
from apps.accounts.services import api_key_create
from apps.core.actor import Actor, Role
from tests.factories import MembershipFactory, OrganizationFactory, UserFactory


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def org(db) -> Organization:  # type: ignore[no-untyped-def]
    return OrganizationFactory(name="Acme")


@pytest.fixture
def other_org(db) -> Organization:  # type: ignore[no-untyped-def]
    return OrganizationFactory(name="Globex")


@pytest.fixture
def user(org: Organization) -> User:
    return MembershipFactory(organization=org, role=Role.OWNER, user__username="alice").user


@pytest.fixture
def other_user(other_org: Organization) -> User:
    return MembershipFactory(organization=other_org, role=Role.OWNER, user__username="bob").user


@pytest.fixture
def actor(org: Organization, user: User) -> Actor:
    return Actor(organization_id=org.id, user_id=user.id, role=Role.OWNER)


@pytest.fixture
def other_org_actor(other_org: Organization, other_user: User) -> Actor:
    return Actor(organization_id=other_org.id, user_id=other_user.id, role=Role.OWNER)


@pytest.fixture
def api_client_for(db) -> Callable[[Actor], APIClient]:  # type: ignore[no-untyped-def]
    """An APIClient authenticated the way the Letta SDK is: `Authorization: Bearer <key>`."""

    def make(actor: Actor) -> APIClient:
        created = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="test")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {created.raw_key}")
        return client

    return make


@pytest.fixture
def make_user() -> Callable[..., User]:
    def make(org: Organization, *, role: Role = Role.MEMBER, **kwargs: object) -> User:
        return MembershipFactory(organization=org, role=role, user=UserFactory(**kwargs)).user

    return make
