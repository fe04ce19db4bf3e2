"""Org scoping that fails closed.

`Model.objects` on a tenant model refuses to build an unscoped queryset: the only ways in are
`.for_actor(actor)`, `.for_org(org_id)` and the grep-able `.unscoped()`. Django's own machinery
(admin, unique validation, related managers, cascades) uses the plain `all_objects` manager,
which every tenant model declares first so that it is the default manager.
"""

from __future__ import annotations

from typing import Any, Self

from django.db import models

from apps.core.actor import Actor


class OrgScopeMissing(RuntimeError):
    """Raised when tenant data is queried without saying for which organisation."""


class OrgQuerySet(models.QuerySet):
    _scoped_org_id: str | None = None

    def _clone(self) -> Self:
        clone = super()._clone()
        clone._scoped_org_id = self._scoped_org_id
        return clone

    def create(self, **kwargs: Any) -> Any:
        """Create inside the scoped organisation; a mismatching organisation is a bug, not a choice."""
        if self._scoped_org_id is not None:
            given = kwargs.get("organization_id") or getattr(kwargs.get("organization"), "id", None)
            if given is not None and given != self._scoped_org_id:
                raise OrgScopeMissing(
                    f"create() for org {given} on a queryset scoped to {self._scoped_org_id}"
                )
            if given is None:
                kwargs["organization_id"] = self._scoped_org_id
        return super().create(**kwargs)


class OrgScopedManager(models.Manager.from_queryset(OrgQuerySet)):  # type: ignore[misc]
    def get_queryset(self) -> OrgQuerySet:
        raise OrgScopeMissing(
            f"{self.model.__name__}.objects needs a scope: use .for_actor(actor), .for_org(id) or .unscoped()"
        )

    def _base(self) -> OrgQuerySet:
        return OrgQuerySet(model=self.model, using=self._db, hints=self._hints)

    def for_org(self, organization_id: str) -> OrgQuerySet:
        qs = self._base().filter(organization_id=organization_id)
        qs._scoped_org_id = organization_id
        return qs

    def for_actor(self, actor: Actor) -> OrgQuerySet:
        return self.for_org(actor.organization_id)

    def unscoped(self) -> OrgQuerySet:
        """Every organisation's rows. For migrations, admin for superusers, and cross-org maintenance."""
        return self._base()
