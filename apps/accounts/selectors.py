from __future__ import annotations

from django.utils import timezone

from apps.accounts.models import ApiKey, Invitation, Membership, Organization, User
from apps.core.actor import Actor, Role
from apps.core.errors import NotFound

# The session key holding the organisation a signed-in user acts for (the ADE and the session-authenticated API).
SESSION_ORG_KEY = "organization_id"


def organization_get(*, actor: Actor) -> Organization:
    return Organization.objects.get(id=actor.organization_id)


def api_key_list(*, actor: Actor):  # -> QuerySet[ApiKey]
    return ApiKey.objects.for_actor(actor).select_related("user").order_by("-created_at")


def membership_for(*, user: User, organization_id: str | None = None) -> Membership:
    """The user's membership in the given organisation (or their oldest one). Raises NotFound."""
    qs = Membership.objects.filter(user=user).select_related("organization").order_by("created_at")
    if organization_id is not None:
        qs = qs.filter(organization_id=organization_id)
    membership = qs.first()
    if membership is None:
        raise NotFound("User has no membership in that organization")
    return membership


def actor_for_user(*, user: User, organization_id: str | None = None) -> Actor:
    membership = membership_for(user=user, organization_id=organization_id)
    return Actor(organization_id=membership.organization_id, user_id=user.id, role=Role(membership.role))


def staff_organization_ids(*, user: User) -> list[str]:
    """Organisations a staff user may see in the admin."""
    return list(Membership.objects.filter(user=user).values_list("organization_id", flat=True))


def user_memberships(*, user: User):  # -> QuerySet[Membership]
    """The organisations a user belongs to, for the ADE's organisation switcher."""
    return Membership.objects.filter(user=user).select_related("organization").order_by("organization__name")


def membership_list(*, actor: Actor):  # -> QuerySet[Membership]
    """The actor's organisation's members with their users, for the ADE's members settings."""
    return (
        Membership.objects.filter(organization_id=actor.organization_id)
        .select_related("user")
        .order_by("user__username")
    )


def api_key_list_visible(*, actor: Actor):  # -> QuerySet[ApiKey]
    """The keys the actor may see and revoke: all of the organisation's for owners and admins, their own
    for members (the same rule api_key_revoke applies)."""
    keys = api_key_list(actor=actor)
    return keys if actor.can_manage else keys.filter(user_id=actor.user_id)


# --- invitations --------------------------------------------------------------------------------------

INVITATION_INVALID = "This invitation is not valid."
"""The one answer to a token that cannot be used, whatever the reason (unknown, expired, revoked, used)."""
_TOKEN_MAX_LENGTH = 100  # far above a real token (43 characters); longer input is not even hashed


def invitation_list_pending(*, actor: Actor):  # -> QuerySet[Invitation]
    """The organisation's invitations that can still be accepted, newest first, for the members settings."""
    return (
        Invitation.objects.for_actor(actor)
        .filter(accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now())
        .select_related("created_by")
        .order_by("-created_at")
    )


def invitation_for_token(*, raw_token: str, for_update: bool = False) -> Invitation:
    """The usable invitation behind a raw token, with its organisation: one indexed lookup by the token's
    hash. Raises NotFound(INVITATION_INVALID) for any token that cannot be used, so the answer tells a
    guesser nothing. `for_update` locks the invitation's row (not its organisation's) until the transaction
    ends."""
    if not raw_token or len(raw_token) > _TOKEN_MAX_LENGTH:
        raise NotFound(INVITATION_INVALID, code="invitation_invalid")
    invitations = Invitation.objects.unscoped().select_related("organization")
    if for_update:
        invitations = invitations.select_for_update(of=("self",))
    invitation = invitations.filter(token_hash=Invitation.hash_token(raw_token)).first()
    if invitation is None or not invitation.is_usable:
        raise NotFound(INVITATION_INVALID, code="invitation_invalid")
    return invitation
