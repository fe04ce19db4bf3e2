"""DRF authentication: `Authorization: Bearer <api key>` (what the Letta SDK sends) and session auth for the ADE.

Both put the resolved Actor on `request.auth`, so views never work out the organisation themselves.
A client address that sent API_KEY_FAILURE_LIMIT wrong keys within API_KEY_FAILURE_WINDOW seconds is
answered 429 until the window ends, before its key is looked up (apps.api.throttles).
"""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from apps.accounts.errors import AuthenticationFailed
from apps.accounts.selectors import SESSION_ORG_KEY, actor_for_user
from apps.accounts.services import api_key_authenticate, hash_api_key
from apps.api.throttles import ApiKeyFailureThrottle
from apps.core.errors import NotFound


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
            return None
        user, _ = result
        try:
            actor = actor_for_user(user=user, organization_id=request.session.get(SESSION_ORG_KEY))
        except NotFound as exc:
            raise exceptions.AuthenticationFailed("You are not a member of any organization") from exc
        return user, actor
