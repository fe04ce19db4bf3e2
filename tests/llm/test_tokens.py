"""Offline token counting (the network guard in conftest fails any attempt to download a tokenizer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from apps.llm.tokens import count_text_tokens, count_tokens, estimate_tokens

HELLO = [{"role": "user", "content": "hello world"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "archival_memory_search",
            "description": "Search archival memory for passages about a topic.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_count_tokens_for_a_known_model() -> None:
    assert count_tokens("openai/gpt-4o-mini", HELLO) == 9


def test_count_tokens_accepts_a_bare_model_name() -> None:
    assert count_tokens("gpt-4o-mini", HELLO) == count_tokens("openai/gpt-4o-mini", HELLO)


def test_tool_schemas_are_counted() -> None:
    assert count_tokens("openai/gpt-4o-mini", HELLO, TOOLS) > count_tokens("openai/gpt-4o-mini", HELLO) + 10


def test_unknown_models_are_counted_with_the_default_tokenizer() -> None:
    count = count_tokens(
        "openai/some-vllm-model", [{"role": "user", "content": "one two three four five " * 20}]
    )

    assert 100 <= count <= 130


def test_llama_and_claude_names_are_counted_offline() -> None:
    long = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 10}]

    assert 90 <= count_tokens("ollama/llama-3.1-8b", long) <= 130
    assert 90 <= count_tokens("anthropic/claude-sonnet-4", long) <= 130


def test_tool_call_and_tool_result_messages_are_counted() -> None:
    messages = [
        {"role": "user", "content": "find my notes on tea"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "archival_memory_search", "arguments": '{"query": "tea"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Earl Grey, no sugar."},
    ]

    assert count_tokens("openai/gpt-4o-mini", messages) > count_tokens("openai/gpt-4o-mini", messages[:1])


def test_count_text_tokens() -> None:
    assert count_text_tokens("openai/gpt-4o-mini", "hello world") == 2
    assert count_text_tokens("openai/gpt-4o-mini", "") == 0


def test_estimate_is_four_characters_per_token() -> None:
    assert estimate_tokens("x" * 41) == 11


def test_import_and_counting_never_touch_the_network() -> None:
    """litellm loads its cost map at import time, so the guard must be in place before the import."""
    script = """
import json, os, socket, sys
attempts = []
real = socket.socket.connect
def guarded(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1"):
        attempts.append(repr(address))
        raise OSError("network disabled for this test")
    return real(self, address)
socket.socket.connect = guarded
real_lookup = socket.getaddrinfo
def lookup(host, *args, **kwargs):
    if host not in (None, "localhost", "127.0.0.1", "::1"):
        attempts.append(repr(host))
        raise socket.gaierror("network disabled for this test")
    return real_lookup(host, *args, **kwargs)
socket.getaddrinfo = lookup
import django
django.setup()
from apps.llm import client, embeddings, handles, tokens
tokens.count_tokens("openai/gpt-4o-mini", [{"role": "user", "content": "hi"}])
tokens.count_tokens("ollama/llama-3.1-8b", [{"role": "user", "content": "hi"}])
print(json.dumps(attempts))
"""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    env.pop("LITELLM_LOCAL_MODEL_COST_MAP", None)
    env.pop("LITELLM_OFFLINE_MODE", None)

    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
