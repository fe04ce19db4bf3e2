"""What every ADE view shares: the signed-in user's Actor, domain errors as pages, and HTMX helpers.

Views stay thin: they bind a form (apps/ade/forms/), call a service or selector with `request.actor`, and
render a template or partial. They never filter by organisation themselves; the selectors and services do.
HTMX response headers are set through django-htmx's helpers, never by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget, trigger_client_event
from django_htmx.middleware import HtmxDetails

from apps.accounts.selectors import SESSION_ORG_KEY, actor_for_user
from apps.core.actor import Actor
from apps.core.errors import DomainError, NotFound, PermissionDenied

View = Callable[..., HttpResponse]

AGENT_CHANGED = "ade:agent-changed"
"""The client event of an action that changed what the agent's next request holds: the workspace's
columns refresh on it (static/ade/memory.js listens on document.body)."""


class HtmxRequest(HttpRequest):
    """A request that went through django-htmx's middleware: `request.htmx` is truthy for HTMX requests."""

    htmx: HtmxDetails


class AdeRequest(HtmxRequest):
    """The request an `@ade_view` receives (for type hints)."""

    actor: Actor


def ade_view(view: View) -> View:
    """Sign-in required; sets `request.actor` for the organisation chosen in the session.

    NotFound becomes a 404 (another organisation's object looks exactly like a missing one), and
    PermissionDenied a 403 page that says what role is needed.
    """

    @wraps(view)
    def wrapper(request: HtmxRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        try:
            request.actor = actor_for_user(  # type: ignore[attr-defined]
                user=request.user, organization_id=request.session.get(SESSION_ORG_KEY)
            )
        except NotFound:
            return render(request, "ade/no_organization.html", status=403)
        try:
            return view(request, *args, **kwargs)
        except NotFound as exc:
            raise Http404(exc.message) from exc
        except PermissionDenied as exc:
            return error_response(request, exc, status=403)

    return wrapper


def refusal_status(error: DomainError, default: int = 422) -> int:
    """An inline error's status: 403 when the role matrix refused, else the view's own."""
    return 403 if isinstance(error, PermissionDenied) else default


def error_response(request: HtmxRequest, error: DomainError | str, *, status: int = 400) -> HttpResponse:
    """A clear message where the action happened: the HTMX target gets an inline error, a full page
    request gets the error page."""
    message = error.message if isinstance(error, DomainError) else error
    template = "ade/_error.html" if request.htmx else "ade/error.html"
    response = render(request, template, {"message": message}, status=status)
    if request.htmx:
        # The message goes to the page's flash slot, not into the panel the action targeted.
        reswap(retarget(response, "#flash"), "innerHTML")
    return response


def agent_changed(response: HttpResponse) -> HttpResponse:
    """Tell the workspace the agent changed (the AGENT_CHANGED event, in HX-Trigger)."""
    return trigger_client_event(response, AGENT_CHANGED)


def redirect_after_action(request: HtmxRequest, url: str) -> HttpResponse:
    """Where a finished action leads: HTMX navigates there (HX-Redirect; 204, nothing to swap), a plain
    form post is redirected."""
    if request.htmx:
        return HttpResponseClientRedirect(url, status=204)
    return redirect(url)
