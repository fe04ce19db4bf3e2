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

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODES = ("off", "store", "metrics", "otlp", "otlp-lean")
LEAN = "psycopg,redis"  # otlp-lean: OTEL_PYTHON_DISABLED_INSTRUMENTATIONS (no span per statement/command)


class _DiscardingReceiver:
    """An OTLP/HTTP endpoint on 127.0.0.1 that answers 200 to every export and keeps nothing."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@contextmanager
def _mode(name: str, otlp_url: str) -> Iterator[None]:
    from django.conf import settings
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
    try:
        yield
    finally:
        state = tracing.telemetry()
        if state.exporting and state.provider is not None:
            _uninstrument()
            state.provider.shutdown()
            trace._TRACER_PROVIDER = None
            trace._TRACER_PROVIDER_SET_ONCE = Once()
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        os.environ.pop("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", None)
        settings.RUN_TRACES, settings.METRICS_TOKEN, settings.OTEL_EXPORTER_OTLP_ENDPOINT = saved
        tracing.reset_for_tests()


def _uninstrument() -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    for instrumentor in (
        DjangoInstrumentor(),
        CeleryInstrumentor(),
        PsycopgInstrumentor(),
        RedisInstrumentor(),
        HTTPXClientInstrumentor(),
    ):
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()


def _turns(actor: Any, agent_id: str, kind: str, count: int, start: int) -> tuple[float, float]:
    """(wall p50, CPU ms per turn of this process, all its threads: the OTLP exporter's included)."""
    from bench.inprocess import one_turn
    from bench.stats import percentile

    samples = []
    cpu_started = time.process_time()
    for i in range(count):
        started = time.perf_counter()
        one_turn(actor, agent_id, kind, start + i)
        samples.append((time.perf_counter() - started) * 1000)
    return percentile(samples, 50), (time.process_time() - cpu_started) * 1000 / count


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
            for mode in MODES:
                with _mode(mode, receiver.url):
                    _turns(actor, agents[mode], kind, warmup, 0)
            for r in range(rounds):
                order = MODES if r % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    with _mode(mode, receiver.url):
                        p50, cpu_ms = _turns(actor, agents[mode], kind, turns, 1000 + r * turns)
                    wall[mode].append(p50)
                    cpu[mode].append(cpu_ms)
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
                "wall_cost_over_off_ms": {
                    mode: across([v - o for v, o in zip(wall[mode], wall["off"], strict=True)])
                    for mode in MODES
                    if mode != "off"
                },
            }
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
    finally:
        receiver.close()
    return out


def main() -> int:
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
        (results / "tracing.json").write_text(json.dumps(figures, indent=2))
        return 0
    finally:
        llm.terminate()
        llm.wait(timeout=10)
        Organization.objects.filter(id=org.id).delete()  # with its agents, runs and traces
        User.objects.filter(id=user.id).delete()


if __name__ == "__main__":
    sys.exit(main())
