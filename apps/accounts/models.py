from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractUser
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from apps.core.actor import Role
from apps.core.ids import ID_MAX_LENGTH, new_api_key_id, new_invitation_id, new_org_id, new_user_id
from apps.core.models import OrgOwnedModel, TimestampedModel


class Organization(TimestampedModel):
    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_org_id, editable=False)
    name = models.CharField(max_length=200, unique=True)
    allow_local_sandbox = models.BooleanField(
        default=True,
        help_text="May custom tools run in the local bubblewrap jail when no Docker engine answers?",
    )
    max_steps_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="The largest max_steps a run of this organisation may ask for; empty: the deployment's "
        "MAX_STEPS_LIMIT.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class User(AbstractUser):
    """Custom from the first migration, with Letta-style ids (`user-<uuid>`)."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_user_id, editable=False)
    organizations = models.ManyToManyField(Organization, through="Membership", related_name="users")


class Membership(TimestampedModel):
    ROLE_CHOICES = [(Role.OWNER, "Owner"), (Role.ADMIN, "Admin"), (Role.MEMBER, "Member")]

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=ROLE_CHOICES, default=Role.MEMBER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "organization"], name="membership_unique_user_org")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.organization} ({self.role})"


class ApiKey(OrgOwnedModel):
    """A bearer token. Only its SHA-256 is stored (keys are 256-bit random, so a slow hash adds nothing)."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_api_key_id, editable=False)
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16, help_text="The first characters of the key, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


INVITATION_LIFETIME = timedelta(days=7)


def invitation_expiry() -> datetime:
    """When an invitation created now stops working."""
    return timezone.now() + INVITATION_LIFETIME


class Invitation(OrgOwnedModel):
    """An owner's single-use link to join the organisation with a role.

    Only the token's SHA-256 is stored (tokens are 256-bit random, so a slow hash adds nothing): the link is
    shown once, to the owner who created it."""

    id = models.CharField(
        primary_key=True, max_length=ID_MAX_LENGTH, default=new_invitation_id, editable=False
    )
    role = models.CharField(max_length=16, choices=Membership.ROLE_CHOICES, default=Role.MEMBER)
    note = models.CharField(
        max_length=200,
        blank=True,
        help_text="Who it is for (a name or an e-mail address), for the owners' list; sent nowhere.",
    )
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_by = models.ForeignKey(User, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    expires_at = models.DateTimeField(default=invitation_expiry)
    accepted_by = models.ForeignKey(User, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    accepted_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.role} invitation{f' for {self.note}' if self.note else ''} ({self.id})"

    @staticmethod
    def hash_token(raw_token: str) -> str:
        return hashlib.sha256(raw_token.encode()).hexdigest()

    @property
    def is_usable(self) -> bool:
        """Neither accepted, revoked nor expired."""
        return self.accepted_at is None and self.revoked_at is None and self.expires_at > timezone.now()
