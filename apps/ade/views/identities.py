"""ADE: identities, the app's end users and organisations that agents serve (Letta's identities).

The list filters by name; an identity's page edits its key, name and type, its typed properties (one per
key: adding a key that exists replaces its value, as Letta's PATCH merges them) and the agents it is
linked to, and deletes it (its agents stay). Linking blocks stays in /v1 (`identities.blocks`).

Who may do what is apps.identities.services' rule (the role matrix's identity rows): every member may
create an identity; its creator, owners and admins may change or delete it, and linking an agent also
needs AGENT_CONFIGURE on the agent. Pages show only the controls their viewer may use; a refused action is
a 403 with the service's reason. Another organisation's identity or agent is a 404.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from apps.ade.forms.identities import AgentLinkForm, IdentityForm, PropertyForm
from apps.ade.views.base import AdeRequest, ade_view, redirect_after_action
from apps.agents import selectors as agent_selectors
from apps.core.errors import Conflict, DomainError, PermissionDenied
from apps.core.permissions import Action, allows
from apps.identities import selectors, services
from apps.identities.models import Identity, IdentityType, PropertyType

LIST_LIMIT = 200
"""Identities the list shows (newest first); the name filter reaches them all."""


def _may_write(request: AdeRequest, identity: Identity) -> bool:
    return allows(request.actor, Action.IDENTITY_WRITE, creator_id=identity.created_by_id)


def _choices() -> dict[str, Any]:
    return {"identity_types": IdentityType.choices, "property_types": PropertyType.choices}


# --- the list and create ---------------------------------------------------------------------------------


@require_GET
@ade_view
def identity_list(request: AdeRequest) -> HttpResponse:
    query = request.GET.get("q", "").strip()
    identities = selectors.identity_list(actor=request.actor, name=query or None).order_by(
        "-created_at", "-id"
    )
    context = {"identities": list(identities[:LIST_LIMIT]), "query": query, "limit": LIST_LIMIT}
    return render(request, "ade/identities/list.html", context)


@require_http_methods(["GET", "POST"])
@ade_view
def identity_create(request: AdeRequest) -> HttpResponse:
    empty = {"identifier_key": "", "name": "", "identity_type": IdentityType.USER}
    if request.method != "POST":
        return render(request, "ade/identities/new.html", {"form": empty, "errors": {}} | _choices())
    form = IdentityForm(request.POST)
    status = 422
    if form.is_valid():
        try:
            identity = services.identity_create(actor=request.actor, **form.cleaned_data)
        except PermissionDenied:
            raise  # ade_view's 403
        except DomainError as exc:  # a taken key (409), a long key or name
            form.add_domain_error(exc, "identifier_key")
            status = 409 if isinstance(exc, Conflict) else 422
        else:
            messages.success(request, f"Identity “{identity.name}” created.")
            return redirect_after_action(request, reverse("ade:identity-detail", args=[identity.id]))
    context = {"form": form.values(), "errors": form.error_map()} | _choices()
    return render(request, "ade/identities/new.html", context, status=status)


# --- an identity's page ------------------------------------------------------------------------------------


def _detail(request: AdeRequest, identity: Identity, *, status: int = 200, **extra: Any) -> HttpResponse:
    linked = list(
        agent_selectors.agent_list(actor=request.actor).filter(identities__id=identity.id).order_by("name")
    )
    linked_ids = {agent.id for agent in linked}
    others = [
        agent
        for agent in agent_selectors.agent_list(actor=request.actor).only("id", "name").order_by("name")
        if agent.id not in linked_ids
    ]
    context = {
        "identity": identity,
        "agents": linked,
        "other_agents": others,
        "can_write": _may_write(request, identity),
        "form": {
            "identifier_key": identity.identifier_key,
            "name": identity.name,
            "identity_type": identity.identity_type,
        },
        "property_form": {"key": "", "type": PropertyType.STRING, "value": ""},
        "errors": {},
    }
    return render(request, "ade/identities/detail.html", context | _choices() | extra, status=status)


def _done(request: AdeRequest, identity: Identity, notice: str) -> HttpResponse:
    messages.success(request, notice)
    return redirect_after_action(request, reverse("ade:identity-detail", args=[identity.id]))


@require_GET
@ade_view
def identity_detail(request: AdeRequest, identity_id: str) -> HttpResponse:
    return _detail(request, selectors.identity_get(actor=request.actor, identity_id=identity_id))


@require_POST
@ade_view
def identity_edit(request: AdeRequest, identity_id: str) -> HttpResponse:
    identity = selectors.identity_get(actor=request.actor, identity_id=identity_id)
    form = IdentityForm(request.POST)
    if form.is_valid():
        try:
            identity = services.identity_update(
                actor=request.actor, identity_id=identity.id, **form.cleaned_data
            )
        except PermissionDenied:
            raise
        except DomainError as exc:
            form.add_domain_error(exc, "identifier_key")
            status = 409 if isinstance(exc, Conflict) else 422
            return _detail(request, identity, status=status, form=form.values(), errors=form.error_map())
        return _done(request, identity, "Saved.")
    return _detail(request, identity, status=422, form=form.values(), errors=form.error_map())


@require_POST
@ade_view
def identity_property_set(request: AdeRequest, identity_id: str) -> HttpResponse:
    """One property: a new key is added, an existing key's value and type replaced (Letta's merge)."""
    identity = selectors.identity_get(actor=request.actor, identity_id=identity_id)
    form = PropertyForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            prop = services.IdentityProperty(key=data["key"], value=data["typed_value"], type=data["type"])
            services.identity_update(actor=request.actor, identity_id=identity.id, properties=[prop])
        except PermissionDenied:
            raise
        except DomainError as exc:
            form.add_domain_error(exc, "value")
        else:
            return _done(request, identity, f"Property “{prop.key}” saved.")
    property_errors = {f"property_{name}": text for name, text in form.error_map().items()}
    return _detail(request, identity, status=422, property_form=form.values(), errors=property_errors)


@require_POST
@ade_view
def identity_property_delete(request: AdeRequest, identity_id: str) -> HttpResponse:
    identity = selectors.identity_get(actor=request.actor, identity_id=identity_id)
    key = request.POST.get("key", "")
    kept = [prop for prop in services.parse_properties(identity.properties) if prop.key != key]
    services.identity_properties_set(actor=request.actor, identity_id=identity.id, properties=kept)
    return _done(request, identity, f"Property “{key}” removed.")


@require_POST
@ade_view
def identity_agent_link(request: AdeRequest, identity_id: str) -> HttpResponse:
    identity = selectors.identity_get(actor=request.actor, identity_id=identity_id)
    form = AgentLinkForm(request.POST)
    if not form.is_valid():
        return _detail(request, identity, status=422, errors={"agent": form.first_error})
    services.identity_attach_agent(  # another organisation's agent: its 404; a refusal: ade_view's 403
        actor=request.actor, identity_id=identity.id, agent_id=form.cleaned_data["agent"]
    )
    return _done(request, identity, "Agent linked.")


@require_POST
@ade_view
def identity_agent_unlink(request: AdeRequest, identity_id: str, agent_id: str) -> HttpResponse:
    identity = selectors.identity_get(actor=request.actor, identity_id=identity_id)
    services.identity_detach_agent(actor=request.actor, identity_id=identity.id, agent_id=agent_id)
    return _done(request, identity, "Agent unlinked.")


@require_POST
@ade_view
def identity_delete(request: AdeRequest, identity_id: str) -> HttpResponse:
    """Delete the identity; its agents and blocks stay, unlinked."""
    identity = selectors.identity_get(actor=request.actor, identity_id=identity_id)
    services.identity_delete(actor=request.actor, identity_id=identity.id)  # a refusal: ade_view's 403
    messages.success(request, f"Deleted identity “{identity.name}”.")
    return redirect_after_action(request, reverse("ade:identity-list"))


urlpatterns = [
    path("identities/", identity_list, name="identity-list"),
    path("identities/new/", identity_create, name="identity-create"),
    path("identities/<str:identity_id>/", identity_detail, name="identity-detail"),
    path("identities/<str:identity_id>/edit/", identity_edit, name="identity-edit"),
    path("identities/<str:identity_id>/delete/", identity_delete, name="identity-delete"),
    path("identities/<str:identity_id>/properties/", identity_property_set, name="identity-property-set"),
    path(
        "identities/<str:identity_id>/properties/delete/",
        identity_property_delete,
        name="identity-property-delete",
    ),
    path("identities/<str:identity_id>/agents/", identity_agent_link, name="identity-agent-link"),
    path(
        "identities/<str:identity_id>/agents/<str:agent_id>/unlink/",
        identity_agent_unlink,
        name="identity-agent-unlink",
    ),
]
