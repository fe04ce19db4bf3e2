"""Trace spans of runs: OpenTelemetry, set up once per process, free when nothing records.

Three modes, decided from settings when a process first asks (`configure`):
- OTEL_EXPORTER_OTLP_ENDPOINT set: a global SDK tracer provider exporting over OTLP/HTTP in batches, and
  the official instrumentations (Django, Celery, psycopg, redis, httpx). Celery carries the trace context
  in the task's headers, so a run is one trace from the web request to the worker. Inside a run's
  execution the instrumentations record only outbound HTTP other than the LLM's (`quiet`: no span per SQL
  statement or Redis command, the loop's spans carry their database time; the LLM request carries the
  `llm.call` span's context itself, `propagation_headers`), and a client call in no trace starts none
  (`InTraceClients`): what made exporting cost a turn. The run's own spans are also kept in the
  platform's store (below).
- else RUN_TRACES (default) or METRICS_TOKEN: no SDK provider, so no instrumentation records; each run's
  spans are kept in memory until its execution ends, then written in one statement (RunTrace) and
  counted into the metrics (apps.observability.metrics).
- neither: every helper here is a shared null context; nothing is allocated per span.

In a run the loop's spans are LoopSpans, recorded here without the SDK's per-span machinery; when
exporting, each is handed to the SDK's processors as a ReadableSpan when it ends, and what is sent while
it is open goes under it (an MCP server's HTTP span, the LLM request's `traceparent`: `_in_open_span`).

Spans carry ids, names, counts and durations only: never a message, a tool's arguments or a secret.
(The instrumentations' own: SQL without its parameters, Redis commands as `EVALSHA ? ? ?`.) Each stored
span has the statements run directly in it and their time (`letta.db.statements`, `letta.db.time_ms`),
the root the run's totals (`db.statements`, `db.time_ms`), in every mode.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.instrumentation.utils import _SUPPRESS_INSTRUMENTATION_KEY as _SUPPRESS_KEY
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    ReadableSpan,
    SpanLimits,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased, Sampler, SamplingResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    INVALID_SPAN,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)

logger = logging.getLogger(__name__)

SCOPE = "apps.agents.loop"
ATTRIBUTE_MAX_CHARS = 256
LIMITS = SpanLimits(
    max_span_attributes=32,
    max_attribute_length=ATTRIBUTE_MAX_CHARS,
    max_events=8,
    max_links=8,
    max_event_attributes=8,
    max_link_attributes=8,
)
_NULL: contextlib.nullcontext[Span] = contextlib.nullcontext(INVALID_SPAN)


class LoopSpan:
    """One span of the agent loop: ids, times, attributes, status and its own statements, recorded without
    the SDK's span machinery (a sampler, a lock, validated attributes, context tokens and processors: about
    280 calls a span, most of what tracing cost a turn). It is its own context manager (`span`); what the
    exporter needs is made from it when it ends (`_readable`), and the store's row (`loop_row`) is the
    same as the row of that ReadableSpan (tests/observability/test_span_rows.py)."""

    __slots__ = (
        "_run",
        "_token",
        "attributes",
        "db_ns",
        "end_time",
        "name",
        "parent_id",
        "span_id",
        "start_time",
        "statements",
        "status_code",
        "status_description",
    )

    def __init__(self, run: RunSpans, name: str, attributes: dict[str, Any], start_time: int = 0) -> None:
        self.name = name
        self.span_id = _IDS.generate_span_id()
        self.parent_id = 0
        self.start_time = start_time
        self.end_time = 0
        self.attributes = attributes
        self.status_code = StatusCode.UNSET
        self.status_description = ""
        self.statements = 0
        self.db_ns = 0
        self._run = run
        self._token: contextvars.Token[LoopSpan | None] | None = None

    # The part of opentelemetry.trace.Span the loop uses (llm_response, ToolSpans).
    def is_recording(self) -> bool:
        return True

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_status(self, status: Status) -> None:
        self.status_code = status.status_code
        self.status_description = status.description or ""

    def __enter__(self) -> LoopSpan:
        run = self._run
        parent = _open.get()
        self.parent_id = parent.span_id if parent is not None else run.parent_span_id
        self.start_time = time.time_ns()
        self._token = _open.set(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if kind is not None:
            self.status_code = StatusCode.ERROR
            self.status_description = kind.__name__
            self.attributes["error.type"] = kind.__name__
        if self._token is not None:
            _open.reset(self._token)
        self._run.end(self)


@dataclass
class RunSpans:
    """What one execution of a run recorded, until it ends."""

    run_id: str
    organization_id: str
    trace_id: int = 0
    parent_span_id: int = 0  # the span the run's root is under (the worker's Celery span), when exporting
    parent_remote: bool = False
    # Where the run's spans go as they end (the exporter's batch processor), when exporting and the
    # trace it joins is sampled.
    export: SpanProcessor | None = None
    resource: Resource | None = None
    cap: int = 0
    spans: list[LoopSpan] = field(default_factory=list)
    dropped: int = 0
    db_statements: int = 0
    db_ns: int = 0
    # Set by the run's executor when it stores the spans itself, in a statement it runs anyway
    # (`store_statements`): then the end of run_trace does not.
    handed_over: bool = False

    @property
    def service(self) -> str:
        return str(self.resource.attributes.get("service.name", "")) if self.resource else ""

    def span(self, name: str, attributes: dict[str, Any]) -> LoopSpan:
        return LoopSpan(self, name, _clean(attributes))

    def end(self, span: LoopSpan) -> None:
        """The span ended (its end time, its own statements as attributes): kept up to the cap (the store's
        and the metrics'), exported in any case."""
        span.end_time = span.end_time or time.time_ns()
        if span.statements:
            span.attributes["letta.db.statements"] = span.statements
            span.attributes["letta.db.time_ms"] = round(span.db_ns / 1e6, 3)
        if len(self.spans) < self.cap:
            self.spans.append(span)
        else:
            self.dropped += 1
        if self.export is not None:
            self.export.on_end(_readable(self, span))


_current: contextvars.ContextVar[RunSpans | None] = contextvars.ContextVar("run_spans", default=None)
_open: contextvars.ContextVar[LoopSpan | None] = contextvars.ContextVar("run_open_span", default=None)
_IDS = RandomIdGenerator()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SCOPE = InstrumentationScope(SCOPE)
_UNSET = Status(StatusCode.UNSET)


def _in_open_span(context: otel_context.Context | None = None) -> otel_context.Context | None:
    """`context` (default: the current one) with this context's open LoopSpan as its span, when its run is
    exported; None otherwise. Made only where something needs it (an outbound request's `traceparent`, an
    MCP server's HTTP span), not at every span."""
    current = _open.get()
    if current is None or current._run.export is None:
        return None
    own = SpanContext(current._run.trace_id, current.span_id, False, _SAMPLED)
    return trace.set_span_in_context(NonRecordingSpan(own), context)


def _readable(run: RunSpans, span: LoopSpan) -> ReadableSpan:
    """The span as the SDK's exporters take it. Its attributes are the loop's own (str, bool, int, float
    and lists of str, at most a dozen), so only the SDK's length bound is applied to them."""
    trace_id = run.trace_id
    if not span.parent_id:
        parent = None
    else:
        remote = run.parent_remote and span.parent_id == run.parent_span_id
        parent = SpanContext(trace_id, span.parent_id, remote, _SAMPLED)
    status = (
        _UNSET if span.status_code is StatusCode.UNSET else Status(span.status_code, span.status_description)
    )
    return ReadableSpan(
        name=span.name,
        context=SpanContext(trace_id, span.span_id, False, _SAMPLED),
        parent=parent,
        resource=run.resource,
        attributes={
            key: value[:ATTRIBUTE_MAX_CHARS] if type(value) is str else value
            for key, value in span.attributes.items()
        },
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=_SCOPE,
    )


class InTraceClients(Sampler):
    """Every trace is kept whole (the SDK's default, parent-based, always on), but a client call that is
    in no trace starts none: a SQL statement, Redis command or HTTP request with no span around it (the
    worker's broker polls every second, a web request's statements under daphne, whose requests have no
    span of their own) would be a trace of one span each, most of what OTLP cost a turn and nothing an
    operator can follow. Not sampling: no run's trace loses a span."""

    _default = ParentBased(ALWAYS_ON)

    def should_sample(
        self,
        parent_context: otel_context.Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if kind is SpanKind.CLIENT and not trace.get_current_span(parent_context).get_span_context().is_valid:
            return SamplingResult(Decision.DROP)
        return self._default.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return "InTraceClients"


@dataclass
class Telemetry:
    recording: bool  # the loop's spans are recorded (stored, counted or exported); False: nothing is
    resource: Resource | None = None
    # When exporting: the global SDK provider, its tracer (spans outside a run) and its processors.
    tracer: Tracer | None = None
    provider: TracerProvider | None = None
    processors: SynchronousMultiSpanProcessor | None = None
    exporting: bool = False


_state: Telemetry | None = None
_lock = threading.Lock()


def telemetry() -> Telemetry:
    return _state or configure()


def configure(service_name: str | None = None) -> Telemetry:
    """Set this process up once (idempotent; config/asgi.py, wsgi.py and celery.py call it at start, the
    first span of a process that did not, such as a test or the benchmark, does it then)."""
    global _state
    with _lock:
        if _state is not None:
            return _state
        endpoint = settings.OTEL_EXPORTER_OTLP_ENDPOINT
        recording = settings.RUN_TRACES or bool(settings.METRICS_TOKEN)
        if not endpoint and not recording:
            _state = Telemetry(recording=False)
            return _state
        resource = Resource.create({"service.name": service_name or settings.OTEL_SERVICE_NAME})
        if not endpoint:  # the loop's spans need no SDK: nothing else records
            _state = Telemetry(recording=True, resource=resource)
            return _state
        # The SDK logs a warning for every attribute it truncates to ATTRIBUTE_MAX_CHARS, which with the
        # psycopg instrumentation is most SQL statements: a log line per statement.
        logging.getLogger("opentelemetry.attributes").setLevel(logging.ERROR)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        processors = SynchronousMultiSpanProcessor()
        provider = TracerProvider(
            resource=resource,
            span_limits=LIMITS,
            sampler=InTraceClients(),
            active_span_processor=processors,
        )
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        instrument()
        _state = Telemetry(
            recording=True,
            resource=resource,
            tracer=provider.get_tracer(SCOPE),
            provider=provider,
            processors=processors,
            exporting=True,
        )
        return _state


def instrument() -> None:
    """The official instrumentations, on the global provider. Django's adds a middleware, so this runs
    before the web process builds its handler (config/asgi.py, config/wsgi.py). The SDK's own
    OTEL_PYTHON_DISABLED_INSTRUMENTATIONS (comma-separated: django, celery, psycopg, redis, httpx) leaves
    some out. httpx's transports get `_outbound` around the instrumentation's wrapper (see `quiet`)."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    disabled = {
        name.strip() for name in os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").split(",")
    }
    for name, instrumentor in (
        ("django", DjangoInstrumentor()),
        ("celery", CeleryInstrumentor()),
        ("psycopg", PsycopgInstrumentor()),
        ("redis", RedisInstrumentor()),
        ("httpx", HTTPXClientInstrumentor()),
    ):
        if name not in disabled and not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument()
            if name == "httpx":
                import httpx
                import wrapt

                wrapt.wrap_function_wrapper(httpx.HTTPTransport, "handle_request", _outbound)
                wrapt.wrap_function_wrapper(httpx.AsyncHTTPTransport, "handle_async_request", _outbound_async)


def uninstrument() -> None:
    """Undo `instrument` (the benchmark, which switches modes in one process)."""
    import httpx
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.utils import unwrap

    for instrumentor in (
        DjangoInstrumentor(),
        CeleryInstrumentor(),
        PsycopgInstrumentor(),
        RedisInstrumentor(),
        HTTPXClientInstrumentor(),
    ):
        if instrumentor.is_instrumented_by_opentelemetry:
            if isinstance(instrumentor, HTTPXClientInstrumentor):  # ours first: the outer wrapper
                unwrap(httpx.HTTPTransport, "handle_request")
                unwrap(httpx.AsyncHTTPTransport, "handle_async_request")
            instrumentor.uninstrument()


def reset_for_tests() -> None:
    """Forget this process's set-up (tests that switch modes). An exporting provider is the global one:
    whoever installed it shuts it down."""
    global _state
    with _lock:
        _state = None


# --- spans of the agent loop -------------------------------------------------------------------------


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Span | LoopSpan]:
    """A child of the current span for the block: in a run being traced, a LoopSpan of the run; outside
    one, the SDK's span when exporting (a trace of the web request's, say), else a shared null context.
    A failure marks the span as an error with its type (no message)."""
    collected = _current.get()
    if collected is not None:
        return collected.span(name, attributes)
    tracer = telemetry().tracer
    if tracer is None:
        return _NULL
    return _span(tracer, name, attributes)


@contextlib.contextmanager
def _span(tracer: Tracer, name: str, attributes: dict[str, Any]) -> Iterator[Span]:
    with tracer.start_as_current_span(
        name, attributes=_clean(attributes), record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            current.set_attribute("error.type", type(exc).__name__)
            raise


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if v is not None}


@contextlib.contextmanager
def run_trace(run: Any) -> Iterator[RunSpans | None]:
    """Around one execution of a claimed run: its root span `agent.run`, a `run.queue_wait` span from the
    run's creation to its claim, the statements and database time of the execution; at the end its
    spans are stored (one statement, unless the executor took them over: `RunSpans.handed_over`) and
    counted in the metrics (one Redis round trip). The root is a child of the open span of a run that
    executes this one in a tool call (agent messaging), else, when exporting, of the current span (the
    worker's Celery span: one trace from the web request); every span goes to the exporter as it ends. Yields what it collects (None when nothing records)."""
    state = telemetry()
    if not state.recording:
        yield None
        return
    collected = RunSpans(
        run_id=run.id,
        organization_id=run.organization_id,
        resource=state.resource,
        cap=settings.RUN_TRACE_MAX_SPANS,
    )
    outer = _open.get()  # a run executed in another run's tool call (agent messaging): in its trace
    parent = trace.get_current_span().get_span_context() if state.exporting and outer is None else None
    if outer is not None:
        collected.trace_id, collected.parent_span_id = outer._run.trace_id, outer.span_id
        collected.export = outer._run.export
    elif parent is not None and parent.is_valid:
        collected.trace_id, collected.parent_span_id = parent.trace_id, parent.span_id
        collected.parent_remote = parent.is_remote
        if parent.trace_flags.sampled:  # the trace it joins was sampled upstream: so is the run
            collected.export = state.processors
    else:
        collected.trace_id = _IDS.generate_trace_id()
        collected.export = state.processors
    token = _current.set(collected)
    try:
        with collected.span("agent.run", {"letta.run_id": run.id, "letta.agent_id": run.agent_id}) as root:
            _queue_wait(collected, run)
            try:
                with connection.execute_wrapper(_db_timer(collected)), quiet():
                    yield collected
            finally:
                root.attributes["letta.status"] = str(run.status)
                root.attributes["letta.stop_reason"] = str(run.stop_reason or "")
                root.attributes["db.statements"] = collected.db_statements
                root.attributes["db.time_ms"] = round(collected.db_ns / 1e6, 3)
                if run.status == "failed":
                    root.set_status(Status(StatusCode.ERROR, str(run.stop_reason)))
    finally:
        _current.reset(token)
        _finish(collected, run)


def _queue_wait(collected: RunSpans, run: Any) -> None:
    created, started = getattr(run, "created_at", None), getattr(run, "started_at", None)
    if not (created and started) or started < created:
        return
    queued = LoopSpan(collected, "run.queue_wait", {}, start_time=_ns(created))
    root = _open.get()
    queued.parent_id = root.span_id if root is not None else 0
    queued.end_time = _ns(started)
    collected.end(queued)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Around a run's execution in a worker (its claim, its turn, its stream's end) and the publish of its
    task (apps.agents.recovery.enqueue_run: Celery's span, not the broker command's), when exporting: the
    instrumentations record nothing there but outbound HTTP (`_outbound`). A span per SQL statement and
    Redis command (~25 a turn, one per streamed delta) was most of what OTLP cost a turn; the run's
    database time is on the loop's spans instead (`letta.db.*`, each span's own statements), so the
    trace still says where it went. The loop's own spans are not instrumentations': they record."""
    if _state is None or not _state.exporting or otel_context.get_value(_SUPPRESS_KEY):
        yield
        return
    token = otel_context.attach(otel_context.set_value(_SUPPRESS_KEY, True))
    try:
        yield
    finally:
        otel_context.detach(token)


def propagation_headers() -> dict[str, str]:
    """The current span's W3C trace context (`traceparent`), when exporting, for a request the platform
    sends itself (the LLM's and the embedding provider's, apps.llm.openai_wire): a provider such as vLLM
    joins the trace under the `llm.call` span, and the request gets no HTTP span of its own (`_outbound`),
    which would only repeat the loop's with a span's cost. {} otherwise."""
    if _state is None or not _state.exporting:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=_in_open_span())
    return carrier


def _carries_context(args: Any, kwargs: Any) -> bool:
    request = args[0] if args else kwargs.get("request")
    return request is not None and "traceparent" in request.headers


def _outbound(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """Around httpx's transports, outside the instrumentation's wrapper: an HTTP call inside a run (an
    MCP server's) keeps its span and its `traceparent` header (the server can join the trace). A request
    that already carries the trace context (`propagation_headers`) stays quiet."""
    if not otel_context.get_value(_SUPPRESS_KEY) or _carries_context(args, kwargs):
        return wrapped(*args, **kwargs)
    token = otel_context.attach(_unsuppressed())
    try:
        return wrapped(*args, **kwargs)
    finally:
        otel_context.detach(token)


async def _outbound_async(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    if not otel_context.get_value(_SUPPRESS_KEY) or _carries_context(args, kwargs):
        return await wrapped(*args, **kwargs)
    token = otel_context.attach(_unsuppressed())
    try:
        return await wrapped(*args, **kwargs)
    finally:
        otel_context.detach(token)


def _unsuppressed() -> otel_context.Context:
    """The current context with the instrumentations on, under the open LoopSpan (`_outbound`)."""
    context = otel_context.set_value(_SUPPRESS_KEY, False)
    return _in_open_span(context) or context


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def _db_timer(collected: RunSpans) -> Callable[..., Any]:
    """Counts and times each statement of the run into the loop span it runs in (`letta.db.*`)."""

    def timed(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        current = _open.get()
        if current is None or current._run is not collected:  # a run executed inside this one counts its own
            return execute(sql, params, many, context)
        started = time.perf_counter_ns()
        try:
            return execute(sql, params, many, context)
        finally:
            elapsed = time.perf_counter_ns() - started
            collected.db_statements += 1
            collected.db_ns += elapsed
            current.statements += 1
            current.db_ns += elapsed

    return timed


def _finish(collected: RunSpans, run: Any) -> None:
    """Never fails the run: a store or Redis that refuses is logged."""
    try:
        if settings.RUN_TRACES and collected.spans and not collected.handed_over:
            from apps.observability.services import run_trace_store

            run_trace_store(**_stored(collected))
    except Exception:
        logger.exception("observability.trace_store_failed", extra={"run_id": collected.run_id})
    try:
        if settings.METRICS_TOKEN:
            from apps.observability import metrics

            metrics.count_run(run, collected.spans)
    except Exception:
        logger.exception("observability.metrics_failed", extra={"run_id": collected.run_id})


def store_statements(collected: RunSpans | None) -> list[tuple[str, list[Any]]]:
    """The statement that stores a handed-over run's spans (SQL, params), as a part of another statement
    (apps.core.db.insert_all's `also`): a worker stores them with the run's step traces, one statement
    and round trip fewer a run. [] when there is nothing to store."""
    if collected is None or not collected.handed_over or not collected.spans or not settings.RUN_TRACES:
        return []
    from apps.observability.services import run_trace_upsert

    return [run_trace_upsert(**_stored(collected))]


def _stored(collected: RunSpans) -> dict[str, Any]:
    trace_id = format(collected.trace_id, "032x")
    return {
        "run_id": collected.run_id,
        "organization_id": collected.organization_id,
        "trace_id": trace_id,
        "spans": [loop_row(s, trace_id, collected.service) for s in collected.spans],
        "dropped": collected.dropped,
    }


# --- the stored form: Letta's span objects (ClickHouse otel_traces columns) --------------------------

_KINDS = {0: "Internal", 1: "Server", 2: "Client", 3: "Producer", 4: "Consumer"}
_STATUS = {StatusCode.UNSET: "Unset", StatusCode.OK: "Ok", StatusCode.ERROR: "Error"}


def span_row(span: ReadableSpan) -> dict[str, Any]:
    """One span as Letta's trace endpoint returns it (the columns of the OpenTelemetry Collector's
    ClickHouse exporter, which Letta reads), attribute values as strings."""
    context = span.context
    parent = span.parent
    start, end = span.start_time or 0, span.end_time or span.start_time or 0
    resource = span.resource.attributes if span.resource else {}
    scope = span.instrumentation_scope
    return {
        "Timestamp": datetime.fromtimestamp(start / 1e9, UTC).isoformat(),
        "TraceId": format(context.trace_id, "032x") if context else "",
        "SpanId": format(context.span_id, "016x") if context else "",
        "ParentSpanId": format(parent.span_id, "016x") if parent else "",
        "TraceState": "",
        "SpanName": span.name,
        "SpanKind": _KINDS.get(span.kind.value, "Internal"),
        "ServiceName": str(resource.get("service.name", "")),
        "ResourceAttributes": _strings(resource),
        "ScopeName": scope.name if scope else "",
        "ScopeVersion": (scope.version or "") if scope else "",
        "SpanAttributes": _strings(span.attributes or {}),
        "Duration": max(0, end - start),
        "StatusCode": _STATUS.get(span.status.status_code, "Unset"),
        "StatusMessage": (span.status.description or "")[:ATTRIBUTE_MAX_CHARS],
        "Events.Timestamp": [datetime.fromtimestamp(e.timestamp / 1e9, UTC).isoformat() for e in span.events],
        "Events.Name": [e.name for e in span.events],
        "Events.Attributes": [_strings(e.attributes or {}) for e in span.events],
        "Links.TraceId": [format(link.context.trace_id, "032x") for link in span.links],
        "Links.SpanId": [format(link.context.span_id, "016x") for link in span.links],
        "Links.TraceState": ["" for _ in span.links],
        "Links.Attributes": [_strings(link.attributes or {}) for link in span.links],
    }


EMPTY_DEFAULTS: dict[str, Any] = {
    "TraceState": "",
    "ParentSpanId": "",
    "ScopeVersion": "",
    "StatusMessage": "",
    "Events.Timestamp": [],
    "Events.Name": [],
    "Events.Attributes": [],
    "Links.TraceId": [],
    "Links.SpanId": [],
    "Links.TraceState": [],
    "Links.Attributes": [],
}


def compact(row: dict[str, Any]) -> dict[str, Any]:
    """The stored form: without the empty columns and the resource's attributes (the same for every span
    of a process; `expand` gives back its service name), about half the bytes, so the insert is cheaper."""
    return {
        k: v
        for k, v in row.items()
        if k != "ResourceAttributes" and not (k in EMPTY_DEFAULTS and v == EMPTY_DEFAULTS[k])
    }


def stored_row(span: ReadableSpan) -> dict[str, Any]:
    """`compact(span_row(span))` without building what it drops (the resource's attributes, the empty
    columns): span_row was most of the store's CPU per span."""
    context, parent = span.context, span.parent
    start = span.start_time or 0
    end = span.end_time or start
    scope = span.instrumentation_scope
    status = span.status
    row: dict[str, Any] = {
        "Timestamp": datetime.fromtimestamp(start / 1e9, UTC).isoformat(),
        "TraceId": format(context.trace_id, "032x") if context else "",
        "SpanId": format(context.span_id, "016x") if context else "",
        "SpanName": span.name,
        "SpanKind": _KINDS.get(span.kind.value, "Internal"),
        "ServiceName": str(span.resource.attributes.get("service.name", "")) if span.resource else "",
        "ScopeName": scope.name if scope else "",
        "SpanAttributes": _strings(span.attributes or {}),
        "Duration": max(0, end - start),
        "StatusCode": _STATUS.get(status.status_code, "Unset"),
    }
    if parent:
        row["ParentSpanId"] = format(parent.span_id, "016x")
    if scope and scope.version:
        row["ScopeVersion"] = scope.version
    if status.description:
        row["StatusMessage"] = status.description[:ATTRIBUTE_MAX_CHARS]
    events, links = span.events, span.links
    if events:
        row["Events.Timestamp"] = [datetime.fromtimestamp(e.timestamp / 1e9, UTC).isoformat() for e in events]
        row["Events.Name"] = [e.name for e in events]
        row["Events.Attributes"] = [_strings(e.attributes or {}) for e in events]
    if links:
        row["Links.TraceId"] = [format(link.context.trace_id, "032x") for link in links]
        row["Links.SpanId"] = [format(link.context.span_id, "016x") for link in links]
        row["Links.TraceState"] = ["" for _ in links]
        row["Links.Attributes"] = [_strings(link.attributes or {}) for link in links]
    return row


def loop_row(span: LoopSpan, trace_id: str, service: str) -> dict[str, Any]:
    """`stored_row` of the span's ReadableSpan (`_readable`), from the LoopSpan itself."""
    start = span.start_time
    row: dict[str, Any] = {
        "Timestamp": datetime.fromtimestamp(start / 1e9, UTC).isoformat(),
        "TraceId": trace_id,
        "SpanId": format(span.span_id, "016x"),
        "SpanName": span.name,
        "SpanKind": "Internal",
        "ServiceName": service,
        "ScopeName": SCOPE,
        "SpanAttributes": _strings(span.attributes),
        "Duration": max(0, span.end_time - start),
        "StatusCode": _STATUS[span.status_code],
    }
    if span.parent_id:
        row["ParentSpanId"] = format(span.parent_id, "016x")
    if span.status_description:
        row["StatusMessage"] = span.status_description[:ATTRIBUTE_MAX_CHARS]
    return row


def expand(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored span in Letta's full shape."""
    row = {**EMPTY_DEFAULTS, **stored}
    row.setdefault("ResourceAttributes", {"service.name": row.get("ServiceName", "")})
    return {k: (list(v) if isinstance(v, list) else v) for k, v in row.items()}


def _strings(attributes: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in list(attributes.items())[: LIMITS.max_span_attributes or 32]:
        kind = type(value)
        if kind is str:
            text = value
        elif kind is int:  # json.dumps's text for an int, without its encoder
            text = str(value)
        else:
            text = json.dumps(value, default=str)
        out[key if type(key) is str and len(key) <= 128 else str(key)[:128]] = text[:ATTRIBUTE_MAX_CHARS]
    return out


# --- helpers for the loop's LLM and tool calls -------------------------------------------------------


def llm_response(current: Span | LoopSpan, response: Any) -> None:
    """What an LLM call's span says of its answer: tokens, finish reason, attempts, latency."""
    if not current.is_recording():
        return
    current.set_attribute("gen_ai.usage.input_tokens", int(response.prompt_tokens or 0))
    current.set_attribute("gen_ai.usage.output_tokens", int(response.completion_tokens or 0))
    current.set_attribute("gen_ai.response.finish_reasons", [str(response.finish_reason or "")])
    current.set_attribute("letta.attempts", int(getattr(response, "attempts", 1) or 1))
    current.set_attribute("letta.latency_ms", int(response.latency_ms or 0))


class ToolSpans:
    """A tool call's span, with its `memory.edit` (memory tools) or `sandbox.run` (custom tools) child."""

    def __init__(self, outer: Span | LoopSpan, inner: Span | LoopSpan | None) -> None:
        self.outer, self.inner = outer, inner

    def done(self, result: Any) -> None:
        for current in (self.outer, self.inner):
            if current is None or not current.is_recording():
                continue
            current.set_attribute("tool.status", str(result.status))
            if result.sandbox:
                current.set_attribute("sandbox.backend", str(result.sandbox))
            if result.memory_changed:
                current.set_attribute("letta.memory_changed", True)
            if result.status == "error":
                current.set_status(Status(StatusCode.ERROR, "tool error"))


@contextlib.contextmanager
def tool_spans(name: str, tool_type: str, *, memory: bool) -> Iterator[ToolSpans]:
    """Around one tool call's execution (built-in, MCP or sandboxed)."""
    if _current.get() is None and telemetry().tracer is None:
        yield ToolSpans(INVALID_SPAN, None)
        return
    attributes = {"tool.name": name, "tool.type": tool_type}
    with span("tool.call", **attributes) as outer:
        child = "memory.edit" if memory else None
        if not tool_type.startswith("letta_") and tool_type not in ("external_mcp", "client"):
            child = "sandbox.run"
        if child is None:
            yield ToolSpans(outer, None)
            return
        with span(child, **attributes) as inner:
            yield ToolSpans(outer, inner)
