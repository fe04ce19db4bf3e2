"""Sign in, sign out, and choosing the organisation to act for."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from apps.accounts.selectors import SESSION_ORG_KEY, membership_for
from apps.ade.views.base import ade_view
from apps.core.errors import NotFound


class LoginView(auth_views.LoginView):
    template_name = "ade/auth/login.html"
    redirect_authenticated_user = True


@require_POST
@ade_view
def organization_switch(request: HttpRequest) -> HttpResponse:
    organization_id = request.POST.get("organization_id", "")
    try:
        membership = membership_for(user=request.user, organization_id=organization_id)  # type: ignore[arg-type]
    except NotFound:
        return HttpResponse("You are not a member of that organization.", status=403)
    request.session[SESSION_ORG_KEY] = membership.organization_id
    # Objects of the old organisation are not visible in the new one: land on its agent list.
    target = request.POST.get("next") or reverse("ade:agent-list")
    if (
        not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()})
        or "/agents/agent-" in target
    ):
        target = reverse("ade:agent-list")
    response = redirect(target)
    if request.headers.get("HX-Request"):
        response = HttpResponse(status=204)
        response["HX-Redirect"] = target
    return response


@ade_view
def home(request: HttpRequest) -> HttpResponse:
    return redirect("ade:agent-list")


urlpatterns = [
    path("", home, name="home"),
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="ade:login"), name="logout"),
    path("org/switch/", organization_switch, name="org-switch"),
]
