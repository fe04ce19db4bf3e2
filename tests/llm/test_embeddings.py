"""Embeddings against the scripted server's deterministic /v1/embeddings, with each client
(LLM_CLIENT=direct, the default, and litellm)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from apps.accounts.models import Organization
from apps.llm.embeddings import embed, embedding_dimension
from apps.llm.errors import InvalidLLMResponse, LLMApiError
from apps.llm.handles import EmbeddingTarget, resolve_embedding
from tests.support.scripted_llm import ScriptedLLM, embed_text

TEXTS = ["I like hiking", "tea with milk", "the mountains in spring", "a red bicycle", "hiking boots"]


@pytest.fixture(autouse=True, params=["direct", "litellm"])
def llm_client(request: pytest.FixtureRequest, settings) -> str:
    settings.LLM_CLIENT = request.param
    return str(request.param)


@pytest.fixture
def small_target(env_openai: None, org: Organization) -> EmbeddingTarget:
    """A model the scripted server answers with 384 dimensions and that our table does not know."""
    return resolve_embedding("openai/text-embedding-small-384", organization_id=org.id)


def test_embed_batches_requests_and_keeps_order(small_target: EmbeddingTarget, llm: ScriptedLLM) -> None:
    vectors = embed(small_target, TEXTS, batch_size=2)

    requests = llm.requests("/v1/embeddings")
    assert [r["body"]["input"] for r in requests] == [TEXTS[0:2], TEXTS[2:4], TEXTS[4:5]]
    assert [r["body"]["model"] for r in requests] == ["text-embedding-small-384"] * 3
    assert len(vectors) == 5
    assert {len(v) for v in vectors} == {384}
    for vector, text in zip(vectors, TEXTS, strict=True):
        assert vector == pytest.approx(embed_text(text, 384), abs=1e-6)


def test_embed_uses_the_batch_size_setting(settings, small_target: EmbeddingTarget, llm: ScriptedLLM) -> None:
    settings.LLM_EMBEDDING_BATCH_SIZE = 3

    embed(small_target, TEXTS)

    assert len(llm.requests("/v1/embeddings")) == 2


def test_embed_known_model_has_its_table_dimension(
    env_openai: None, org: Organization, llm: ScriptedLLM
) -> None:
    target = resolve_embedding("openai/text-embedding-3-small", organization_id=org.id)

    vectors = embed(target, ["hello"])

    assert target.dimension == 1536
    assert len(vectors[0]) == 1536


def test_embed_empty_list_sends_nothing(small_target: EmbeddingTarget, llm: ScriptedLLM) -> None:
    assert embed(small_target, []) == []
    assert llm.requests("/v1/embeddings") == []


def test_embedding_dimension_is_measured_once_for_unknown_models(
    small_target: EmbeddingTarget, llm: ScriptedLLM
) -> None:
    dimension = embedding_dimension(small_target)

    assert dimension == 384
    assert len(llm.requests("/v1/embeddings")) == 1


def test_embedding_dimension_of_a_known_model_needs_no_request(
    env_openai: None, org: Organization, llm: ScriptedLLM
) -> None:
    target = resolve_embedding("openai/text-embedding-3-large", organization_id=org.id)

    assert embedding_dimension(target) == 3072
    assert llm.requests("/v1/embeddings") == []


def test_an_unreadable_embedding_response_is_an_invalid_llm_response(
    settings,
    org: Organization,
    canned_server: Callable[..., tuple[str, list[str]]],
) -> None:
    url, hits = canned_server(b"<html>gateway</html>")
    settings.OPENAI_BASE_URL = url
    target = resolve_embedding("openai/text-embedding-small-384", organization_id=org.id)

    with pytest.raises(InvalidLLMResponse):
        embed(target, ["hello"])

    assert hits == ["/v1/embeddings"]


def test_a_failing_embedding_provider_is_retried_then_reported(
    settings,
    org: Organization,
    canned_server: Callable[..., tuple[str, list[str]]],
    llm_client: str,
) -> None:
    body = json.dumps({"error": {"message": "overloaded", "type": "server_error"}}).encode()
    url, hits = canned_server(body, status=503)
    settings.OPENAI_BASE_URL = url
    target = resolve_embedding("openai/text-embedding-small-384", organization_id=org.id)

    with pytest.raises(LLMApiError) as info:
        embed(target, ["hello"])

    assert (info.value.status, info.value.provider_message, info.value.attempts) == (503, "overloaded", 3)
    # litellm.embedding retries inside each of our attempts whatever max_retries says (9 requests):
    # known, left (bench/RESULTS.md); the direct client, the default, sends exactly our attempts.
    assert len(hits) == (3 if llm_client == "direct" else 9)


def test_vectors_of_the_wrong_size_are_rejected(
    env_openai: None, org: Organization, llm: ScriptedLLM
) -> None:
    llm.configure(embedding_dimensions={"text-embedding-3-small": 384})
    target = resolve_embedding("openai/text-embedding-3-small", organization_id=org.id)

    with pytest.raises(InvalidLLMResponse) as info:
        embed(target, ["hello"])

    assert str(info.value) == "openai/text-embedding-3-small: expected 1536-dimensional embeddings, got 384"
