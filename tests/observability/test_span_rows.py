"""The stored form of a span (tracing.stored_row) is Letta's span object (span_row) without its empty
columns and resource attributes (compact), which the API gives back in full (expand)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, Status, StatusCode

from apps.observability import tracing


def _spans() -> list:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "letta-worker"}), span_limits=tracing.LIMITS
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer(tracing.SCOPE, "1.2")
    root = tracer.start_span("agent.run", attributes={"letta.run_id": "run-1"})
    with (
        trace.use_span(root, end_on_exit=True),
        tracer.start_as_current_span(
            "llm.call",
            attributes={
                "gen_ai.usage.input_tokens": 12,
                "letta.memory_changed": True,
                "letta.latency_ms": 1.5,
                "gen_ai.response.finish_reasons": ["stop"],
                "db.statement": "SELECT " + "x, " * 200,
            },
            links=[Link(root.get_span_context(), {"why": "retry"})],
        ) as child,
    ):
        child.add_event("retry", {"attempt": 2})
        child.set_status(Status(StatusCode.ERROR, "RateLimitError"))
    provider.shutdown()
    return list(exporter.get_finished_spans())


def test_the_stored_row_is_the_compact_span_row_and_expands_back():
    for span in _spans():
        stored = tracing.stored_row(span)

        assert stored == tracing.compact(tracing.span_row(span))
        assert tracing.expand(stored)["ResourceAttributes"] == {"service.name": "letta-worker"}
    child = next(s for s in _spans() if s.name == "llm.call")
    attributes = tracing.stored_row(child)["SpanAttributes"]
    assert attributes["gen_ai.usage.input_tokens"] == "12"
    assert attributes["letta.memory_changed"] == "true"
    assert attributes["gen_ai.response.finish_reasons"] == '["stop"]'
    assert len(attributes["db.statement"]) == tracing.ATTRIBUTE_MAX_CHARS


def test_a_loop_spans_stored_row_is_the_row_of_the_span_the_exporter_is_given():
    run = tracing.RunSpans(
        run_id="run-1",
        organization_id="org-1",
        resource=Resource.create({"service.name": "letta-worker"}),
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        parent_span_id=0xB7AD6B7169203331,
        cap=10,
    )
    with run.span("agent.run", {"letta.run_id": "run-1", "letta.memory_changed": True}) as root:
        with run.span("llm.call", {"gen_ai.response.finish_reasons": ["stop"], "none": None}) as child:
            child.set_attribute("db.statement", "SELECT " + "x, " * 200)
            child.set_status(Status(StatusCode.ERROR, "RateLimitError"))
        try:
            with run.span("tool.call", {"tool.name": "memory_replace"}):
                raise KeyError("the tool's own words")
        except KeyError:
            pass
    trace_id = format(run.trace_id, "032x")

    assert [s.name for s in run.spans] == ["llm.call", "tool.call", "agent.run"]
    for span in run.spans:
        readable = tracing._readable(run, span)
        assert tracing.loop_row(span, trace_id, run.service) == tracing.compact(tracing.span_row(readable))
    rows = {s.name: tracing.loop_row(s, trace_id, run.service) for s in run.spans}
    assert rows["agent.run"]["ParentSpanId"] == format(run.parent_span_id, "016x")
    assert (
        rows["llm.call"]["ParentSpanId"] == rows["tool.call"]["ParentSpanId"] == format(root.span_id, "016x")
    )
    assert "none" not in rows["llm.call"]["SpanAttributes"]
    assert len(rows["llm.call"]["SpanAttributes"]["db.statement"]) == tracing.ATTRIBUTE_MAX_CHARS
    assert (rows["llm.call"]["StatusCode"], rows["llm.call"]["StatusMessage"]) == ("Error", "RateLimitError")
    # A failure is an error with its type, never its message.
    assert rows["tool.call"]["SpanAttributes"]["error.type"] == "KeyError"
    assert "the tool's own words" not in str(rows)
