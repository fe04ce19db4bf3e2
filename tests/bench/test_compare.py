"""The pure parts of the benchmarks' side-by-side mode and the bench LLM server's generation rate."""

from __future__ import annotations

import argparse
import json
import urllib.request
from typing import Any

import pytest

from bench import compare
from bench.llm_server import BenchLLMServer, reply_text


def test_better_is_how_many_times_this_platform_is_ahead() -> None:
    assert compare.better(50.0, 500.0, higher_is_better=False) == 10.0  # ms: other / this
    assert compare.better(30.0, 2.0, higher_is_better=True) == 15.0  # turns/s: this / other
    assert compare.better(100.0, 50.0, higher_is_better=False) == 0.5  # slower: below 1
    assert compare.better(None, 5.0, higher_is_better=False) is None
    assert compare.better(0.0, 5.0, higher_is_better=False) is None


def test_summary_and_table_show_both_columns_and_the_ratio() -> None:
    rounds = {
        "this": [
            {"simple_p50_ms": 30.0, "throughput_turns_per_s": 40.0},
            {"simple_p50_ms": 40.0, "throughput_turns_per_s": 30.0},
        ],
        "other": [
            {"simple_p50_ms": 500.0, "throughput_turns_per_s": 2.0},
            {"simple_p50_ms": 600.0, "throughput_turns_per_s": 3.0},
        ],
    }
    summary = {key: compare.summarise(values) for key, values in rounds.items()}
    assert summary["this"]["simple_p50_ms"] == {"median": 35.0, "spread": 10.0}
    lines = compare.table(summary, "http://127.0.0.1:8283")
    assert "this platform" in lines[0]
    assert "http://127.0.0.1:8283" in lines[0]
    [simple] = [line for line in lines if line.startswith("simple turn (1 LLM call), sequential, p50")]
    assert simple.split()[-6:] == ["550", "±100", "35", "±10", "ms", "15.71x"]  # other, this, unit, x
    [rate] = [line for line in lines if line.startswith("N agents, memory turns: throughput")]
    assert rate.split()[-1] == "14x"  # 35 / 2.5
    assert not [line for line in lines if line.startswith("agent create")]  # not measured: no row


def test_compare_options_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compare.ENV_URL, "http://127.0.0.1:8283")
    monkeypatch.setenv(compare.ENV_KEY, "secret")
    monkeypatch.delenv(compare.ENV_LLM, raising=False)
    parser = argparse.ArgumentParser()
    compare.compare_options(parser)
    args = parser.parse_args([])
    assert (args.compare_url, args.compare_key, args.compare_llm_url) == (
        "http://127.0.0.1:8283",
        "secret",
        compare.DEFAULT_LLM_URL,
    )
    args = parser.parse_args(
        ["--compare-url", "http://127.0.0.1:9000", "--compare-llm-url", "http://127.0.0.1:1"]
    )
    assert (args.compare_url, args.compare_llm_url) == ("http://127.0.0.1:9000", "http://127.0.0.1:1")


def test_reply_text_has_the_asked_number_of_words() -> None:
    assert reply_text(0) == "Noted, thanks."
    assert len(reply_text(50).split()) == 50


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    return urllib.request.urlopen(request, timeout=30)


def test_bench_llm_server_streams_the_configured_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import llm_server

    monkeypatch.setattr(llm_server, "TIMINGS", llm_server._Timings())
    with BenchLLMServer(models=["gpt-4o-mini"]) as server:
        root = server.base_url
        config = json.loads(_post(f"{root}/_bench/config", {"tokens_per_s": 1000, "reply_tokens": 12}).read())
        assert config == {"latency": 0.0, "tokens_per_s": 1000.0, "reply_tokens": 12}
        body = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        chunks = [line for line in _post(f"{root}/v1/chat/completions", body) if line.startswith(b"data: {")]
        words = [json.loads(c[6:])["choices"][0]["delta"].get("content") for c in chunks]
        assert len([w for w in words if w]) == 12
        models = json.loads(urllib.request.urlopen(f"{root}/v1/models", timeout=30).read())
        assert [m["id"] for m in models["data"]] == ["gpt-4o-mini"]
