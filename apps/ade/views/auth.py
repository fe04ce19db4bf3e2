"""Sign in, sign out, and choosing the organisation to act for.

Failed sign-ins are counted by django-axes (settings: Throttling); a locked-out pair of username and
address gets `lockout_response`.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from axes.helpers import get_cool_off, get_lockout_message
from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from apps.accounts.selectors import SESSION_ORG_KEY, membership_for
from apps.ade.forms.account import OrganizationSwitchForm
from apps.ade.views.base import AdeRequest, ade_view, redirect_after_action
from apps.core.errors import NotFound


class LoginView(auth_views.LoginView):
    template_name = "ade/auth/login.html"
    redirect_authenticated_user = True
    http_method_names = ["get", "post", "head", "options"]  # a FormView would treat PUT as POST


def lockout_response(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict[str, Any] | None = None,
) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: 429 with Retry-After. The ADE's sign-in page says plainly why, in its own
    layout; the admin's sign-in (and anything else) answers django-axes' own message."""
    cool_off = get_cool_off(request)
    seconds = int(cool_off.total_seconds()) if cool_off else None
    status = settings.AXES_HTTP_RESPONSE_CODE
    if request.path == reverse("ade:login"):
        wait = f"Try again in {_minutes(seconds)}." if seconds else "Ask an administrator to unlock it."
        username = (credentials or {}).get("username") or request.POST.get("username", "")
        context = {
            "form": AuthenticationForm(request, initial={"username": username}),
            "next": request.POST.get("next", ""),
            "locked_out": f"Too many failed sign-ins for this username from your address. {wait}",
        }
        response = render(request, LoginView.template_name, context, status=status)
    else:
        response = HttpResponse(
            get_lockout_message(), status=status, content_type="text/plain; charset=utf-8"
        )
    if seconds:
        response["Retry-After"] = str(seconds)
    return response


def _minutes(seconds: int) -> str:
    minutes = max(1, round(seconds / 60))
    return "1 minute" if minutes == 1 else f"{minutes} minutes"


@require_POST
@ade_view
def organization_switch(request: AdeRequest) -> HttpResponse:
    form = OrganizationSwitchForm(request.POST)
    membership = None
    if form.is_valid():  # text, as typed: membership_for decides
        with suppress(NotFound):
            membership = membership_for(
                user=request.user,  # type: ignore[arg-type]
                organization_id=form.cleaned_data["organization_id"],
            )
    if membership is None:
        return HttpResponse("You are not a member of that organization.", status=403)
    request.session[SESSION_ORG_KEY] = membership.organization_id
    # Objects of the old organisation are not visible in the new one: land on its agent list.
    target = form.cleaned_data["next"] or reverse("ade:agent-list")
    if (
        not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()})
        or "/agents/agent-" in target
    ):
        target = reverse("ade:agent-list")
    return redirect_after_action(request, target)


@require_GET
@ade_view
def home(request: HttpRequest) -> HttpResponse:
    return redirect("ade:agent-list")


urlpatterns = [
    path("", home, name="home"),
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="ade:login"), name="logout"),
    path("org/switch/", organization_switch, name="org-switch"),
]
