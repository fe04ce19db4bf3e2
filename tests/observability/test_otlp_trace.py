"""With OTEL_EXPORTER_OTLP_ENDPOINT set, a run is one trace from the web request to the worker.

The web side runs in this process (the API through Django's test client) with an SDK tracer provider and
an in-memory exporter, and the Django and Celery instrumentations; the worker is a real Celery process
exporting over OTLP/HTTP to a small receiver here (127.0.0.1), which decodes the protobuf requests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from celery import current_app
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from apps.agents import services
from apps.observability.models import RunTrace
from tests.support.otlp import exported_spans
from tests.support.scripted_llm import text, tool_call, tool_calls
from tests.support.workers import WorkerProcess, worker_env

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "otlp-trace"


class Receiver:
    """An OTLP/HTTP trace receiver: every span it was sent, as (trace id, span id, parent id, name, service,
    scope, attributes as text)."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                for service, scope, span in exported_spans(body):
                    receiver.spans.append(
                        {
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_id": span.parent_span_id.hex(),
                            "name": span.name,
                            "service": service,
                            "scope": scope,
                            "attributes": {
                                a.key: str(getattr(a.value, a.value.WhichOneof("value") or "string_value"))
                                for a in span.attributes
                            },
                        }
                    )
                payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, name: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(s["name"] == name for s in self.spans):
            assert time.monotonic() < deadline, f"no {name} span exported: {self.spans}"
            time.sleep(0.1)

    def close(self) -> None:
        self.server.shutdown()


def _reset_global_provider() -> None:
    trace._TRACER_PROVIDER = None  # the SDK's own tests reset it so
    trace._TRACER_PROVIDER_SET_ONCE = Once()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def otlp_worker(django_db_setup, receiver, scripted_server, tmp_path) -> Iterator[WorkerProcess]:
    env = worker_env(
        scripted_server.url,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_BSP_SCHEDULE_DELAY="100",  # milliseconds between the worker's export batches
    )
    worker = WorkerProcess("otlp", env, tmp_path, queues=QUEUE).wait_ready()
    yield worker
    worker.stop()


@pytest.fixture
def web_spans(monkeypatch) -> Iterator[InMemorySpanExporter]:
    """This process as the web process with OTLP on: a global SDK provider (in memory here), Django and
    Celery instrumented; the runs it submits go to this module's worker."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_provider()
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    CeleryInstrumentor().instrument()

    def enqueue(run_id: str, agent_id: str | None = None, conversation_id: str | None = None) -> None:
        current_app.send_task("agents.execute_run", args=[run_id, agent_id, conversation_id], queue=QUEUE)

    monkeypatch.setattr(services, "enqueue_run", enqueue)
    yield exporter
    CeleryInstrumentor().uninstrument()
    DjangoInstrumentor().uninstrument()
    provider.shutdown()
    _reset_global_provider()


def test_a_run_is_one_trace_from_the_web_request_through_the_worker(
    web_spans, otlp_worker, receiver, api_client_for, actor, make_agent, llm, fast_streams
):
    agent = make_agent(embedding="")
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        text("Hi Sam!"),
    )

    response = api_client_for(actor).post(
        f"/v1/agents/{agent.id}/messages",
        {"messages": [{"role": "user", "content": "I'm Sam, my phrase is plum-42"}]},
        format="json",
    )
    receiver.wait_for("agent.run")
    otlp_worker.wait_idle()
    time.sleep(0.5)  # the worker's last batch (its spans after the run's root)

    assert response.status_code == 200
    web = web_spans.get_finished_spans()
    [request] = [s for s in web if s.kind == trace.SpanKind.SERVER]
    [publish] = [s for s in web if s.name == "apply_async/agents.execute_run"]
    trace_id = format(request.context.trace_id, "032x")
    # The worker's own traces (its start-up queries, Redis polls between tasks) are others: the run's
    # spans are all in the request's trace.
    worker = [s for s in receiver.spans if s["trace_id"] == trace_id]
    assert publish.parent is not None
    assert publish.parent.span_id == request.context.span_id
    [consume] = [s for s in worker if s["name"] == "run/agents.execute_run"]
    assert consume["parent_id"] == format(publish.context.span_id, "016x")
    [run] = [s for s in receiver.spans if s["name"] == "agent.run"]
    assert run["parent_id"] == consume["span_id"]
    assert run["service"] == "letta-worker"
    worker_names = [s["name"] for s in worker]
    for name in (
        "run.queue_wait",
        "agent.load",
        "agent.step",
        "llm.call",
        "tool.call",
        "memory.edit",
        "agent.persist",
    ):
        assert name in worker_names
    scopes = {s["scope"] for s in worker}
    # The LLM's requests carry the run's trace under their llm.call span (a provider such as vLLM joins
    # it), with no HTTP span of their own repeating llm.call's.
    calls = {s["span_id"] for s in worker if s["name"] == "llm.call"}
    sent = [r["headers"].get("traceparent", "") for r in llm.requests("/v1/chat/completions")]
    assert len(sent) == len(calls) == 2
    assert {value.split("-")[1] for value in sent} == {trace_id}
    assert {value.split("-")[2] for value in sent} == calls
    assert "opentelemetry.instrumentation.httpx" not in scopes
    # Inside the run no span per SQL statement or Redis command (most of what OTLP cost a turn): the
    # database time is on the loop's spans, each span's own statements, together the run's.
    assert not scopes & {"opentelemetry.instrumentation.psycopg", "opentelemetry.instrumentation.redis"}
    loop = [s for s in worker if s["scope"] == "apps.agents.loop"]
    [exported_root] = [s for s in loop if s["name"] == "agent.run"]
    statements = int(exported_root["attributes"]["db.statements"])
    assert statements > 0
    assert sum(int(s["attributes"].get("letta.db.statements", 0)) for s in loop) == statements
    assert all(float(s["attributes"]["letta.db.time_ms"]) > 0 for s in loop if s["name"] == "agent.persist")
    # A client call in no trace (the worker's broker polls between tasks) starts no trace of its own.
    clients = ("psycopg", "redis", "httpx")
    orphans = [
        s
        for s in receiver.spans
        if not s["parent_id"] and s["scope"] in {f"opentelemetry.instrumentation.{c}" for c in clients}
    ]
    assert orphans == []
    # What reaches the operator's collector holds no tenant text.
    exported = str([s["attributes"] for s in worker])
    assert "plum-42" not in exported
    assert "Hi Sam" not in exported
    # The run's stored trace keeps the loop's spans (what the ADE draws), each with its own database time;
    # the statement, command and HTTP spans went to the collector only.
    stored = RunTrace.all_objects.get(run_id=response.json()["messages"][0]["run_id"])
    assert stored.trace_id == trace_id
    assert {s["SpanName"] for s in stored.spans} >= {
        "agent.run",
        "run.queue_wait",
        "agent.load",
        "agent.step",
        "llm.call",
        "tool.call",
        "memory.edit",
        "agent.persist",
    }
    assert {s["ScopeName"] for s in stored.spans} == {"apps.agents.loop"}
    [root] = [s for s in stored.spans if s["SpanName"] == "agent.run"]
    assert sum(int(s["SpanAttributes"].get("letta.db.statements", 0)) for s in stored.spans) == int(
        root["SpanAttributes"]["db.statements"]
    )
