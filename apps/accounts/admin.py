from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from apps.accounts.admin_base import (
    OrgScopedAdmin,
    admin_actor,
    admin_org_ids,
    admin_orgs_allowing,
    admin_require,
    organization_members,
)
from apps.accounts.models import ApiKey, Invitation, Membership, Organization, User
from apps.accounts.selectors import staff_organization_ids
from apps.accounts.services import (
    api_key_create,
    api_key_revoke,
    membership_add,
    membership_remove,
    membership_set_role,
)
from apps.core.errors import DomainError
from apps.core.permissions import Action


class MembershipInline(admin.TabularInline):
    """Editable by superusers only: the organisation page is read-only for everyone else."""

    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    """An organisation's settings are the operator's (its step limit replaces the deployment's, its sandbox
    fallback weakens isolation): superusers change them; other staff users see their organisations."""

    list_display = ["name", "id", "allow_local_sandbox", "max_steps_limit", "created_at"]
    search_fields = ["name", "id"]
    list_filter = ["allow_local_sandbox"]
    inlines = [MembershipInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        org_ids = admin_org_ids(request)
        return qs if org_ids is None else qs.filter(id__in=org_ids)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser and super().has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser and super().has_delete_permission(request, obj)


@admin.register(User)
class PlatformUserAdmin(UserAdmin):
    """People are the deployment's, not one organisation's. Superusers manage every user. Another staff user
    sees the users who share an organisation with them, and changes (or deletes, or sets the password of) a
    user only when every organisation that user belongs to is one they own, never a staff user or a
    superuser; who is staff, superuser, and Django's groups and permissions are for superusers to set."""

    list_display = ["username", "email", "is_staff", "is_superuser", "is_active", "date_joined"]
    search_fields = ["username", "email", "id"]
    OPERATOR_FIELDS = ("is_staff", "is_superuser", "groups", "user_permissions")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        org_ids = admin_org_ids(request)
        if org_ids is None:
            return qs
        return qs.filter(id__in=organization_members(organization_ids=org_ids).values("id"))

    def may_manage(self, request: HttpRequest, user: User) -> bool:
        if request.user.is_superuser:
            return True
        if user.is_staff or user.is_superuser:
            return False
        org_ids = staff_organization_ids(user=user)
        owned = set(admin_orgs_allowing(request, Action.MEMBER_MANAGE))
        return bool(org_ids) and owned.issuperset(org_ids)

    def has_add_permission(self, request: HttpRequest) -> bool:
        """New accounts are the operator's; owners bring people in from the ADE's members settings."""
        return request.user.is_superuser and super().has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = super().has_change_permission(request, obj)
        return allowed and (obj is None or self.may_manage(request, obj))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = super().has_delete_permission(request, obj)
        return allowed and (request.user.is_superuser if obj is None else self.may_manage(request, obj))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        if not request.user.is_superuser:
            fields += [name for name in self.OPERATOR_FIELDS if name not in fields]
        return fields


@admin.register(Membership)
class MembershipAdmin(OrgScopedAdmin):
    """Owners add members, change roles and remove members, through the same services as the ADE (the last
    owner stays; a removed member's keys are revoked)."""

    list_display = ["user", "organization", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__username", "organization__name"]
    add_action = change_action = Action.MEMBER_MANAGE
    free_user_fields = ("user",)  # the person who becomes a member
    actions = ["remove_members"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = Membership.objects.select_related("user", "organization")
        org_ids = admin_org_ids(request)
        return qs if org_ids is None else qs.filter(organization_id__in=org_ids)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "user"] if obj is not None else fields

    def save_model(self, request: HttpRequest, obj: Membership, form: Any, change: bool) -> None:
        actor = admin_actor(request, obj.organization_id)
        with self.refusal_shown(request):
            if change:
                membership_set_role(actor=actor, membership_id=obj.pk, role=obj.role)
                return
            created = membership_add(actor=actor, username=obj.user.username, role=obj.role)
            obj.pk = created.pk
            obj._state.adding = False

    def delete_model(self, request: HttpRequest, obj: Membership) -> None:
        with self.refusal_shown(request):
            membership_remove(actor=admin_actor(request, obj.organization_id), membership_id=obj.pk)

    def get_actions(self, request: HttpRequest) -> Any:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # deletes rows, not members: remove_members calls the service
        return actions

    @admin.action(description="Remove selected members", permissions=["delete"])
    def remove_members(self, request: HttpRequest, queryset: QuerySet) -> None:
        """Each member on its own: one that may not be removed (the last owner) is named with the reason."""
        removed = 0
        for membership in queryset:
            try:
                self.row_require(request, membership, "delete")
                membership_remove(
                    actor=admin_actor(request, membership.organization_id), membership_id=membership.pk
                )
            except DomainError as exc:
                self.message_user(request, f"{membership.user.username}: {exc.message}", messages.ERROR)
            else:
                removed += 1
        if removed:
            self.message_user(request, f"Removed {removed} member{'s' if removed != 1 else ''}.")


@admin.register(ApiKey)
class ApiKeyAdmin(OrgScopedAdmin):
    """Keys are created through the service so the raw key is shown exactly once, never stored. Everyone
    makes and revokes their own keys; owners and admins see and revoke everyone's; a key for someone else
    is for owners to mint."""

    list_display = ["name", "prefix", "user", "organization", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = ["prefix", "last_used_at", "revoked_at"]
    fields = ["organization", "user", "name", "prefix", "last_used_at", "revoked_at"]
    actions = ["revoke_keys"]
    add_action = Action.API_KEY_OWN

    def row_action(self, request: HttpRequest, obj: Any, kind: str) -> Action | None:
        if kind == "add" or obj is None or obj.user_id == request.user.pk:
            return Action.API_KEY_OWN
        return Action.API_KEY_REVOKE_OTHERS

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        managed = admin_orgs_allowing(request, Action.API_KEY_REVOKE_OTHERS)
        return qs.filter(Q(organization_id__in=managed) | Q(user_id=request.user.pk))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """A stored key keeps its user: giving it to someone else would mint a key for them."""
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "user"] if obj is not None else fields

    def add_require(self, request: HttpRequest, form: forms.ModelForm, organization_id: str) -> None:
        user = form.cleaned_data.get("user")
        if user is not None and user.pk != request.user.pk:
            admin_require(
                request,
                organization_id,
                Action.API_KEY_MINT_FOR_OTHERS,
                subject=f"a key for '{user.username}'",
            )

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            obj.save(update_fields=["name", "updated_at"])
            return
        with self.refusal_shown(request):
            created = api_key_create(
                actor=admin_actor(request, obj.organization_id), user=obj.user, name=obj.name
            )
            obj.pk = created.api_key.pk
            obj.prefix = created.api_key.prefix
            obj.key_hash = created.api_key.key_hash
            obj._state.adding = False
            self.message_user(
                request, f"API key (shown once, copy it now): {created.raw_key}", messages.WARNING
            )

    @admin.action(description="Revoke selected API keys")
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet) -> None:
        """Each key on its own: one the user may not revoke is named with the reason, the others are revoked."""
        revoked = 0
        for key in queryset:
            try:
                self.row_require(request, key, "delete")
                api_key_revoke(actor=admin_actor(request, key.organization_id), api_key_id=key.id)
            except DomainError as exc:
                self.message_user(request, f"API key '{key.name}': {exc.message}", messages.ERROR)
            else:
                revoked += 1
        if revoked:
            self.message_user(request, f"Revoked {revoked} API key{'s' if revoked != 1 else ''}.")


@admin.register(Invitation)
class InvitationAdmin(OrgScopedAdmin):
    """Shown to owners, never made here: an invitation's link is shown once, by the ADE's members settings
    that create it. Deleting one makes its link useless."""

    list_display = [
        "id",
        "role",
        "note",
        "organization",
        "created_by",
        "expires_at",
        "accepted_at",
        "revoked_at",
    ]
    list_filter = ["role"]
    search_fields = ["id", "note"]
    fields = readonly_fields = [
        "organization",
        "role",
        "note",
        "created_by",
        "expires_at",
        "accepted_by",
        "accepted_at",
        "revoked_at",
    ]
    view_action = change_action = Action.MEMBER_MANAGE

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
