"""Reads of the llm app: an organisation's provider credentials, and whether it can call any model."""

from __future__ import annotations

from django.conf import settings
from django.db.models import QuerySet

from apps.core.actor import Actor
from apps.core.errors import NotFound
from apps.llm.models import Provider


def provider_list(*, actor: Actor) -> QuerySet[Provider]:
    return Provider.objects.for_actor(actor).order_by("name")


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
