"""Figures measured inside the benchmark process, on the same code the workers run.

- SQL statements per turn and per step: `run_create` + `execute_run_streamed` (what the API and a
  worker do for one turn) under Django's query capture, for a one-step and a two-step turn.
- Context compilation for an agent with 10 memory blocks and 200 in-context messages: loading the
  run's state (`load_state`) and compiling the request (`prepare_request`: system message, tool
  schemas, messages, token budget), cold (first step of a run: every message is tokenised) and warm
  (later steps of the same run).
- Optionally a pyinstrument profile of a worker's turn (`--profile`), written to bench/results/.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.agents.loop import runner
from apps.agents.loop.events import NullSink
from apps.agents.loop.state import load_state
from apps.agents.models import Agent, Message, Run
from apps.agents.services import BlockSpec, MessageIn, agent_create, run_create
from apps.core.actor import Actor
from bench.stats import across, percentile
from bench.turns import MEMORY, SIMPLE, turn_text

MODEL = "openai/gpt-4o-mini"


def one_turn(actor: Actor, agent_id: str, kind: str, index: int) -> runner.TurnResult:
    run = run_create(actor=actor, agent_id=agent_id, messages=[MessageIn(content=turn_text(kind, index))])
    result = runner.execute_run_streamed(run.id)
    if result is None or result.stop_reason != "end_turn":
        raise RuntimeError(f"in-process turn failed: {result and result.stop_reason}")
    return result


def query_counts(actor: Actor, make_agent: Callable[[str], str], *, warmup: int = 3) -> dict[str, Any]:
    """Statements for one turn (API side's run_create + the worker's execution), steady state."""
    out: dict[str, Any] = {}
    for kind in (SIMPLE, MEMORY):
        agent_id = make_agent("")
        for i in range(warmup):
            one_turn(actor, agent_id, kind, i)
        with CaptureQueriesContext(connection) as captured:
            run = run_create(
                actor=actor, agent_id=agent_id, messages=[MessageIn(content=turn_text(kind, 99))]
            )
        submit = len(captured.captured_queries)
        with CaptureQueriesContext(connection) as captured:
            result = runner.execute_run_streamed(run.id)
        statements = [q["sql"] for q in captured.captured_queries]
        savepoints = sum(1 for s in statements if s.startswith(("SAVEPOINT", "RELEASE SAVEPOINT")))
        steps = result.usage.step_count if result else 0
        out[kind] = {
            "steps": steps,
            "run_create": submit,
            "execute_run": len(statements),
            "execute_run_without_savepoints": len(statements) - savepoints,
            "per_step": round((len(statements) - savepoints) / max(1, steps), 1),
        }
    extra = out[MEMORY]["execute_run_without_savepoints"] - out[SIMPLE]["execute_run_without_savepoints"]
    out["extra_step_with_memory_tool"] = extra
    return out


def _context_agent(actor: Actor, blocks: int, messages: int) -> Agent:
    agent = Agent.objects.for_actor(actor).get(
        id=agent_create(
            actor=actor,
            model=MODEL,
            memory_blocks=[
                BlockSpec(f"block{i}", value=f"Block {i}. " + "Some remembered fact. " * 20, limit=5000)
                for i in range(blocks)
            ],
        ).id
    )
    rows = []
    for i in range(messages // 4):
        call_id = f"call_{i:06d}"
        rows += [
            Message(organization_id=actor.organization_id, agent=agent, role="user", text=f"Question {i}?",
                    content=[{"type": "text", "text": f"Question {i}: what do you remember about topic {i}?"}]),
            Message(organization_id=actor.organization_id, agent=agent, role="assistant", text="",
                    content=[], tool_calls=[{"id": call_id, "type": "function", "function": {
                        "name": "conversation_search", "arguments": f'{{"query": "topic {i}"}}'}}]),
            Message(organization_id=actor.organization_id, agent=agent, role="tool", name="conversation_search",
                    tool_call_id=call_id, text=f"Found 3 messages about topic {i}.",
                    content=[{"type": "text", "text": f'{{"status": "OK", "message": "Found 3 messages about topic {i}."}}'}]),
            Message(organization_id=actor.organization_id, agent=agent, role="assistant",
                    text=f"Here is what I remember about topic {i}: quite a lot, actually.",
                    content=[{"type": "text", "text": f"Here is what I remember about topic {i}: quite a lot, actually."}]),
        ]  # fmt: skip
    Message.all_objects.bulk_create(rows)
    Agent.all_objects.filter(id=agent.id).update(message_ids=[m.id for m in rows])
    return agent


def context_compilation(
    actor: Actor, *, blocks: int = 10, messages: int = 200, runs: int = 3, per_run: int = 10
) -> dict[str, Any]:
    agent = _context_agent(actor, blocks, messages)
    run = Run(organization_id=actor.organization_id, agent_id=agent.id, request_config={})
    load, cold, warm, prompt_chars = [], [], [], 0
    for _ in range(runs):
        load_s, cold_s, warm_s = [], [], []
        for _ in range(per_run):
            started = time.perf_counter()
            state = load_state(run, NullSink())
            loaded = time.perf_counter()
            request = runner.prepare_request(state)
            compiled = time.perf_counter()
            runner.prepare_request(state)
            warm_done = time.perf_counter()
            load_s.append((loaded - started) * 1000)
            cold_s.append((compiled - loaded) * 1000)
            warm_s.append((warm_done - compiled) * 1000)
            prompt_chars = sum(len(str(m.get("content") or "")) for m in request.messages)
            if len(state.in_context) != messages or len(state.blocks) != blocks:
                raise RuntimeError("context agent was not loaded as built")
        load.append(percentile(load_s, 50))
        cold.append(percentile(cold_s, 50))
        warm.append(percentile(warm_s, 50))
    return {
        "blocks": blocks,
        "in_context_messages": messages,
        "prompt_chars": prompt_chars,
        "load_state_ms": across(load),
        "compile_first_step_ms": across(cold),
        "compile_later_step_ms": across(warm),
    }


def api_block_figures(actor: Actor, api_key: str, *, runs: int, per_run: int = 100) -> dict[str, Any]:
    """GET and PATCH /v1/blocks/{id} through DRF with Bearer auth, in-process (no socket, one connection)."""
    from rest_framework.test import APIClient

    from apps.memory import services as memory_services

    client = APIClient(SERVER_NAME="localhost")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key}")
    block = memory_services.block_create(actor=actor, label="bench", value="Name: Sam", limit=10_000)
    counter = iter(range(10**9))

    def get() -> None:
        assert client.get(f"/v1/blocks/{block.id}").status_code == 200

    def patch() -> None:
        response = client.patch(f"/v1/blocks/{block.id}", {"value": f"v{next(counter)}"}, format="json")
        assert response.status_code == 200

    out: dict[str, Any] = {}
    for name, fn in (("api_block_get", get), ("api_block_patch", patch)):
        fn()
        p50s = []
        for _ in range(runs):
            samples = []
            for _ in range(per_run):
                started = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - started) * 1000)
            p50s.append(percentile(samples, 50))
        out[name] = across(p50s)
    return out


def load_state_ms(actor: Actor, agent_id: str, *, repeat: int = 10) -> float:
    """Median time to load a run's state (blocks, tools, in-context messages, memory statistics)."""
    run = Run(organization_id=actor.organization_id, agent_id=agent_id, request_config={})
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        load_state(run, NullSink())
        samples.append((time.perf_counter() - started) * 1000)
    return round(percentile(samples, 50), 2)


def profile_turns(
    actor: Actor, make_agent: Callable[[str], str], out_dir: Path, *, turns: int = 60
) -> Path | None:
    """pyinstrument profile of memory-editing turns executed as a worker does; None without pyinstrument."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        return None
    agent_id = make_agent("")
    for i in range(5):
        one_turn(actor, agent_id, MEMORY, i)
    profiler = Profiler(interval=0.0005)
    profiler.start()
    for i in range(turns):
        one_turn(actor, agent_id, MEMORY, i)
    profiler.stop()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "profile-memory-turn.txt"
    path.write_text(profiler.output_text(unicode=False, color=False))
    (out_dir / "profile-memory-turn.html").write_text(profiler.output_html())
    return path
