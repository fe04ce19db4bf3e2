"""Template context every ADE page needs: who is signed in, for which organisation, and the others."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from apps.accounts.selectors import user_memberships


def ade(request: HttpRequest) -> dict[str, Any]:
    actor = getattr(request, "actor", None)
    if actor is None or not request.user.is_authenticated:
        return {}
    # Lazy: only full pages (the organisation switcher) read them, not the HTMX partials of every action.
    memberships = SimpleLazyObject(lambda: list(user_memberships(user=request.user)))  # type: ignore[arg-type]
    current = SimpleLazyObject(
        lambda: next((m for m in memberships if m.organization_id == actor.organization_id), None)
    )
    return {"actor": actor, "memberships": memberships, "current_membership": current}
