"""Each run's trace spans: kept in the platform's store, returned by GET /v1/runs/{id}/trace (the SDK's
runs.trace.retrieve), drawn on the ADE's run page; nothing recorded when tracing is off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from letta_client import Letta, NotFoundError

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.models import Run
from apps.api import sse
from apps.core.actor import Actor
from apps.observability import tracing
from apps.observability.models import RunTrace
from apps.observability.selectors import run_spans
from tests.support.scripted_llm import text, tool_call, tool_calls

MEMORY_EDIT = tool_calls(
    tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
)


@pytest.fixture
def traces_on(settings) -> Iterator[None]:
    settings.RUN_TRACES = True
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = ""
    tracing.reset_for_tests()
    yield
    tracing.reset_for_tests()


def names(spans: list[dict[str, Any]]) -> list[str]:
    return sorted(s["SpanName"] for s in spans)


def by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["SpanName"] == name]


def test_a_run_stores_one_trace_with_its_queue_wait_load_steps_llm_tool_memory_and_persist_spans(
    traces_on, make_agent, send, llm, actor
):
    agent = make_agent(embedding="")
    llm.push(MEMORY_EDIT, text("Hi Sam!"))

    result = send(agent, "I'm Sam")

    trace = RunTrace.all_objects.get(run_id=result.run.id)
    spans = run_spans(actor=actor, run_id=result.run.id)
    assert names(spans) == sorted(
        [
            "agent.run",
            "run.queue_wait",
            "agent.load",
            "agent.step",
            "agent.step",
            "llm.call",
            "llm.call",
            "tool.call",
            "memory.edit",
            "agent.persist",
            "agent.persist",
            "agent.persist",
        ]
    )
    assert {s["TraceId"] for s in spans} == {trace.trace_id}
    assert trace.span_count == 12
    [root] = by_name(spans, "agent.run")
    assert root["ParentSpanId"] == ""
    assert root["SpanAttributes"]["letta.run_id"] == result.run.id
    assert root["SpanAttributes"]["letta.stop_reason"] == "end_turn"
    assert int(root["SpanAttributes"]["db.statements"]) > 0
    # Each span's own statements (not its children's) and their time: together, the run's.
    assert sum(int(s["SpanAttributes"].get("letta.db.statements", 0)) for s in spans) == int(
        root["SpanAttributes"]["db.statements"]
    )
    for persist in by_name(spans, "agent.persist"):
        assert int(persist["SpanAttributes"]["letta.db.statements"]) > 0
        assert float(persist["SpanAttributes"]["letta.db.time_ms"]) > 0
    steps = {s["SpanId"] for s in by_name(spans, "agent.step")}
    assert {s["ParentSpanId"] for s in by_name(spans, "agent.step")} == {root["SpanId"]}
    assert {s["ParentSpanId"] for s in by_name(spans, "llm.call")} == steps
    [tool] = by_name(spans, "tool.call")
    [edit] = by_name(spans, "memory.edit")
    assert edit["ParentSpanId"] == tool["SpanId"]
    assert tool["SpanAttributes"]["tool.name"] == "memory_replace"
    assert tool["SpanAttributes"]["tool.status"] == "success"
    assert {s["SpanAttributes"]["gen_ai.request.model"] for s in by_name(spans, "llm.call")} == {
        "openai/gpt-4o-mini"
    }
    assert all(s["Duration"] >= 0 for s in spans)


def test_span_attributes_hold_no_message_text_or_tool_arguments(traces_on, make_agent, send, llm):
    agent = make_agent(embedding="")
    llm.push(MEMORY_EDIT, text("Hi Sam, nice to meet you!"))

    result = send(agent, "my secret phrase is plum-42")

    stored = str(RunTrace.all_objects.get(run_id=result.run.id).spans)
    assert "plum-42" not in stored
    assert "nice to meet you" not in stored
    assert "old_string" not in stored


def test_a_run_keeps_at_most_the_span_cap_and_counts_the_rest(traces_on, settings, make_agent, send, llm):
    settings.RUN_TRACE_MAX_SPANS = 5
    agent = make_agent(embedding="")
    llm.push(MEMORY_EDIT, text("Hi Sam!"))

    result = send(agent, "I'm Sam")

    trace = RunTrace.all_objects.get(run_id=result.run.id)
    assert (len(trace.spans), trace.span_count, trace.dropped_spans) == (5, 5, 7)


def test_tracing_off_records_nothing_and_its_helpers_are_one_shared_null_context(
    settings, make_agent, send, llm
):
    settings.RUN_TRACES = False
    settings.METRICS_TOKEN = ""
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = ""
    tracing.reset_for_tests()
    try:
        agent = make_agent(embedding="")
        llm.push(text("hello"))

        result = send(agent, "hi")

        assert result.stop_reason == "end_turn"
        assert not RunTrace.all_objects.filter(run_id=result.run.id).exists()
        assert not tracing.telemetry().recording
        assert tracing.telemetry().tracer is None
        assert tracing.span("agent.step") is tracing.span("llm.call")
    finally:
        tracing.reset_for_tests()


def test_the_api_answers_the_runs_spans_and_another_organisation_gets_404(
    traces_on, make_agent, send, llm, actor, other_org_actor, api_client_for
):
    agent = make_agent(embedding="")
    llm.push(text("hello"))
    run_id = send(agent, "hi").run.id

    mine = api_client_for(actor).get(f"/v1/runs/{run_id}/trace", {"limit": 2})
    theirs = api_client_for(other_org_actor).get(f"/v1/runs/{run_id}/trace")

    assert mine.status_code == 200
    assert len(mine.json()) == 2
    assert set(mine.json()[0]) >= {
        "TraceId",
        "SpanId",
        "ParentSpanId",
        "SpanName",
        "Duration",
        "SpanAttributes",
    }
    assert theirs.status_code == 404
    assert api_client_for(actor).get(f"/v1/runs/{run_id}/trace", {"limit": 0}).status_code == 422


def test_the_ade_run_page_draws_the_waterfall(traces_on, make_agent, send, llm, client, user):
    agent = make_agent(embedding="")
    llm.push(MEMORY_EDIT, text("Hi Sam!"))
    run_id = send(agent, "I'm Sam").run.id
    client.force_login(user)

    page = client.get(reverse("ade:run-detail", args=[run_id]))

    assert page.status_code == 200
    body = page.content.decode()
    assert 'data-testid="waterfall"' in body
    for group in ("queue", "load", "llm", "tool", "persist"):
        assert f'data-group="{group}"' in body
    assert body.count('data-testid="waterfall-row"') == 12


# --- through the official SDK, the run executed by a real worker --------------------------------------


@pytest.fixture
def _no_persistent_connections_in_server_threads() -> Iterator[None]:
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


@pytest.fixture
def sdk_for(live_server: Any, monkeypatch: pytest.MonkeyPatch, _no_persistent_connections_in_server_threads):
    monkeypatch.setattr(sse, "FOLLOW_TIMEOUT_S", 30.0)

    def make(actor: Actor) -> Letta:
        key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk")
        return Letta(base_url=live_server.url, api_key=key.raw_key, timeout=30)

    return make


@pytest.mark.django_db(transaction=True)
def test_the_sdk_retrieves_the_trace_of_a_run_a_worker_executed(
    sdk_for, actor, other_org_actor, make_agent, llm, celery_worker
):
    agent = make_agent(embedding="")
    llm.push(MEMORY_EDIT, text("Hi Sam!"))
    sdk = sdk_for(actor)
    response = sdk.agents.messages.create(
        agent_id=agent.id, messages=[{"role": "user", "content": "I'm Sam"}]
    )
    run_id = response.messages[0].run_id
    celery_worker.wait_idle()

    spans = sdk.runs.trace.retrieve(run_id)

    assert names(spans) == sorted(
        [
            "agent.run",
            "run.queue_wait",
            "agent.load",
            "agent.step",
            "agent.step",
            "llm.call",
            "llm.call",
            "tool.call",
            "memory.edit",
            "agent.persist",
            "agent.persist",
            "agent.persist",
        ]
    )
    assert len({s["TraceId"] for s in spans}) == 1
    assert [s["SpanName"] for s in sdk.runs.trace.retrieve(run_id, limit=1)] == ["run.queue_wait"]
    assert Run.all_objects.get(id=run_id).status == "completed"
    with pytest.raises(NotFoundError):
        sdk_for(other_org_actor).runs.trace.retrieve(run_id)


def test_a_traced_run_stores_its_spans_with_its_step_traces_in_no_statement_of_its_own(
    settings, make_agent, send, llm
):
    """The worker's statements for a turn are the same with the trace store on as off: the run's spans go
    into the statement that stores its steps' provider traces."""
    statements: dict[bool, int] = {}
    settings.METRICS_TOKEN = ""
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = ""
    try:
        for on in (False, True):
            settings.RUN_TRACES = on
            tracing.reset_for_tests()
            agent = make_agent(embedding="")
            llm.push(text("hello"))
            send(agent, "warm-up")  # the agent's first turn reads what later ones have cached
            llm.push(MEMORY_EDIT, text("Hi Sam!"))
            with CaptureQueriesContext(connections["default"]) as captured:
                result = send(agent, "I'm Sam")
            statements[on] = len(captured.captured_queries)
            assert RunTrace.all_objects.filter(run_id=result.run.id).exists() is on
    finally:
        tracing.reset_for_tests()

    assert statements[True] == statements[False]
    [row] = RunTrace.all_objects.filter(run_id=result.run.id)
    assert {"agent.run", "agent.persist", "memory.edit"} <= {s["SpanName"] for s in row.spans}


@pytest.mark.django_db(transaction=True)
def test_a_run_executed_inside_another_runs_tool_call_is_in_its_trace_under_that_call(
    traces_on, make_agent, send, llm
):
    wait = "send_message_to_agent_and_wait_for_reply"
    asker = make_agent(name="Asker", embedding="", tools=[wait])
    oracle = make_agent(name="Oracle", embedding="")
    llm.push(
        tool_calls(tool_call(wait, {"message": "What is 2+2?", "other_agent_id": oracle.id})),
        text("Four.", when_last_user_contains="Incoming message from agent with ID"),
        text("The oracle says four."),
    )

    result = send(asker, "ask the oracle")

    outer = RunTrace.all_objects.get(run_id=result.run.id)
    inner_run = Run.all_objects.get(agent_id=oracle.id)
    inner = RunTrace.all_objects.get(run_id=inner_run.id)
    [call] = [s for s in outer.spans if s["SpanName"] == "tool.call"]
    [inner_root] = [s for s in inner.spans if s["SpanName"] == "agent.run"]
    # The oracle's run was executed in the asker's tool call (this worker's thread): one trace, its root
    # under that call, as a collector shows them; each run's own spans stay in its own stored trace.
    assert inner.trace_id == outer.trace_id
    assert inner_root["ParentSpanId"] == call["SpanId"]
    assert {s["SpanAttributes"].get("letta.run_id") for s in inner.spans} - {None} == {inner_run.id}
    assert not {s["SpanId"] for s in inner.spans} & {s["SpanId"] for s in outer.spans}
    # Each run's statements are its own: its spans' add up to its root's total.
    for stored in (outer, inner):
        [root] = [s for s in stored.spans if s["SpanName"] == "agent.run"]
        assert sum(int(s["SpanAttributes"].get("letta.db.statements", 0)) for s in stored.spans) == int(
            root["SpanAttributes"]["db.statements"]
        )
