"""Agent turns through the real API (daphne -> Celery workers -> bench LLM server), timed at the client.

A turn is one POST /v1/agents/{id}/messages (blocking, or streaming=true). "Overhead" is the turn's
wall time at the client minus the time the LLM server spent on the requests the turn caused (chat
completions and embeddings, from the server's timing log).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.llm_server import REMEMBER, BenchLLMClient
from bench.stats import percentile

SIMPLE = "simple"
MEMORY = "memory"


def turn_text(kind: str, index: int) -> str:
    if kind == MEMORY:
        return f"My counter moved again {REMEMBER} (turn {index})"
    return f"Hello there, how are you doing today? (turn {index})"


def turn_body(kind: str, index: int, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": turn_text(kind, index)}], **extra}


@dataclass
class TurnSample:
    started: float  # epoch seconds
    wall_ms: float
    llm_ms: float = 0.0
    chat_calls: int = 0
    embed_calls: int = 0

    @property
    def overhead_ms(self) -> float:
        return self.wall_ms - self.llm_ms


def _check(response: httpx.Response, kind: str) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"turn failed: HTTP {response.status_code} {response.text[:500]}")
    data = response.json()
    stop = (data.get("stop_reason") or {}).get("stop_reason")
    if stop != "end_turn":
        raise RuntimeError(f"turn ended with {stop!r}: {json.dumps(data)[:800]}")
    types = [m.get("message_type") for m in data.get("messages") or []]
    if kind == MEMORY and "tool_return_message" not in types:
        usage = data.get("usage") or {}
        raise RuntimeError(
            f"memory turn without a tool return: {types} (run {usage.get('run_ids')}, "
            f"step_count {usage.get('step_count')})"
        )


def attribute_llm_time(samples: list[TurnSample], timings: list[list[Any]]) -> None:
    """Give each turn the LLM server time of the requests that started inside its window."""
    ordered = sorted(timings, key=lambda e: e[1])
    for sample in samples:
        end = sample.started + sample.wall_ms / 1000
        for kind, started, duration, _ttft in ordered:
            if sample.started <= started <= end:
                sample.llm_ms += duration * 1000
                if kind == "chat":
                    sample.chat_calls += 1
                else:
                    sample.embed_calls += 1


def sequential_turns(
    client: httpx.Client, llm: BenchLLMClient, agent_id: str, *, kind: str, count: int
) -> list[TurnSample]:
    """`count` turns, one after the other, on one agent."""
    mark = llm.mark()
    samples = []
    for index in range(count):
        started, t0 = time.time(), time.perf_counter()
        response = client.post(f"/v1/agents/{agent_id}/messages", json=turn_body(kind, index))
        wall = (time.perf_counter() - t0) * 1000
        _check(response, kind)
        samples.append(TurnSample(started=started, wall_ms=wall))
    attribute_llm_time(samples, llm.timings(mark))
    return samples


def streaming_first_token(
    client: httpx.Client, llm: BenchLLMClient, agent_id: str, *, count: int
) -> list[dict[str, float]]:
    """Time from the request to the first token event (assistant_message chunk) at the client, and the
    LLM server's own time to its first content chunk for that turn."""
    results = []
    for index in range(count):
        mark = llm.mark()
        started, t0 = time.time(), time.perf_counter()
        first = None
        done = False
        body = turn_body(SIMPLE, index, streaming=True, stream_tokens=True)
        with client.stream("POST", f"/v1/agents/{agent_id}/messages", json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(f"stream failed: HTTP {response.status_code} {response.read()[:300]!r}")
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                if payload == "[DONE]":
                    done = True
                    break
                if first is None and json.loads(payload).get("message_type") == "assistant_message":
                    first = (time.perf_counter() - t0) * 1000
        total = (time.perf_counter() - t0) * 1000
        if first is None or not done:
            raise RuntimeError("stream ended without a token event or without [DONE]")
        chats = [e for e in llm.timings(mark) if e[0] == "chat" and e[1] >= started]
        llm_ttft = (chats[0][3] or 0.0) * 1000 if chats else 0.0
        results.append({"first_token_ms": first, "llm_ttft_ms": llm_ttft, "total_ms": total})
    return results


async def _agent_loop(
    client: httpx.AsyncClient, agent_id: str, kind: str, turns: int, latencies: list[float], errors: list[str]
) -> None:
    for index in range(turns):
        t0 = time.perf_counter()
        try:
            response = await client.post(f"/v1/agents/{agent_id}/messages", json=turn_body(kind, index))
            _check(response, kind)
        except (httpx.HTTPError, RuntimeError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            continue
        latencies.append((time.perf_counter() - t0) * 1000)


async def _concurrent(
    base_url: str, api_key: str, agent_ids: list[str], *, kind: str, turns_per_agent: int
) -> dict[str, float]:
    limits = httpx.Limits(max_connections=len(agent_ids) + 4, max_keepalive_connections=len(agent_ids) + 4)
    async with httpx.AsyncClient(
        base_url=base_url,
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=120,
        limits=limits,
    ) as client:
        latencies: list[float] = []
        errors: list[str] = []
        started = time.perf_counter()
        await asyncio.gather(
            *(
                _agent_loop(client, agent_id, kind, turns_per_agent, latencies, errors)
                for agent_id in agent_ids
            )
        )
        elapsed = time.perf_counter() - started
    return {
        "turns": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "seconds": elapsed,
        "turns_per_s": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 50) if latencies else float("nan"),
        "p95_ms": percentile(latencies, 95) if latencies else float("nan"),
    }


def concurrent_turns(
    base_url: str, api_key: str, agent_ids: list[str], *, kind: str, turns_per_agent: int
) -> dict[str, float]:
    """Every agent sends `turns_per_agent` turns back to back, all agents at once. Failed turns are
    counted (and left out of the rate and latencies), not raised."""
    return asyncio.run(_concurrent(base_url, api_key, agent_ids, kind=kind, turns_per_agent=turns_per_agent))
