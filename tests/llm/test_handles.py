"""Resolving `provider/model` handles: organisation providers, environment settings, tenancy."""

from __future__ import annotations

import pytest

from apps.accounts.models import Organization
from apps.llm.errors import ContextWindowLimitTooLarge, ProviderNotConfigured, UnknownModelHandle
from apps.llm.handles import (
    DEFAULT_CONTEXT_WINDOW,
    EmbeddingTarget,
    ModelTarget,
    resolve_embedding,
    resolve_model,
)
from apps.llm.models import Provider
from tests.factories import ProviderFactory


@pytest.fixture
def clean_env(settings) -> None:
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = ""
    settings.ANTHROPIC_API_KEY = ""
    settings.OLLAMA_BASE_URL = ""


def test_openai_handle_resolves_from_environment(settings, clean_env: None, org: Organization) -> None:
    settings.OPENAI_API_KEY = "sk-env"

    target = resolve_model("openai/gpt-4o-mini", organization_id=org.id)

    assert target == ModelTarget(
        handle="openai/gpt-4o-mini",
        provider_name="openai",
        provider_type="openai",
        litellm_model="openai/gpt-4o-mini",
        api_base="https://api.openai.com/v1",
        api_key="sk-env",
        context_window=DEFAULT_CONTEXT_WINDOW,
        max_context_window=128_000,
    )


def test_openai_base_url_serves_any_model_name(settings, clean_env: None, org: Organization) -> None:
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9999/v1/"

    target = resolve_model("openai/some-local-model", organization_id=org.id)

    assert target.litellm_model == "openai/some-local-model"
    assert target.api_base == "http://127.0.0.1:9999/v1"
    assert target.api_key is None
    assert (target.context_window, target.max_context_window) == (
        DEFAULT_CONTEXT_WINDOW,
        DEFAULT_CONTEXT_WINDOW,
    )


def test_anthropic_handle_resolves_with_known_window(settings, clean_env: None, org: Organization) -> None:
    settings.ANTHROPIC_API_KEY = "sk-ant"

    target = resolve_model("anthropic/claude-sonnet-4", organization_id=org.id)

    assert target.litellm_model == "anthropic/claude-sonnet-4"
    assert target.api_base == "https://api.anthropic.com"
    assert target.api_key == "sk-ant"
    assert (target.context_window, target.max_context_window) == (DEFAULT_CONTEXT_WINDOW, 200_000)


def test_ollama_handle_uses_its_openai_api_under_v1(settings, clean_env: None, org: Organization) -> None:
    settings.OLLAMA_BASE_URL = "http://localhost:11434"

    target = resolve_model("ollama/llama3.1", organization_id=org.id)

    assert target.provider_type == "ollama"
    assert target.litellm_model == "openai/llama3.1"
    assert target.api_base == "http://localhost:11434/v1"
    assert target.api_key is None
    assert (target.context_window, target.max_context_window) == (8192, 8192)


def test_org_provider_of_type_openai_compatible(clean_env: None, org: Organization) -> None:
    ProviderFactory(
        organization=org,
        name="vllm",
        provider_type=Provider.Type.OPENAI_COMPATIBLE,
        base_url="http://vllm.internal:8000/v1",
        api_key="sk-vllm",
    )

    target = resolve_model("vllm/meta-llama/Llama-3.1-8B-Instruct", organization_id=org.id)

    assert target == ModelTarget(
        handle="vllm/meta-llama/Llama-3.1-8B-Instruct",
        provider_name="vllm",
        provider_type="openai_compatible",
        litellm_model="openai/meta-llama/Llama-3.1-8B-Instruct",
        api_base="http://vllm.internal:8000/v1",
        api_key="sk-vllm",
        context_window=DEFAULT_CONTEXT_WINDOW,
        max_context_window=DEFAULT_CONTEXT_WINDOW,
    )


def test_org_provider_without_a_key_resolves_to_no_key(clean_env: None, org: Organization) -> None:
    ProviderFactory(
        organization=org,
        name="local",
        provider_type=Provider.Type.OPENAI_COMPATIBLE,
        base_url="http://x/v1",
        api_key="",
    )

    target = resolve_model("local/qwen", organization_id=org.id)

    assert target.api_key is None


def test_org_provider_beats_environment_settings(settings, org: Organization) -> None:
    settings.OPENAI_API_KEY = "sk-env"
    settings.OPENAI_BASE_URL = "http://env.example/v1"
    ProviderFactory(organization=org, name="openai", api_key="sk-org", base_url="http://org.example/v1")

    target = resolve_model("openai/gpt-4o-mini", organization_id=org.id)

    assert (target.api_key, target.api_base) == ("sk-org", "http://org.example/v1")


def test_other_orgs_provider_is_not_resolvable(
    clean_env: None, org: Organization, other_org: Organization
) -> None:
    ProviderFactory(
        organization=other_org,
        name="vllm",
        provider_type=Provider.Type.OPENAI_COMPATIBLE,
        base_url="http://x/v1",
    )

    with pytest.raises(UnknownModelHandle) as info:
        resolve_model("vllm/any-model", organization_id=org.id)

    assert info.value.code == "unknown_model_handle"
    assert str(info.value) == (
        "Unknown provider 'vllm' in handle 'vllm/any-model': add a provider of that name to the "
        "organisation, or use openai/, anthropic/ or ollama/."
    )


@pytest.mark.parametrize("handle", ["gpt-4o-mini", "/gpt-4o-mini", "openai/", "  "])
def test_malformed_handle_is_rejected(clean_env: None, org: Organization, handle: str) -> None:
    with pytest.raises(UnknownModelHandle):
        resolve_model(handle, organization_id=org.id)


def test_handle_without_slash_says_what_is_expected(clean_env: None, org: Organization) -> None:
    with pytest.raises(UnknownModelHandle) as info:
        resolve_model("gpt-4o-mini", organization_id=org.id)

    assert str(info.value) == (
        "Invalid model handle 'gpt-4o-mini': expected 'provider/model', e.g. 'openai/gpt-4o-mini'."
    )


def test_environment_provider_without_credentials_is_not_configured(
    clean_env: None, org: Organization
) -> None:
    with pytest.raises(ProviderNotConfigured) as info:
        resolve_model("anthropic/claude-sonnet-4", organization_id=org.id)

    assert info.value.code == "provider_not_configured"
    assert str(info.value) == (
        "Provider 'anthropic' for handle 'anthropic/claude-sonnet-4' is not configured: it needs an API key."
    )


def test_org_compatible_provider_without_base_url_is_not_configured(
    clean_env: None, org: Organization
) -> None:
    ProviderFactory(
        organization=org, name="lmstudio", provider_type=Provider.Type.OPENAI_COMPATIBLE, base_url=""
    )

    with pytest.raises(ProviderNotConfigured):
        resolve_model("lmstudio/qwen", organization_id=org.id)


def test_context_window_limit_is_applied(settings, clean_env: None, org: Organization) -> None:
    settings.OPENAI_API_KEY = "sk-env"

    target = resolve_model("openai/gpt-4o-mini", organization_id=org.id, context_window_limit=64_000)

    assert (target.context_window, target.max_context_window) == (64_000, 128_000)


def test_context_window_limit_above_the_model_maximum_is_rejected(
    settings, clean_env: None, org: Organization
) -> None:
    settings.OPENAI_API_KEY = "sk-env"

    with pytest.raises(ContextWindowLimitTooLarge) as info:
        resolve_model("openai/gpt-4o-mini", organization_id=org.id, context_window_limit=200_000)

    assert str(info.value) == (
        "Context window limit 200000 is larger than openai/gpt-4o-mini's maximum of 128000 tokens."
    )


def test_context_window_limit_is_trusted_for_unknown_models(
    settings, clean_env: None, org: Organization
) -> None:
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9999/v1"

    target = resolve_model("openai/local-128k", organization_id=org.id, context_window_limit=131_072)

    assert (target.context_window, target.max_context_window) == (131_072, 131_072)


def test_api_key_is_not_in_repr(settings, clean_env: None, org: Organization) -> None:
    settings.OPENAI_API_KEY = "sk-very-secret"

    target = resolve_model("openai/gpt-4o-mini", organization_id=org.id)

    assert "sk-very-secret" not in repr(target)


def test_embedding_handle_resolves_with_known_dimension(settings, clean_env: None, org: Organization) -> None:
    settings.OPENAI_API_KEY = "sk-env"

    target = resolve_embedding("openai/text-embedding-3-small", organization_id=org.id)

    assert target == EmbeddingTarget(
        handle="openai/text-embedding-3-small",
        provider_name="openai",
        provider_type="openai",
        litellm_model="openai/text-embedding-3-small",
        api_base="https://api.openai.com/v1",
        api_key="sk-env",
        dimension=1536,
    )


def test_ollama_embedding_dimension_ignores_the_tag(settings, clean_env: None, org: Organization) -> None:
    settings.OLLAMA_BASE_URL = "http://localhost:11434/"

    target = resolve_embedding("ollama/nomic-embed-text:latest", organization_id=org.id)

    assert (target.litellm_model, target.api_base, target.dimension) == (
        "openai/nomic-embed-text:latest",
        "http://localhost:11434/v1",
        768,
    )


def test_unknown_embedding_model_has_no_dimension_yet(settings, clean_env: None, org: Organization) -> None:
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9999/v1"

    target = resolve_embedding("openai/bge-small", organization_id=org.id)

    assert target.dimension is None


def test_empty_embedding_handle_is_an_error_not_a_default(settings, org: Organization) -> None:
    settings.OPENAI_API_KEY = "sk-env"

    with pytest.raises(UnknownModelHandle) as info:
        resolve_embedding("", organization_id=org.id)

    assert str(info.value) == "No embedding handle given; expected 'provider/model'."


def test_anthropic_has_no_embeddings(settings, clean_env: None, org: Organization) -> None:
    settings.ANTHROPIC_API_KEY = "sk-ant"

    with pytest.raises(UnknownModelHandle) as info:
        resolve_embedding("anthropic/claude-sonnet-4", organization_id=org.id)

    assert (
        str(info.value) == "Embedding handle 'anthropic/claude-sonnet-4': Anthropic has no embedding models."
    )
