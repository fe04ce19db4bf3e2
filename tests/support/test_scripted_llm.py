"""Tests for the scripted stand-in LLM, driven through real litellm / openai SDK calls over HTTP.

Runs without Django or a DB:
``.venv/bin/python -m pytest -p no:django -p no:cacheprovider --noconftest tests/support -q``
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.support.scripted_llm import (
    EXHAUSTED_MESSAGE,
    ScriptedLLM,
    ScriptedLLMServer,
    context_length_exceeded,
    embed_text,
    error,
    text,
    tool_call,
    tool_calls,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::1", "localhost"}
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="session", autouse=True)
def _no_network() -> Iterator[None]:
    """Fail loudly if anything (litellm import/cost map, telemetry, tokenizers) tries to leave the machine."""
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in LOOPBACK:
            raise AssertionError(f"network access attempted: {address!r}")
        return real_connect(self, address)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", guarded)
        yield


@pytest.fixture(scope="session")
def litellm(_no_network: None) -> ModuleType:
    """Import litellm only after forcing its offline settings (the import itself loads the cost map)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
    import litellm as module

    module.telemetry = False
    module.suppress_debug_info = True
    return module


@pytest.fixture(scope="session")
def server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as srv:
        yield srv


@pytest.fixture
def llm(server: ScriptedLLMServer) -> Iterator[ScriptedLLM]:
    client = server.client()
    client.reset(config=True)
    yield client
    client.reset(config=True)


def _complete(litellm: ModuleType, server: ScriptedLLMServer, **kwargs: Any) -> Any:
    params: dict[str, Any] = {
        "model": "openai/scripted-chat",
        "api_base": server.url,
        "api_key": "sk-test",
        "messages": MESSAGES,
        "max_retries": 0,
    }
    params.update(kwargs)
    return litellm.completion(**params)


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


# -- blocking chat completions -------------------------------------------------------------------------


def test_blocking_text_with_reasoning_and_usage(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    llm.push(
        text(
            "Hello there!",
            reasoning="The user greeted me.",
            usage={"prompt_tokens": 42, "completion_tokens": 7},
        )
    )
    resp = _complete(litellm, server)
    msg = resp.choices[0].message
    assert msg.content == "Hello there!"
    assert msg.reasoning_content == "The user greeted me."
    assert msg.tool_calls is None
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens == 42
    assert resp.usage.completion_tokens == 7
    assert resp.usage.total_tokens == 49
    assert resp.model == "scripted-chat"


def test_default_usage_is_estimated_and_never_zero(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    llm.push(text("x" * 40))
    resp = _complete(litellm, server, messages=[{"role": "user", "content": ""}])
    assert resp.usage.prompt_tokens >= 1
    assert resp.usage.completion_tokens == 10


def test_blocking_parallel_tool_calls_and_malformed_arguments(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    llm.push(
        tool_calls(
            tool_call("send_message", {"message": "Hi!"}, id="call_a"),
            tool_call("archival_memory_search", '{"query": "hik', id="call_b"),
            text="Calling tools.",
            reasoning="Need two tools.",
        )
    )
    resp = _complete(litellm, server, tools=[])
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Calling tools."
    assert choice.message.reasoning_content == "Need two tools."
    calls = choice.message.tool_calls
    assert [c.id for c in calls] == ["call_a", "call_b"]
    assert [c.function.name for c in calls] == ["send_message", "archival_memory_search"]
    assert json.loads(calls[0].function.arguments) == {"message": "Hi!"}
    assert calls[1].function.arguments == '{"query": "hik'  # delivered verbatim, for error-path tests
    with pytest.raises(json.JSONDecodeError):
        json.loads(calls[1].function.arguments)


def test_finish_reason_length(litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM) -> None:
    llm.push(text("truncated", finish_reason="length"))
    assert _complete(litellm, server).choices[0].finish_reason == "length"


# -- streaming -----------------------------------------------------------------------------------------


def test_stream_text_reasoning_and_usage(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    llm.push(
        text(
            "one two three four",
            reasoning="thinking hard now",
            usage={"prompt_tokens": 11, "completion_tokens": 5},
        )
    )
    chunks = list(_complete(litellm, server, stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    content = [d.content for d in deltas if d.content]
    reasoning = [getattr(d, "reasoning_content", None) for d in deltas]
    reasoning = [r for r in reasoning if r]
    assert len(content) >= 4
    assert "".join(content) == "one two three four"
    assert "".join(reasoning) == "thinking hard now"
    assert len(reasoning) >= 3
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usages = [c.usage for c in chunks if getattr(c, "usage", None)]
    assert usages
    assert usages[-1].prompt_tokens == 11
    assert usages[-1].completion_tokens == 5
    assert llm.last_chat_request()["stream_options"] == {"include_usage": True}

    rebuilt = litellm.stream_chunk_builder(chunks, messages=MESSAGES)
    assert rebuilt.choices[0].message.content == "one two three four"
    assert rebuilt.usage.prompt_tokens == 11


def test_stream_parallel_tool_calls_split_into_argument_deltas(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    args_a = {"message": "A fairly long message so the arguments are split"}
    llm.push(tool_calls(tool_call("send_message", args_a, id="call_a"), tool_call("noop", {}, id="call_b")))
    chunks = list(_complete(litellm, server, stream=True))
    tool_deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    first_a = [tc for tc in tool_deltas if tc.index == 0]
    assert len(first_a) >= 3  # header delta + several argument deltas
    assert first_a[0].id == "call_a"
    assert first_a[0].function.name == "send_message"
    assert all(tc.id is None and tc.function.name is None for tc in first_a[1:])
    assert json.loads("".join(tc.function.arguments or "" for tc in first_a)) == args_a
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "tool_calls"
    ]

    rebuilt = litellm.stream_chunk_builder(chunks, messages=MESSAGES)
    calls = rebuilt.choices[0].message.tool_calls
    assert [(c.id, c.function.name) for c in calls] == [("call_a", "send_message"), ("call_b", "noop")]
    assert json.loads(calls[0].function.arguments) == args_a
    assert json.loads(calls[1].function.arguments) == {}


def test_async_stream(litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM) -> None:
    llm.push(text("async works fine"))

    async def run() -> str:
        stream = await litellm.acompletion(
            model="openai/scripted-chat",
            api_base=server.url,
            api_key="sk-test",
            messages=MESSAGES,
            stream=True,
            max_retries=0,
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert asyncio.run(run()) == "async works fine"


def test_concurrent_requests_each_get_one_turn(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    llm.push(*[text(f"reply {i}", latency=0.05) for i in range(12)])
    with ThreadPoolExecutor(max_workers=12) as pool:
        futures = [pool.submit(_complete, litellm, server, stream=bool(i % 2)) for i in range(12)]
        results = [f.result() for f in futures]
    replies = []
    for i, res in enumerate(results):
        if i % 2:
            replies.append("".join(c.choices[0].delta.content or "" for c in res if c.choices))
        else:
            replies.append(res.choices[0].message.content)
    assert sorted(replies) == sorted(f"reply {i}" for i in range(12))
    assert llm.pending() == []


def test_latency_and_chunk_delay(litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM) -> None:
    llm.push(text("slow", latency=0.3), text("a b c d", chunk_delay=0.05))
    start = time.monotonic()
    _complete(litellm, server)
    assert time.monotonic() - start >= 0.3
    start = time.monotonic()
    list(_complete(litellm, server, stream=True))
    assert time.monotonic() - start >= 0.25  # >= 5 gaps between ~7 chunks


# -- errors ----------------------------------------------------------------------------------------------


def test_500_surfaces_as_internal_server_error(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    llm.push(error(500, "upstream exploded"))
    with pytest.raises(litellm.InternalServerError) as info:
        _complete(litellm, server)
    assert info.value.status_code == 500
    assert "upstream exploded" in str(info.value)


def test_429_surfaces_as_rate_limit_error(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    llm.push(error(429, "slow down", code="rate_limit_exceeded"))
    with pytest.raises(litellm.RateLimitError) as info:
        _complete(litellm, server, stream=True)
    assert info.value.status_code == 429


def test_context_length_exceeded(litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM) -> None:
    llm.push(context_length_exceeded(), error(400, "bad tool schema"))
    with pytest.raises(litellm.ContextWindowExceededError):
        _complete(litellm, server)
    with pytest.raises(litellm.BadRequestError) as info:
        _complete(litellm, server)
    assert not isinstance(info.value, litellm.ContextWindowExceededError)


def test_retries_consume_error_turns(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    """An error with ``times`` answers that many requests (a client's retries), then the script resumes."""
    llm.push(error(500, "flaky", times=2, headers={"retry-after-ms": "10"}), text("recovered"))
    for _ in range(2):
        with pytest.raises(litellm.InternalServerError):
            _complete(litellm, server)
    resp = _complete(litellm, server)
    assert resp.choices[0].message.content == "recovered"
    assert len(llm.chat_requests()) == 3


# -- script semantics ------------------------------------------------------------------------------------


def test_default_turn_and_strict_mode(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    assert _complete(litellm, server).choices[0].message.content == "OK"
    llm.configure(default_turn=text("fallback"))
    assert _complete(litellm, server).choices[0].message.content == "fallback"
    llm.configure(strict=True)
    with pytest.raises(litellm.InternalServerError) as info:
        _complete(litellm, server)
    assert EXHAUSTED_MESSAGE in str(info.value)
    assert llm.requests()[-1]["served"] == "exhausted"


def test_fifo_order_and_conditional_turns(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    llm.push(text("about hiking", when_last_user_contains="HIKING"), text("first"), text("second"))

    def ask(content: str) -> str:
        messages = [{"role": "user", "content": "old hiking msg"}, {"role": "assistant", "content": "x"}]
        messages.append({"role": "user", "content": [{"type": "text", "text": content}]})
        return _complete(litellm, server, messages=messages).choices[0].message.content

    assert ask("hello") == "first"  # the conditional turn is skipped: only the LAST user message counts
    assert ask("I love hiking") == "about hiking"
    assert ask("again") == "second"
    assert ask("more") == "OK"
    assert llm.pending() == []


def test_persistent_responder(litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM) -> None:
    llm.push(text("standing reply", persist=True, when_last_user_contains="ping"))
    ping = [{"role": "user", "content": "ping"}]
    for _ in range(3):
        assert _complete(litellm, server, messages=ping).choices[0].message.content == "standing reply"
    assert _complete(litellm, server).choices[0].message.content == "OK"
    assert len(llm.pending()) == 1


def test_invalid_turn_is_rejected_at_push(llm: ScriptedLLM) -> None:
    with pytest.raises(RuntimeError, match="unknown turn keys"):
        llm.push({"contnet": "typo"})
    with pytest.raises(RuntimeError, match="finish_reason"):
        llm.push({"content": "x", "finish_reason": "done"})
    assert llm.pending() == []


# -- control endpoints, logging, models -------------------------------------------------------------------


def test_control_from_second_client_and_request_log(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    other = ScriptedLLM(server.url)  # e.g. what a Celery worker process would build from a URL
    assert other.health()
    assert other.push(text("from other client")) == 1
    assert [t["content"] for t in llm.pending()] == ["from other client"]
    assert _complete(litellm, server, temperature=0.1).choices[0].message.content == "from other client"

    log = llm.requests()
    assert len(log) == 1
    entry = log[0]
    assert entry["path"] == "/v1/chat/completions"
    assert entry["method"] == "POST"
    assert entry["body"]["messages"] == MESSAGES
    assert entry["body"]["temperature"] == 0.1
    assert entry["served"] == "script"
    assert isinstance(entry["time"], float)
    auth = {k.lower(): v for k, v in entry["headers"].items()}["authorization"]
    assert auth == "<redacted>"
    assert "sk-test" not in json.dumps(log)
    assert other.chat_requests() == [entry["body"]]

    other.reset()
    assert llm.requests() == []


def test_models_endpoint(server: ScriptedLLMServer, llm: ScriptedLLM) -> None:
    resp = httpx.get(server.url + "/models")
    assert resp.status_code == 200
    ids = [m["id"] for m in resp.json()["data"]]
    assert "scripted-chat" in ids
    llm.configure(models=["letta-free", "gpt-4o-mini"])
    assert [m["id"] for m in httpx.get(server.url + "/models").json()["data"]] == [
        "letta-free",
        "gpt-4o-mini",
    ]


def test_openai_sdk_direct(server: ScriptedLLMServer, llm: ScriptedLLM) -> None:
    """The plain OpenAI SDK works too (it requests base64 embeddings by default)."""
    import openai

    client = openai.OpenAI(base_url=server.url, api_key="sk-test", max_retries=0)
    llm.push(text("sdk hello"))
    assert (
        client.chat.completions.create(model="x", messages=MESSAGES).choices[0].message.content == "sdk hello"
    )
    emb = client.embeddings.create(model="text-embedding-small-384", input="hello world")
    assert len(emb.data[0].embedding) == 384
    assert emb.data[0].embedding == pytest.approx(embed_text("hello world", 384), abs=1e-6)
    assert [m.id for m in client.models.list()] == [
        "scripted-chat",
        "text-embedding-3-small",
        "text-embedding-small-384",
    ]


# -- embeddings -------------------------------------------------------------------------------------------


def test_embedding_dimensions(litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM) -> None:
    def dim(model: str, **kwargs: Any) -> int:
        resp = litellm.embedding(model=model, api_base=server.url, api_key="sk-test", input="hello", **kwargs)
        return len(resp.data[0]["embedding"])

    assert dim("openai/text-embedding-small-384") == 384
    assert dim("openai/some-other-model") == 1536
    assert dim("openai/text-embedding-3-small", dimensions=256) == 256
    llm.configure(embedding_dimensions={"letta-embed": 64})
    assert dim("openai/letta-embed") == 64


def test_embedding_similarity_and_determinism(
    litellm: ModuleType, server: ScriptedLLMServer, llm: ScriptedLLM
) -> None:
    passages = [
        "The user enjoys hiking in the mountains every weekend.",
        "Quarterly revenue grew by twelve percent.",
        "My cat sleeps on the keyboard.",
        "Python is a programming language.",
    ]
    resp = litellm.embedding(
        model="openai/text-embedding-small-384",
        api_base=server.url,
        api_key="sk-test",
        input=[*passages, "what hiking trips does the user like?", *passages[:1]],
    )
    vectors = [d["embedding"] for d in resp.data]
    assert [d["index"] for d in resp.data] == list(range(6))
    assert resp.usage.prompt_tokens > 0
    for vec in vectors:
        assert math.isclose(math.sqrt(sum(x * x for x in vec)), 1.0, rel_tol=1e-6)
    query = vectors[4]
    scores = [_cosine(query, v) for v in vectors[:4]]
    assert scores.index(max(scores)) == 0
    assert vectors[5] == vectors[0]  # deterministic

    for q, expected in [("revenue numbers", 1), ("my cat", 2), ("programming in Python", 3)]:
        qv = embed_text(q, 384)
        ranked = sorted(range(4), key=lambda i: -_cosine(qv, embed_text(passages[i], 384)))
        assert ranked[0] == expected, q

    body = llm.requests("/v1/embeddings")[0]["body"]
    assert body["model"] == "text-embedding-small-384"


# -- standalone process -----------------------------------------------------------------------------------


def test_standalone_process_controlled_over_http(litellm: ModuleType, tmp_path: Path) -> None:
    """``python -m tests.support.scripted_llm`` in another process, scripted purely over HTTP."""
    script = tmp_path / "turns.json"
    script.write_text(json.dumps([text("preloaded")]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.scripted_llm",
            "--port",
            "0",
            "--strict",
            "--script",
            str(script),
        ],
        cwd=REPO_ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "listening on" in line, line
        url = line.rsplit(" ", 1)[-1].strip()
        client = ScriptedLLM(url)
        client.push(tool_calls(tool_call("send_message", {"message": "hi"})))
        common = {
            "model": "openai/scripted-chat",
            "api_base": url,
            "api_key": "sk-test",
            "messages": MESSAGES,
        }
        assert litellm.completion(**common, max_retries=0).choices[0].message.content == "preloaded"
        resp = litellm.completion(**common, max_retries=0)
        assert resp.choices[0].message.tool_calls[0].function.name == "send_message"
        with pytest.raises(litellm.InternalServerError, match="script exhausted"):
            litellm.completion(**common, max_retries=0)
        assert len(client.chat_requests()) == 3
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()
