"""Abstract base models shared by every app."""

from __future__ import annotations

from django.db import models

from apps.core.tenancy import OrgScopedManager


class TimestampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class OrgOwnedModel(TimestampedModel):
    """A row that belongs to exactly one organisation. Query it through `objects.for_actor()`."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")

    # Declared first so it is the default manager Django's internals use (see apps.core.tenancy).
    all_objects = models.Manager()
    objects = OrgScopedManager()

    class Meta:
        abstract = True
