from __future__ import annotations

from apps.accounts.models import ApiKey, Membership, Organization, User
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
