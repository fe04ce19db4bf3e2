"""Reading what an OTLP/HTTP trace exporter sends: for the tests' receiver and bench/tracing_bench.py's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


def exported_spans(body: bytes) -> Iterator[tuple[str, str, Any]]:
    """(service.name, instrumentation scope, span) of every span in one export request's body."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    for resource_spans in request.resource_spans:
        service = next(
            (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), ""
        )
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield service, scope_spans.scope.name, span
