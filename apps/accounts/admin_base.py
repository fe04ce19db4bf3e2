"""Admin base classes for tenant models.

The admin decides the way the API and the ADE do (apps/core/permissions.py): a staff user acts in each
organisation with their membership role there; superusers act as owners of every organisation. A staff user
who is not a superuser sees only the rows of the organisations they belong to, and a row their role does not
let them change is read-only. Every row a form links stays in the form's organisation, and a user picked for
a row is one of its members. Secrets are write-only.

Bypassing these checks (a ModelAdmin that is not an OrgScopedAdmin, a form that is not an OrgAdminForm)
hands every staff user the rights of an owner in each of their organisations.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.core.exceptions import PermissionDenied as AdminPermissionDenied
from django.db import connection, transaction
from django.db.models import ForeignKey, Model, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.text import capfirst

from apps.accounts.models import Membership, Organization, User
from apps.core import permissions
from apps.core.actor import Actor, Role
from apps.core.errors import DomainError, PermissionDenied
from apps.core.permissions import Action

NOT_A_MEMBER = "Not allowed: you are not a member of this organization."


# --- who the staff user is in each organisation -------------------------------------------------------------


def membership_roles(*, user: User) -> dict[str, Role]:
    """The user's role in each organisation they belong to, by organisation id."""
    rows = Membership.objects.filter(user=user).values_list("organization_id", "role")
    return {organization_id: Role(role) for organization_id, role in rows}


def organization_members(*, organization_ids: list[str]) -> QuerySet:
    """The users who belong to any of these organisations, each once (the admin's user pickers)."""
    members = Membership.objects.filter(organization_id__in=organization_ids).values("user_id")
    return User.objects.filter(id__in=members).order_by("username")


def is_member(*, user_id: str, organization_id: str) -> bool:
    return Membership.objects.filter(user_id=user_id, organization_id=organization_id).exists()


def admin_roles(request: HttpRequest) -> dict[str, Role]:
    """The signed-in user's role in each organisation they belong to (read once per request)."""
    cached = getattr(request, "_admin_roles", None)
    if cached is None:
        cached = membership_roles(user=request.user)  # type: ignore[arg-type]
        request._admin_roles = cached  # type: ignore[attr-defined]
    return cached


def admin_org_ids(request: HttpRequest) -> list[str] | None:
    """None means every organisation (superusers)."""
    if request.user.is_superuser:
        return None
    return list(admin_roles(request))


def admin_role(request: HttpRequest, organization_id: str) -> Role | None:
    """The user's role in that organisation: owner for superusers, None for a non-member."""
    if request.user.is_superuser:
        return Role.OWNER
    return admin_roles(request).get(organization_id)


def admin_actor(request: HttpRequest, organization_id: str) -> Actor:
    """The Actor the admin's service calls use: the user with their real role in that organisation.
    Raises Django's PermissionDenied (403) for an organisation they do not belong to."""
    role = admin_role(request, organization_id)
    if role is None:
        raise AdminPermissionDenied(NOT_A_MEMBER)
    return Actor(organization_id=organization_id, user_id=request.user.pk, role=role)


def admin_require(
    request: HttpRequest,
    organization_id: str,
    action: Action,
    *,
    creator_id: str | None = None,
    shared: bool = False,
    subject: str = "",
) -> None:
    """permissions.require for the signed-in user in that organisation. Raises apps.core.errors.PermissionDenied
    with the role matrix's reason (a non-member is refused everything)."""
    role = admin_role(request, organization_id)
    if role is None:
        raise PermissionDenied(NOT_A_MEMBER)
    actor = Actor(organization_id=organization_id, user_id=request.user.pk, role=role)
    permissions.require(actor, action, creator_id=creator_id, shared=shared, subject=subject)


def admin_allows_somewhere(request: HttpRequest, action: Action, *, as_creator: bool = True) -> bool:
    """May the user do `action` in at least one organisation (on something they created, with `as_creator`)?
    The admin's answer before a row or an organisation is known (model-level permissions)."""
    return request.user.is_superuser or bool(admin_orgs_allowing(request, action, as_creator=as_creator))


def admin_orgs_allowing(request: HttpRequest, action: Action, *, as_creator: bool = True) -> list[str]:
    """The organisations (of a non-superuser) where the user may do `action` (on something they created,
    with `as_creator`)."""
    user_id = request.user.pk
    creator_id = user_id if as_creator else None
    return [
        organization_id
        for organization_id, role in admin_roles(request).items()
        if permissions.allows(Actor(organization_id, user_id, role), action, creator_id=creator_id)
    ]


# --- relations stay in one organisation ---------------------------------------------------------------------


def is_org_owned(model: type[Model]) -> bool:
    return model is not Organization and any(f.name == "organization" for f in model._meta.fields)


def check_relations(
    form: forms.ModelForm,
    organization_id: str,
    *,
    free_user_fields: tuple[str, ...] = (),
    owner: str | None = None,
) -> None:
    """Add a form error for every row the form links that belongs to another organisation than
    `organization_id`, and for every user who is not one of its members (except in `free_user_fields`).
    On a change, only the fields that changed are checked (what was stored before is the database's).
    `owner` names what the organisation is that of (the form's model, or an inline's parent)."""
    model = form._meta.model
    owner = owner or str(model._meta.verbose_name)
    adding = form.instance._state.adding
    for name, value in list(form.cleaned_data.items()):
        try:
            field = model._meta.get_field(name)
        except FieldDoesNotExist:
            continue
        if not field.is_relation or not value or (not adding and name not in form.changed_data):
            continue
        related = field.related_model
        values = list(value) if field.many_to_many else [value]
        if related is User:
            if name in free_user_fields:
                continue
            outsiders = [u for u in values if not is_member(user_id=u.pk, organization_id=organization_id)]
            if outsiders:
                names = ", ".join(f"'{u.username}'" for u in outsiders)
                form.add_error(
                    name,
                    f"{names} {'is' if len(outsiders) == 1 else 'are'} not a member of this {owner}'s organization.",
                )
        elif is_org_owned(related):
            others = [v for v in values if v.organization_id != organization_id]
            if others:
                what = capfirst(related._meta.verbose_name)
                form.add_error(
                    name,
                    f"{what} {', '.join(repr(str(v)) for v in others)} belongs to another organization than "
                    f"this {owner}: link only rows of one organization.",
                )


def _members_or_current(organization_id: str, current: Any) -> QuerySet:
    """The organisation's members, plus the users a stored row already names (a former member stays valid
    until someone changes the field)."""
    values = current if isinstance(current, list | tuple) else [current]
    current_ids = [getattr(v, "pk", v) for v in values if v]
    members = organization_members(organization_ids=[organization_id]).values("id")
    return User.objects.filter(Q(id__in=members) | Q(id__in=current_ids)).order_by("username")


# --- forms and admins ---------------------------------------------------------------------------------------


class OrgAdminForm(forms.ModelForm):
    """The form of every OrgScopedAdmin. OrgScopedAdmin.get_form sets the two attributes on the per-request
    class, so the form's clean can refuse, with the reason, what the user's role does not allow."""

    model_admin: OrgScopedAdmin | None = None
    admin_request: HttpRequest | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.model_admin is not None and self.admin_request is not None:
            self.model_admin.narrow_form(self.admin_request, self)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.model_admin is not None and self.admin_request is not None:
            self.model_admin.clean_form(self.admin_request, self)
        return cleaned


class OrgScopedAdmin(admin.ModelAdmin):
    """For models with an `organization` FK (OrgOwnedModel).

    Rights: `add_action` in the chosen organisation to add, `change_action` (`delete_action`, `view_action`)
    in the row's organisation to change (delete, see) it, with the row's creator (its `created_by`, or that
    of the row its `via` field names) for the matrix's creator rule. None: the Django permission alone.
    Services the admin calls get `admin_actor`; a DomainError they raise is shown as the page's error and
    nothing of that request is saved (`refusal_shown`)."""

    org_path = "organization_id"
    form = OrgAdminForm
    add_action: Action | None = None
    change_action: Action | None = None
    delete_action: Action | None = None  # None: change_action
    view_action: Action | None = None
    via: str | None = None
    free_user_fields: tuple[str, ...] = ()  # user fields that need not name a member (Membership.user)

    # Rights on rows.

    def row_action(self, request: HttpRequest, obj: Any, kind: str) -> Action | None:
        if kind == "delete":
            return self.delete_action or self.change_action
        return {"add": self.add_action, "change": self.change_action, "view": self.view_action}[kind]

    def row_creator_id(self, obj: Any) -> str | None:
        owner = getattr(obj, self.via) if self.via else obj
        return getattr(owner, "created_by_id", None)

    def row_shared(self, request: HttpRequest, obj: Any) -> bool:
        """Do other people's agents depend on this row (permissions.allows' `shared`)?"""
        return False

    def row_require(self, request: HttpRequest, obj: Any, kind: str) -> None:
        """Raises PermissionDenied unless the user may do `kind` (change, delete, view) to `obj`."""
        action = self.row_action(request, obj, kind)
        if action is None:
            return
        admin_require(
            request,
            obj.organization_id,
            action,
            creator_id=self.row_creator_id(obj),
            shared=self.row_shared(request, obj),
        )

    def _role_allows(self, request: HttpRequest, obj: Any, kind: str) -> bool:
        if obj is None:
            action = self.row_action(request, None, kind)
            # A new row has no creator yet unless it hangs on one (`via`): see add_require.
            as_creator = kind != "add" or self.via is not None
            return action is None or admin_allows_somewhere(request, action, as_creator=as_creator)
        try:
            self.row_require(request, obj, kind)
        except PermissionDenied:
            return False
        return True

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and self._role_allows(request, None, "add")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_change_permission(request, obj) and self._role_allows(request, obj, "change")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_delete_permission(request, obj) and self._role_allows(request, obj, "delete")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) and self._role_allows(request, obj, "view")

    def add_require(self, request: HttpRequest, form: forms.ModelForm, organization_id: str) -> None:
        """Raises PermissionDenied unless the user may add the row the form describes (or hang a stored one
        on another `via` row): for the matrix's creator rule, the creator is that of the `via` row, else
        nobody yet (so an add that needs the creator rule is for owners and admins)."""
        action = self.row_action(request, None, "add")
        if action is None:
            return
        target = form.cleaned_data.get(self.via) if self.via else None
        admin_require(request, organization_id, action, creator_id=getattr(target, "created_by_id", None))

    # Querysets and forms.

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

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """A stored row stays in its organisation: moving it would carry its links into another one."""
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None and is_org_owned(self.model) and "organization" not in fields:
            fields.append("organization")
        return fields

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        if not issubclass(form, OrgAdminForm):
            raise ImproperlyConfigured(f"{type(self).__name__}.form must be an OrgAdminForm")
        form.model_admin = self  # a class made for this call by modelform_factory
        form.admin_request = request
        return form

    def formfield_for_foreignkey(self, db_field: ForeignKey, request: HttpRequest, **kwargs: Any) -> Any:
        org_ids = admin_org_ids(request)
        related = db_field.related_model
        if org_ids is not None:
            if related is Organization:
                action = self.row_action(request, None, "add")
                as_creator = self.via is not None
                allowed = (
                    org_ids if action is None else admin_orgs_allowing(request, action, as_creator=as_creator)
                )
                kwargs["queryset"] = Organization.objects.filter(id__in=allowed)
            elif related is User:
                kwargs["queryset"] = organization_members(organization_ids=org_ids)
            elif hasattr(related, "all_objects") and is_org_owned(related):
                kwargs["queryset"] = related.all_objects.filter(organization_id__in=org_ids)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def formfield_for_manytomany(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        org_ids = admin_org_ids(request)
        related = db_field.related_model
        if org_ids is not None:
            if related is User:
                kwargs["queryset"] = organization_members(organization_ids=org_ids)
            elif hasattr(related, "all_objects"):
                kwargs["queryset"] = related.all_objects.filter(organization_id__in=org_ids)
        return super().formfield_for_manytomany(db_field, request, **kwargs)

    def form_organization_id(self, form: forms.ModelForm) -> str | None:
        if "organization" in form.fields:
            organization = form.cleaned_data.get("organization")
            return organization.pk if organization is not None else None
        return form.instance.organization_id

    def narrow_form(self, request: HttpRequest, form: forms.ModelForm) -> None:
        """On a stored row (or an add page opened for one organisation), user pickers list that
        organisation's members only."""
        if form.instance._state.adding:
            organization_id = form.initial.get("organization")
            if not isinstance(organization_id, str) or admin_role(request, organization_id) is None:
                return
        else:
            organization_id = form.instance.organization_id
        for name, field in form.fields.items():
            queryset = getattr(field, "queryset", None)
            if queryset is not None and queryset.model is User and name not in self.free_user_fields:
                field.queryset = _members_or_current(organization_id, form.initial.get(name))

    def clean_form(self, request: HttpRequest, form: forms.ModelForm) -> None:
        """OrgAdminForm.clean: what the user's role does not allow, and links out of the row's organisation,
        are form errors."""
        organization_id = self.form_organization_id(form)
        if organization_id is None:
            return  # the organisation field's own error says what is missing
        if form.instance._state.adding or (self.via is not None and self.via in form.changed_data):
            try:
                self.add_require(request, form, organization_id)
            except PermissionDenied as exc:
                form.add_error(None, exc.message)
        check_relations(form, organization_id, free_user_fields=self.free_user_fields)

    # Service calls whose refusal is shown, with nothing saved.

    @contextmanager
    def refusal_shown(self, request: HttpRequest) -> Iterator[None]:
        """Run a service call: a DomainError it raises becomes the page's error message, the request's
        transaction is rolled back (the admin's log entry too) and no success is reported."""
        try:
            yield
        except DomainError as exc:
            if connection.in_atomic_block:
                transaction.set_rollback(True)
            request._admin_refused = True  # type: ignore[attr-defined]
            self.message_user(request, exc.message, messages.ERROR)

    @staticmethod
    def refused(request: HttpRequest) -> bool:
        return getattr(request, "_admin_refused", False)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        if not self.refused(request):
            super().save_related(request, form, formsets, change)

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        return None if self.refused(request) else super().log_addition(request, obj, message)

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        return None if self.refused(request) else super().log_change(request, obj, message)

    def response_add(self, request: HttpRequest, obj: Any, post_url_continue: Any = None) -> HttpResponse:
        if self.refused(request):
            return HttpResponseRedirect(request.path)
        return super().response_add(request, obj, post_url_continue)

    def response_change(self, request: HttpRequest, obj: Any) -> HttpResponse:
        if self.refused(request):
            return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: Any) -> HttpResponse:
        if self.refused(request):
            opts = self.model._meta
            return HttpResponseRedirect(
                reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(obj_id)])
            )
        return super().response_delete(request, obj_display, obj_id)


class OrgInlineFormSet(forms.BaseInlineFormSet):
    """The rows of an OrgScopedInline: what they link stays in the parent's organisation.
    OrgScopedInline.get_formset sets the two attributes on the per-request class."""

    model_admin: OrgScopedInline | None = None
    admin_request: HttpRequest | None = None

    def clean(self) -> None:
        super().clean()
        organization_id = getattr(self.instance, "organization_id", None)
        if organization_id is None or self.model_admin is None or self.admin_request is None:
            return  # the parent's form says why it has no organisation
        for form in self.forms:
            if not hasattr(form, "cleaned_data") or self._should_delete_form(form) or not form.has_changed():
                continue
            check_relations(form, organization_id, owner=str(self.instance._meta.verbose_name))
            self.model_admin.clean_inline_form(self.admin_request, form)


class OrgScopedInline(admin.TabularInline):
    extra = 0
    formset = OrgInlineFormSet

    def formfield_for_foreignkey(self, db_field: ForeignKey, request: HttpRequest, **kwargs: Any) -> Any:
        org_ids = admin_org_ids(request)
        related = db_field.related_model
        if org_ids is not None and hasattr(related, "all_objects"):
            kwargs["queryset"] = related.all_objects.filter(organization_id__in=org_ids)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        formset = super().get_formset(request, obj, **kwargs)
        formset.model_admin = self  # a class made for this call by inlineformset_factory
        formset.admin_request = request
        return formset

    def clean_inline_form(self, request: HttpRequest, form: forms.ModelForm) -> None:
        """A changed row of the inline, after its relations were checked: add errors for what the user's
        role does not allow (the parent's own rights were checked before)."""


class WriteOnlySecretForm(OrgAdminForm):
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
