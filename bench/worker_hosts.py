"""Turns per second with one worker host and with two, the same cores in total (issue 24).

Both layouts run the same two Celery workers (threads pool, WORKER_CONCURRENCY each) on two cores, pinned
with taskset: "one host" puts both workers on cores 0 and 1 together (one two-core machine); "two hosts"
pins worker 1 to core 0 and worker 2 to core 1 (two one-core machines). daphne, the bench LLM server,
PostgreSQL and Redis are not pinned (on a real cluster they have machines of their own; here they share
the same two cores, so the figure compares the layouts, not the absolute rate of either). Each layout is
measured in ROUNDS rounds of AGENTS agents sending memory turns (a tool call, then a reply: two LLM calls)
at once, alternating the layouts so that other load on the machine hits both alike.

    make bench-hosts    # = echo "python -m bench.worker_hosts" | python scripts/devenv.py shell

(prints a table, writes bench/results/worker_hosts.json). Environment: BENCH_HOSTS_ROUNDS (default 5),
BENCH_HOSTS_AGENTS (8), BENCH_HOSTS_TURNS (64 per round), WORKER_CONCURRENCY (4).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from django.core.management import call_command  # noqa: E402

from bench import run as bench_run  # noqa: E402  (sets Django up)
from bench import turns  # noqa: E402
from bench.stack import Child, Platform  # noqa: E402
from bench.stats import across  # noqa: E402

LAYOUTS = {"one host (2 cores)": ["0,1", "0,1"], "two hosts (1 core each)": ["0", "1"]}


@dataclass
class PinnedPlatform(Platform):
    """Platform with each worker pinned to its CPU list (`worker_cpus[i]` for worker i + 1)."""

    worker_cpus: list[str] = field(default_factory=list)

    def _spawn(self, name: str, command: list[str], **env: str) -> Child:
        if name.startswith("worker") and self.worker_cpus:
            command = ["taskset", "-c", self.worker_cpus[int(name.removeprefix("worker")) - 1], *command]
        return super()._spawn(name, command, **env)


def measure_round(platform: Platform, tenant: Any, agent_ids: list[str], total: int) -> dict[str, float]:
    per_agent = max(1, math.ceil(total / len(agent_ids)))
    return turns.concurrent_turns(
        platform.web_url, tenant.api_key, agent_ids, kind=turns.MEMORY, turns_per_agent=per_agent
    )


def main() -> int:
    rounds = int(os.environ.get("BENCH_HOSTS_ROUNDS", "5"))
    agents = int(os.environ.get("BENCH_HOSTS_AGENTS", "8"))
    total = int(os.environ.get("BENCH_HOSTS_TURNS", "64"))
    concurrency = int(os.environ.get("WORKER_CONCURRENCY", "4"))
    if (os.cpu_count() or 1) < 2:
        print("needs 2 cores", file=sys.stderr)
        return 2
    call_command("migrate", "--noinput", verbosity=0)
    tenant = bench_run.Tenant()
    agent_ids = [tenant.agent() for _ in range(agents)]
    samples: dict[str, dict[str, list[float]]] = {name: {"rate": [], "p95": []} for name in LAYOUTS}
    failed = 0
    try:
        for index in range(rounds):
            for name, cpus in LAYOUTS.items():
                with PinnedPlatform(workers=2, worker_concurrency=concurrency, worker_cpus=cpus) as platform:
                    measure_round(platform, tenant, agent_ids, len(agent_ids))  # warm-up: one turn each
                    result = measure_round(platform, tenant, agent_ids, total)
                samples[name]["rate"].append(result["turns_per_s"])
                samples[name]["p95"].append(result["p95_ms"])
                failed += int(result["errors"])
                print(
                    f"round {index + 1}, {name}: {result['turns_per_s']:.1f} turns/s, p95 {result['p95_ms']:.0f} ms",
                    flush=True,
                )
    finally:
        tenant.delete()
    figures = {
        name: {"turns_per_s": across(values["rate"], 1), "p95_ms": across(values["p95"], 0)}
        for name, values in samples.items()
    }
    out = {
        "what": f"memory turns, {agents} agents at once, {total} turns a round, 2 workers x threads {concurrency}",
        "rounds": rounds,
        "failed_turns": failed,
        "load_at_end": [round(x, 2) for x in os.getloadavg()],
        "figures": figures,
    }
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "worker_hosts.json").write_text(json.dumps(out, indent=2))
    print(f"\n{out['what']}, {rounds} rounds (median, spread = max - min):")
    for name, fig in figures.items():
        rate, p95 = fig["turns_per_s"], fig["p95_ms"]
        print(
            f"  {name:26} {rate['median']:6.1f} turns/s (spread {rate['spread']}), p95 {p95['median']:.0f} ms"
        )
    print(f"failed turns: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
