"""Git's smart HTTP protocol for an agent's memory (Letta's `/v1/git/{agent_id}/state.git`, outside the
OpenAPI schema as in Letta): `git clone http://127.0.0.1:8283/v1/git/<agent id>/state.git`.

Plain Django views, not DRF: the bodies are git's binary pkt-lines, and git authenticates in two ways the
API's authentication does not: `Authorization: Bearer <key>` (`git -c http.extraHeader=...`) and HTTP
basic with the API key as the password (or as the user name, with no password), so a plain clone URL
with credentials works. Without credentials: 401 with `WWW-Authenticate: Basic`, which makes git ask.
No session or cookie is accepted, hence no CSRF check. What the repository does lives in
apps.memory.git_memory (through apps.memory.services)."""

from __future__ import annotations

import base64
import binascii
import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import Throttled

from apps.accounts.errors import AuthenticationFailed
from apps.accounts.services import api_key_authenticate, hash_api_key
from apps.agents.selectors import agent_get
from apps.api.throttles import ApiKeyFailureThrottle, ApiKeyRateThrottle, OrganizationRateThrottle, refused_by
from apps.core.actor import Actor
from apps.core.errors import DomainError, NotFound, PermissionDenied
from apps.memory.services import decode_body, git_info_refs, git_receive_pack, git_upload_pack

logger = logging.getLogger(__name__)

REALM = 'Basic realm="Letta agent memory", charset="UTF-8"'


def _text(status: int, message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")
    if status == 401:
        response["WWW-Authenticate"] = REALM
    return response


def _raw_key(request: HttpRequest) -> str | None:
    """The API key from a Bearer or Basic Authorization header; None when there is none."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, credentials = header.partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer":
        return credentials or None
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        username, _, password = decoded.partition(":")
        return password or username or None
    return None


def _authenticate(request: HttpRequest) -> Actor | HttpResponse:
    if not request.META.get("HTTP_AUTHORIZATION"):
        return _text(401, "Authentication required: use your API key as the password")
    failures = ApiKeyFailureThrottle()
    try:
        failures.check(request)  # type: ignore[arg-type]  # it reads only META
    except Throttled:
        return _text(429, "Too many wrong API keys from this address; try again later")
    raw_key = _raw_key(request)
    try:
        if raw_key is None:
            raise AuthenticationFailed("Authorization must be 'Bearer <api key>' or Basic with the key")
        _, actor = api_key_authenticate(raw_key=raw_key)
    except AuthenticationFailed as exc:
        failures.record_failure(request)  # type: ignore[arg-type]
        return _text(401, exc.message)
    # The API's request rates, counted in the same buckets as the key's /v1 requests (they read these).
    request.auth = actor  # type: ignore[attr-defined]
    request.api_key_hash = hash_api_key(raw_key.strip())  # type: ignore[attr-defined]
    refused = refused_by([ApiKeyRateThrottle(), OrganizationRateThrottle()], request, None)  # type: ignore[arg-type]
    if refused:
        response = _text(429, "Request was throttled: too many requests for this API key or organisation")
        response["Retry-After"] = str(int(max(t.wait() for t in refused) or 1))
        return response
    return actor


def _error(exc: DomainError) -> HttpResponse:
    if isinstance(exc, NotFound):
        return _text(404, exc.message)
    if isinstance(exc, PermissionDenied):
        return _text(403, exc.message)
    return _text(400, exc.message)


def _no_cache(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-cache, max-age=0, must-revalidate"
    response["Expires"] = "Fri, 01 Jan 1980 00:00:00 GMT"
    response["Pragma"] = "no-cache"
    return response


@csrf_exempt
@require_GET
def git_info_refs_view(request: HttpRequest, agent_id: str) -> HttpResponse:
    actor = _authenticate(request)
    if isinstance(actor, HttpResponse):
        return actor
    service = request.GET.get("service", "")
    try:
        agent = agent_get(actor=actor, agent_id=agent_id)
        body = git_info_refs(actor=actor, agent=agent, service=service)
    except DomainError as exc:
        return _error(exc)
    return _no_cache(HttpResponse(body, content_type=f"application/x-{service}-advertisement"))


def _service_view(request: HttpRequest, agent_id: str, service: str) -> HttpResponse:
    actor = _authenticate(request)
    if isinstance(actor, HttpResponse):
        return actor
    if request.content_type != f"application/x-{service}-request":
        return _text(415, f"Expected Content-Type application/x-{service}-request")
    try:
        agent = agent_get(actor=actor, agent_id=agent_id)
        raw = request.read(settings.GIT_MEMORY_MAX_PUSH_BYTES + 1)
        body = decode_body(raw, request.META.get("HTTP_CONTENT_ENCODING", ""))
        handler = git_receive_pack if service == "git-receive-pack" else git_upload_pack
        result = handler(actor=actor, agent=agent, body=body)
    except DomainError as exc:
        return _error(exc)
    return _no_cache(HttpResponse(result, content_type=f"application/x-{service}-result"))


@csrf_exempt
@require_POST
def git_upload_pack_view(request: HttpRequest, agent_id: str) -> HttpResponse:
    return _service_view(request, agent_id, "git-upload-pack")


@csrf_exempt
@require_POST
def git_receive_pack_view(request: HttpRequest, agent_id: str) -> HttpResponse:
    return _service_view(request, agent_id, "git-receive-pack")


_REPO = r"^v1/git/(?P<agent_id>[^/]+)/state\.git/"

urlpatterns = [
    re_path(_REPO + r"info/refs$", git_info_refs_view, name="git-info-refs"),
    re_path(_REPO + r"git-upload-pack$", git_upload_pack_view, name="git-upload-pack"),
    re_path(_REPO + r"git-receive-pack$", git_receive_pack_view, name="git-receive-pack"),
]
