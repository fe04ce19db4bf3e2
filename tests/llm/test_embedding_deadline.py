"""Embedding calls are bounded like chat calls: a provider that trickles its answer cannot hold the
thread past LLM_CALL_DEADLINE (recall embeddings run after every turn, archival ones inside tools)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from apps.llm.embeddings import embed
from apps.llm.errors import LLMDeadlineExceeded
from apps.llm.handles import EmbeddingTarget
from tests.support.tarpit_llm import TarpitLLMServer


@pytest.fixture
def tarpit() -> Iterator[TarpitLLMServer]:
    with TarpitLLMServer(interval=0.3, mode="trickle") as server:
        yield server


def test_an_embedding_provider_that_trickles_is_cut_at_the_call_deadline(tarpit, settings):
    settings.OPENAI_BASE_URL = tarpit.url  # the deployment's own provider: trusted by the outbound guard
    settings.LLM_CALL_DEADLINE = 2.0
    settings.LLM_REQUEST_TIMEOUT = 30.0  # per read: never reached, a byte comes every 0.3 s
    target = EmbeddingTarget(
        handle="openai/text-embedding-3-small",
        provider_name="openai",
        provider_type="openai",
        litellm_model="openai/text-embedding-3-small",
        api_base=tarpit.url,
        api_key="sk-test",
        dimension=1536,
    )
    started = time.monotonic()

    with pytest.raises(LLMDeadlineExceeded):
        embed(target, ["remember this"])

    assert time.monotonic() - started < 5.0
