from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from apps.accounts.admin_base import OrgAdminForm, OrgScopedAdmin, admin_actor
from apps.core.errors import InvalidInput
from apps.core.permissions import Action
from apps.identities import services
from apps.identities.models import Identity

FIELDS = ["identifier_key", "name", "identity_type", "project_id", "properties"]


class IdentityAdminForm(OrgAdminForm):
    class Meta:
        model = Identity
        fields = "__all__"

    def clean_properties(self) -> Any:
        try:
            return [p.as_json() for p in services.parse_properties(self.cleaned_data["properties"])]
        except InvalidInput as exc:
            raise ValidationError(exc.message) from exc


@admin.register(Identity)
class IdentityAdmin(OrgScopedAdmin):
    """Saves and deletes go through the identities' services: a member changes the identities they created
    (owners and admins every one), and links only agents they configure and blocks they may write."""

    form = IdentityAdminForm
    add_action = Action.IDENTITY_CREATE
    change_action = Action.IDENTITY_WRITE
    list_display = ["name", "identifier_key", "identity_type", "id", "organization", "updated_at"]
    list_filter = ["identity_type"]
    search_fields = ["name", "identifier_key", "id"]
    readonly_fields = ["created_by"]
    fields = ["organization", *FIELDS, "agents", "blocks", "created_by"]
    filter_horizontal = ["agents", "blocks"]

    def save_model(self, request: HttpRequest, obj: Identity, form: Any, change: bool) -> None:
        actor = admin_actor(request, obj.organization_id)
        data = form.cleaned_data
        properties = services.parse_properties(data["properties"])
        with self.refusal_shown(request):
            if change:
                changed = set(form.changed_data)
                services.identity_update(
                    actor=actor,
                    identity_id=obj.pk,
                    replace=True,
                    **{
                        name: data[name]
                        for name in ("identifier_key", "name", "identity_type")
                        if name in changed
                    },
                    properties=properties if "properties" in changed else None,
                    agent_ids=[a.pk for a in data["agents"]] if "agents" in changed else None,
                    block_ids=[b.pk for b in data["blocks"]] if "blocks" in changed else None,
                    project_id=(data["project_id"] or "") if "project_id" in changed else None,
                )
                return
            created = services.identity_create(
                actor=actor,
                identifier_key=data["identifier_key"],
                name=data["name"],
                identity_type=data["identity_type"],
                project_id=data.get("project_id"),
                properties=properties,
                agent_ids=[a.pk for a in data["agents"]],
                block_ids=[b.pk for b in data["blocks"]],
            )
            obj.pk = created.pk
            obj._state.adding = False

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """The agents and blocks were linked by the service in save_model, with its checks."""

    def delete_model(self, request: HttpRequest, obj: Identity) -> None:
        with self.refusal_shown(request):
            services.identity_delete(actor=admin_actor(request, obj.organization_id), identity_id=obj.pk)
