"""Side by side: the same client-side workload against another Letta-compatible server and this platform.

Only the official SDK (`letta_client`) talks to either server, so the workload is what a user runs and
works against any server that speaks Letta's API (a Letta install, or a second instance of this
platform). Per target and round:

  agent create       `agents.create` (two memory blocks, the chat model, an embedding model), p50/p95
  simple turn        sequential `agents.messages.create` on one agent (one LLM call), wall time p50/p95,
                     and the same minus the LLM server's time when its timing log is reachable
  N agents           every agent sends memory turns back to back, each from a thread of its own
                     (bench/sdk_throughput.py): turns/s, p50/p95, failed turns
  archival           `agents.passages.create` of one passage, then `agents.passages.search` top 10, p50/p95
  first token        `agents.messages.stream(stream_tokens=True)`: time to the first `assistant_message`
                     chunk, p50/p95

Rounds alternate (other, this, this, other, ...) so a slow minute of a shared machine falls on both. The
table shows each target's median over the rounds and "x better": how many times this platform is ahead
(other / this for times, this / other for rates; above 1: this platform is faster).

The other server must use a bench LLM server (bench/llm_server.py) as its OpenAI endpoint; pass its root
URL (`--compare-llm-url`, default http://127.0.0.1:8099) so the bench sets the same LLM configuration on
both and can subtract LLM time. bench/README.md ("Comparing with another server") has the steps.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.llm_server import BenchLLMClient
from bench.stats import percentile

CHAT_MODEL = "gpt-4o-mini"  # served by the bench LLM server under this name (its /v1/models lists it)
EMBEDDING_MODEL = "text-embedding-3-small"  # a name Letta knows without asking the endpoint
BLOCKS: list[Any] = [
    {"label": "human", "value": "Name: Sam\nCounter: 0"},
    {"label": "persona", "value": "I am a concise, helpful assistant."},
]
ENV_URL, ENV_KEY, ENV_LLM = "BENCH_COMPARE_URL", "BENCH_COMPARE_KEY", "BENCH_COMPARE_LLM_URL"
DEFAULT_LLM_URL = "http://127.0.0.1:8099"

FULL = {
    "rounds": 2,
    "creates": 10,
    "simple_turns": 20,
    "agents": 8,
    "turns_per_agent": 4,
    "passages": 20,
    "streams": 10,
}
QUICK = {
    "rounds": 1,
    "creates": 3,
    "simple_turns": 5,
    "agents": 4,
    "turns_per_agent": 2,
    "passages": 5,
    "streams": 3,
}

# (key, label, unit, higher is better)
FIGURES: list[tuple[str, str, str, bool]] = [
    ("create_p50_ms", "agent create, p50", "ms", False),
    ("create_p95_ms", "agent create, p95", "ms", False),
    ("simple_p50_ms", "simple turn (1 LLM call), sequential, p50", "ms", False),
    ("simple_p95_ms", "simple turn (1 LLM call), sequential, p95", "ms", False),
    ("simple_overhead_p50_ms", "simple turn minus LLM time, p50", "ms", False),
    ("throughput_turns_per_s", "N agents, memory turns: throughput", "turns/s", True),
    ("throughput_p50_ms", "N agents, memory turns: p50", "ms", False),
    ("throughput_p95_ms", "N agents, memory turns: p95", "ms", False),
    ("throughput_failed", "N agents, memory turns: failed", "turns", False),
    ("insert_p50_ms", "archival insert (1 passage), p50", "ms", False),
    ("insert_p95_ms", "archival insert (1 passage), p95", "ms", False),
    ("search_p50_ms", "archival search top 10, p50", "ms", False),
    ("search_p95_ms", "archival search top 10, p95", "ms", False),
    ("first_token_p50_ms", "first streamed token at the client, p50", "ms", False),
    ("first_token_p95_ms", "first streamed token at the client, p95", "ms", False),
    ("first_token_overhead_p50_ms", "first streamed token minus LLM TTFT, p50", "ms", False),
]


@dataclass
class Target:
    name: str
    base_url: str
    api_key: str
    llm: BenchLLMClient | None = None  # the bench LLM server this target calls, if reachable


def compare_options(parser: argparse.ArgumentParser) -> None:
    """The flags of bench/run.py for this mode (defaults from the environment, so `make bench
    BENCH_COMPARE_URL=...` works)."""
    parser.add_argument(
        "--compare-url",
        default=os.environ.get(ENV_URL, ""),
        help=f"base URL of another Letta-compatible server to run the SDK workload against too (${ENV_URL})",
    )
    parser.add_argument(
        "--compare-key",
        default=os.environ.get(ENV_KEY, ""),
        help=f"its API key (${ENV_KEY}; any value for a Letta without a password)",
    )
    parser.add_argument(
        "--compare-llm-url",
        default=os.environ.get(ENV_LLM, DEFAULT_LLM_URL),
        help=f"root URL of the bench LLM server that server calls (${ENV_LLM}, default {DEFAULT_LLM_URL})",
    )


def better(this: float | None, other: float | None, higher_is_better: bool) -> float | None:
    """How many times this platform is ahead of the other server (above 1: this one is faster)."""
    if this is None or other is None:
        return None
    if higher_is_better:
        return round(this / other, 2) if other else None
    return round(other / this, 2) if this else None


def _med(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def summarise(rounds: list[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Median and spread (max - min) of each figure over a target's rounds."""
    out: dict[str, dict[str, Any]] = {}
    for key, *_ in FIGURES:
        values = [r[key] for r in rounds if r.get(key) is not None]
        if values:
            out[key] = {"median": _med(values), "spread": round(max(values) - min(values), 2)}
    return out


def table(summary: dict[str, dict[str, dict[str, Any]]], other_name: str) -> list[str]:
    """The side-by-side table: figure, the other server, this platform, and this platform's advantage."""
    other, this = summary.get("other", {}), summary.get("this", {})
    lines = [
        f"{'figure':46} {other_name[:22]:>22} {'this platform':>16} {'unit':>8} {'x better':>9}",
    ]

    def shown(fig: dict[str, Any] | None) -> str:
        if not fig:
            return "-"
        spread = f" ±{fig['spread']:g}" if fig.get("spread") else ""
        return f"{fig['median']:g}{spread}"

    for key, label, unit, higher in FIGURES:
        if key not in other and key not in this:
            continue
        ratio = better((this.get(key) or {}).get("median"), (other.get(key) or {}).get("median"), higher)
        if key == "throughput_failed":
            ratio = None
        lines.append(
            f"{label:46} {shown(other.get(key)):>22} {shown(this.get(key)):>16} {unit:>8} "
            f"{'' if ratio is None else f'{ratio:g}x':>9}"
        )
    return lines


# --- the workload ---------------------------------------------------------------------------------


def resolve_handles(client: Any) -> tuple[str, str]:
    """The chat and embedding handles the server gives the bench LLM server's models (Letta names an
    OpenAI endpoint other than api.openai.com `openai-proxy/...`; this platform `openai/...`)."""
    chat = embedding = ""
    try:
        for model in client.models.list():
            handle = getattr(model, "handle", None) or ""
            if handle.endswith("/" + CHAT_MODEL) and (not chat or handle.startswith("openai")):
                chat = handle
    except Exception:  # a server without the listing: fall back to the usual handle
        pass
    try:
        for model in client.models.embeddings.list():
            handle = getattr(model, "handle", None) or ""
            if handle.endswith("/" + EMBEDDING_MODEL) and (not embedding or handle.startswith("openai/")):
                embedding = handle
    except Exception:
        pass
    return chat or f"openai/{CHAT_MODEL}", embedding or f"openai/{EMBEDDING_MODEL}"


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = call()
    return (time.perf_counter() - t0) * 1000, result


def _llm_ms(llm: BenchLLMClient | None, mark: int, started: float, ended: float) -> float | None:
    if llm is None:
        return None
    return sum(e[2] * 1000 for e in llm.timings(mark) if started <= e[1] <= ended)


def first_token_ms(client: Any, agent_id: str, text: str) -> float:
    """Time from the request to the first assistant_message chunk of a token stream, at the client."""
    t0 = time.perf_counter()
    first = None
    stream = client.agents.messages.stream(
        agent_id, messages=[{"role": "user", "content": text}], stream_tokens=True
    )
    for chunk in stream:
        if first is None and getattr(chunk, "message_type", None) == "assistant_message":
            first = (time.perf_counter() - t0) * 1000
    if first is None:
        raise RuntimeError("stream ended without an assistant_message chunk")
    return first


def workload(target: Target, cfg: dict[str, Any], log: Callable[[str], None]) -> dict[str, float]:
    """One round of the whole workload against one server; the agents it made are deleted."""
    from letta_client import Letta

    from bench import turns
    from bench.sdk_throughput import sdk_turns

    client = Letta(base_url=target.base_url, api_key=target.api_key or "none", timeout=120, max_retries=0)
    chat, embedding = resolve_handles(client)
    made: list[str] = []
    out: dict[str, float] = {}
    try:

        def create() -> str:
            agent = client.agents.create(model=chat, embedding=embedding, memory_blocks=BLOCKS)
            made.append(agent.id)
            return agent.id

        create()  # warm-up
        creates = [_timed(create)[0] for _ in range(cfg["creates"])]
        out["create_p50_ms"], out["create_p95_ms"] = percentile(creates, 50), percentile(creates, 95)

        agent_id = made[0]
        client.agents.messages.create(agent_id, messages=[{"role": "user", "content": "warm up"}])
        walls, overheads = [], []
        for index in range(cfg["simple_turns"]):
            mark = target.llm.mark() if target.llm else 0
            started = time.time()
            text = turns.turn_text(turns.SIMPLE, index)
            wall, _ = _timed(
                functools.partial(
                    client.agents.messages.create, agent_id, messages=[{"role": "user", "content": text}]
                )
            )
            walls.append(wall)
            llm = _llm_ms(target.llm, mark, started, started + wall / 1000)
            if llm is not None:
                overheads.append(wall - llm)
        out["simple_p50_ms"], out["simple_p95_ms"] = percentile(walls, 50), percentile(walls, 95)
        if overheads:
            out["simple_overhead_p50_ms"] = percentile(overheads, 50)

        agent_ids = made[1 : 1 + cfg["agents"]]
        while len(agent_ids) < cfg["agents"]:
            agent_ids.append(create())
        sdk_turns(target.base_url, target.api_key, agent_ids, kind=turns.MEMORY, per_agent=1)  # warm
        r = sdk_turns(
            target.base_url, target.api_key, agent_ids, kind=turns.MEMORY, per_agent=cfg["turns_per_agent"]
        )
        out["throughput_turns_per_s"] = r["turns_per_s"]
        out["throughput_p50_ms"], out["throughput_p95_ms"] = r["p50_ms"], r["p95_ms"]
        out["throughput_failed"] = r["errors"]
        if r["errors"]:
            log(f"  {target.name}: {r['errors']} failed turns, first: {r['first_error']}")

        inserts, searches = [], []
        for index in range(cfg["passages"]):
            text = f"The bench passage number {index} talks about apples, rivers and counter {index}."
            inserts.append(_timed(functools.partial(client.agents.passages.create, agent_id, text=text))[0])
        for index in range(cfg["passages"]):
            query = f"apples and rivers {index}"
            search = functools.partial(client.agents.passages.search, agent_id, query=query, top_k=10)
            searches.append(_timed(search)[0])
        out["insert_p50_ms"], out["insert_p95_ms"] = percentile(inserts, 50), percentile(inserts, 95)
        out["search_p50_ms"], out["search_p95_ms"] = percentile(searches, 50), percentile(searches, 95)

        firsts, first_overheads = [], []
        for index in range(cfg["streams"]):
            mark = target.llm.mark() if target.llm else 0
            started = time.time()
            first = first_token_ms(client, agent_id, turns.turn_text(turns.SIMPLE, index))
            firsts.append(first)
            if target.llm is not None:
                chats = [e for e in target.llm.timings(mark) if e[0] == "chat" and e[1] >= started]
                if chats and chats[0][3] is not None:
                    first_overheads.append(first - chats[0][3] * 1000)
        out["first_token_p50_ms"], out["first_token_p95_ms"] = percentile(firsts, 50), percentile(firsts, 95)
        if first_overheads:
            out["first_token_overhead_p50_ms"] = percentile(first_overheads, 50)
    finally:
        for agent_id in made:
            try:
                client.agents.delete(agent_id)
            except Exception as exc:  # a leftover agent must not lose the figures
                log(f"  {target.name}: could not delete agent {agent_id}: {exc}")
        client.close()
    return {k: round(v, 2) for k, v in out.items()}


def reachable_llm(root: str) -> BenchLLMClient | None:
    llm = BenchLLMClient(root) if root else None
    return llm if llm is not None and llm.healthy() else None


def side_by_side(this: Target, other: Target, *, quick: bool, log: Callable[[str], None]) -> dict[str, Any]:
    """Rounds of the workload against both servers (alternating order); medians, spreads, the table."""
    cfg = QUICK if quick else FULL
    for target in (this, other):
        if target.llm is not None:  # the same LLM behaviour on both sides: zero latency, short replies
            target.llm.configure(latency=0, tokens_per_s=0, reply_tokens=0)
    rounds: dict[str, list[dict[str, float]]] = {"this": [], "other": []}
    for index in range(cfg["rounds"]):
        order = [("other", other), ("this", this)]
        for key, target in order if index % 2 == 0 else order[::-1]:
            started = time.monotonic()
            rounds[key].append(workload(target, cfg, log))
            log(f"  {target.name} round {index + 1}: {time.monotonic() - started:.0f} s, {rounds[key][-1]}")
    summary = {key: summarise(values) for key, values in rounds.items()}
    lines = table(summary, other.name)
    for line in lines:
        log("  " + line)
    return {
        "other": {"base_url": other.base_url, "llm_timings": other.llm is not None},
        "config": cfg,
        "rounds": rounds,
        "summary": summary,
        "table": lines,
    }
