"""ADE: organisation settings: LLM provider credentials, API keys, members and roles.

Each settings tab is one page whose panel (`#<tab>-panel`) is re-rendered by its HTMX actions: invalid
input answers 422 with the panel and its message, a refused role answers 403 (see base.ade_view).

Who may do what (the services enforce it; the pages only hide what would be refused):
- LLM providers: owners and admins add and delete; members see the list (never a key).
- API keys: everyone creates their own keys; owners and admins see and revoke every key of the
  organisation, members only their own.
- Members: owners invite (a single-use link, shown once), change roles and remove; the last owner can be
  neither demoted nor removed. Nothing on the page says whether a username exists: people join by
  opening the link (apps/ade/views/invitations.py).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRefresh

from apps.accounts import selectors as account_selectors
from apps.accounts import services as account_services
from apps.ade.forms.account import ApiKeyForm, InvitationForm, MemberRoleForm, ProviderForm
from apps.ade.views.base import AdeRequest, ade_view, redirect_after_action
from apps.core import permissions
from apps.core.actor import Role
from apps.core.errors import Conflict, InvalidInput
from apps.core.permissions import Action
from apps.llm import selectors as llm_selectors
from apps.llm import services as llm_services
from apps.llm.models import Provider

PROVIDER_TYPES = [
    # (value, label, default name, base URL placeholder, what it needs)
    (Provider.Type.OPENAI.value, "OpenAI", "openai", "https://api.openai.com/v1 (default)",
     "An API key from platform.openai.com. A base URL is only needed for a proxy."),
    (Provider.Type.ANTHROPIC.value, "Anthropic", "anthropic", "https://api.anthropic.com (default)",
     "An API key from console.anthropic.com."),
    (Provider.Type.OLLAMA.value, "Ollama", "ollama", "http://localhost:11434",
     "The base URL of an Ollama server; no key needed."),
    (Provider.Type.OPENAI_COMPATIBLE.value, "OpenAI-compatible (vLLM, LM Studio, ...)", "local",
     "http://localhost:8000/v1", "The server's base URL (with /v1), and a key if it asks for one."),
]  # fmt: skip
ROLE_CHOICES = [(Role.OWNER.value, "Owner"), (Role.ADMIN.value, "Admin"), (Role.MEMBER.value, "Member")]


def _render(
    request: AdeRequest, tab: str, context: dict[str, Any], *, status: int = 200, oob_banner: bool = False
) -> HttpResponse:
    """The tab's full page, or for HTMX requests its panel (plus the no-provider banner, out of band,
    when the action may have changed it)."""
    context = {
        "tab": tab,
        "llm_configured": llm_selectors.llm_configured(actor=request.actor),
        "oob_banner": oob_banner,
        **context,
    }
    template = f"ade/settings/_{tab}_panel.html" if request.htmx else f"ade/settings/{tab}.html"
    return render(request, template, context, status=status)


@require_GET
@ade_view
def settings_home(request: AdeRequest) -> HttpResponse:
    return redirect("ade:settings-providers")


# --- LLM providers ---------------------------------------------------------------------------------


def _providers_context(request: AdeRequest, **extra: Any) -> dict[str, Any]:
    providers = [
        (
            provider,
            llm_selectors.provider_missing(
                provider_type=provider.provider_type, api_key=provider.api_key, base_url=provider.base_url
            ),
        )
        for provider in llm_selectors.provider_list(actor=request.actor)
    ]
    return {
        "providers": providers,
        "deployment_providers": llm_selectors.deployment_llm_providers(),
        "provider_types": PROVIDER_TYPES,
        "form": {"provider_type": Provider.Type.OPENAI.value, "name": "openai"},
        **extra,
    }


@require_http_methods(["GET", "POST"])
@ade_view
def providers(request: AdeRequest) -> HttpResponse:
    if request.method != "POST":
        return _render(request, "providers", _providers_context(request))
    # The key is read once here and never put back into a page, not even when the form is refused.
    form = ProviderForm(request.POST)
    if form.is_valid():  # text, as typed: the service judges it
        try:
            provider = llm_services.provider_create(actor=request.actor, **form.cleaned_data)
        except (InvalidInput, Conflict) as exc:
            form.add_domain_error(exc)
    if not form.is_valid():
        context = _providers_context(request, form=form.values(), error=form.first_error)
        return _render(request, "providers", context, status=422)
    notice = f"Provider '{provider.name}' added: use it in handles such as {provider.name}/<model>."
    if not request.htmx:
        messages.success(request, notice)
        return redirect("ade:settings-providers")
    return _render(request, "providers", _providers_context(request, notice=notice), oob_banner=True)


@require_POST
@ade_view
def provider_delete(request: AdeRequest, provider_id: str) -> HttpResponse:
    provider = llm_services.provider_delete(actor=request.actor, provider_id=provider_id)
    notice = f"Provider '{provider.name}' deleted."
    if not request.htmx:
        messages.success(request, notice)
        return redirect("ade:settings-providers")
    return _render(request, "providers", _providers_context(request, notice=notice), oob_banner=True)


# --- API keys --------------------------------------------------------------------------------------


def _api_keys_context(request: AdeRequest, **extra: Any) -> dict[str, Any]:
    return {"api_keys": account_selectors.api_key_list_visible(actor=request.actor)[:200], **extra}


@require_http_methods(["GET", "POST"])
@ade_view
def api_keys(request: AdeRequest) -> HttpResponse:
    if request.method != "POST":
        return _render(request, "api_keys", _api_keys_context(request))
    form = ApiKeyForm(request.POST)
    if not form.is_valid():
        context = _api_keys_context(request, error=form.first_error, name=form.values()["name"])
        return _render(request, "api_keys", context, status=422)
    created = account_services.api_key_create(
        actor=request.actor,
        user=request.user,  # type: ignore[arg-type]
        name=form.cleaned_data["name"],
    )
    # The raw key is in this one response and nowhere else: no redirect, no session, no cache.
    response = _render(request, "api_keys", _api_keys_context(request, created=created))
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@ade_view
def api_key_revoke(request: AdeRequest, api_key_id: str) -> HttpResponse:
    api_key = account_services.api_key_revoke(actor=request.actor, api_key_id=api_key_id)
    notice = f"Key '{api_key.name}' ({api_key.prefix}…) revoked: requests with it are now refused."
    if not request.htmx:
        messages.success(request, notice)
        return redirect("ade:settings-api-keys")
    return _render(request, "api_keys", _api_keys_context(request, notice=notice))


# --- members and roles -----------------------------------------------------------------------------


def _members_context(request: AdeRequest, **extra: Any) -> dict[str, Any]:
    is_owner = permissions.allows(request.actor, Action.MEMBER_MANAGE)
    invitations = account_selectors.invitation_list_pending(actor=request.actor)[:200] if is_owner else []
    return {
        "members": account_selectors.membership_list(actor=request.actor),
        "invitations": invitations,
        "role_choices": ROLE_CHOICES,
        "is_owner": is_owner,
        "form": {"role": Role.MEMBER.value},
        **extra,
    }


def _members_result(request: AdeRequest, notice: str) -> HttpResponse:
    if not request.htmx:
        messages.success(request, notice)
        return redirect("ade:settings-members")
    return _render(request, "members", _members_context(request, notice=notice))


def _members_error(request: AdeRequest, error: str, **extra: Any) -> HttpResponse:
    return _render(request, "members", _members_context(request, error=error, **extra), status=422)


@require_GET
@ade_view
def members(request: AdeRequest) -> HttpResponse:
    return _render(request, "members", _members_context(request))


@require_POST
@ade_view
def invitation_create(request: AdeRequest) -> HttpResponse:
    form = InvitationForm(request.POST)
    if form.is_valid():  # text, as typed: the service judges the role and the note
        try:
            created = account_services.invitation_create(actor=request.actor, **form.cleaned_data)
        except InvalidInput as exc:
            form.add_domain_error(exc)
    if not form.is_valid():
        return _members_error(request, form.first_error, form=form.values())
    link = request.build_absolute_uri(reverse("ade:invitation-accept", args=[created.raw_token]))
    # The link is in this one response and nowhere else: no redirect, no session, no cache.
    response = _render(request, "members", _members_context(request, created=created.invitation, link=link))
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@ade_view
def invitation_revoke(request: AdeRequest, invitation_id: str) -> HttpResponse:
    try:
        invitation = account_services.invitation_revoke(actor=request.actor, invitation_id=invitation_id)
    except InvalidInput as exc:
        return _members_error(request, exc.message)
    label = f" for {invitation.note}" if invitation.note else ""
    return _members_result(request, f"Invitation{label} revoked: its link no longer works.")


@require_POST
@ade_view
def member_role(request: AdeRequest, membership_id: int) -> HttpResponse:
    form = MemberRoleForm(request.POST)
    if not form.is_valid():  # text, as typed: the service judges the role
        return _members_error(request, form.first_error)
    try:
        membership = account_services.membership_set_role(
            actor=request.actor, membership_id=membership_id, role=form.cleaned_data["role"]
        )
    except InvalidInput as exc:
        return _members_error(request, exc.message)
    if membership.user_id == request.actor.user_id and request.htmx:
        # One's own new role changes what this page may show: the whole page loads again.
        return HttpResponseClientRefresh()
    return _members_result(request, f"{membership.user.username} is now {membership.role}.")


@require_POST
@ade_view
def member_remove(request: AdeRequest, membership_id: int) -> HttpResponse:
    try:
        membership = account_services.membership_remove(actor=request.actor, membership_id=membership_id)
    except InvalidInput as exc:
        return _members_error(request, exc.message)
    if membership.user_id == request.actor.user_id:  # left the organisation: nothing here is theirs now
        return redirect_after_action(request, reverse("ade:home"))
    return _members_result(request, f"{membership.user.username} removed from the organization.")


urlpatterns = [
    path("settings/", settings_home, name="settings"),
    path("settings/providers/", providers, name="settings-providers"),
    path("settings/providers/<str:provider_id>/delete/", provider_delete, name="settings-provider-delete"),
    path("settings/api-keys/", api_keys, name="settings-api-keys"),
    path("settings/api-keys/<str:api_key_id>/revoke/", api_key_revoke, name="settings-api-key-revoke"),
    path("settings/members/", members, name="settings-members"),
    path("settings/members/invitations/", invitation_create, name="settings-invitation-create"),
    path(
        "settings/members/invitations/<str:invitation_id>/revoke/",
        invitation_revoke,
        name="settings-invitation-revoke",
    ),
    path("settings/members/<int:membership_id>/role/", member_role, name="settings-member-role"),
    path("settings/members/<int:membership_id>/remove/", member_remove, name="settings-member-remove"),
]
