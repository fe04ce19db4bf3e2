"""Writes of the llm app: an organisation's provider credentials (Letta's BYOK providers), and checking
that a provider answers to its key.

Keys are write-only: they are stored encrypted (apps.core.crypto) and no read path hands them back to
a person; only apps.llm.handles decrypts them to make a call, and the checks below to list models.
"""

from __future__ import annotations

import json
import logging
import re
from urllib.parse import urlsplit

import httpx
from django.db import IntegrityError, transaction

from apps.core import permissions
from apps.core.actor import Actor
from apps.core.errors import Conflict, DomainError, InvalidInput
from apps.core.outbound import check_url
from apps.core.permissions import Action
from apps.llm import records
from apps.llm.errors import STATUS_HINTS, LLMDeadlineExceeded, LLMError
from apps.llm.handles import ANTHROPIC_API_BASE, OPENAI_API_BASE
from apps.llm.models import LlmCall, Provider
from apps.llm.retry import CallBounds, CallGuard, Deadline, RetryPolicy, guarded
from apps.llm.selectors import (
    is_deployment_endpoint,
    provider_get,
    provider_missing,
    tenant_http_client,
)

logger = logging.getLogger(__name__)

PROVIDER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
"""A handle prefix: `<name>/<model>`, so no '/' and nothing a person could misread."""
BASE_URL_MAX_LENGTH = Provider._meta.get_field("base_url").max_length or 200


def _require_manage(actor: Actor) -> None:
    permissions.require(actor, Action.PROVIDER_MANAGE)


def check_base_url(url: str) -> None:
    """http(s) with a host the outbound guard lets tenants reach (apps.core.outbound: public addresses;
    a model server on the same machine or network only when the operator allows it, OUTBOUND_ALLOW).
    Raises InvalidInput (OutboundRefused) with the reason."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise InvalidInput(f"The base URL is not a valid URL: '{url}'.") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in url:
        raise InvalidInput(f"The base URL must be an http:// or https:// URL, got '{url}'.")
    if len(url) > BASE_URL_MAX_LENGTH:
        raise InvalidInput(f"The base URL is longer than {BASE_URL_MAX_LENGTH} characters.")
    check_url(url, what="The base URL")


@transaction.atomic
def provider_create(
    *, actor: Actor, name: str, provider_type: str, api_key: str = "", base_url: str = ""
) -> Provider:
    """Add a provider credential to the actor's organisation (owners and admins only).

    Raises PermissionDenied, InvalidInput (bad name, type or URL; a type's required key or URL missing)
    and Conflict (the organisation already has a provider of that name).
    """
    _require_manage(actor)
    name, api_key, base_url = name.strip(), api_key.strip(), base_url.strip()
    if provider_type not in Provider.Type.values:
        raise InvalidInput(f"Choose a provider type ({', '.join(Provider.Type.values)}).")
    if not PROVIDER_NAME.match(name):
        raise InvalidInput(
            "The name is the handle prefix (as in 'openai/gpt-4o-mini'): use letters, digits, '-', '_' "
            "or '.', at most 100 characters, without '/'."
        )
    if base_url:
        check_base_url(base_url)
    missing = provider_missing(provider_type=provider_type, api_key=api_key, base_url=base_url)
    if missing:
        raise InvalidInput(f"{Provider.Type(provider_type).label} providers need {missing}.")
    providers = Provider.objects.for_actor(actor)
    if providers.filter(name=name).exists():
        raise Conflict(
            f"This organization already has a provider named '{name}'; delete it first to replace it."
        )
    try:
        with transaction.atomic():
            return providers.create(
                name=name, provider_type=provider_type, api_key=api_key, base_url=base_url
            )
    except IntegrityError as exc:  # created concurrently under the same name
        raise Conflict(f"This organization already has a provider named '{name}'.") from exc


@transaction.atomic
def provider_delete(*, actor: Actor, provider_id: str) -> Provider:
    """Remove a provider credential (owners and admins only). Agents whose handles named it stop
    resolving until a provider of that name exists again (or the deployment serves the name).
    Raises PermissionDenied, NotFound."""
    _require_manage(actor)
    provider = provider_get(actor=actor, provider_id=provider_id)
    provider.delete()
    return provider


@transaction.atomic
def provider_update(
    *, actor: Actor, provider_id: str, api_key: str | None = None, base_url: str | None = None
) -> Provider:
    """Replace a provider's key and/or base URL (None: keep; "": clear). Its name and type stay (Letta's
    ProviderUpdate). Raises PermissionDenied, NotFound, InvalidInput (a URL the outbound guard refuses,
    or a change that leaves the provider without what its type needs)."""
    _require_manage(actor)
    provider = provider_get(actor=actor, provider_id=provider_id)
    provider = Provider.objects.for_actor(actor).select_for_update().get(id=provider.id)
    if api_key is not None:
        provider.api_key = api_key.strip()
    if base_url is not None:
        base_url = base_url.strip()
        if base_url:
            check_base_url(base_url)
        provider.base_url = base_url
    missing = provider_missing(
        provider_type=provider.provider_type, api_key=provider.api_key, base_url=provider.base_url
    )
    if missing:
        raise InvalidInput(f"{Provider.Type(provider.provider_type).label} providers need {missing}.")
    provider.save()
    return provider


# --- checking a provider's key ------------------------------------------------------------------------------

CHECK_DEADLINE_S = 30.0
"""A check answers a person waiting in a request: at most this long (or LLM_CALL_DEADLINE, if shorter)."""
CHECK_MAX_BODY_BYTES = 4 * 1024 * 1024
"""More than any real model list; a provider sending more is not read further."""
ANTHROPIC_VERSION = "2023-06-01"


class ProviderCheckFailed(DomainError):
    """The provider did not accept the key or could not be asked. The message says which kind of failure
    and the HTTP status, never the provider's body or the network's words (a tenant's URL may point
    anywhere the guard allows). `key_refused`: the provider answered 401 or 403."""

    code = "provider_check_failed"

    def __init__(self, message: str, *, key_refused: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.key_refused = key_refused
        self.status = status


def provider_check(*, actor: Actor, provider_type: str, api_key: str = "", base_url: str = "") -> str:
    """Ask a provider that is not stored whether it accepts the key (Letta's check_provider): one model
    listing, behind the outbound guard for a URL the tenant chose, within CHECK_DEADLINE_S. Returns
    Letta's success message. Raises PermissionDenied, InvalidInput (a bad type, a refused URL, what the
    type needs missing), ProviderCheckFailed."""
    _require_manage(actor)
    api_key, base_url = api_key.strip(), base_url.strip()
    if provider_type not in Provider.Type.values:
        raise InvalidInput(f"Choose a provider type ({', '.join(Provider.Type.values)}).")
    if base_url:
        check_base_url(base_url)
    missing = provider_missing(provider_type=provider_type, api_key=api_key, base_url=base_url)
    if missing:
        raise InvalidInput(f"{Provider.Type(provider_type).label} providers need {missing}.")
    _probe(provider_type=provider_type, api_key=api_key, base_url=base_url)
    return f"Valid api key for provider_type={provider_type}"


def provider_check_stored(*, actor: Actor, provider_id: str) -> str:
    """provider_check for one of the organisation's providers, with its stored key. Raises
    PermissionDenied, NotFound, InvalidInput, ProviderCheckFailed."""
    _require_manage(actor)
    provider = provider_get(actor=actor, provider_id=provider_id)
    missing = provider_missing(
        provider_type=provider.provider_type, api_key=provider.api_key, base_url=provider.base_url
    )
    if missing:
        raise InvalidInput(f"Provider '{provider.name}' needs {missing}.")
    _probe(provider_type=provider.provider_type, api_key=provider.api_key, base_url=provider.base_url)
    return f"Valid api key for provider_type={provider.provider_type}"


def _listing_request(*, provider_type: str, api_key: str, base_url: str) -> tuple[str, str, dict[str, str]]:
    """(API base, URL, headers) of the model listing that proves a key: OpenAI-style `GET {base}/models`
    (Ollama's OpenAI API is under /v1), or Anthropic's `GET /v1/models`. The API base is normalised as
    apps.llm.handles resolves it, so that the deployment's own providers are recognised."""
    if provider_type == Provider.Type.ANTHROPIC:
        base = (base_url or ANTHROPIC_API_BASE).rstrip("/")
        url = f"{base}/models" if base.endswith("/v1") else f"{base}/v1/models"
        return base, url, {"x-api-key": api_key, "anthropic-version": ANTHROPIC_VERSION}
    base = (base_url or OPENAI_API_BASE).rstrip("/")
    if provider_type == Provider.Type.OLLAMA and not base.endswith("/v1"):
        base += "/v1"
    return base, f"{base}/models", ({"Authorization": f"Bearer {api_key}"} if api_key else {})


def _probe(*, provider_type: str, api_key: str, base_url: str) -> None:
    base, url, headers = _listing_request(provider_type=provider_type, api_key=api_key, base_url=base_url)
    policy = RetryPolicy.from_settings()
    bounds = CallBounds.from_settings(
        within=Deadline.after(CHECK_DEADLINE_S, f"the provider did not answer within {CHECK_DEADLINE_S:g} s")
    )
    label = f"{provider_type} provider check"
    try:
        with guarded(bounds, label=label) as guard:
            if is_deployment_endpoint(base):  # the operator's own provider: trusted, as for its calls
                with httpx.Client() as client:
                    status, body = _get(client, url, headers, guard, policy)
            else:
                status, body = _get(tenant_http_client(), url, headers, guard, policy)
    except LLMError as exc:  # the deadline passed (the check's own, or LLM_CALL_DEADLINE if sooner)
        reason = exc.deadline.reason if isinstance(exc, LLMDeadlineExceeded) else exc.message
        raise ProviderCheckFailed(f"Provider check failed: {reason}") from exc
    if status in (401, 403):
        raise ProviderCheckFailed(
            f"Provider check failed: the provider refused the API key (HTTP {status})",
            key_refused=True,
            status=status,
        )
    if not 200 <= status < 300:
        hint = "redirects are not followed" if 300 <= status < 400 else STATUS_HINTS.get(status)
        raise ProviderCheckFailed(
            f"Provider check failed: the provider answered HTTP {status}" + (f" ({hint})" if hint else ""),
            status=status,
        )
    try:
        listing = json.loads(body)
    except ValueError:
        listing = None
    if not isinstance(listing, dict) or not isinstance(listing.get("data"), list):
        raise ProviderCheckFailed(
            "Provider check failed: the answer is not a model list (check the base URL)", status=status
        )


def _get(
    client: httpx.Client, url: str, headers: dict[str, str], guard: CallGuard, policy: RetryPolicy
) -> tuple[int, bytes]:
    """One bounded GET: (status, body of a 2xx answer, at most CHECK_MAX_BODY_BYTES). Raises
    ProviderCheckFailed for a transport failure, the guard's stop for its deadline."""
    try:
        with client.stream(
            "GET", url, headers=headers, timeout=guard.read_timeout(policy.timeout)
        ) as response:
            if not 200 <= response.status_code < 300:
                return response.status_code, b""
            body = bytearray()
            for chunk in response.iter_bytes():
                guard.check()
                body += chunk
                if len(body) > CHECK_MAX_BODY_BYTES:
                    raise ProviderCheckFailed(
                        "Provider check failed: the answer is larger than a model list "
                        f"({CHECK_MAX_BODY_BYTES} bytes)",
                        status=response.status_code,
                    )
            return response.status_code, bytes(body)
    except httpx.HTTPError as exc:
        stop = guard.stop_after_failure()
        if stop is not None:
            raise stop from exc
        logger.info("llm.provider_check_unreachable", extra={"error": type(exc).__name__})
        raise ProviderCheckFailed(f"Provider check failed: {_transport_summary(exc)}") from exc


def _transport_summary(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return "could not connect to the provider"
    if isinstance(exc, httpx.TimeoutException):
        return "the provider did not answer in time"
    return "the connection to the provider failed"


def llm_calls_forget_agents(*, organization_id: str, agent_ids: list[str]) -> int:
    """Delete the LLM call records of deleted agents (they hold the agents' conversations; records link to
    agents by id, apps.llm sitting below apps.agents, so no cascade removes them). Returns how many."""
    deleted, _ = LlmCall.objects.for_org(organization_id).filter(agent_id__in=agent_ids).delete()
    return deleted


def llm_call_curl(record: LlmCall) -> str:
    """A recorded request as a curl command, with `$API_KEY` where the key goes (apps.llm.records)."""
    return records.curl_command(record)
