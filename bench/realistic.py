"""Turns with a realistic LLM: 300 ms before the first token, then 50 tokens a second.

The bench LLM server is set to {"latency": 0.3, "tokens_per_s": 50, "reply_tokens": 50}: a text reply is
50 tokens (about 1.3 s), the memory_replace call's arguments 4 pieces, so a memory turn (tool call, then
reply) spends about 1.7 s in the LLM and a simple turn about 1.3 s. With the official SDK as the client
(bench/sdk_throughput.py: each agent a thread of its own and its own `Letta` client), it measures:

  at 8, 32 and 128 agents   memory turns back to back: turns/s, p50/p95 at the client, failed turns, the
                            peak of runs in flight (running / queued, sampled every 50 ms), CPU ms/turn
  worker threads needed     128 agents with 8, 32 and 128 worker threads in all (2 workers, threads pool):
                            turns/s grows with the threads until the runs in flight stop being capped by
                            them; each run in flight holds a worker thread (and its PostgreSQL connection)
                            for its whole LLM time
  first token               sequential streams (`agents.messages.stream(stream_tokens=True)`, simple
                            turns): time to the first assistant_message chunk at the client minus the LLM
                            server's time to its first content chunk (the platform's part), p50/p95

Each worker-thread setting is a fresh platform (bench/stack.py). Every worker thread keeps a PostgreSQL
connection, so a setting whose threads and the web pool do not fit in the server's max_connections is
skipped (and said so): for 128 threads set max_connections = 300 in DATA_DIR/bench/postgres/postgresql.conf.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from django.db import connection

from bench.stats import across, percentile

LLM: dict[str, Any] = {"latency": 0.3, "tokens_per_s": 50.0, "reply_tokens": 50}
FULL: dict[str, Any] = {"runs": 2, "levels": {8: 4, 32: 3, 128: 2}, "threads": [8, 32, 128], "streams": 20}
QUICK: dict[str, Any] = {"runs": 1, "levels": {8: 2, 32: 1, 128: 1}, "threads": [8, 128], "streams": 5}
SPARE_CONNECTIONS = 12  # the bench process, the services' own, a margin


class InFlight:
    """Samples the runs of one organisation in flight (running, and queued: created, not yet claimed)."""

    def __init__(self, organization_id: Any, every: float = 0.05) -> None:
        self.organization_id = organization_id
        self.every = every
        self.peak_running = 0
        self.peak_queued = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        try:
            with connection.cursor() as cursor:
                while not self._stop.is_set():
                    cursor.execute(
                        "SELECT count(*) FILTER (WHERE status = 'running'), count(*) FILTER (WHERE status = "
                        "'created') FROM agents_run WHERE organization_id = %s AND status IN ('running', "
                        "'created')",
                        [self.organization_id],
                    )
                    running, queued = cursor.fetchone()
                    self.peak_running = max(self.peak_running, running)
                    self.peak_queued = max(self.peak_queued, queued)
                    self._stop.wait(self.every)
        finally:
            connection.close()

    @contextlib.contextmanager
    def sampling(self) -> Iterator[InFlight]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


def max_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SHOW max_connections")
        return int(cursor.fetchone()[0])


def level_figures(
    platform: Any,
    tenant: Any,
    agent_ids: list[str],
    *,
    per_agent: int,
    runs: int,
    log: Callable[[str], None],
    warm: bool = True,
) -> dict[str, Any]:
    from bench.run import cpu_per_turn
    from bench.sdk_throughput import sdk_turns
    from bench.turns import MEMORY

    if warm:
        sdk_turns(platform.web_url, tenant.api_key, agent_ids, kind=MEMORY, per_agent=1)
    rates, p50, p95, failed, running, queued, first_error = [], [], [], 0, [], [], None
    cpu0, done, started = platform.cpu_seconds(), 0, time.monotonic()
    for _ in range(runs):
        sampler = InFlight(tenant.organization.id)
        with sampler.sampling():
            r = sdk_turns(platform.web_url, tenant.api_key, agent_ids, kind=MEMORY, per_agent=per_agent)
        rates.append(r["turns_per_s"])
        p50.append(r["p50_ms"])
        p95.append(r["p95_ms"])
        failed += r["errors"]
        first_error = first_error or r["first_error"]
        done += r["turns"]
        running.append(sampler.peak_running)
        queued.append(sampler.peak_queued)
        log(
            f"    {len(agent_ids)} agents: {r['turns_per_s']:.1f} turns/s, p50 {r['p50_ms']:.0f} p95 "
            f"{r['p95_ms']:.0f} ms, in flight peak {sampler.peak_running} running + {sampler.peak_queued} "
            f"queued" + (f", {r['errors']} failed: {r['first_error']}" if r["errors"] else "")
        )
    cpu = cpu_per_turn(cpu0, platform.cpu_seconds(), done, time.monotonic() - started)
    return {
        "turns_per_run": per_agent * len(agent_ids),
        "turns_per_s": across(rates, 1),
        "p50_ms": across(p50, 0),
        "p95_ms": across(p95, 0),
        "failed_turns": failed,
        "first_error": first_error,
        "peak_running": max(running),
        "peak_queued": max(queued),
        **cpu,
    }


def first_token_figures(
    platform: Any, tenant: Any, agent_id: str, *, count: int, runs: int
) -> dict[str, Any]:
    from letta_client import Letta

    from bench.compare import first_token_ms
    from bench.turns import SIMPLE, turn_text

    client = Letta(base_url=platform.web_url, api_key=tenant.api_key, timeout=120, max_retries=0)
    first_token_ms(client, agent_id, "warm up")
    p50, p95, at_client, llm_ttft = [], [], [], []
    stages: dict[str, list[float]] = {name: [] for name in FIRST_TOKEN_STAGES}
    try:
        for _ in range(runs):
            overheads, firsts, ttfts = [], [], []
            split: dict[str, list[float]] = {name: [] for name in FIRST_TOKEN_STAGES}
            for index in range(count):
                mark, started = platform.llm.mark(), time.time()
                first = first_token_ms(client, agent_id, turn_text(SIMPLE, index))
                chats = [e for e in platform.llm.timings(mark) if e[0] == "chat" and e[1] >= started]
                if not chats or chats[0][3] is None:
                    continue
                ttft = chats[0][3] * 1000
                overheads.append(first - ttft)
                firsts.append(first)
                ttfts.append(ttft)
                for name, value in first_token_stages(agent_id, started, chats[0][1], first, ttft).items():
                    split[name].append(value)
            p50.append(percentile(overheads, 50))
            p95.append(percentile(overheads, 95))
            at_client.append(percentile(firsts, 50))
            llm_ttft.append(percentile(ttfts, 50))
            for name, values in split.items():
                if values:
                    stages[name].append(percentile(values, 50))
    finally:
        client.close()
    return {
        "streams_per_run": count,
        "added_p50_ms": across(p50),
        "added_p95_ms": across(p95),
        "at_client_p50_ms": across(at_client, 1),
        "llm_ttft_p50_ms": across(llm_ttft, 1),
        "stages_p50_ms": {name: across(values) for name, values in stages.items() if values},
    }


FIRST_TOKEN_STAGES = ("web_in", "queue", "worker_to_llm", "relay_out")


def first_token_stages(
    agent_id: str, started: float, llm_started: float, first_ms: float, ttft_ms: float
) -> dict[str, float]:
    """Where one stream's added time went, from its Run row and the LLM server's log (one host clock):
    POST -> run created (web_in: auth, throttles, the run's insert), created -> claimed by a worker (queue:
    commit, Celery, pickup, lock and claim), claimed -> the LLM server has the request (worker_to_llm: load,
    compile, send), the LLM's first content chunk -> the client's first assistant chunk (relay_out: worker
    -> Redis -> web -> SSE -> SDK). They add up to the added time."""
    from apps.agents.models import Run

    row = (
        Run.all_objects.filter(agent_id=agent_id, created_at__gte=datetime.fromtimestamp(started, UTC))
        .order_by("created_at")
        .values_list("created_at", "started_at")
        .first()
    )
    if row is None or row[1] is None:
        return {}
    created, claimed = row[0].timestamp(), row[1].timestamp()
    return {
        "web_in": (created - started) * 1000,
        "queue": (claimed - created) * 1000,
        "worker_to_llm": (llm_started - claimed) * 1000,
        "relay_out": first_ms - ((llm_started - started) * 1000 + ttft_ms),
    }


def realistic_figures(
    tenant: Any, *, quick: bool, web_db_pool: str, log: Callable[[str], None]
) -> dict[str, Any]:
    from bench.stack import Platform

    cfg = QUICK if quick else FULL
    limit = max_connections()
    out: dict[str, Any] = {"llm": LLM, "config": cfg, "max_connections": limit, "threads": {}}
    most = max(cfg["levels"])
    fitting = [t for t in cfg["threads"] if t + int(web_db_pool or 0) + SPARE_CONNECTIONS <= limit]
    for threads in sorted(cfg["threads"], reverse=True):
        if threads not in fitting:
            needed = threads + int(web_db_pool or 0) + SPARE_CONNECTIONS
            out["threads"][str(threads)] = {
                "skipped": f"needs max_connections >= {needed} (one per worker thread), the server has {limit}"
            }
            log(f"  {threads} worker threads skipped: {out['threads'][str(threads)]['skipped']}")
            continue
        per_worker = max(1, threads // 2)
        platform = Platform(workers=2, worker_concurrency=per_worker, web_db_pool=web_db_pool)
        log(f"  --- {threads} worker threads (2 x {per_worker})")
        try:
            platform.start()
            platform.llm.configure(**LLM)
            agent_ids = [tenant.agent() for _ in range(most)]
            full = threads == max(fitting)  # the most threads that fit: every agent count, first token
            # Fewer threads: one cold round of one turn per agent (the rate shows the cap; at 8 threads a
            # warm-up alone would take most of a minute).
            levels = cfg["levels"] if full else {most: 1}
            fig = out["threads"].setdefault(str(threads), {"agents": {}})
            for agents, per_agent in levels.items():
                fig["agents"][str(agents)] = level_figures(
                    platform,
                    tenant,
                    agent_ids[:agents],
                    per_agent=per_agent,
                    runs=cfg["runs"] if full else 1,
                    log=log,
                    warm=full,
                )
                platform.check_alive()
            if full:
                out["first_token"] = first_token_figures(
                    platform, tenant, agent_ids[0], count=cfg["streams"], runs=cfg["runs"]
                )
                log(f"    first token added by the platform: {out['first_token']}")
        finally:
            platform.stop()
    return out


def table_rows(results: dict[str, Any]) -> list[tuple[str, Any, Any, str, str]]:
    """(figure, median, spread, unit, bar) rows for bench/run.py's table."""
    rows: list[tuple[str, Any, Any, str, str]] = []
    llm = results.get("llm", LLM)
    tag = f"{llm['latency'] * 1000:.0f} ms + {llm['tokens_per_s']:g} tok/s LLM"
    threads = results.get("threads", {})
    for count, fig in sorted(threads.items(), key=lambda kv: -int(kv[0])):
        if "skipped" in fig:
            rows.append((f"{tag}, {count} worker threads: skipped", "", "", "", fig["skipped"][:60]))
            continue
        for agents, level in sorted(fig["agents"].items(), key=lambda kv: int(kv[0])):
            name = f"{tag}, {count} threads, {agents} agents"
            rows.append(
                (
                    f"{name}: turns/s",
                    level["turns_per_s"]["median"],
                    level["turns_per_s"]["spread"],
                    "turns/s",
                    "",
                )
            )
            rows.append((f"{name}: p95", level["p95_ms"]["median"], level["p95_ms"]["spread"], "ms", ""))
            rows.append(
                (
                    f"{name}: runs in flight, peak running (queued)",
                    f"{level['peak_running']} ({level['peak_queued']})",
                    "",
                    "runs",
                    "",
                )
            )
            if level["failed_turns"]:
                rows.append((f"{name}: FAILED turns", level["failed_turns"], "", "", ""))
    first = results.get("first_token")
    if first:
        bar = "< 10: MET" if first["added_p50_ms"]["median"] < 10 else "< 10: NOT MET"
        rows.append(
            (
                f"{tag}: first token added by the platform, p50",
                first["added_p50_ms"]["median"],
                first["added_p50_ms"]["spread"],
                "ms",
                bar,
            )
        )
        rows.append(
            (
                f"{tag}: first token added by the platform, p95",
                first["added_p95_ms"]["median"],
                first["added_p95_ms"]["spread"],
                "ms",
                "",
            )
        )
        for name, value in first.get("stages_p50_ms", {}).items():
            rows.append((f"{tag}: first token, {name} p50", value["median"], value["spread"], "ms", ""))
    return rows
