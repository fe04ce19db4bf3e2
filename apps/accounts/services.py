from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from apps.accounts.errors import AuthenticationFailed, DuplicateApiKey
from apps.accounts.models import ApiKey, Membership, Organization, User
from apps.core.actor import Actor, Role
from apps.core.errors import InvalidInput, NotFound

API_KEY_PREFIX = "sk-let-"
# last_used_at is advisory; writing it on every request would cost a write per call.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_api_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


@transaction.atomic
def organization_create(*, name: str, owner: User | None = None) -> Organization:
    if Organization.objects.filter(name=name).exists():
        raise InvalidInput(f"An organization named '{name}' already exists")
    organization = Organization.objects.create(name=name)
    if owner is not None:
        Membership.objects.create(user=owner, organization=organization, role=Role.OWNER)
    return organization


def membership_set(*, organization: Organization, user: User, role: Role) -> Membership:
    membership, _ = Membership.objects.update_or_create(
        user=user, organization=organization, defaults={"role": role}
    )
    return membership


@dataclass(frozen=True)
class CreatedApiKey:
    api_key: ApiKey
    raw_key: str  # shown once, never stored


@transaction.atomic
def api_key_create(*, actor: Actor, user: User, name: str, raw_key: str | None = None) -> CreatedApiKey:
    """Create a key for `user` in the actor's organisation. The raw key is returned once."""
    if not actor.can_manage and actor.user_id != user.id:
        raise NotFound("User not found")
    if not Membership.objects.filter(user=user, organization_id=actor.organization_id).exists():
        raise InvalidInput("That user is not a member of this organization")
    raw_key = raw_key or API_KEY_PREFIX + secrets.token_urlsafe(32)
    if len(raw_key) < 16:
        raise InvalidInput("An API key must be at least 16 characters long")
    key_hash = hash_api_key(raw_key)
    if ApiKey.objects.unscoped().filter(key_hash=key_hash).exists():
        raise DuplicateApiKey("That API key is already in use")
    api_key = ApiKey.objects.for_actor(actor).create(
        user=user, name=name, prefix=raw_key[:12], key_hash=key_hash
    )
    return CreatedApiKey(api_key=api_key, raw_key=raw_key)


def api_key_revoke(*, actor: Actor, api_key_id: str) -> ApiKey:
    api_key = ApiKey.objects.for_actor(actor).filter(id=api_key_id).first()
    if api_key is None or (not actor.can_manage and api_key.user_id != actor.user_id):
        raise NotFound(f"API key '{api_key_id}' not found")
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at", "updated_at"])
    return api_key


def api_key_authenticate(*, raw_key: str) -> tuple[User, Actor]:
    """Resolve a bearer token into its user and Actor. Raises AuthenticationFailed."""
    api_key = (
        ApiKey.objects.unscoped()
        .select_related("user")
        .filter(key_hash=hash_api_key(raw_key), revoked_at__isnull=True)
        .first()
    )
    if api_key is None or not api_key.user.is_active:
        raise AuthenticationFailed("Invalid or revoked API key")
    membership = Membership.objects.filter(user=api_key.user, organization_id=api_key.organization_id).first()
    if membership is None:
        raise AuthenticationFailed("The key's user is no longer a member of its organization")
    now = timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.unscoped().filter(id=api_key.id).update(last_used_at=now)
    actor = Actor(
        organization_id=api_key.organization_id, user_id=api_key.user_id, role=Role(membership.role)
    )
    return api_key.user, actor


@dataclass(frozen=True)
class BootstrapResult:
    organization: Organization
    admin: User
    created_admin: bool
    raw_api_key: str | None  # only when a key was created in this call
    generated_password: str | None  # only when the admin was created without a given password


@transaction.atomic
def platform_bootstrap(
    *,
    organization_name: str,
    admin_username: str,
    admin_email: str,
    admin_password: str | None,
    api_key: str | None,
) -> BootstrapResult:
    """First-run setup, idempotent: the first organisation, its owner (a superuser), and an API key.

    A key is created when the organisation has none yet, or when `api_key` is given and not yet stored
    (so BOOTSTRAP_API_KEY works on an existing data directory too).
    """
    organization = Organization.objects.order_by("created_at").first()
    if organization is None:
        organization = Organization.objects.create(name=organization_name)

    admin = User.objects.filter(username=admin_username).first()
    created_admin = admin is None
    generated_password: str | None = None
    if admin is None:
        if not admin_password:
            generated_password = admin_password = secrets.token_urlsafe(12)
        admin = User.objects.create_superuser(
            username=admin_username, email=admin_email, password=admin_password
        )
    membership_set(organization=organization, user=admin, role=Role.OWNER)

    actor = Actor(organization_id=organization.id, user_id=admin.id, role=Role.OWNER)
    raw_key: str | None = None
    if api_key is not None:
        if not ApiKey.objects.unscoped().filter(key_hash=hash_api_key(api_key)).exists():
            raw_key = api_key_create(actor=actor, user=admin, name="bootstrap", raw_key=api_key).raw_key
    elif not ApiKey.objects.for_org(organization.id).exists():
        raw_key = api_key_create(actor=actor, user=admin, name="bootstrap").raw_key
    return BootstrapResult(
        organization=organization,
        admin=admin,
        created_admin=created_admin,
        raw_api_key=raw_key,
        generated_password=generated_password,
    )
