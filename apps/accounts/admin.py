from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.accounts.admin_base import OrgScopedAdmin, admin_actor, admin_org_ids
from apps.accounts.models import ApiKey, Membership, Organization, User
from apps.accounts.services import api_key_create, api_key_revoke


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ["name", "id", "allow_local_sandbox", "max_steps_limit", "created_at"]
    search_fields = ["name", "id"]
    list_filter = ["allow_local_sandbox"]
    inlines = [MembershipInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        org_ids = admin_org_ids(request)
        return qs if org_ids is None else qs.filter(id__in=org_ids)


@admin.register(User)
class PlatformUserAdmin(UserAdmin):
    list_display = ["username", "email", "is_staff", "is_superuser", "is_active", "date_joined"]
    search_fields = ["username", "email", "id"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        org_ids = admin_org_ids(request)
        return qs if org_ids is None else qs.filter(memberships__organization_id__in=org_ids).distinct()


@admin.register(Membership)
class MembershipAdmin(OrgScopedAdmin):
    list_display = ["user", "organization", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__username", "organization__name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = Membership.objects.select_related("user", "organization")
        org_ids = admin_org_ids(request)
        return qs if org_ids is None else qs.filter(organization_id__in=org_ids)


@admin.register(ApiKey)
class ApiKeyAdmin(OrgScopedAdmin):
    """Keys are created through the service so the raw key is shown exactly once, never stored."""

    list_display = ["name", "prefix", "user", "organization", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = ["prefix", "last_used_at", "revoked_at"]
    fields = ["organization", "user", "name", "prefix", "last_used_at", "revoked_at"]
    actions = ["revoke_keys"]

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            obj.save(update_fields=["name", "updated_at"])
            return
        created = api_key_create(
            actor=admin_actor(request, obj.organization_id), user=obj.user, name=obj.name
        )
        obj.pk = created.api_key.pk
        obj.prefix = created.api_key.prefix
        obj.key_hash = created.api_key.key_hash
        obj._state.adding = False
        self.message_user(request, f"API key (shown once, copy it now): {created.raw_key}", messages.WARNING)

    @admin.action(description="Revoke selected API keys")
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet) -> None:
        for key in queryset:
            api_key_revoke(actor=admin_actor(request, key.organization_id), api_key_id=key.id)
