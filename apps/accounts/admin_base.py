"""Admin base classes for tenant models: a staff user who is not a superuser sees and edits only the rows
of organisations they belong to; secrets are write-only."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import ForeignKey, QuerySet
from django.http import HttpRequest

from apps.accounts.models import Organization
from apps.accounts.selectors import staff_organization_ids
from apps.core.actor import Actor, Role


def admin_org_ids(request: HttpRequest) -> list[str] | None:
    """None means every organisation (superusers)."""
    user = request.user
    if user.is_superuser:
        return None
    cached = getattr(request, "_admin_org_ids", None)
    if cached is None:
        cached = staff_organization_ids(user=user)  # type: ignore[arg-type]
        request._admin_org_ids = cached  # type: ignore[attr-defined]
    return cached


def admin_actor(request: HttpRequest, organization_id: str) -> Actor:
    return Actor(organization_id=organization_id, user_id=request.user.pk, role=Role.ADMIN)


class OrgScopedAdmin(admin.ModelAdmin):
    """For models with an `organization` FK (OrgOwnedModel)."""

    org_path = "organization_id"

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = self.model.all_objects.get_queryset()
        ordering = self.get_ordering(request)
        if ordering:
            qs = qs.order_by(*ordering)
        org_ids = admin_org_ids(request)
        return qs if org_ids is None else qs.filter(**{f"{self.org_path}__in": org_ids})

    def get_list_filter(self, request: HttpRequest) -> Any:
        filters = list(super().get_list_filter(request))
        if request.user.is_superuser and "organization" not in filters and self.org_path == "organization_id":
            filters.insert(0, "organization")
        return filters

    def formfield_for_foreignkey(self, db_field: ForeignKey, request: HttpRequest, **kwargs: Any) -> Any:
        org_ids = admin_org_ids(request)
        related = db_field.related_model
        if org_ids is not None:
            if related is Organization:
                kwargs["queryset"] = Organization.objects.filter(id__in=org_ids)
            elif hasattr(related, "all_objects") and any(
                f.name == "organization" for f in related._meta.fields
            ):
                kwargs["queryset"] = related.all_objects.filter(organization_id__in=org_ids)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def formfield_for_manytomany(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        org_ids = admin_org_ids(request)
        related = db_field.related_model
        if org_ids is not None and hasattr(related, "all_objects"):
            kwargs["queryset"] = related.all_objects.filter(organization_id__in=org_ids)
        return super().formfield_for_manytomany(db_field, request, **kwargs)


class OrgScopedInline(admin.TabularInline):
    extra = 0

    def formfield_for_foreignkey(self, db_field: ForeignKey, request: HttpRequest, **kwargs: Any) -> Any:
        org_ids = admin_org_ids(request)
        related = db_field.related_model
        if org_ids is not None and hasattr(related, "all_objects"):
            kwargs["queryset"] = related.all_objects.filter(organization_id__in=org_ids)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class WriteOnlySecretForm(forms.ModelForm):
    """Secret fields render empty and keep their stored value when left empty on change."""

    secret_fields: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in self.secret_fields:
            if name in self.fields:
                required = self.instance._state.adding and self.fields[name].required
                self.fields[name] = forms.CharField(
                    required=required,
                    widget=forms.PasswordInput(render_value=False),
                    help_text="Write-only: leave empty to keep the stored value."
                    if not self.instance._state.adding
                    else "Write-only: it will not be shown again.",
                )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        for name in self.secret_fields:
            if not cleaned.get(name) and not self.instance._state.adding:
                cleaned[name] = getattr(self.instance, name)
        return cleaned


def secret_form(model: type, fields: tuple[str, ...]) -> type[forms.ModelForm]:
    meta = type("Meta", (), {"model": model, "fields": "__all__"})
    return type(f"{model.__name__}AdminForm", (WriteOnlySecretForm,), {"Meta": meta, "secret_fields": fields})
