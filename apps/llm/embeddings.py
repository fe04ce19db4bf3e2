"""Embeddings, batched, with the same retry policy and client reuse as chat calls: OpenAI-wire targets
through apps.llm.openai_wire (unless LLM_CLIENT=litellm), others through litellm; URLs an organisation
chose through the guarded client, their failures summarised, as in apps.llm.client."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from apps.llm import openai_wire
from apps.llm._litellm import litellm, tenant_client
from apps.llm.client import KEYLESS_API_KEY
from apps.llm.errors import InvalidLLMResponse, told_to_tenant
from apps.llm.handles import EmbeddingTarget
from apps.llm.retry import CallBounds, RetryPolicy, call_with_retries, guarded
from apps.llm.selectors import is_deployment_endpoint

DEFAULT_BATCH_SIZE = 100
"""Texts per request (setting LLM_EMBEDDING_BATCH_SIZE); well under OpenAI's 2048-input limit and
small enough that one failed request re-sends little."""


def embed(
    target: EmbeddingTarget,
    texts: list[str],
    *,
    batch_size: int | None = None,
    policy: RetryPolicy | None = None,
) -> list[list[float]]:
    """One vector per text, in order; `len(texts) / batch_size` requests, none for an empty list.

    Raises LLMApiError (after retries), InvalidLLMResponse when the provider returns the wrong number
    of vectors or vectors of a size other than `target.dimension`.
    """
    size = batch_size or int(getattr(settings, "LLM_EMBEDDING_BATCH_SIZE", DEFAULT_BATCH_SIZE))
    if size < 1:
        raise ValueError("batch_size must be at least 1")
    policy = policy or RetryPolicy.from_settings()
    vectors: list[list[float]] = []
    for start in range(0, len(texts), size):
        vectors.extend(_embed_batch(target, texts[start : start + size], policy=policy))
    return vectors


def embedding_dimension(target: EmbeddingTarget, *, policy: RetryPolicy | None = None) -> int:
    """The target's vector size: from the known table, else measured with one short request."""
    if target.dimension is not None:
        return target.dimension
    return len(_embed_batch(target, ["dimension probe"], policy=policy or RetryPolicy.from_settings())[0])


def _embed_batch(target: EmbeddingTarget, batch: list[str], *, policy: RetryPolicy) -> list[list[float]]:
    tenant_url = not is_deployment_endpoint(target.api_base)

    def send() -> Any:
        timeout = guard.read_timeout(policy.timeout)
        if openai_wire.handles(target):
            return openai_wire.embed(target, batch, timeout=timeout)
        response = litellm.embedding(
            model=target.litellm_model,
            input=batch,
            api_base=target.api_base,
            api_key=target.api_key or KEYLESS_API_KEY,
            timeout=timeout,
            max_retries=0,
            num_retries=0,
            **({"client": _tenant_openai_client(target, policy)} if tenant_url else {}),
        )
        return getattr(response, "data", None)

    # Bounded like a chat call (LLM_CALL_DEADLINE in all): a trickling provider cannot hold the thread.
    with (
        told_to_tenant(target.handle, applies=tenant_url),
        guarded(CallBounds.from_settings(), label=target.handle) as guard,
    ):
        data, _ = call_with_retries(send, policy=policy, label=target.handle, guard=guard)
    if not isinstance(data, list) or len(data) != len(batch):
        raise InvalidLLMResponse(
            f"{target.handle}: expected {len(batch)} embeddings, got {len(data) if isinstance(data, list) else 'none'}"
        )
    ordered = sorted(data, key=lambda item: _field(item, "index") or 0)
    vectors = [_vector(target, _field(item, "embedding")) for item in ordered]
    return vectors


def _tenant_openai_client(target: EmbeddingTarget, policy: RetryPolicy) -> Any:
    """litellm embeds through the OpenAI SDK: for a URL an organisation chose, an SDK client on the
    guarded HTTP client (litellm would otherwise build one on its unguarded, redirect-following one)."""
    import openai

    return openai.OpenAI(
        api_key=target.api_key or KEYLESS_API_KEY,
        base_url=target.api_base,
        http_client=tenant_client(),
        timeout=policy.timeout,
        max_retries=0,
    )


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _vector(target: EmbeddingTarget, value: Any) -> list[float]:
    if not isinstance(value, list) or not value:
        raise InvalidLLMResponse(f"{target.handle}: an embedding is not a list of numbers")
    if target.dimension is not None and len(value) != target.dimension:
        raise InvalidLLMResponse(
            f"{target.handle}: expected {target.dimension}-dimensional embeddings, got {len(value)}"
        )
    return [float(x) for x in value]
