from __future__ import annotations

import functools
import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.accounts.errors import AuthenticationFailed, DuplicateApiKey
from apps.accounts.models import ApiKey, Invitation, Membership, Organization, User
from apps.accounts.selectors import invitation_for_token
from apps.core import permissions
from apps.core.actor import Actor, Role
from apps.core.db import prepared_cursor
from apps.core.errors import Conflict, InvalidInput, NotFound
from apps.core.permissions import Action

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
    if actor.user_id != user.id:
        permissions.require(actor, Action.API_KEY_MINT_FOR_OTHERS, subject=f"a key for '{user.username}'")
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
    if api_key is None or (
        api_key.user_id != actor.user_id and not permissions.allows(actor, Action.API_KEY_REVOKE_OTHERS)
    ):  # a member cannot see other people's keys
        raise NotFound(f"API key '{api_key_id}' not found")
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at", "updated_at"])
    return api_key


def api_key_authenticate(*, raw_key: str) -> tuple[User, Actor]:
    """Resolve a bearer token into its user and Actor. Raises AuthenticationFailed.

    Every API request runs this: the key, its user and the user's role in the key's organisation in one
    statement, written as SQL because the ORM's compilation of that query cost more CPU than the query
    (~1.1 -> ~0.4 ms per request), and prepared (prepared_cursor)."""
    with prepared_cursor() as cursor:
        cursor.execute(_authenticate_sql(), [hash_api_key(raw_key)])
        row = cursor.fetchone()
    if row is None:
        raise AuthenticationFailed("Invalid or revoked API key")
    key_id, organization_id, last_used_at, role, *user_values = row
    user = User.from_db(connection.alias, [f.attname for f in User._meta.concrete_fields], user_values)
    if not user.is_active:
        raise AuthenticationFailed("Invalid or revoked API key")
    if role is None:
        raise AuthenticationFailed("The key's user is no longer a member of its organization")
    now = timezone.now()
    if last_used_at is None or now - last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.unscoped().filter(id=key_id).update(last_used_at=now)
    return user, Actor(organization_id=organization_id, user_id=user.id, role=Role(role))


@functools.cache
def _authenticate_sql() -> str:
    user_columns = ", ".join(f'u."{f.column}"' for f in User._meta.concrete_fields)
    return (
        f"SELECT k.id, k.organization_id, k.last_used_at, m.role, {user_columns} "
        f"FROM {ApiKey._meta.db_table} k JOIN {User._meta.db_table} u ON u.id = k.user_id "
        f"LEFT JOIN {Membership._meta.db_table} m "
        "ON m.user_id = k.user_id AND m.organization_id = k.organization_id "
        "WHERE k.key_hash = %s AND k.revoked_at IS NULL"
    )


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


# --- members and roles (the ADE's organisation settings) ------------------------------------------------

ASSIGNABLE_ROLES = (Role.OWNER, Role.ADMIN, Role.MEMBER)


def _require_owner(actor: Actor) -> None:
    permissions.require(actor, Action.MEMBER_MANAGE)


def _assignable_role(role: str) -> Role:
    if role not in ASSIGNABLE_ROLES:
        raise InvalidInput(f"Choose a role: owner, admin or member (got '{role}').")
    return Role(role)


def _lock_members(actor: Actor) -> None:
    """Membership changes of one organisation are serialised on its row, so two owners demoting each
    other at the same moment cannot leave it without an owner."""
    Organization.objects.select_for_update().filter(id=actor.organization_id).first()


def _member(actor: Actor, membership_id: int) -> Membership:
    membership = (
        Membership.objects.select_related("user")
        .filter(id=membership_id, organization_id=actor.organization_id)
        .first()
    )
    if membership is None:
        raise NotFound("Member not found")
    return membership


def _is_last_owner(membership: Membership) -> bool:
    return (
        membership.role == Role.OWNER
        and not Membership.objects.filter(organization_id=membership.organization_id, role=Role.OWNER)
        .exclude(id=membership.id)
        .exists()
    )


@transaction.atomic
def membership_add(
    *, actor: Actor, username: str, role: str, password: str = "", email: str = ""
) -> Membership:
    """Add a user to the actor's organisation with a role (owners only). An existing user is named by
    username; with a password, a new user of that name is created first.

    Raises PermissionDenied, InvalidInput (unknown user without a password, a password for an existing
    user, a password the validators refuse, already a member).
    """
    _require_owner(actor)
    role_value = _assignable_role(role)
    username = username.strip()
    if not username:
        raise InvalidInput("Give the username of the person to add.")
    user = User.objects.filter(username=username).first()
    if user is None:
        if not password:
            raise InvalidInput(f"There is no user named '{username}'. Give a password to create the account.")
        candidate = User(username=username, email=email.strip())
        try:
            User.username_validator(username)
            validate_password(password, user=candidate)
        except DjangoValidationError as exc:
            raise InvalidInput(" ".join(exc.messages)) from exc
        user = User.objects.create_user(username=username, email=email.strip(), password=password)
    elif password:
        raise InvalidInput(
            f"A user named '{username}' already exists: leave the password empty to add them as they are."
        )
    if Membership.objects.filter(user=user, organization_id=actor.organization_id).exists():
        raise InvalidInput(f"'{username}' is already a member of this organization.")
    return Membership.objects.create(user=user, organization_id=actor.organization_id, role=role_value)


@transaction.atomic
def membership_set_role(*, actor: Actor, membership_id: int, role: str) -> Membership:
    """Change a member's role (owners only); the last owner cannot be demoted.
    Raises PermissionDenied, NotFound (another organisation's membership too), InvalidInput."""
    _require_owner(actor)
    role_value = _assignable_role(role)
    _lock_members(actor)
    membership = _member(actor, membership_id)
    if role_value != Role.OWNER and _is_last_owner(membership):
        raise InvalidInput(
            f"{membership.user.username} is the last owner of this organization: "
            "make another member an owner first."
        )
    if membership.role != role_value:
        membership.role = role_value
        membership.save(update_fields=["role", "updated_at"])
    return membership


@transaction.atomic
def membership_remove(*, actor: Actor, membership_id: int) -> Membership:
    """Remove a member (owners only) and revoke their API keys in this organisation; the last owner
    cannot be removed. Raises PermissionDenied, NotFound, InvalidInput."""
    _require_owner(actor)
    _lock_members(actor)
    membership = _member(actor, membership_id)
    if _is_last_owner(membership):
        raise InvalidInput(
            f"{membership.user.username} is the last owner of this organization and cannot be removed: "
            "make another member an owner first."
        )
    ApiKey.objects.for_actor(actor).filter(user_id=membership.user_id, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    membership.delete()
    return membership


# --- operators' provisioning (manage.py create_organization, create_user, add_member, create_api_key) ---


def organization_lookup(*, reference: str) -> Organization:
    """An organisation named by its id or its name. Raises NotFound."""
    organization = (
        Organization.objects.filter(id=reference).first()
        or Organization.objects.filter(name=reference).first()
    )
    if organization is None:
        raise NotFound(f"There is no organization with the id or name '{reference}'.")
    return organization


def user_lookup(*, username: str) -> User:
    """Raises NotFound."""
    user = User.objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"There is no user named '{username}'.")
    return user


@transaction.atomic
def organization_provision(*, name: str, owner_username: str | None = None) -> Organization:
    """A new organisation, with an existing user as its owner when one is named.
    Raises InvalidInput (empty or taken name), NotFound (unknown owner)."""
    name = name.strip()
    if not name:
        raise InvalidInput("Give the organization a name.")
    owner = user_lookup(username=owner_username) if owner_username else None
    return organization_create(name=name, owner=owner)


@dataclass(frozen=True)
class CreatedUser:
    user: User
    generated_password: str | None  # only when no password was given: shown once, never stored


@transaction.atomic
def user_create(*, username: str, password: str | None = None, email: str = "") -> CreatedUser:
    """A new (non-staff) user; without a password, a random one is generated and returned once.
    Raises InvalidInput (a taken or invalid username, a password the validators refuse)."""
    username, email = username.strip(), email.strip()
    if not username:
        raise InvalidInput("Give the user a username.")
    if User.objects.filter(username=username).exists():
        raise InvalidInput(f"A user named '{username}' already exists.")
    generated = None if password else secrets.token_urlsafe(12)
    password = password or generated
    candidate = User(username=username, email=email)
    try:
        User.username_validator(username)
        validate_password(password, user=candidate)
    except DjangoValidationError as exc:
        raise InvalidInput(" ".join(exc.messages)) from exc
    user = User.objects.create_user(username=username, email=email, password=password)
    return CreatedUser(user=user, generated_password=generated)


@dataclass(frozen=True)
class MembershipChange:
    membership: Membership
    previous_role: Role | None  # None: the user was not a member before


@transaction.atomic
def membership_grant(*, organization: Organization, user: User, role: str) -> MembershipChange:
    """Make `user` a member of `organization` with `role`, or change the role of an existing member
    (idempotent). The last owner cannot be demoted. Raises InvalidInput."""
    role_value = _assignable_role(role)
    _lock_members(Actor.system(organization.id))
    membership = (
        Membership.objects.filter(user=user, organization=organization).select_related("user").first()
    )
    if membership is None:
        membership = Membership.objects.create(user=user, organization=organization, role=role_value)
        return MembershipChange(membership=membership, previous_role=None)
    previous = Role(membership.role)
    if previous != role_value:
        if role_value != Role.OWNER and _is_last_owner(membership):
            raise InvalidInput(
                f"{user.username} is the last owner of {organization.name}: make another member an owner first."
            )
        membership.role = role_value
        membership.save(update_fields=["role", "updated_at"])
    return MembershipChange(membership=membership, previous_role=previous)


def api_key_provision(*, organization: Organization, user: User, name: str) -> CreatedApiKey:
    """A new API key for a member of `organization`, as the operator (the raw key is returned once).
    Raises InvalidInput (not a member)."""
    membership = Membership.objects.filter(user=user, organization=organization).first()
    if membership is None:
        raise InvalidInput(
            f"'{user.username}' is not a member of {organization.name}: add them first (add_member)."
        )
    actor = Actor(organization_id=organization.id, user_id=user.id, role=Role(membership.role))
    return api_key_create(actor=actor, user=user, name=name)


# --- invitations (the ADE's way to bring people in) ------------------------------------------------------
# An owner creates an invitation with a role and gets a link, once; whoever opens the link while it is
# valid joins with that role (signed in, or with a new account made on the spot). Nothing here says which
# usernames exist, except to someone holding a valid link who picks a taken one for a new account.

INVITATION_NOTE_MAX_LENGTH = 200


class CreatedInvitation(NamedTuple):
    invitation: Invitation
    raw_token: str  # shown once, as a link, never stored


@transaction.atomic
def invitation_create(*, actor: Actor, role: str, note: str = "") -> CreatedInvitation:
    """A single-use invitation to the actor's organisation with `role` (owners only), valid for
    INVITATION_LIFETIME. The raw token is returned once. Raises PermissionDenied, InvalidInput."""
    permissions.require(actor, Action.MEMBER_MANAGE)
    role_value = _assignable_role(role)
    note = note.strip()
    if len(note) > INVITATION_NOTE_MAX_LENGTH:
        raise InvalidInput(f"Keep the note to {INVITATION_NOTE_MAX_LENGTH} characters.")
    raw_token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.for_actor(actor).create(
        role=role_value, note=note, token_hash=Invitation.hash_token(raw_token), created_by_id=actor.user_id
    )
    return CreatedInvitation(invitation=invitation, raw_token=raw_token)


@transaction.atomic
def invitation_revoke(*, actor: Actor, invitation_id: str) -> Invitation:
    """Make a pending invitation unusable (owners only; idempotent). Raises PermissionDenied, NotFound
    (another organisation's invitation too), InvalidInput (already accepted: remove the member instead)."""
    permissions.require(actor, Action.MEMBER_MANAGE)
    invitation = Invitation.objects.for_actor(actor).select_for_update().filter(id=invitation_id).first()
    if invitation is None:
        raise NotFound("Invitation not found")
    if invitation.accepted_at is not None:
        raise InvalidInput("That invitation was already accepted: remove the member instead.")
    if invitation.revoked_at is None:
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at", "updated_at"])
    return invitation


@transaction.atomic
def invitation_accept(*, user: User, raw_token: str) -> Membership:
    """Make `user` a member with the invitation's role and use the invitation up. Single-use under
    concurrency: the invitation's row is locked, so of two acceptances the second finds it used.
    Raises NotFound(INVITATION_INVALID) (unknown, expired, revoked or used), Conflict (already a member)."""
    invitation = invitation_for_token(raw_token=raw_token, for_update=True)
    return _invitation_use(invitation, user)


@transaction.atomic
def invitation_accept_as_new_user(*, raw_token: str, username: str, password: str) -> Membership:
    """Create an account and accept the invitation with it, all or nothing. The token is checked first, so
    only a valid link's holder learns that a username is taken. Raises NotFound(INVITATION_INVALID),
    InvalidInput (a taken or invalid username, a password the validators refuse)."""
    invitation = invitation_for_token(raw_token=raw_token, for_update=True)
    username = username.strip()
    if not username:
        raise InvalidInput("Choose a username.")
    taken = InvalidInput("That username is taken: choose another username.")
    if User.objects.filter(username=username).exists():
        raise taken
    candidate = User(username=username)
    try:
        User.username_validator(username)
        validate_password(password, user=candidate)
    except DjangoValidationError as exc:
        raise InvalidInput(" ".join(exc.messages)) from exc
    try:
        with transaction.atomic():  # a concurrent sign-up may take the name between the check and here
            user = User.objects.create_user(username=username, password=password)
    except IntegrityError as exc:
        raise taken from exc
    return _invitation_use(invitation, user)


def _invitation_use(invitation: Invitation, user: User) -> Membership:
    """Inside the transaction that locked `invitation`."""
    _lock_members(Actor.system(invitation.organization_id))
    if Membership.objects.filter(user=user, organization_id=invitation.organization_id).exists():
        raise Conflict(f"You are already a member of {invitation.organization.name}.", code="already_member")
    membership = Membership.objects.create(
        user=user, organization_id=invitation.organization_id, role=invitation.role
    )
    invitation.accepted_by = user
    invitation.accepted_at = timezone.now()
    invitation.save(update_fields=["accepted_by", "accepted_at", "updated_at"])
    return membership
