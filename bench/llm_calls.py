"""Per-call overhead of the platform's LLM client (apps.llm.client) against the bench LLM server.

    python -m bench.llm_calls [--calls 300] [--stream]

Starts bench/llm_server.py as a subprocess (zero latency), sends a request shaped like an agent step
(a system message with memory blocks, 20 history messages, 8 tool schemas) and reports, per call, the
wall time at the client minus the server's own time, and the client's CPU time. No database is used.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from apps.llm import client as llm  # noqa: E402
from apps.llm.handles import ModelTarget  # noqa: E402
from apps.llm.retry import RetryPolicy  # noqa: E402
from bench.llm_server import BenchLLMClient  # noqa: E402
from bench.stats import percentile  # noqa: E402


def _request(remember: bool) -> llm.ChatRequest:
    system = (
        "You are a helpful agent with memory.\n"
        + "\n".join(f"<block{i}>\nSome remembered fact number {i}. " * 8 + f"\n</block{i}>" for i in range(6))
        + "\n<human>\nName: Sam\nCounter: 3\n</human>"
    )
    history: list[dict] = []
    for i in range(10):
        history.append({"role": "user", "content": f"Question {i}: what do you remember about topic {i}?"})
        history.append({"role": "assistant", "content": f"Here is what I remember about topic {i}."})
    history.append({"role": "user", "content": "hello [remember]" if remember else "hello"})
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"The {name} tool. " * 10,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "label": {"type": "string", "description": "Section of the memory to edit."},
                        "old_string": {"type": "string", "description": "Text to replace."},
                        "new_string": {"type": "string", "description": "New text."},
                    },
                    "required": ["label"],
                },
            },
        }
        for name in (
            "memory_replace", "memory_insert", "memory_rethink", "conversation_search",
            "archival_memory_insert", "archival_memory_search", "send_message", "web_search",
        )
    ]  # fmt: skip
    return llm.ChatRequest(
        messages=[{"role": "system", "content": system}, *history],
        tools=tools,
        tool_choice="auto",
        parallel_tool_calls=False,
    )


def measure(base: str, *, calls: int, stream: bool, remember: bool) -> dict[str, float]:
    target = ModelTarget(
        handle="openai/gpt-4o-mini",
        provider_name="openai",
        provider_type="openai",
        litellm_model="openai/gpt-4o-mini",
        api_base=base + "/v1",
        api_key="bench",
        context_window=32768,
        max_context_window=32768,
    )
    policy = RetryPolicy(max_attempts=1, timeout=120.0)
    request = _request(remember)
    timings = BenchLLMClient(base)

    def call() -> llm.ChatResponse:
        if stream:
            return llm.stream(target, request, lambda delta: None, policy=policy)
        return llm.complete(target, request, policy=policy)

    for _ in range(20):
        call()
    mark = timings.mark()
    walls, cpus = [], []
    for _ in range(calls):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        response = call()
        walls.append(time.perf_counter() - wall0)
        cpus.append(time.process_time() - cpu0)
    server = [entry[2] for entry in timings.timings(mark)]
    assert len(server) == calls, (len(server), calls)
    assert response.prompt_tokens > 0
    assert response.tool_calls or response.content
    overhead = [(w - s) * 1000 for w, s in zip(walls, server, strict=True)]
    return {
        "overhead_p50_ms": round(percentile(overhead, 50), 2),
        "overhead_p90_ms": round(percentile(overhead, 90), 2),
        "cpu_mean_ms": round(sum(cpus) / len(cpus) * 1000, 2),
        "server_p50_ms": round(percentile([s * 1000 for s in server], 50), 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--port", type=int, default=8897)
    args = parser.parse_args(argv)
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.llm_server", "--port", str(args.port)],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(100):
            if BenchLLMClient(base).healthy():
                break
            time.sleep(0.1)
        for stream in (False, True):
            for remember in (False, True):
                figures = measure(base, calls=args.calls, stream=stream, remember=remember)
                label = f"{'stream' if stream else 'blocking'}, {'tool call' if remember else 'reply'}"
                print(f"{label:24} {figures}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
