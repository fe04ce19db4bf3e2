"""CPU of one memory turn's API-side submit and worker-side execution, in-process (no sockets but the LLM's).

`echo ".venv/bin/python -m bench.cpu_turn [--profile]" | DATA_DIR=... python scripts/devenv.py shell`
(`DATABASE_SERVER_SIDE_BINDING=true` measures with prepared statements, as workers run): starts the
bench LLM server in this process, creates an agent, warms it up, then runs memory turns as the API and a
worker do (`run_create`, then `execute_run_streamed`), and reports this thread's CPU per turn
(time.thread_time: the LLM server's threads are not counted) for each side, and the SQL statements and
Valkey commands per turn, and the garbage collector's pauses in the measured turns (per generation:
collections, ms per turn, longest). `--freeze`: first what a worker does once started
(config/celery.py's freeze_start_up_objects). `--profile` writes a cProfile of the measured turns (bench/results/cpu-turn.prof,
and the top functions by own and cumulative time to cpu-turn.txt).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import django
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402

from apps.agents.loop import runner  # noqa: E402
from apps.agents.services import MessageIn, run_create  # noqa: E402
from bench import stack  # noqa: E402
from bench.llm_server import BenchLLMServer  # noqa: E402
from bench.run import Tenant  # noqa: E402
from bench.sdk_throughput import redis_commands  # noqa: E402
from bench.turns import MEMORY, SIMPLE, turn_text  # noqa: E402

OUT = ROOT / "bench" / "results"


class StatementCounter:
    """Counts the statements sent, as a connection.execute_wrapper. Not CaptureQueriesContext: its debug
    cursor renders every statement with its parameters (psycopg's mogrify), which cost ~5 of the 35 ms a
    memory turn measured here and no worker pays."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def postgres_cpu(postmaster: psutil.Process) -> float:
    """CPU seconds of the postmaster and its backends (other clients' backends included: run it alone)."""
    total = 0.0
    for process in [postmaster, *postmaster.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class GcPauses:
    """The collector's pauses, by generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.started = 0
        self.by_generation: dict[int, list[float]] = {}

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter_ns()
        else:
            pause = (time.perf_counter_ns() - self.started) / 1e6
            self.by_generation.setdefault(info["generation"], []).append(pause)

    def summary(self, turns: int) -> dict[str, str]:
        return {
            f"gen{g}": f"{len(p)} collections, {sum(p) / turns:.3f} ms/turn, longest {max(p):.1f} ms"
            for g, p in sorted(self.by_generation.items())
        }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--kind", default=MEMORY, choices=(MEMORY, SIMPLE))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--freeze", action="store_true", help="gc.freeze() after warm-up, as a worker does")
    parser.add_argument(
        "--toggle",
        default="",
        help="an environment variable set to 1 and 0 on alternate turns (a code switch read at call time): "
        "the two sides' medians, interleaved turn by turn so the machine's slow phases fall on both",
    )
    args = parser.parse_args(argv)
    server = BenchLLMServer().start()
    settings.OPENAI_BASE_URL = f"http://127.0.0.1:{server.port}/v1"
    settings.OPENAI_API_KEY = "sk-bench"
    tenant = Tenant()
    try:
        agent_id = tenant.agent()
        for i in range(args.warmup):
            run = run_create(
                actor=tenant.actor, agent_id=agent_id, messages=[MessageIn(turn_text(args.kind, i))]
            )
            runner.execute_run_streamed(run.id)
        if args.freeze:
            from config.celery import freeze_start_up_objects

            freeze_start_up_objects()
        pauses = GcPauses()
        gc.callbacks.append(pauses.callback)
        submit, execute = [], []
        statements = {"run_create": 0, "execute": 0}
        commands0 = redis_commands()
        postgres = psutil.Process(stack._service_pids()["postgres"])
        pg0 = postgres_cpu(postgres)
        profiler = cProfile.Profile(time.thread_time) if args.profile else None  # CPU, not waits
        sides: dict[str, dict[str, list[float]]] = {"1": {}, "0": {}}
        for i in range(args.turns):
            if args.toggle:
                side = "1" if (i // 2) % 2 == 0 else "0"  # 1 1 0 0 1 1 ...: each side follows each
                os.environ[args.toggle] = side
                pg_before = postgres_cpu(postgres)
            counter = StatementCounter()
            with connection.execute_wrapper(counter):
                if profiler:
                    profiler.enable()
                t0 = time.thread_time()
                run = run_create(
                    actor=tenant.actor, agent_id=agent_id, messages=[MessageIn(turn_text(args.kind, 100 + i))]
                )
                t1 = time.thread_time()
                submitted = counter.count
                t2 = time.thread_time()
                result = runner.execute_run_streamed(run.id)
                t3 = time.thread_time()
                if profiler:
                    profiler.disable()
            if result is None or result.stop_reason != "end_turn":
                raise RuntimeError(f"turn failed: {result and result.stop_reason}")
            submit.append((t1 - t0) * 1000)
            execute.append((t3 - t2) * 1000)
            if args.toggle:
                got = sides[side]
                got.setdefault("run_create", []).append((t1 - t0) * 1000)
                got.setdefault("execute", []).append((t3 - t2) * 1000)
                got.setdefault("postgres", []).append((postgres_cpu(postgres) - pg_before) * 1000)
            statements["run_create"] += submitted
            statements["execute"] += counter.count - submitted
        gc.callbacks.remove(pauses.callback)
        commands1 = redis_commands()
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements")
            prepared = cursor.fetchone()[0]
        pg_ms = (postgres_cpu(postgres) - pg0) * 1000 / args.turns
        n = args.turns
        per = {k: round((commands1.get(k, 0) - commands0.get(k, 0)) / n, 2) for k in commands1}
        print(
            f"{args.kind} turns: run_create CPU p50 {statistics.median(submit):.2f} ms, "
            f"execute CPU p50 {statistics.median(execute):.2f} ms (mean {statistics.mean(execute):.2f}); "
            f"statements/turn run_create {statements['run_create'] / n:.1f} execute {statements['execute'] / n:.1f}; "
            f"postgres CPU {pg_ms:.2f} ms/turn; valkey/turn {dict(sorted(((k, v) for k, v in per.items() if v), key=lambda x: -x[1]))}; "
            f"load {os.getloadavg()[0]:.2f}; prepared statements on this connection {prepared}"
        )
        print(
            f"  garbage collector ({'frozen start-up' if args.freeze else 'no freeze'}): {pauses.summary(n)}"
        )
        for side, got in sides.items():
            if got:
                medians = {name: round(statistics.median(values), 2) for name, values in got.items()}
                means = {name: round(statistics.mean(values), 2) for name, values in got.items()}
                print(f"  {args.toggle}={side}: CPU ms per turn, median {medians}, mean {means}")
        if profiler:
            OUT.mkdir(exist_ok=True)
            profiler.dump_stats(str(OUT / "cpu-turn.prof"))
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.sort_stats("tottime").print_stats(60)
            stats.sort_stats("cumulative").print_stats(120)
            (OUT / "cpu-turn.txt").write_text(text.getvalue())
            print(f"wrote {OUT / 'cpu-turn.txt'}")
    finally:
        tenant.delete()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
