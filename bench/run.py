"""`make bench`: the platform's figures on this machine, printed as a table and written as JSON.

scripts/devenv.py starts embedded PostgreSQL+pgvector and Valkey (DATA_DIR/bench) and migrates; this
script then starts the bench LLM server, daphne and two Celery workers as subprocesses (all stopped at
the end, also on errors and on SIGTERM), and measures:

  turns        server overhead per turn (sequential, zero-latency LLM; and with a fixed LLM latency),
               LLM calls per turn, embeddings' cost, streaming time to first token
  throughput   turns/s and p95 latency with 1, 8 and 32 agents sending at once
  memory       resident memory of the web process and the workers after >= 1,000 turns
  in-process   SQL statements per turn and step, context compilation (10 blocks, 200 messages)
  archival     insert throughput, search at 10k and 100k passages, recall search at 100k messages
  sandbox      a custom tool call in Docker (cold, warm) and in the local bubblewrap jail
  folders      ingestion of uploads, embedding excluded: parse (PDF, DOCX, HTML in the parser jail) + chunk
  realistic    a 300 ms + 50 tokens/s LLM, official SDK client: turns/s and p95 at 8, 32, 128 agents,
               worker threads needed, first token added by the platform (bench/realistic.py)
  compare      only with --compare-url (or BENCH_COMPARE_URL): the same SDK workload against another
               Letta-compatible server and this platform, side by side (bench/compare.py)

Each figure is the median of repeated runs, with the spread (max - min) of those runs.
Options: --quick (small counts, for a smoke test), --only turns,throughput,... , --profile (write a
pyinstrument profile of a worker's turn to bench/results/), --no-archival, --no-sandbox.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform as host
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import django

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

import httpx  # noqa: E402
import psutil  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402

from apps.accounts.models import Membership, Organization, User  # noqa: E402
from apps.accounts.services import api_key_create  # noqa: E402
from apps.agents.models import Run  # noqa: E402
from apps.agents.services import BlockSpec, agent_create  # noqa: E402
from apps.core.actor import Actor, Role  # noqa: E402
from bench import archival, compare, inprocess, spy, turns  # noqa: E402
from bench.stack import Platform  # noqa: E402
from bench.stats import across, machine_speed_ms, percentile  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
MODEL = "openai/gpt-4o-mini"
EMBEDDING = archival.EMBEDDING_HANDLE
PHASES = (
    "turns",
    "throughput",
    "memory",
    "inprocess",
    "archival",
    "sandbox",
    "folders",
    "realistic",
    "tracing",
    "compare",
)

FULL = {
    "runs": 3,
    "memory_turns": 200,
    "simple_turns": 100,
    "embedding_turns": 50,
    "latency_turns": 30,
    "latency_s": 0.05,
    "stream_turns": 20,
    "throughput_turns": {1: 30, 8: 64, 32: 128},
    "rss_after_turns": 1000,
    "sizes": [10_000, 100_000],
    "search_per_run": 50,
    "insert_batches": 10,
    "sandbox_repeat": 10,
    "folders_repeat": 5,
}
QUICK = {
    **FULL,
    "runs": 2,
    "memory_turns": 20,
    "simple_turns": 20,
    "embedding_turns": 10,
    "latency_turns": 5,
    "stream_turns": 5,
    "throughput_turns": {1: 5, 8: 16, 32: 32},
    "rss_after_turns": 0,
    "sizes": [2_000, 5_000],
    "search_per_run": 10,
    "insert_batches": 2,
    "sandbox_repeat": 3,
    "folders_repeat": 2,
}

STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[bench {time.monotonic() - STARTED:6.1f}s] {message}", flush=True)


@contextlib.contextmanager
def phase(name: str, results: dict[str, Any]) -> Iterator[None]:
    """Time a phase; a failure is recorded in the results and the benchmark goes on."""
    log(f"--- {name}")
    started = time.monotonic()
    try:
        yield
    except Exception as exc:  # one broken figure must not lose the others
        log(f"!!! {name} failed: {type(exc).__name__}: {exc}")
        traceback.print_exc()
        results.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        results.setdefault("phase_seconds", {})[name] = round(time.monotonic() - started, 1)
        log(f"--- {name} done in {time.monotonic() - started:.1f} s")


class Tenant:
    """An organisation, an owner and an API key of its own, deleted at the end."""

    def __init__(self) -> None:
        stamp = time.time_ns()
        self.organization = Organization.objects.create(name=f"bench-{stamp}")
        self.user = User.objects.create_user(username=f"bench-{stamp}")
        Membership.objects.create(user=self.user, organization=self.organization, role=Role.OWNER)
        self.actor = Actor(organization_id=self.organization.id, user_id=self.user.id, role=Role.OWNER)
        self.api_key = api_key_create(actor=self.actor, user=self.user, name="bench").raw_key

    def agent(self, embedding: str = "") -> str:
        return agent_create(
            actor=self.actor,
            model=MODEL,
            embedding=embedding,
            memory_blocks=[
                BlockSpec("human", "Name: Sam\nCounter: 0"),
                BlockSpec("persona", "I am a concise, helpful assistant."),
            ],
        ).id

    def delete(self) -> None:
        archival_seconds = archival.cleanup(self.organization.id)
        cleaned = time.monotonic()
        with connection.cursor() as cursor:
            for table in ("agents_step", "agents_run"):
                cursor.execute(f"DELETE FROM {table} WHERE organization_id = %s", [self.organization.id])
        Organization.objects.filter(id=self.organization.id).delete()
        User.objects.filter(id=self.user.id).delete()
        log(f"  clean-up: {archival_seconds}; the organisation {time.monotonic() - cleaned:.1f} s")


# --- turn figures ------------------------------------------------------------------------------------


def overhead_runs(
    client: httpx.Client,
    platform: Platform,
    tenant: Tenant,
    *,
    kind: str,
    count: int,
    runs: int,
    embedding: str = "",
) -> dict[str, Any]:
    """`runs` fresh agents, `count` sequential turns each; per run p50/p95 of (wall - LLM time)."""
    p50, p95, wall50, llm50, first, last, chat_calls, embed_calls = [], [], [], [], [], [], [], []
    stages: dict[str, list[float]] = {name: [] for name in STAGES}
    edge = max(1, min(20, count // 5))
    for run in range(runs):
        agent_id = tenant.agent(embedding)
        samples = turns.sequential_turns(client, platform.llm, agent_id, kind=kind, count=count)
        overhead = [s.overhead_ms for s in samples]
        p50.append(percentile(overhead, 50))
        p95.append(percentile(overhead, 95))
        wall50.append(percentile([s.wall_ms for s in samples], 50))
        llm50.append(percentile([s.llm_ms for s in samples], 50))
        first.append(percentile(overhead[:edge], 50))
        last.append(percentile(overhead[-edge:], 50))
        chat_calls.append(sum(s.chat_calls for s in samples) / len(samples))
        embed_calls.append(sum(s.embed_calls for s in samples) / len(samples))
        for name, values in turn_stages(agent_id, samples).items():
            stages[name].append(percentile(values, 50))
        log(
            f"  {kind}{' +embeddings' if embedding else ''} run {run + 1}/{runs}: overhead p50 {p50[-1]:.1f} ms, "
            f"p95 {p95[-1]:.1f} ms (first {edge}: {first[-1]:.1f}, last {edge}: {last[-1]:.1f}), "
            f"LLM calls/turn {chat_calls[-1]:.2f}"
        )
    return {
        "turns_per_run": count,
        "overhead_p50_ms": across(p50),
        "overhead_p95_ms": across(p95),
        "wall_p50_ms": across(wall50),
        "llm_p50_ms": across(llm50),
        f"overhead_first_{edge}_turns_p50_ms": across(first),
        f"overhead_last_{edge}_turns_p50_ms": across(last),
        "llm_calls_per_turn": across(chat_calls),
        "embedding_calls_per_turn": across(embed_calls),
        "stages_p50_ms": {name: across(values) for name, values in stages.items() if values},
    }


STAGES = ("web_in", "queue", "execute_minus_llm", "web_out")


def turn_stages(agent_id: str, samples: list[turns.TurnSample]) -> dict[str, list[float]]:
    """Where a turn's time goes, from its Run row's timestamps: request -> run created (web_in),
    created -> claimed by a worker (queue: commit, Celery, lock), claimed -> finished minus the LLM's
    time (execute_minus_llm), finished -> response at the client (web_out)."""
    runs = list(
        Run.all_objects.filter(agent_id=agent_id)
        .order_by("created_at")
        .values_list("created_at", "started_at", "completed_at")
    )
    out: dict[str, list[float]] = {name: [] for name in STAGES}
    if len(runs) != len(samples):
        return out
    for sample, (created, started, completed) in zip(samples, runs, strict=True):
        if not (created and started and completed):
            continue
        end = sample.started + sample.wall_ms / 1000
        out["web_in"].append((created.timestamp() - sample.started) * 1000)
        out["queue"].append((started - created).total_seconds() * 1000)
        out["execute_minus_llm"].append((completed - started).total_seconds() * 1000 - sample.llm_ms)
        out["web_out"].append((end - completed.timestamp()) * 1000)
    return out


def streaming_runs(
    client: httpx.Client, platform: Platform, tenant: Tenant, *, count: int, runs: int
) -> dict[str, Any]:
    p50, p95, first50, llm50 = [], [], [], []
    for _ in range(runs):
        samples = turns.streaming_first_token(client, platform.llm, tenant.agent(), count=count)
        overhead = [s["first_token_ms"] - s["llm_ttft_ms"] for s in samples]
        p50.append(percentile(overhead, 50))
        p95.append(percentile(overhead, 95))
        first50.append(percentile([s["first_token_ms"] for s in samples], 50))
        llm50.append(percentile([s["llm_ttft_ms"] for s in samples], 50))
    return {
        "turns_per_run": count,
        "first_token_overhead_p50_ms": across(p50),
        "first_token_overhead_p95_ms": across(p95),
        "first_token_at_client_p50_ms": across(first50),
        "llm_ttft_p50_ms": across(llm50),
    }


def throughput_runs(
    platform: Platform, tenant: Tenant, *, kind: str, levels: dict[int, int], runs: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for agents, total in levels.items():
        agent_ids = [tenant.agent() for _ in range(agents)]
        per_agent = max(1, math.ceil(total / agents))
        turns.concurrent_turns(platform.web_url, tenant.api_key, agent_ids, kind=kind, turns_per_agent=1)
        rates, p50, p95, errors, first_error = [], [], [], 0, None
        cpu_before, turns_done, started = platform.cpu_seconds(), 0, time.monotonic()
        for _ in range(runs):
            r = turns.concurrent_turns(
                platform.web_url, tenant.api_key, agent_ids, kind=kind, turns_per_agent=per_agent
            )
            rates.append(r["turns_per_s"])
            p50.append(r["p50_ms"])
            p95.append(r["p95_ms"])
            errors += r["errors"]
            turns_done += r["turns"]
            first_error = first_error or r["first_error"]
            log(
                f"  {agents} agents, {kind}: {r['turns_per_s']:.1f} turns/s, p95 {r['p95_ms']:.0f} ms"
                + (f", {r['errors']} failed: {r['first_error']}" if r["errors"] else "")
            )
        out[str(agents)] = {
            "turns_per_run": per_agent * agents,
            "turns_per_s": across(rates, 1),
            "p50_ms": across(p50, 1),
            "p95_ms": across(p95, 1),
            "failed_turns": errors,
            "first_error": first_error,
            **cpu_per_turn(cpu_before, platform.cpu_seconds(), turns_done, time.monotonic() - started),
        }
        log(
            f"  CPU ms per turn: {out[str(agents)]['cpu_ms_per_turn']}, machine busy {out[str(agents)]['cpu_busy_pct']}%"
        )
        platform.check_alive()
    return out


def cpu_per_turn(
    before: dict[str, float], after: dict[str, float], count: int, seconds: float
) -> dict[str, Any]:
    """CPU milliseconds each part used per turn, and how busy the machine's cores were (all processes
    of the benchmark together; other load on the machine is not counted)."""
    used = {name: after[name] - before.get(name, 0.0) for name in after}
    cores = os.cpu_count() or 1
    return {
        "cpu_ms_per_turn": {name: round(value * 1000 / max(1, count), 1) for name, value in used.items()},
        "cpu_busy_pct": round(100 * sum(used.values()) / (seconds * cores), 1),
    }


def rss_mib(platform: Platform) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("web", "worker1", "worker2"):
        pids = platform.pids(name)
        if pids:
            sizes = [round(psutil.Process(pid).memory_info().rss / 2**20, 1) for pid in pids]
            out[name] = {"main_mib": sizes[0], "pool_mib": sizes[1:], "total_mib": round(sum(sizes), 1)}
    return out


# --- table -------------------------------------------------------------------------------------------


def _median(value: Any) -> Any:
    return value.get("median") if isinstance(value, dict) else value


def _spread(value: Any) -> Any:
    return value.get("spread") if isinstance(value, dict) else ""


def rows(results: dict[str, Any]) -> list[tuple[str, Any, Any, str, str]]:
    """(figure, median, spread, unit, bar) for the table."""
    out: list[tuple[str, Any, Any, str, str]] = []
    t = results.get("turns", {})

    def add(name: str, value: Any, unit: str, bar: str = "") -> None:
        if value is not None:
            out.append((name, _median(value), _spread(value), unit, bar))

    def bar_text(value: Any, limit: float, below: bool = True) -> str:
        v = _median(value)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        ok = v < limit if below else v >= limit
        return f"{'<' if below else '>='} {limit:g}: {'MET' if ok else 'NOT MET'}"

    for key, label, bar in (
        ("simple", "turn overhead, 1 LLM call", 30),
        ("memory", "turn overhead, memory tool + reply", 45),
        ("memory_embeddings", "turn overhead, memory + reply, embeddings", None),
        ("memory_latency", "turn overhead, memory + reply, fixed LLM latency", None),
    ):
        if key in t:
            fig = t[key]
            add(
                f"{label}: p50",
                fig["overhead_p50_ms"],
                "ms",
                bar_text(fig["overhead_p50_ms"], bar) if bar else "",
            )
            add(f"{label}: p95", fig["overhead_p95_ms"], "ms")
            add(f"{label}: LLM calls/turn", fig["llm_calls_per_turn"], "calls")
            if key == "memory":
                for name, value in fig.items():
                    if name.startswith(("overhead_first", "overhead_last")):
                        add(
                            f"{label}: {name.replace('overhead_', '').replace('_p50_ms', '')} p50",
                            value,
                            "ms",
                        )
            for stage, value in fig.get("stages_p50_ms", {}).items():
                add(f"{label}: stage {stage} p50", value, "ms")
            if key == "memory_embeddings":
                add(f"{label}: embedding calls/turn", fig["embedding_calls_per_turn"], "calls")
    if "streaming" in t:
        add("stream: first token - LLM TTFT, p50", t["streaming"]["first_token_overhead_p50_ms"], "ms")
        add("stream: first token - LLM TTFT, p95", t["streaming"]["first_token_overhead_p95_ms"], "ms")
    labels = {"memory": "memory turns", "simple": "simple turns", "memory_latency": "memory turns, 50 ms LLM"}
    for kind, levels in results.get("throughput", {}).items():
        for agents, fig in levels.items():
            label = labels.get(kind, kind)
            bar = (
                bar_text(fig["turns_per_s"], 40, below=False)
                if agents == "8" and kind != "memory_latency"
                else ""
            )
            add(f"throughput, {label}, {agents} agents", fig["turns_per_s"], "turns/s", bar)
            add(f"throughput, {label}, {agents} agents: p95 latency", fig["p95_ms"], "ms")
            if "cpu_ms_per_turn" in fig and agents == "8":
                cpu = fig["cpu_ms_per_turn"]
                parts = ", ".join(f"{k} {v:g}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))
                out.append(
                    (
                        f"throughput, {label}, 8 agents: CPU ms/turn ({parts})",
                        round(sum(cpu.values()), 1),
                        "",
                        "ms",
                        "",
                    )
                )
            if fig["failed_turns"]:
                out.append(
                    (f"throughput, {label}, {agents} agents: FAILED turns", fig["failed_turns"], "", "", "")
                )
    mem = results.get("memory", {})
    for name, value in mem.get("after", {}).items():
        add(f"RSS {name} after {mem.get('turns_before')} turns", value["total_mib"], "MiB")
    q = results.get("queries", {})
    for kind in ("simple", "memory"):
        if kind in q:
            add(
                f"SQL per turn ({kind}, {q[kind]['steps']} step): submit + execute",
                q[kind]["run_create"] + q[kind]["execute_run_without_savepoints"],
                "stmts",
            )
            add(f"SQL per step ({kind})", q[kind]["per_step"], "stmts")
    for name, value in results.get("api", {}).items():
        add(f"{name.replace('_', ' ')} (in-process DRF), p50", value, "ms")
    c = results.get("context", {})
    if c:
        add("context: load state (10 blocks, 200 msgs)", c["load_state_ms"], "ms")
        add("context: compile, first step of a run", c["compile_first_step_ms"], "ms")
        add("context: compile, later steps", c["compile_later_step_ms"], "ms")
    a = results.get("archival", {})
    if "archival_insert" in a:
        add(
            "archival insert (passage_insert, batches of 100)",
            a["archival_insert"]["passages_per_s"],
            "passages/s",
        )
    if "archival_single_insert" in a:
        one = a["archival_single_insert"]
        n = f"{one['passages']:,}"
        add(
            f"archival single insert at {n} (embedding excluded): p50",
            one["p50_ms"],
            "ms",
            bar_text(one["p50_ms"], 30),
        )
        add(f"archival single insert at {n} (embedding excluded): p95", one["p95_ms"], "ms")
    for name, fig in a.items():
        if name.startswith("archival_") and name not in ("archival_insert", "archival_single_insert"):
            n = f"{fig['passages']:,}"
            add(f"archival search at {n}: p50", fig["search"]["p50_ms"], "ms")
            add(f"archival search at {n}: p95", fig["search"]["p95_ms"], "ms")
            add(f"archival search at {n}, DB only: p50", fig["search_db_only"]["p50_ms"], "ms")
            add(f"load a run's state, agent with {n} passages", fig.get("agent_load_state_ms"), "ms")
        if name.startswith("recall_"):
            n = f"{fig['messages']:,}"
            add(f"recall conversation_search at {n}: p50", fig["search"]["p50_ms"], "ms")
            add(f"recall conversation_search at {n}: p95", fig["search"]["p95_ms"], "ms")
            add(f"load a run's state, agent with {n} messages", fig.get("agent_load_state_ms"), "ms")
    s = results.get("sandbox", {})
    out.extend(
        (
            f"{name.replace('_', ' ')}: p50 (p95)",
            f"{s[name]['p50_ms']} ({s[name]['p95_ms']})",
            s[name]["spread_ms"],
            "ms",
            "",
        )
        for name in ("sandbox_docker_cold", "sandbox_docker_warm", "sandbox_local")
        if name in s
    )
    if "sandbox_local_first" in s:
        out.append(("sandbox local: first call of a process", s["sandbox_local_first"], "", "ms", ""))
    if "docker" in s:
        out.append(("sandbox docker", s["docker"], "", "", ""))
    if "folders" in results:
        from bench.folders_bench import table_rows

        out.extend(table_rows(results["folders"]))
    if "realistic" in results:
        from bench.realistic import table_rows as realistic_rows

        out.extend(realistic_rows(results["realistic"]))
    if "tracing" in results:
        from bench.tracing_bench import table_rows as tracing_rows

        out.extend(tracing_rows(results["tracing"]))
    return out


def print_table(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "",
        f"machine: {m['cores']} cores, {m['memory_gib']} GiB, load average at start {m['load_at_start']}; "
        f"commit {results['commit']}; {results['date']}",
        f"machine speed (a fixed workload, min/median ms; lower is faster): at start "
        f"{m.get('speed_at_start_ms')}, at end {m.get('speed_at_end_ms')}; CPU steal during the run: "
        f"{m.get('cpu_steal_percent', 'n/a')}%",
        f"{'figure':62} {'median':>12} {'spread':>9} {'unit':>11}  bar",
    ]
    for name, value, spread, unit, bar in rows(results):
        shown = f"{value:.2f}" if isinstance(value, float) else str(value)
        spread_shown = f"{spread:.2f}" if isinstance(spread, float) else str(spread)
        lines.append(f"{name:62} {shown:>12} {spread_shown:>9} {unit:>11}  {bar}")
    if "compare" in results:
        lines += [
            "",
            "side by side, official SDK client (median ±spread of the rounds):",
            *results["compare"]["table"],
        ]
    for name, error in results.get("errors", {}).items():
        lines.append(f"ERROR in {name}: {error.splitlines()[0][:200]}")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def cpu_steal_ticks() -> tuple[int, int] | None:
    """(steal, total) ticks of all CPUs so far (Linux /proc/stat): CPU time the hypervisor gave away."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+uncommitted" if git("status", "--porcelain") else "")


# --- main --------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke test, not figures")
    parser.add_argument(
        "--only", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}"
    )
    parser.add_argument(
        "--profile", action="store_true", help="write a pyinstrument profile of a worker turn"
    )
    parser.add_argument(
        "--py-spy",
        action="store_true",
        help="only py-spy profiles of daphne and the workers during simple and memory turns (bench/spy.py)",
    )
    parser.add_argument(
        "--worker-pool",
        default="threads",
        help="Celery pool of the 2 workers: threads (default, as make run) or prefork",
    )
    parser.add_argument(
        "--worker-concurrency", type=int, default=4, help="Celery concurrency of each worker (default 4)"
    )
    parser.add_argument(
        "--web-db-pool",
        default="16",
        help="DATABASE_POOL_MAX_SIZE of the daphne process (default 16, as `make run`; 0: no pool, a new "
        "connection per request)",
    )
    parser.add_argument(
        "--web-conn-max-age",
        default="0",
        help="DATABASE_CONN_MAX_AGE of the daphne process without a pool (default 0; 300 leaks "
        "connections under daphne: see bench/RESULTS.md)",
    )
    compare.compare_options(parser)
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    only = {p.strip() for p in args.only.split(",") if p.strip()}
    if unknown := only - set(PHASES):
        parser.error(f"unknown phases {sorted(unknown)}")
    if os.environ.get("BENCH_SIZES"):
        cfg = {**cfg, "sizes": [int(s) for s in os.environ["BENCH_SIZES"].split(",")]}

    # SIGTERM (timeout, devenv) unwinds like Ctrl-C: children stopped, data deleted, partial results kept.
    def interrupted(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the clean-up short
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "machine": {
            "cores": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "load_at_start": [round(x, 2) for x in os.getloadavg()],
            "speed_at_start_ms": machine_speed_ms(),
            "python": host.python_version(),
        },
        "config": {
            "quick": args.quick,
            **{k: v for k, v in cfg.items() if k != "throughput_turns"},
            "throughput_turns": {str(k): v for k, v in cfg["throughput_turns"].items()},
            "workers": f"2 x celery {args.worker_pool}, concurrency {args.worker_concurrency}",
            "web": f"daphne, 1 process, DATABASE_POOL_MAX_SIZE={args.web_db_pool}"
            + ("" if args.web_db_pool != "0" else f", DATABASE_CONN_MAX_AGE={args.web_conn_max_age}"),
        },
    }
    steal_start = cpu_steal_ticks()
    phases = ", ".join(p for p in PHASES if p in only)
    log(f"{os.cpu_count()} cores; phases: {phases}{' (quick)' if args.quick else ''}")
    tenant = Tenant()
    platform = Platform(
        workers=2,
        worker_concurrency=args.worker_concurrency,
        worker_pool=args.worker_pool,
        web_db_pool=args.web_db_pool,
        web_conn_max_age=args.web_conn_max_age,
    )
    try:
        if args.py_spy:
            spy_profiles(cfg, tenant, platform)
        else:
            measure(cfg, only, results, tenant, platform, profile=args.profile, args=args)
    except KeyboardInterrupt:
        log("interrupted: stopping the platform, deleting the benchmark data, keeping what was measured")
        results["interrupted"] = True
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):  # nothing may interrupt the clean-up
            signal.signal(signum, signal.SIG_IGN)
        platform.stop()
        with phase("clean up benchmark data", results):
            tenant.delete()
    results["machine"]["speed_at_end_ms"] = machine_speed_ms()
    if steal_start is not None and (steal_end := cpu_steal_ticks()) is not None:
        ticks = max(1, steal_end[1] - steal_start[1])
        results["machine"]["cpu_steal_percent"] = round(100 * (steal_end[0] - steal_start[0]) / ticks, 1)
    results["total_seconds"] = round(time.monotonic() - STARTED, 1)
    table = print_table(results)
    log(f"total {results['total_seconds']} s")
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "latest.json").write_text(json.dumps(results, indent=2, default=str))
    (RESULTS_DIR / "latest.txt").write_text(table + "\n")
    log(f"wrote {RESULTS_DIR / 'latest.json'}")
    if results.get("interrupted"):
        return 130
    return 1 if results.get("errors") else 0


def measure(
    cfg: dict[str, Any],
    only: set[str],
    results: dict[str, Any],
    tenant: Tenant,
    platform: Platform,
    *,
    profile: bool,
    args: argparse.Namespace | None = None,
) -> None:
    runs = cfg["runs"]
    turn_total = 0
    with phase("start platform (LLM server, daphne, 2 workers)", results):
        platform.start()
    settings.OPENAI_BASE_URL = f"{platform.llm_root}/v1"  # in-process figures call the same LLM server
    settings.OPENAI_API_KEY = "sk-bench"
    if "turns" in only or "throughput" in only or "memory" in only:
        with httpx.Client(
            base_url=platform.web_url, headers={"Authorization": f"Bearer {tenant.api_key}"}, timeout=120
        ) as client:
            turn_total += turn_phases(cfg, only, results, tenant, platform, client)
        if "throughput" in only:
            th = results.setdefault("throughput", {})
            with phase("throughput, memory tool + reply", results):
                th["memory"] = throughput_runs(
                    platform, tenant, kind=turns.MEMORY, levels=cfg["throughput_turns"], runs=runs
                )
            with phase("throughput at 8 agents, 1 LLM call", results):
                th["simple"] = throughput_runs(
                    platform, tenant, kind=turns.SIMPLE, levels={8: cfg["throughput_turns"][8]}, runs=runs
                )
            with phase(f"throughput at 8 agents, {cfg['latency_s'] * 1000:.0f} ms LLM latency", results):
                platform.llm.set_latency(cfg["latency_s"])
                try:
                    th["memory_latency"] = throughput_runs(
                        platform, tenant, kind=turns.MEMORY, levels={8: cfg["throughput_turns"][8]}, runs=runs
                    )
                finally:
                    platform.llm.set_latency(0)
            turn_total += (runs + 1) * (
                sum(cfg["throughput_turns"].values()) + 2 * cfg["throughput_turns"][8]
            )
        if "memory" in only:
            with phase("resident memory", results):
                results["memory"] = resident_memory(cfg, tenant, platform, turn_total)
    if "compare" in only and args is not None and args.compare_url:
        with phase(f"side by side with {args.compare_url} (official SDK)", results):
            results["compare"] = compare.side_by_side(
                compare.Target("this platform", platform.web_url, tenant.api_key, platform.llm),
                compare.Target(
                    args.compare_url,
                    args.compare_url,
                    args.compare_key or "none",
                    compare.reachable_llm(args.compare_llm_url),
                ),
                quick=args.quick,
                log=log,
            )
    elif "compare" in only:
        log("--- side by side: skipped (no --compare-url or BENCH_COMPARE_URL)")
    platform.stop_servers()
    if "inprocess" in only:
        with phase("SQL statements per turn and step", results):
            results["queries"] = inprocess.query_counts(tenant.actor, tenant.agent)
            log(f"  {json.dumps(results['queries'])}")
        with phase("API block read and write (in-process)", results):
            results["api"] = inprocess.api_block_figures(tenant.actor, tenant.api_key, runs=runs)
        with phase("context compilation (10 blocks, 200 messages)", results):
            results["context"] = inprocess.context_compilation(tenant.actor, runs=runs)
            log(f"  {json.dumps(results['context'])}")
        if profile:
            with phase("profile of a worker turn (pyinstrument)", results):
                path = inprocess.profile_turns(tenant.actor, tenant.agent, RESULTS_DIR)
                log(f"  profile: {path or 'pyinstrument is not installed'}")
    if "archival" in only:
        with phase("archival and recall memory", results):
            results["archival"] = archival.archival_and_recall(
                tenant.actor,
                tenant.agent,
                sizes=cfg["sizes"],
                runs=runs,
                per_run=cfg["search_per_run"],
                insert_batches=cfg["insert_batches"],
                log=log,
            )
    if "sandbox" in only:
        with phase("sandbox tool calls", results):
            from bench.sandbox_bench import sandbox_figures

            results["sandbox"] = sandbox_figures(repeat=cfg["sandbox_repeat"])
    if "folders" in only:
        with phase("folder ingestion (parse + chunk)", results):
            from bench.folders_bench import ingestion_figures

            results["folders"] = ingestion_figures(repeat=cfg["folders_repeat"])
    if "tracing" in only:
        with phase("tracing cost per turn (off, store, metrics, otlp)", results):
            from bench.tracing_bench import tracing_figures

            quick = {"rounds": 2, "turns": 5, "warmup": 2} if cfg is QUICK else {}
            results["tracing"] = tracing_figures(tenant.actor, tenant.agent, **quick)
    if "realistic" in only:
        with phase("realistic LLM latency (300 ms + 50 tokens/s), official SDK", results):
            from bench.realistic import realistic_figures

            results["realistic"] = realistic_figures(
                tenant,
                quick=bool(cfg is QUICK),
                web_db_pool=args.web_db_pool if args is not None else "16",
                log=log,
            )


def spy_profiles(cfg: dict[str, Any], tenant: Tenant, platform: Platform) -> None:
    """py-spy samples of every platform process during sequential simple, then memory turns."""
    platform.start()
    count = cfg["simple_turns"]
    with httpx.Client(
        base_url=platform.web_url, headers={"Authorization": f"Bearer {tenant.api_key}"}, timeout=120
    ) as client:
        for kind in (turns.SIMPLE, turns.MEMORY):
            paths = spy.record_turns(
                client, platform, tenant.agent(), kind=kind, count=count, out_dir=RESULTS_DIR
            )
            for path in paths.values():
                summary = spy.summary(path, turn_count=count)
                path.with_suffix(".summary.txt").write_text(summary + "\n")
                log(summary)


def turn_phases(
    cfg: dict[str, Any],
    only: set[str],
    results: dict[str, Any],
    tenant: Tenant,
    platform: Platform,
    client: httpx.Client,
) -> int:
    """The sequential turn figures; returns how many turns they sent."""
    if "turns" not in only:
        return 0
    runs, sent = cfg["runs"], 0
    t = results.setdefault("turns", {})
    with phase("turn overhead, 1 LLM call", results):
        t["simple"] = overhead_runs(
            client, platform, tenant, kind=turns.SIMPLE, count=cfg["simple_turns"], runs=runs
        )
        sent += runs * cfg["simple_turns"]
    with phase("turn overhead, memory tool + reply", results):
        t["memory"] = overhead_runs(
            client, platform, tenant, kind=turns.MEMORY, count=cfg["memory_turns"], runs=runs
        )
        sent += runs * cfg["memory_turns"]
    with phase("turn overhead with message embeddings", results):
        t["memory_embeddings"] = overhead_runs(
            client,
            platform,
            tenant,
            kind=turns.MEMORY,
            count=cfg["embedding_turns"],
            runs=runs,
            embedding=EMBEDDING,
        )
        sent += runs * cfg["embedding_turns"]
    with phase(f"turn overhead with {cfg['latency_s'] * 1000:.0f} ms LLM latency", results):
        platform.llm.set_latency(cfg["latency_s"])
        try:
            t["memory_latency"] = overhead_runs(
                client, platform, tenant, kind=turns.MEMORY, count=cfg["latency_turns"], runs=runs
            )
            t["memory_latency"]["llm_latency_ms"] = cfg["latency_s"] * 1000
        finally:
            platform.llm.set_latency(0)
        sent += runs * cfg["latency_turns"]
    with phase("streaming: first token", results):
        t["streaming"] = streaming_runs(client, platform, tenant, count=cfg["stream_turns"], runs=runs)
        sent += runs * cfg["stream_turns"]
    return sent


def resident_memory(
    cfg: dict[str, Any], tenant: Tenant, platform: Platform, turn_total: int
) -> dict[str, Any]:
    if turn_total < cfg["rss_after_turns"]:
        missing = cfg["rss_after_turns"] - turn_total
        log(f"  {missing} more turns (8 agents) to reach {cfg['rss_after_turns']}")
        agent_ids = [tenant.agent() for _ in range(8)]
        r = turns.concurrent_turns(
            platform.web_url,
            tenant.api_key,
            agent_ids,
            kind=turns.MEMORY,
            turns_per_agent=math.ceil(missing / 8),
        )
        turn_total += r["turns"] + r["errors"]
    after = rss_mib(platform)
    log(f"  RSS after {turn_total} turns: {json.dumps(after)}")
    return {"turns_before": turn_total, "after": after}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
