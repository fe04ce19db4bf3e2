"""What tracing costs per turn: in-process turns (run_create + the worker's execute_run_streamed, as
bench/inprocess.py runs them) against the bench LLM server, in each tracing mode, interleaved round by
round so the machine's drift hits every mode alike:

  off      RUN_TRACES off, no METRICS_TOKEN, no OTLP endpoint: nothing records (the bar: free)
  store    RUN_TRACES on (the default): the run's spans, one INSERT per run
  metrics  store + METRICS_TOKEN: also one Redis pipeline per run
  otlp     store + metrics + OTEL_EXPORTER_OTLP_ENDPOINT (a local receiver that discards) with the
           Django, Celery, psycopg, redis and httpx instrumentations (the bar: under 2 ms)
  otlp-lean  otlp without the psycopg and redis instrumentations (OTEL_PYTHON_DISABLED_INSTRUMENTATIONS)

Each figure: the median turn time of a mode in a round, then the median and spread over the rounds, and
the cost = mode - off (per round, then median). Also the cost of one span helper call when off (ns).

    python -m bench.tracing_bench            # inside `scripts/devenv.py shell` (after `manage migrate`)
    tracing_figures(actor, make_agent, ...)  # from bench/run.py, with the platform's LLM server
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODES = ("off", "store", "metrics", "otlp", "otlp-lean")
LEAN = "psycopg,redis"  # otlp-lean: OTEL_PYTHON_DISABLED_INSTRUMENTATIONS (no span per statement/command)


def _serve_receiver(counts: str = "") -> None:
    """An OTLP/HTTP endpoint on 127.0.0.1 that answers 200 to every export and keeps nothing; prints its
    port. Its own process: the operator's collector is not the platform's CPU. With `counts` (a file),
    it also writes there the spans it was sent by service, scope and name (JSON), after each export."""
    import json
    import threading
    from collections import Counter

    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def count(body: bytes) -> None:
        from tests.support.otlp import exported_spans

        with lock:
            for service, scope, span in exported_spans(body):
                seen[f"{service} | {scope} | {span.name[:40]}"] += 1
            Path(counts).write_text(json.dumps(seen))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if counts:
                count(body)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


class _DiscardingReceiver:
    """`_serve_receiver` in a child process."""

    def __init__(self, counts: str = "") -> None:
        import subprocess

        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.tracing_bench", "--receiver", *([counts] if counts else [])],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.url = f"http://127.0.0.1:{self.process.stdout.readline().strip()}"

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@contextmanager
def _mode(name: str, otlp_url: str) -> Iterator[None]:
    from django.conf import settings
    from django.db import connections
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    from apps.observability import tracing

    saved = (settings.RUN_TRACES, settings.METRICS_TOKEN, settings.OTEL_EXPORTER_OTLP_ENDPOINT)
    settings.RUN_TRACES = name != "off"
    exporting = name.startswith("otlp")
    settings.METRICS_TOKEN = "bench-token" if name != "off" and name != "store" else ""
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = otlp_url if exporting else ""
    if exporting:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_url
    if name == "otlp-lean":
        os.environ["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = LEAN
    tracing.reset_for_tests()
    if exporting:
        # As a worker does at start: instrument before any connection opens (psycopg's instrumentation
        # wraps connect), so this process's open connections are reopened.
        tracing.configure()
        connections.close_all()
    # The connection is open before the turns are measured (a reopened one costs its first turn).
    connections["default"].ensure_connection()
    try:
        yield
    finally:
        state = tracing.telemetry()
        if state.exporting and state.provider is not None:
            _uninstrument()
            connections.close_all()
            state.provider.shutdown()
            trace._TRACER_PROVIDER = None
            trace._TRACER_PROVIDER_SET_ONCE = Once()
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        os.environ.pop("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", None)
        settings.RUN_TRACES, settings.METRICS_TOKEN, settings.OTEL_EXPORTER_OTLP_ENDPOINT = saved
        tracing.reset_for_tests()


def _uninstrument() -> None:
    from apps.observability import tracing

    tracing.uninstrument()


def _turns(
    actor: Any, agent_id: str, kind: str, count: int, start: int, *, warm: int = 2
) -> tuple[float, float, float]:
    """(wall p50, CPU ms per turn of this process, all its threads: the OTLP exporter's included, CPU ms
    per turn of this thread alone: the turn's own path)."""
    from apps.observability import tracing
    from bench.inprocess import one_turn
    from bench.stats import percentile

    for i in range(warm):  # after a mode switch: its provider's and exporter's first use
        one_turn(actor, agent_id, kind, start + i)
    samples = []
    cpu_started, thread_started = time.process_time(), time.thread_time()
    for i in range(count):
        started = time.perf_counter()
        one_turn(actor, agent_id, kind, start + i)
        samples.append((time.perf_counter() - started) * 1000)
    provider = tracing.telemetry().provider
    if provider is not None:
        provider.force_flush()  # the exporter's encoding and sending of these turns' spans, in the window
    thread_ms = (time.thread_time() - thread_started) * 1000 / count
    return percentile(samples, 50), (time.process_time() - cpu_started) * 1000 / count, thread_ms


def span_counts(actor: Any, agent_id: str, kind: str, *, otlp_url: str, turns: int = 5) -> dict[str, Any]:
    """Spans per turn in the otlp mode, by instrumentation scope (what the exporter sends), and the spans
    per turn kept in the run's stored trace."""
    from collections import Counter

    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

    from apps.agents.models import Run
    from apps.observability import tracing
    from apps.observability.models import RunTrace
    from bench.inprocess import one_turn

    scopes: Counter[str] = Counter()

    class Count(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            scopes[span.instrumentation_scope.name if span.instrumentation_scope else ""] += 1

    with _mode("otlp", otlp_url):
        one_turn(actor, agent_id, kind, 0)
        provider = tracing.telemetry().provider
        assert provider is not None
        provider.add_span_processor(Count())
        for i in range(turns):
            one_turn(actor, agent_id, kind, 1 + i)
    runs = Run.all_objects.filter(agent_id=agent_id).order_by("-created_at")[:turns]
    stored = sum(t.span_count for t in RunTrace.all_objects.filter(run_id__in=[r.id for r in runs]))
    return {
        "exported_per_turn": {scope: round(n / turns, 1) for scope, n in sorted(scopes.items())},
        "stored_per_turn": round(stored / turns, 1),
    }


def trace_path_us(actor: Any, agent_id: str, *, mode: str, otlp_url: str, repeat: int = 300) -> float:
    """The telemetry work of one memory turn alone (median, microseconds): run_trace with the spans such
    a turn opens (load; two steps with an LLM call and a persist each, the first with a memory tool call;
    the finish), its store INSERT and its metrics pipeline, on a real run, without the turn's own work."""
    from types import SimpleNamespace

    from apps.agents.models import Run
    from apps.observability import tracing
    from apps.observability.models import RunTrace
    from bench.stats import percentile

    real = Run.all_objects.filter(agent_id=agent_id).order_by("-created_at").first()
    if real is None:
        return float("nan")
    run = SimpleNamespace(
        id=real.id,
        organization_id=real.organization_id,
        agent_id=real.agent_id,
        created_at=real.created_at,
        started_at=real.started_at,
        status="completed",
        stop_reason="end_turn",
    )
    response = SimpleNamespace(
        prompt_tokens=100, completion_tokens=10, finish_reason="stop", attempts=1, latency_ms=1
    )
    result = SimpleNamespace(status="success", sandbox="", memory_changed=True)
    samples = []
    with _mode(mode, otlp_url):
        for _ in range(repeat):
            RunTrace.all_objects.filter(run_id=run.id).delete()
            started = time.perf_counter_ns()
            with tracing.run_trace(run):
                with tracing.span("agent.load"):
                    pass
                for step in (1, 2):
                    with tracing.span("agent.step", **{"letta.step": step}):
                        with tracing.span(
                            "llm.call", **{"gen_ai.request.model": "openai/gpt-4o-mini"}
                        ) as llm:
                            tracing.llm_response(llm, response)
                        if step == 1:
                            with tracing.tool_spans(
                                "memory_replace", "letta_sleeptime_core", memory=True
                            ) as tool:
                                tool.done(result)
                        with tracing.span("agent.persist", **{"letta.persist": "step"}):
                            pass
                with tracing.span("agent.persist", **{"letta.persist": "finish"}):
                    pass
            samples.append((time.perf_counter_ns() - started) / 1000)
    RunTrace.all_objects.filter(run_id=run.id).delete()
    return round(percentile(samples, 50), 1)


def unit_costs_us(otlp_url: str, *, batch: int = 200, batches: int = 7) -> dict[str, Any]:
    """CPU (this process, all threads: the exporter's encoding and sending included, flushed) of one SQL
    statement and one Redis command inside a span where the instrumentations record (outside a run's
    execution: a web request's), and of one loop span in a run's trace, with OTLP and every
    instrumentation on, minus the same with tracing off; the least of `batches` batches (the machine's
    other load only ever adds). With the spans per turn (span_counts), what each piece costs a turn."""
    from types import SimpleNamespace

    from apps.agents.models import Agent
    from apps.observability import tracing
    from apps.streams.redis_client import get_redis

    run = SimpleNamespace(  # no such run: its spans' INSERT stores nothing (once a batch)
        id="run-bench-unit",
        organization_id="org-bench-unit",
        agent_id="agent-bench-unit",
        created_at=None,
        started_at=None,
        status="completed",
        stop_reason="end_turn",
    )

    def run_sql() -> None:  # an agent's row: a statement as long as a turn's (over 256 characters)
        list(Agent.all_objects.filter(id="agent-none")[:1])

    client = get_redis()

    def run_redis() -> None:
        client.set("bench:tracing:unit", "x")

    def run_span() -> None:
        with tracing.span("agent.persist", **{"letta.persist": "step"}):
            pass

    def cost(mode: str, unit: Callable[[], None]) -> float:
        best = float("inf")
        with _mode(mode, otlp_url):
            provider = tracing.telemetry().provider
            unit()
            for _ in range(batches):
                started = time.process_time()
                around = tracing.run_trace(run) if unit is run_span else contextlib.nullcontext()
                with around, tracing.span("agent.step"):
                    for _ in range(batch):
                        unit()
                if provider is not None:
                    provider.force_flush()
                best = min(best, (time.process_time() - started) * 1e6 / batch)
        return best

    out: dict[str, Any] = {}
    for name, unit in (("sql_statement", run_sql), ("redis_command", run_redis), ("loop_span", run_span)):
        off, on = cost("off", unit), cost("otlp", unit)
        out[name] = {"off_us": round(off, 1), "otlp_us": round(on, 1), "cost_us": round(on - off, 1)}
    client.delete("bench:tracing:unit")
    return out


def null_span_ns(calls: int = 200_000) -> float:
    """One `with tracing.span(...)` when nothing records."""
    from apps.observability import tracing

    started = time.perf_counter_ns()
    for _ in range(calls):
        with tracing.span("agent.step"):
            pass
    return (time.perf_counter_ns() - started) / calls


def tracing_figures(
    actor: Any, make_agent: Callable[[str], str], *, rounds: int = 5, turns: int = 30, warmup: int = 5
) -> dict[str, Any]:
    """Per-turn time of simple and memory turns in each mode, and each mode's cost over `off`."""
    from bench.stats import across
    from bench.turns import MEMORY, SIMPLE

    receiver = _DiscardingReceiver()
    out: dict[str, Any] = {}
    try:
        for kind in (SIMPLE, MEMORY):
            agents = {mode: make_agent("") for mode in MODES}
            wall: dict[str, list[float]] = {mode: [] for mode in MODES}
            cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
            main: dict[str, list[float]] = {mode: [] for mode in MODES}
            for mode in MODES:
                with _mode(mode, receiver.url):
                    _turns(actor, agents[mode], kind, warmup, 0)
            for r in range(rounds):
                order = MODES if r % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    with _mode(mode, receiver.url):
                        p50, cpu_ms, main_ms = _turns(actor, agents[mode], kind, turns, 1000 + r * turns)
                    wall[mode].append(p50)
                    cpu[mode].append(cpu_ms)
                    main[mode].append(main_ms)
            out[kind] = {
                "turns_per_round": turns,
                "rounds": rounds,
                "turn_wall_p50_ms": {mode: across(values) for mode, values in wall.items()},
                "turn_cpu_ms": {mode: across(values) for mode, values in cpu.items()},
                "cpu_cost_over_off_ms": {
                    mode: across([v - o for v, o in zip(cpu[mode], cpu["off"], strict=True)])
                    for mode in MODES
                    if mode != "off"
                },
                "main_thread_cpu_cost_over_off_ms": {
                    mode: across([v - o for v, o in zip(main[mode], main["off"], strict=True)])
                    for mode in MODES
                    if mode != "off"
                },
                "wall_cost_over_off_ms": {
                    mode: across([v - o for v, o in zip(wall[mode], wall["off"], strict=True)])
                    for mode in MODES
                    if mode != "off"
                },
            }
            out[kind]["spans"] = span_counts(actor, agents["otlp"], kind, otlp_url=receiver.url)
            if kind == MEMORY:
                out["trace_path_us"] = {
                    mode: across(
                        [
                            trace_path_us(actor, agents[mode], mode=mode, otlp_url=receiver.url)
                            for _ in range(3)
                        ],
                        1,
                    )
                    for mode in MODES
                }
        with _mode("off", receiver.url):
            out["null_span_ns"] = round(null_span_ns(), 1)
        out["unit_costs_us"] = unit_costs_us(receiver.url)
    finally:
        receiver.close()
    return out


STACK_MODES = ("off", "store", "otlp")


def _stack(label: str, redis_db: int, root: Path = ROOT, **extra: str) -> Any:
    """A Platform (daphne + one Celery worker + its LLM server) with `extra` in its environment and a
    Redis database of its own (its own Celery queue and streams); the same PostgreSQL."""
    import subprocess
    from dataclasses import dataclass, field
    from urllib.parse import urlparse

    from bench import stack

    redis = urlparse(os.environ["REDIS_URL"])
    redis_url = redis._replace(path=f"/{redis_db}").geturl()

    @dataclass
    class Traced(stack.Platform):
        workers: int = 1
        worker_concurrency: int = 2
        settings: dict[str, str] = field(default_factory=dict)

        def env(self) -> dict[str, str]:
            return {**super().env(), "REDIS_URL": redis_url, "CELERY_BROKER_URL": redis_url, **self.settings}

        def _spawn(self, name: str, command: list[str], **env: str) -> stack.Child:
            stack.LOG_DIR.mkdir(parents=True, exist_ok=True)
            log = stack.LOG_DIR / f"tracing-{label}-{name}.log"
            process = subprocess.Popen(
                command,
                cwd=root,
                env={**self.env(), **env},
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=stack._die_with_parent,
            )
            child = stack.Child(name, process, log)
            self.children.append(child)
            return child

    return Traced(settings=extra)


def _threads_cpu_ns(pids: list[int]) -> dict[tuple[int, int], int]:
    """Nanoseconds on CPU of each thread of these processes (/proc/PID/task/TID/schedstat): psutil's
    times are clock ticks, 10 ms, too coarse for a block of turns."""
    out: dict[tuple[int, int], int] = {}
    for pid in pids:
        tasks = Path(f"/proc/{pid}/task")
        for task in tasks.iterdir() if tasks.exists() else ():
            try:
                out[(pid, int(task.name))] = int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError):
                continue
    return out


def _cpu_ns_between(before: dict[tuple[int, int], int], after: dict[tuple[int, int], int]) -> tuple[int, int]:
    """(CPU ns of the threads between two readings, threads that ended meanwhile: their last part is
    lost, so the block is flagged)."""
    return sum(ns - before.get(key, 0) for key, ns in after.items()), len(before.keys() - after.keys())


def stack_figures(
    api_key: str,
    make_agent: Callable[[str], str],
    *,
    rounds: int = 8,
    turns: int = 10,
    warmup: int = 5,
    before: Path | None = None,
    lean: bool = False,
) -> dict[str, Any]:
    """What tracing costs a turn through the real entry points: three platforms side by side on the
    same PostgreSQL (off; store, the default; otlp: store + OTLP to a discarding receiver with every
    instrumentation, in the web process and the worker; no metrics in either, so otlp - store is what
    exporting adds), turns through POST /v1/agents/{id}/messages, the platforms taking turns block by
    block (order reversed every other round) so the machine's drift hits each alike. Per round: the CPU
    of each platform's web process and worker over the whole round (/proc schedstat, every thread), per
    turn it served; per block: the turns' wall p50. Also the spans the otlp platform exports per turn.
    `before`: another checkout (same database schema), run as a fourth platform `otlp-before` with the
    otlp settings, to compare a change. `lean`: a platform `otlp-lean` without the psycopg and redis
    instrumentations."""
    import json

    import httpx

    from bench.stats import across, percentile
    from bench.turns import MEMORY, SIMPLE, _check, turn_body

    counts = ROOT / "bench" / "results" / "tracing-stack-spans.json"
    counts.unlink(missing_ok=True)
    receiver = _DiscardingReceiver(str(counts))
    settings_of = {
        "off": {"RUN_TRACES": "false", "METRICS_TOKEN": "", "OTEL_EXPORTER_OTLP_ENDPOINT": ""},
        "store": {"RUN_TRACES": "true", "METRICS_TOKEN": "", "OTEL_EXPORTER_OTLP_ENDPOINT": ""},
        # the SDK's batch defaults (an export every 5 s or 512 spans): what an operator gets
        "otlp": {"RUN_TRACES": "true", "METRICS_TOKEN": "", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url},
    }
    modes = STACK_MODES + (("otlp-before",) if before else ()) + (("otlp-lean",) if lean else ())
    settings_of["otlp-before"] = settings_of["otlp"]
    settings_of["otlp-lean"] = {**settings_of["otlp"], "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": LEAN}
    platforms = {
        mode: _stack(mode, 11 + i, before if mode == "otlp-before" and before else ROOT, **settings_of[mode])
        for i, mode in enumerate(modes)
    }
    out: dict[str, Any] = {"turns_per_block": turns, "rounds": rounds, "load": [os.getloadavg()]}
    try:
        for platform in platforms.values():
            platform.start(timeout=180)
        clients = {
            mode: httpx.Client(
                base_url=platform.web_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60
            )
            for mode, platform in platforms.items()
        }

        def cpu_ns() -> dict[str, dict[str, dict[tuple[int, int], int]]]:
            return {
                mode: {role: _threads_cpu_ns(platform.pids(role)) for role in ("web", "worker1")}
                for mode, platform in platforms.items()
            }

        def block(mode: str, agent_id: str, kind: str, start: int, count: int) -> float:
            client = clients[mode]
            samples = []
            for i in range(count):
                t0 = time.perf_counter()
                response = client.post(f"/v1/agents/{agent_id}/messages", json=turn_body(kind, start + i))
                samples.append((time.perf_counter() - t0) * 1000)
                _check(response, kind)
            return percentile(samples, 50)

        for kind in (SIMPLE, MEMORY):
            agents = {mode: make_agent("") for mode in modes}
            for mode in modes:
                block(mode, agents[mode], kind, 0, warmup)
            # Spans the otlp platform exports per turn, by service, scope and name (10 turns alone).
            time.sleep(6)  # the SDK's export schedule: 5 s
            seen_before = json.loads(counts.read_text()) if counts.exists() else {}
            block("otlp", agents["otlp"], kind, 500, 10)
            time.sleep(6)
            seen = json.loads(counts.read_text())
            per_turn = {k: round((n - seen_before.get(k, 0)) / 10, 1) for k, n in seen.items()}
            spans = {k: n for k, n in sorted(per_turn.items(), key=lambda kv: -kv[1]) if n}
            cpu: dict[str, list[float]] = {mode: [] for mode in modes}
            by_role: dict[str, dict[str, list[float]]] = {mode: {"web": [], "worker1": []} for mode in modes}
            wall: dict[str, list[float]] = {mode: [] for mode in modes}
            profilers = _start_profilers(platforms, kind)
            # Each platform's CPU over a whole round (its block and its idle while the others run: its
            # exporter's batches fall anywhere), per turn it served.
            for r in range(rounds):
                order = modes if r % 2 == 0 else tuple(reversed(modes))
                round_start = cpu_ns()
                for mode in order:
                    wall[mode].append(block(mode, agents[mode], kind, 1000 + r * turns, turns))
                round_end = cpu_ns()
                for mode in modes:
                    total = 0
                    for role, readings in by_role[mode].items():
                        ns, ended = _cpu_ns_between(round_start[mode][role], round_end[mode][role])
                        out["threads_ended_in_rounds"] = out.get("threads_ended_in_rounds", 0) + ended
                        readings.append(ns / 1e6 / turns)
                        total += ns
                    cpu[mode].append(total / 1e6 / turns)
            _stop_profilers(profilers)
            out[kind] = {
                "otlp_spans_per_turn": spans,
                "otlp_spans_per_turn_total": round(sum(spans.values()), 1),
                "cpu_ms_per_turn": {mode: across(v) for mode, v in cpu.items()},
                "wall_p50_ms": {mode: across(v) for mode, v in wall.items()},
                "cpu_cost_over_off_ms": {
                    mode: across([a - b for a, b in zip(cpu[mode], cpu["off"], strict=True)])
                    for mode in modes
                    if mode != "off"
                },
                "cpu_otlp_over_store_ms": across(
                    [a - b for a, b in zip(cpu["otlp"], cpu["store"], strict=True)]
                ),
                # Where the cost falls: the web process (the send) and the worker (the run).
                "cpu_ms_per_turn_by_process": {
                    mode: {"web" if role == "web" else "worker": across(v) for role, v in roles.items()}
                    for mode, roles in by_role.items()
                },
                "wall_cost_over_off_ms": {
                    mode: across([a - b for a, b in zip(wall[mode], wall["off"], strict=True)])
                    for mode in modes
                    if mode != "off"
                },
            }
            out["load"].append(os.getloadavg())
        for client in clients.values():
            client.close()
    finally:
        for platform in platforms.values():
            platform.stop()
        receiver.close()
    return out


def _start_profilers(platforms: dict[str, Any], kind: str) -> list[subprocess.Popen[bytes]]:
    """With BENCH_TRACING_PROFILE=DIR: py-spy samples every platform's web process and worker over the
    rounds (DIR/{kind}-{mode}-{process}.txt, collapsed stacks for a flame graph or a diff). It reads the
    processes from outside without stopping them, but its own CPU is the machine's: figures of a
    profiled run are not the bench's."""
    folder = os.environ.get("BENCH_TRACING_PROFILE")
    if not folder:
        return []
    Path(folder).mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).with_name("py-spy")
    return [
        subprocess.Popen(
            [
                str(spy),
                "record",
                "--nonblocking",
                "--format",
                "raw",
                "--rate",
                "250",
                "--pid",
                str(pid),
                "--output",
                f"{folder}/{kind}-{mode}-{role}.txt",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for mode, platform in platforms.items()
        for role in ("web", "worker1")
        for pid in platform.pids(role)[:1]
    ]


def _stop_profilers(profilers: list[subprocess.Popen[bytes]]) -> None:
    for profiler in profilers:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    for profiler in profilers:
        profiler.wait(timeout=60)


def table_rows(figures: dict[str, Any]) -> list[tuple[str, Any, Any, str, str]]:
    """(figure, median, spread, unit, bar) rows for bench/run.py's table: CPU per turn over `off`."""
    from bench.turns import MEMORY, SIMPLE

    out: list[tuple[str, Any, Any, str, str]] = []
    for kind in (SIMPLE, MEMORY):
        costs = figures.get(kind, {}).get("cpu_cost_over_off_ms", {})
        for mode, cost in costs.items():
            bar = ""
            if mode == "otlp":
                bar = f"< 2: {'MET' if cost['median'] < 2 else 'NOT MET'}"
            out.append(
                (f"tracing {mode}: CPU over off, {kind} turn", cost["median"], cost["spread"], "ms", bar)
            )
    if "null_span_ns" in figures:
        out.append(("tracing off: one span helper call", figures["null_span_ns"], "", "ns", ""))
    return out


def main() -> int:
    if sys.argv[1:2] == ["--receiver"]:
        _serve_receiver(*sys.argv[2:3])
        return 0
    import django

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    import json
    import subprocess

    from django.conf import settings

    from apps.accounts.models import Membership, Organization, User
    from apps.agents.services import BlockSpec, agent_create
    from apps.core.actor import Actor, Role
    from bench.stack import free_port

    port = free_port()
    llm = subprocess.Popen([sys.executable, "-m", "bench.llm_server", "--port", str(port)], cwd=ROOT)
    stamp = time.time_ns()
    org = Organization.objects.create(name=f"bench-tracing-{stamp}")
    user = User.objects.create_user(username=f"bench-tracing-{stamp}")
    try:
        from bench.llm_server import BenchLLMClient

        client = BenchLLMClient(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while not client.healthy():
            if time.monotonic() > deadline:
                raise RuntimeError("the bench LLM server did not start")
            time.sleep(0.1)
        settings.OPENAI_BASE_URL = f"http://127.0.0.1:{port}/v1"
        settings.OPENAI_API_KEY = "sk-bench"
        Membership.objects.create(user=user, organization=org, role=Role.OWNER)
        actor = Actor(organization_id=org.id, user_id=user.id, role=Role.OWNER)

        def make_agent(embedding: str) -> str:
            return agent_create(
                actor=actor,
                model="openai/gpt-4o-mini",
                embedding=embedding,
                memory_blocks=[
                    BlockSpec("human", "Name: Sam\nCounter: 0"),
                    BlockSpec("persona", "I am a concise, helpful assistant."),
                ],
            ).id

        if "--stack" in sys.argv[1:]:
            from apps.accounts.services import api_key_create

            key = api_key_create(actor=actor, user=user, name="bench-tracing").raw_key
            rounds = int(os.environ.get("BENCH_TRACING_ROUNDS", "8"))
            turns = int(os.environ.get("BENCH_TRACING_TURNS", "10"))
            before = os.environ.get("BENCH_TRACING_BEFORE")  # another checkout, to compare
            figures: dict[str, Any] = {
                "stack": stack_figures(
                    key,
                    make_agent,
                    rounds=rounds,
                    turns=turns,
                    before=Path(before) if before else None,
                    lean=os.environ.get("BENCH_TRACING_LEAN") == "1",
                )
            }
        else:
            rounds = int(os.environ.get("BENCH_TRACING_ROUNDS", "5"))
            turns = int(os.environ.get("BENCH_TRACING_TURNS", "30"))
            figures = tracing_figures(actor, make_agent, rounds=rounds, turns=turns)
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
        figures["commit"] = commit
        figures["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        figures["cores"] = os.cpu_count()
        figures["load"] = os.getloadavg()
        print(json.dumps(figures, indent=2))
        results = ROOT / "bench" / "results"
        results.mkdir(parents=True, exist_ok=True)
        name = "tracing-stack.json" if "stack" in figures else "tracing.json"
        (results / name).write_text(json.dumps(figures, indent=2))
        return 0
    finally:
        llm.terminate()
        llm.wait(timeout=10)
        Organization.objects.filter(id=org.id).delete()  # with its agents, runs and traces
        User.objects.filter(id=user.id).delete()


if __name__ == "__main__":
    sys.exit(main())
