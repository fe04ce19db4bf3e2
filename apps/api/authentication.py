"""DRF authentication: `Authorization: Bearer <api key>` (what the Letta SDK sends) and session auth for the ADE.

Both put the resolved Actor on `request.auth`, so views never work out the organisation themselves.
A client address that sent API_KEY_FAILURE_LIMIT wrong keys within API_KEY_FAILURE_WINDOW seconds is
answered 429 until the window ends, before its key is looked up (apps.api.throttles).

Single-user local mode (ALLOW_ANONYMOUS_LOCAL, off by default): a request with neither a key nor a session
acts as the bootstrap admin (DJANGO_SUPERUSER_USERNAME) in their first organisation, with their role
there, when it comes from this machine (see anonymous_local).
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from apps.accounts.errors import AuthenticationFailed
from apps.accounts.selectors import SESSION_ORG_KEY, actor_for_user
from apps.accounts.services import api_key_authenticate, hash_api_key, user_lookup
from apps.api.throttles import ApiKeyFailureThrottle
from apps.core.errors import NotFound

logger = logging.getLogger(__name__)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        failures = ApiKeyFailureThrottle()
        failures.check(request)
        scheme, _, raw_key = header.partition(" ")
        if scheme.lower() != "bearer" or not raw_key.strip():
            failures.record_failure(request)
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <api key>'")
        try:
            result = api_key_authenticate(raw_key=raw_key.strip())
        except AuthenticationFailed as exc:
            failures.record_failure(request)
            raise exceptions.AuthenticationFailed(exc.message) from exc
        request.api_key_hash = hash_api_key(raw_key.strip())  # type: ignore[attr-defined]  # ApiKeyRateThrottle's
        return result

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class OrgSessionAuthentication(authentication.SessionAuthentication):
    """Django session (the ADE); the acting organisation is the one chosen in the session."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        result = super().authenticate(request)
        if result is None:
            return anonymous_local(request)  # the last resort, after a key and a session
        user, _ = result
        try:
            actor = actor_for_user(user=user, organization_id=request.session.get(SESSION_ORG_KEY))
        except NotFound as exc:
            raise exceptions.AuthenticationFailed("You are not a member of any organization") from exc
        return user, actor


FORWARDING_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")
"""Set by a reverse proxy: behind one, every client looks like loopback."""
BROWSER_HEADERS = ("HTTP_ORIGIN", "HTTP_SEC_FETCH_SITE")
"""Sent by browsers (to loopback origins too): a page on any site could otherwise drive the API."""
_announced = False


def _is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def anonymous_local(request: Request) -> tuple[Any, Any] | None:
    """Single-user local mode: (user, Actor) of the bootstrap admin for a request without credentials, or
    None (then 401 as usual).

    Only when ALLOW_ANONYMOUS_LOCAL is on, and only for a request that comes from this machine: its
    connection from a loopback address (REMOTE_ADDR: Django cannot know the address daphne binds, so the
    settings refuse to load with a non-loopback HOST, and each request is checked too), to a loopback host
    name (no DNS rebinding, whatever DJANGO_ALLOWED_HOSTS says), not relayed by a proxy (forwarding
    headers) and not sent by a browser (Origin, Sec-Fetch-Site: browsers sign in, so a web page cannot use
    the mode). Any process on this machine is then the owner: the mode is for a single-user computer."""
    global _announced
    if not settings.ALLOW_ANONYMOUS_LOCAL:
        return None
    meta = request.META
    if not _is_loopback(str(meta.get("REMOTE_ADDR") or "")):
        return None
    if any(meta.get(name) for name in (*FORWARDING_HEADERS, *BROWSER_HEADERS)):
        return None
    domain, _ = split_domain_port(str(meta.get("HTTP_HOST") or meta.get("SERVER_NAME") or ""))
    if not _is_loopback(domain):
        return None
    try:
        user = user_lookup(username=settings.ANONYMOUS_LOCAL_USERNAME)
        actor = actor_for_user(user=user)
    except NotFound:
        return None
    if not user.is_active:
        return None
    if not _announced:
        _announced = True
        logger.warning(
            "auth.anonymous_local_in_use",
            extra={"username": user.username, "organization_id": actor.organization_id},
        )
    return user, actor
