"""An identity: one of an app's end users (or organisations, or anything else) with the agents and blocks
that serve it. `identifier_key` is the app's own key for it, unique in the organisation."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.core.ids import ID_MAX_LENGTH, new_identity_id
from apps.core.models import OrgOwnedModel


class IdentityType(models.TextChoices):
    ORG = "org", "Organization"
    USER = "user", "User"
    OTHER = "other", "Other"


class PropertyType(models.TextChoices):
    STRING = "string", "String"
    NUMBER = "number", "Number"
    BOOLEAN = "boolean", "Boolean"
    JSON = "json", "JSON"


class Identity(OrgOwnedModel):
    """`properties` is a list of {key, value, type} (apps.identities.services.IdentityProperty), one per key.
    The agent and block links are refused by the database across organisations (migration 0002).
    `created_by` decides who may change it (the role matrix's IDENTITY_WRITE)."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_identity_id, editable=False)
    identifier_key = models.CharField(max_length=255, help_text="The app's own key for this identity.")
    name = models.CharField(max_length=255)
    identity_type = models.CharField(max_length=16, choices=IdentityType.choices)
    project_id = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="An opaque project label; it does not scope the key.",
    )
    properties = models.JSONField(default=list, blank=True)
    agents = models.ManyToManyField("agents.Agent", related_name="identities", blank=True)
    blocks = models.ManyToManyField("memory.Block", related_name="identities", blank=True)
    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]
        verbose_name_plural = "identities"
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "identifier_key"],
                name="identity_unique_key_per_organization",
                violation_error_message="Another identity of this organization has this identifier key.",
            ),
            models.CheckConstraint(condition=~Q(identifier_key=""), name="identity_key_not_empty"),
            models.CheckConstraint(
                condition=Q(identity_type__in=IdentityType.values), name="identity_type_known"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.identifier_key})"
