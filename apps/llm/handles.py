"""Letta-style handles (`provider/model`) resolved into everything a litellm call needs.

The part before the first '/' names a provider: an organisation's `Provider` row of that name wins,
otherwise the deployment's environment settings (OPENAI_*, ANTHROPIC_API_KEY, OLLAMA_BASE_URL) may
supply `openai`, `anthropic` or `ollama`. Anything else is an `UnknownModelHandle`; there is no
silent fallback to OpenAI, for chat or for embeddings.

OpenAI-compatible servers (vLLM, LM Studio, the scripted test LLM) and Ollama are called through
litellm's OpenAI client at their `/v1` URL, so one well-exercised code path serves them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from apps.core.db import fetch_instances
from apps.llm._litellm import litellm
from apps.llm.errors import ContextWindowLimitTooLarge, ProviderNotConfigured, UnknownModelHandle
from apps.llm.models import Provider

DEFAULT_CONTEXT_WINDOW = 32_768
"""Context window for models litellm does not know (OpenAI-compatible servers, most Ollama models),
and the default cap for models it does know (Letta caps at 32k unless an agent sets a limit):
larger prompts cost more and answer slower, so a bigger window is an explicit choice."""

EMBEDDING_DIMENSIONS: dict[str, int] = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
    "nomic-embed-text": 768,
    "mxbai-embed-large": 1024,
    "all-minilm": 384,
}
"""Known embedding sizes by model name; other models learn theirs from a first call."""

OPENAI_API_BASE = "https://api.openai.com/v1"
ANTHROPIC_API_BASE = "https://api.anthropic.com"

ProviderType = Provider.Type


@dataclass(frozen=True, slots=True)
class ModelTarget:
    """A chat model resolved for one organisation.

    `api_base` is always explicit (the provider's public URL when none is configured), so where a call
    goes never depends on the process environment. `api_key` is kept out of repr (logs, tracebacks).
    """

    handle: str
    provider_name: str
    provider_type: str
    litellm_model: str
    api_base: str | None
    api_key: str | None = field(repr=False)
    context_window: int
    max_context_window: int


@dataclass(frozen=True, slots=True)
class EmbeddingTarget:
    """An embedding model resolved for one organisation; `dimension` is None until learned."""

    handle: str
    provider_name: str
    provider_type: str
    litellm_model: str
    api_base: str | None
    api_key: str | None = field(repr=False)
    dimension: int | None


@dataclass(frozen=True, slots=True)
class _Credentials:
    name: str
    provider_type: str
    api_key: str | None
    api_base: str | None


def resolve_model(
    handle: str,
    *,
    organization_id: str,
    context_window_limit: int | None = None,
    provider_rows: list[Provider] | None = None,
) -> ModelTarget:
    """Resolve a chat handle such as `openai/gpt-4o-mini` for an organisation.

    Raises UnknownModelHandle (or its ProviderNotConfigured) when the handle cannot be served, and
    ContextWindowLimitTooLarge when `context_window_limit` exceeds what litellm knows the model accepts.
    For models litellm does not know, an explicit limit is trusted as the model's window.
    `provider_rows`: what provider_query(handle) read, for a caller that sent it with other reads.
    """
    provider_name, model = _split(handle, kind="model")
    creds = _credentials(provider_name, organization_id=organization_id, handle=handle, rows=provider_rows)
    if creds.provider_type == ProviderType.ANTHROPIC:
        litellm_model, api_base = f"anthropic/{model}", creds.api_base or ANTHROPIC_API_BASE
    else:
        litellm_model, api_base = f"openai/{model}", _openai_base(creds)
    known = _known_context_window(creds.provider_type, model)
    if known is None:
        max_window = context_window_limit or DEFAULT_CONTEXT_WINDOW
    elif context_window_limit is not None and context_window_limit > known:
        raise ContextWindowLimitTooLarge(
            f"Context window limit {context_window_limit} is larger than {handle}'s maximum of {known} tokens."
        )
    else:
        max_window = known
    return ModelTarget(
        handle=handle,
        provider_name=creds.name,
        provider_type=creds.provider_type,
        litellm_model=litellm_model,
        api_base=api_base,
        api_key=creds.api_key,
        context_window=context_window_limit or min(max_window, DEFAULT_CONTEXT_WINDOW),
        max_context_window=max_window,
    )


def resolve_embedding(
    handle: str, *, organization_id: str, provider_rows: list[Provider] | None = None
) -> EmbeddingTarget:
    """Resolve an embedding handle such as `openai/text-embedding-3-small` for an organisation.

    An empty handle is an error (UnknownModelHandle), never a default model. Anthropic has no
    embedding models, so its handles are rejected too. `provider_rows`: as resolve_model's.
    """
    provider_name, model = _split(handle, kind="embedding")
    creds = _credentials(provider_name, organization_id=organization_id, handle=handle, rows=provider_rows)
    if creds.provider_type == ProviderType.ANTHROPIC:
        raise UnknownModelHandle(f"Embedding handle '{handle}': Anthropic has no embedding models.")
    return EmbeddingTarget(
        handle=handle,
        provider_name=creds.name,
        provider_type=creds.provider_type,
        litellm_model=f"openai/{model}",
        api_base=_openai_base(creds),
        api_key=creds.api_key,
        dimension=EMBEDDING_DIMENSIONS.get(model.split(":", 1)[0]),
    )


def _split(handle: str, *, kind: str) -> tuple[str, str]:
    provider_name, sep, model = (handle or "").strip().partition("/")
    if not handle or not handle.strip():
        raise UnknownModelHandle(f"No {kind} handle given; expected 'provider/model'.")
    if not sep or not provider_name or not model:
        raise UnknownModelHandle(
            f"Invalid {kind} handle '{handle}': expected 'provider/model', e.g. 'openai/gpt-4o-mini'."
        )
    return provider_name, model


PROVIDER_ALIAS = "provider"


def provider_query(handle: str, *, organization_id: str) -> tuple[str, list[Any]] | None:
    """The SELECT (select list `{columns}`, apps.core.db.RowReader, alias PROVIDER_ALIAS) of the
    organisation's Provider row a handle names; None for a handle resolve_model refuses anyway."""
    try:
        provider_name, _ = _split(handle, kind="model")
    except UnknownModelHandle:
        return None
    sql = (
        f"SELECT {{columns}} FROM {Provider._meta.db_table} AS {PROVIDER_ALIAS} "
        f"WHERE {PROVIDER_ALIAS}.organization_id = %s AND {PROVIDER_ALIAS}.name = %s LIMIT 1"
    )
    return sql, [organization_id, provider_name]


def _credentials(
    provider_name: str, *, organization_id: str, handle: str, rows: list[Provider] | None = None
) -> _Credentials:
    """The organisation's Provider row of that name, else the environment's provider of that name."""
    # Read for every run: the hand-written query costs a third of the ORM's (apps.core.db.RowReader).
    if rows is None:
        rows = fetch_instances(
            Provider,
            f"SELECT {{columns}} FROM {Provider._meta.db_table} AS {PROVIDER_ALIAS} "
            f"WHERE {PROVIDER_ALIAS}.organization_id = %s AND {PROVIDER_ALIAS}.name = %s LIMIT 1",
            [organization_id, provider_name],
            alias=PROVIDER_ALIAS,
        )
    row = rows[0] if rows else None
    if row is not None:
        creds = _Credentials(
            name=row.name,
            provider_type=row.provider_type,
            api_key=row.api_key or None,
            api_base=row.base_url or None,
        )
    else:
        creds = _environment_credentials(provider_name, handle=handle)
    _check_complete(creds, handle=handle)
    return creds


def _environment_credentials(provider_name: str, *, handle: str) -> _Credentials:
    if provider_name == "openai":
        return _Credentials(
            name="openai",
            provider_type=ProviderType.OPENAI.value,
            api_key=settings.OPENAI_API_KEY or None,
            api_base=settings.OPENAI_BASE_URL or None,
        )
    if provider_name == "anthropic":
        return _Credentials(
            name="anthropic",
            provider_type=ProviderType.ANTHROPIC.value,
            api_key=settings.ANTHROPIC_API_KEY or None,
            api_base=None,
        )
    if provider_name == "ollama":
        return _Credentials(
            name="ollama",
            provider_type=ProviderType.OLLAMA.value,
            api_key=None,
            api_base=settings.OLLAMA_BASE_URL or None,
        )
    raise UnknownModelHandle(
        f"Unknown provider '{provider_name}' in handle '{handle}': add a provider of that name "
        "to the organisation, or use openai/, anthropic/ or ollama/."
    )


def _check_complete(creds: _Credentials, *, handle: str) -> None:
    """A provider without what its type needs is refused now, not as a confusing 401 at call time."""
    kind = creds.provider_type
    if kind == ProviderType.OPENAI:
        missing = not (creds.api_key or creds.api_base)
    elif kind == ProviderType.ANTHROPIC:
        missing = not creds.api_key
    else:
        missing = not creds.api_base
    if missing:
        needs = "an API key" if kind in (ProviderType.OPENAI, ProviderType.ANTHROPIC) else "a base URL"
        raise ProviderNotConfigured(
            f"Provider '{creds.name}' for handle '{handle}' is not configured: it needs {needs}."
        )


def _openai_base(creds: _Credentials) -> str:
    """Always explicit: left empty, litellm would read OPENAI_BASE_URL from the process environment
    and send an organisation's key there. Ollama serves the OpenAI API under /v1."""
    if creds.api_base is None:
        return OPENAI_API_BASE
    base = creds.api_base.rstrip("/")
    if creds.provider_type == ProviderType.OLLAMA and not base.endswith("/v1"):
        base += "/v1"
    return base


def _known_context_window(provider_type: str, model: str) -> int | None:
    """The model's input window from litellm's bundled model map, or None when it is not listed.

    OpenAI-compatible servers name models freely, so their names are never looked up. Ollama names
    are read from the static map only: litellm's get_model_info would ask a local Ollama server.
    """
    if provider_type == ProviderType.OPENAI_COMPATIBLE:
        return None
    if provider_type == ProviderType.OLLAMA:
        info = litellm.model_cost.get(f"ollama/{model}") or {}
    else:
        try:
            info = litellm.get_model_info(model=model, custom_llm_provider=provider_type)
        except litellm.exceptions.ModelNotMappedError:
            return None
    window = info.get("max_input_tokens") or info.get("max_tokens")
    return int(window) if window else None
