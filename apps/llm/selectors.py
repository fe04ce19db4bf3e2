"""Reads of the llm app: an organisation's provider credentials, whether it can call any model, which
provider URLs are the deployment's own (trusted, and never shown to tenants), and a provider's model ids."""

from __future__ import annotations

import logging
import os
import threading

import httpx
from django.conf import settings
from django.db.models import QuerySet

from apps.core.actor import Actor
from apps.core.errors import NotFound
from apps.core.outbound import OutboundRefused, guarded_client, without_credentials
from apps.core.pagination import PageParams, paginate
from apps.llm.handles import (
    ANTHROPIC_API_BASE,
    DEFAULT_CONTEXT_WINDOW,  # noqa: F401 - for the adapters (as OPENAI_API_BASE)
    OPENAI_API_BASE,
)
from apps.llm.models import LlmCall, Provider

logger = logging.getLogger(__name__)

PUBLIC_API_BASES = frozenset({OPENAI_API_BASE, ANTHROPIC_API_BASE})
"""Providers' public defaults: shown to tenants whoever configured them (they reveal nothing)."""


def provider_list(*, actor: Actor) -> QuerySet[Provider]:
    return Provider.objects.for_actor(actor).order_by("name")


def provider_page(
    *, actor: Actor, page: PageParams, name: str | None = None, provider_type: str | None = None
) -> list[Provider]:
    """One page of the organisation's providers (Letta's list_providers: newest first by default)."""
    qs = Provider.objects.for_actor(actor)
    if name:
        qs = qs.filter(name=name)
    if provider_type:
        qs = qs.filter(provider_type=provider_type)
    return paginate(qs, page)


def provider_get(*, actor: Actor, provider_id: str) -> Provider:
    provider = Provider.objects.for_actor(actor).filter(id=provider_id).first()
    if provider is None:
        raise NotFound(f"Provider '{provider_id}' not found")
    return provider


def provider_missing(*, provider_type: str, api_key: str, base_url: str) -> str | None:
    """What a provider of this type still needs before it can serve a model ("an API key", "a base
    URL"), or None when it is complete. The same rule apps.llm.handles applies when resolving a handle:
    OpenAI needs a key (or a base URL: an OpenAI-compatible server behind the openai name), Anthropic a
    key, Ollama and OpenAI-compatible servers a base URL."""
    if provider_type == Provider.Type.OPENAI:
        return None if (api_key or base_url) else "an API key"
    if provider_type == Provider.Type.ANTHROPIC:
        return None if api_key else "an API key"
    return None if base_url else "a base URL"


def deployment_llm_providers() -> list[str]:
    """Provider names the deployment itself serves from its settings (OPENAI_API_KEY, OPENAI_BASE_URL,
    ANTHROPIC_API_KEY, OLLAMA_BASE_URL), available to every organisation without a Provider row."""
    names = []
    if settings.OPENAI_API_KEY or settings.OPENAI_BASE_URL:
        names.append("openai")
    if settings.ANTHROPIC_API_KEY:
        names.append("anthropic")
    if settings.OLLAMA_BASE_URL:
        names.append("ollama")
    return names


def llm_configured(*, actor: Actor) -> bool:
    """Can this organisation call any chat model at all: a complete Provider of its own, or a provider
    configured for the whole deployment? (Whether the remote end answers is not checked here.)"""
    if deployment_llm_providers():
        return True
    return any(
        provider_missing(provider_type=kind, api_key=key, base_url=base) is None
        for kind, key, base in provider_list(actor=actor).values_list("provider_type", "api_key", "base_url")
    )


def deployment_api_bases() -> frozenset[str]:
    """The API bases of the deployment's own providers (settings OPENAI_BASE_URL or, with only a key,
    OpenAI's; Anthropic's with ANTHROPIC_API_KEY; OLLAMA_BASE_URL), normalised as apps.llm.handles
    resolves them, so that a target's `api_base` compares equal."""
    bases = set()
    if settings.OPENAI_BASE_URL:
        bases.add(settings.OPENAI_BASE_URL.rstrip("/"))
    elif settings.OPENAI_API_KEY:
        bases.add(OPENAI_API_BASE)
    if settings.ANTHROPIC_API_KEY:
        bases.add(ANTHROPIC_API_BASE)
    if settings.OLLAMA_BASE_URL:
        ollama = settings.OLLAMA_BASE_URL.rstrip("/")
        bases.add(ollama if ollama.endswith("/v1") else f"{ollama}/v1")
    return frozenset(bases)


def is_deployment_endpoint(api_base: str | None) -> bool:
    """Whether calls to `api_base` go to a provider the operator configured (trusted: not behind the
    outbound guard). Anything else was chosen by a tenant. An organisation's provider with the very same
    URL reaches nothing more than the deployment's provider every organisation can use anyway."""
    return bool(api_base) and str(api_base).rstrip("/") in deployment_api_bases()


def endpoint_for_tenants(api_base: str | None) -> str | None:
    """What a tenant may see of a provider URL (`model_endpoint`, a trace's `api_base`): a public default
    as it is, the deployment's own URLs never (None: its hosts are internal), an organisation's own URL
    without the credentials a `user:password@` part would show."""
    if not api_base:
        return None
    if api_base.rstrip("/") in PUBLIC_API_BASES:
        return api_base
    if is_deployment_endpoint(api_base):
        return None
    return without_credentials(api_base)


def fetch_model_ids(base_url: str, *, api_key: str | None, timeout: float) -> list[str]:
    """Model ids from an OpenAI-style `GET {base_url}/models`; [] when the server is down, slow, refused
    by the outbound guard or answers oddly. A URL an organisation chose goes through the guard (one
    shared guarded client: public addresses or OUTBOUND_ALLOW, no redirects, no cookies); the
    deployment's own as before. No litellm here: listings run in the web process, which does not load it.
    """
    url = f"{base_url.rstrip('/')}/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        if is_deployment_endpoint(base_url):
            response = httpx.get(url, headers=headers, timeout=timeout)
        else:
            response = _model_list_client().get(url, headers=headers, timeout=timeout)
        response.raise_for_status()
        data = response.json().get("data")
    except (httpx.HTTPError, ValueError, AttributeError, OutboundRefused) as exc:
        logger.info("models.list_unreachable", extra={"error": type(exc).__name__})
        return []
    if not isinstance(data, list):
        return []
    return sorted({item["id"] for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)})


def tenant_http_client() -> httpx.Client:
    """The web process's shared client for provider URLs an organisation chose (model lists, checks):
    behind the outbound guard, no redirects, no cookies, no environment."""
    return _model_list_client()


_list_client: httpx.Client | None = None
_list_client_lock = threading.Lock()


def _model_list_client() -> httpx.Client:
    global _list_client
    with _list_client_lock:
        if _list_client is None:
            _list_client = guarded_client()
        return _list_client


def _forget_model_list_client() -> None:
    """A forked child must not share its parent's sockets: it builds its own client when it needs one."""
    global _list_client
    _list_client = None


os.register_at_fork(after_in_child=_forget_model_list_client)


def llm_call_list(
    *,
    actor: Actor,
    run_id: str | None = None,
    agent_id: str | None = None,
    step_id: str | None = None,
    status: str | None = None,
) -> QuerySet[LlmCall]:
    """The organisation's LLM call records, oldest first, filtered by what is given."""
    qs = LlmCall.objects.for_actor(actor)
    if run_id:
        qs = qs.filter(run_id=run_id)
    if agent_id:
        qs = qs.filter(agent_id=agent_id)
    if step_id:
        qs = qs.filter(step_id=step_id)
    if status:
        qs = qs.filter(status=status)
    return qs.order_by("created_at", "id")


def llm_call_get(*, actor: Actor, llm_call_id: str) -> LlmCall:
    """One record of the organisation. Raises NotFound."""
    record = LlmCall.objects.for_actor(actor).filter(id=llm_call_id).first()
    if record is None:
        raise NotFound(f"LLM call with id '{llm_call_id}' not found")
    return record


def run_token_turns(*, actor: Actor, run_id: str) -> list[LlmCall]:
    """The run's step calls with token data (return_token_ids / return_logprobs), in order."""
    return list(
        llm_call_list(actor=actor, run_id=run_id, status=LlmCall.Status.SUCCESS)
        .exclude(step_id="")
        .only("id", "step_id", "output_token_ids", "logprobs", "response_body", "created_at")
    )
