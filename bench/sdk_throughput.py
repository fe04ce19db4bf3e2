"""Throughput and CPU per turn with the official SDK (`letta_client`) as the client.

`echo "python -m bench.sdk_throughput" | DATA_DIR=... python scripts/devenv.py shell` (after a
`devenv.py manage migrate` in that DATA_DIR), or with `--trees A,B` to A/B two checkouts of the code:
each round starts the platform (bench/stack.py: the bench LLM server, daphne, 2 Celery workers) from one
tree after the other (the order reversed every other round), so slow phases of a shared machine fall on
both. Each round: 8 agents (fresh each round), one warm-up turn each, then every agent sends memory turns
(a memory_replace tool call, then a reply: two LLM calls) back to back through
`Letta.agents.messages.create` in a thread of its own.

Per round it records turns/s, p50/p95 latency at the client, and CPU ms per turn of each process, from
/proc (utime + stime, children included): daphne (web), the workers, PostgreSQL (postmaster and
backends), Valkey, and, reported apart, the LLM server and this process (the SDK client). It also counts
per turn the Valkey commands (INFO commandstats) and PostgreSQL commits (pg_stat_database). The summary is
the median of the rounds with the spread (max - min).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import django

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from letta_client import Letta  # noqa: E402

from bench import stack, turns  # noqa: E402
from bench.run import Tenant, cpu_per_turn, log  # noqa: E402
from bench.stats import machine_speed_ms, percentile  # noqa: E402

COUNTED = ("web", "workers", "postgres", "valkey")  # the platform; llm and client are reported apart


def redis_commands() -> dict[str, int]:
    info = redis.Redis.from_url(settings.REDIS_URL).info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in info.items()}


def pg_commits() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def sdk_turns(
    base_url: str, api_key: str, agent_ids: list[str], *, kind: str, per_agent: int
) -> dict[str, Any]:
    """Every agent sends `per_agent` turns back to back, each agent from its own thread and SDK client."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def agent_loop(agent_id: str) -> None:
        client = Letta(base_url=base_url, api_key=api_key, timeout=120, max_retries=0)
        for index in range(per_agent):
            t0 = time.perf_counter()
            try:
                response = client.agents.messages.create(
                    agent_id, messages=[{"role": "user", "content": turns.turn_text(kind, index)}]
                )
                types = [m.message_type for m in response.messages]
                if kind == turns.MEMORY and "tool_return_message" not in types:
                    raise RuntimeError(f"memory turn without a tool return: {types}")
            except Exception as exc:  # counted, not raised: a figure with failures says so
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            with lock:
                latencies.append((time.perf_counter() - t0) * 1000)
        client.close()

    threads = [threading.Thread(target=agent_loop, args=(a,)) for a in agent_ids]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return {
        "turns": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "turns_per_s": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 50) if latencies else float("nan"),
        "p95_ms": percentile(latencies, 95) if latencies else float("nan"),
    }


def one_round(tree: Path, tenant: Tenant, *, agents: int, per_agent: int, kind: str) -> dict[str, Any]:
    stack.ROOT = tree  # the children run from this checkout (cwd), on the same databases
    platform = stack.Platform(workers=2, worker_concurrency=4)
    try:
        platform.start()
        agent_ids = [tenant.agent() for _ in range(agents)]
        sdk_turns(platform.web_url, tenant.api_key, agent_ids, kind=kind, per_agent=1)  # warm
        cpu0, redis0, commits0 = platform.cpu_seconds(), redis_commands(), pg_commits()
        started = time.monotonic()
        r = sdk_turns(platform.web_url, tenant.api_key, agent_ids, kind=kind, per_agent=per_agent)
        seconds = time.monotonic() - started
        cpu = cpu_per_turn(cpu0, platform.cpu_seconds(), r["turns"], seconds)
        redis1, commits1 = redis_commands(), pg_commits()
        platform.check_alive()
    finally:
        platform.stop()
    count = max(1, r["turns"])
    per = cpu["cpu_ms_per_turn"]
    r["cpu_ms_per_turn"] = per
    r["platform_cpu_ms_per_turn"] = round(sum(per.get(name, 0.0) for name in COUNTED), 1)
    r["cpu_busy_pct"] = cpu["cpu_busy_pct"]
    calls = {name: (redis1.get(name, 0) - redis0.get(name, 0)) / count for name in redis1}
    r["valkey_commands_per_turn"] = {
        k: round(v, 2) for k, v in sorted(calls.items(), key=lambda x: -x[1]) if v
    }
    r["pg_commits_per_turn"] = round((commits1 - commits0) / count, 2)  # the counting queries excluded
    r["load"] = [round(x, 2) for x in os.getloadavg()]
    return r


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns-per-agent", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kind", default=turns.MEMORY, choices=(turns.MEMORY, turns.SIMPLE))
    parser.add_argument(
        "--trees", default=str(ROOT), help="comma-separated checkouts to A/B (default: this one)"
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "sdk-throughput.json"))
    args = parser.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    tenant = Tenant()
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "speed_at_start_ms": machine_speed_ms(),
        "load_at_start": [round(x, 2) for x in os.getloadavg()],
        "config": vars(args),
        "rounds": {str(t): [] for t in trees},
    }
    try:
        for index in range(args.rounds):
            for tree in trees if index % 2 == 0 else trees[::-1]:
                r = one_round(
                    tree, tenant, agents=args.agents, per_agent=args.turns_per_agent, kind=args.kind
                )
                results["rounds"][str(tree)].append(r)
                log(
                    f"{tree.name} round {index + 1}: {r['turns_per_s']:.1f} turns/s, p50 {r['p50_ms']:.0f} "
                    f"p95 {r['p95_ms']:.0f} ms, platform CPU {r['platform_cpu_ms_per_turn']} ms/turn "
                    f"{r['cpu_ms_per_turn']}, {r['errors']} failed, load {r['load']}"
                )
    finally:
        tenant.delete()
    results["speed_at_end_ms"] = machine_speed_ms()
    results["summary"] = {}
    for tree, rounds in results["rounds"].items():
        if not rounds:
            continue

        def med(values: list[float]) -> dict[str, float]:
            return {
                "median": round(statistics.median(values), 1),
                "spread": round(max(values) - min(values), 1),
            }

        names = sorted({n for r in rounds for n in r["cpu_ms_per_turn"]})
        results["summary"][tree] = {
            "turns_per_s": med([r["turns_per_s"] for r in rounds]),
            "p50_ms": med([r["p50_ms"] for r in rounds]),
            "p95_ms": med([r["p95_ms"] for r in rounds]),
            "platform_cpu_ms_per_turn": med([r["platform_cpu_ms_per_turn"] for r in rounds]),
            "cpu_ms_per_turn": {n: med([r["cpu_ms_per_turn"].get(n, 0.0) for r in rounds]) for n in names},
            "pg_commits_per_turn": med([r["pg_commits_per_turn"] for r in rounds]),
            "failed_turns": sum(r["errors"] for r in rounds),
        }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2, default=str))
    print(json.dumps(results["summary"], indent=2))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
