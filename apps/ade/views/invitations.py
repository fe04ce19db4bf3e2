"""Accepting an invitation: the page behind the link an owner shares (`/invite/<token>/`).

Open to everyone, so not an `@ade_view`: a signed-in user (even one who belongs to no organisation yet)
sees the organisation and role and accepts; a visitor signs in first (and comes back here) or creates an
account on the page and joins in one step. Afterwards the session acts for the new organisation.

Any token that cannot be used (unknown, expired, revoked, already used) gets the same page and status, so
the answer helps no one guess. The page is cheap to ask: one indexed lookup of the token's SHA-256, and the
costly part (hashing a new account's password) only runs for a valid token. Tokens are 256-bit random, so
there is nothing to gain from guessing; sign-ins from here go through the sign-in page and its lockout.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_http_methods

from apps.accounts import selectors as account_selectors
from apps.accounts import services as account_services
from apps.accounts.models import Invitation, Membership
from apps.accounts.selectors import SESSION_ORG_KEY
from apps.ade.forms.account import JoinForm
from apps.core.errors import Conflict, InvalidInput, NotFound

# A new account's sign-in skips authenticate(), so the session must name the backend that loads it.
_SESSION_BACKEND = "django.contrib.auth.backends.ModelBackend"


def _page(request: HttpRequest, invitation: Invitation, *, status: int = 200, **extra: Any) -> HttpResponse:
    user = request.user
    context = {
        "invitation": invitation,
        "organization": invitation.organization,
        "already_member": user.is_authenticated
        and account_selectors.user_memberships(user=user)
        .filter(organization_id=invitation.organization_id)
        .exists(),
        "form": {"username": ""},
        **extra,
    }
    return _no_store(render(request, "ade/invitations/accept.html", context, status=status))


def _invalid(request: HttpRequest) -> HttpResponse:
    return _no_store(render(request, "ade/invitations/invalid.html", status=404))


def _no_store(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-store"  # the page's address is the secret
    return response


def _joined(request: HttpRequest, membership: Membership) -> HttpResponse:
    request.session[SESSION_ORG_KEY] = membership.organization_id
    messages.success(request, f"You joined {membership.organization.name} as {membership.role}.")
    return redirect("ade:agent-list")


@require_http_methods(["GET", "POST"])
def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    try:
        invitation = account_selectors.invitation_for_token(raw_token=token)
    except NotFound:
        return _invalid(request)
    if request.method == "GET":
        return _page(request, invitation)

    if request.user.is_authenticated:
        try:
            membership = account_services.invitation_accept(user=request.user, raw_token=token)
        except NotFound:  # used or revoked since the page was shown
            return _invalid(request)
        except Conflict as exc:
            return _page(request, invitation, status=409, error=exc.message)
        return _joined(request, membership)

    form = JoinForm(request.POST)
    if form.is_valid():  # text, as typed: the service judges the username and the password
        try:
            membership = account_services.invitation_accept_as_new_user(raw_token=token, **form.cleaned_data)
        except NotFound:
            return _invalid(request)
        except InvalidInput as exc:
            form.add_domain_error(exc)
    if not form.is_valid():
        username = form.values()["username"]
        return _page(request, invitation, status=422, error=form.first_error, form={"username": username})
    login(request, membership.user, backend=_SESSION_BACKEND)
    return _joined(request, membership)


urlpatterns = [
    path("invite/<str:token>/", invitation_accept, name="invitation-accept"),
]
