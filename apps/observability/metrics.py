"""Prometheus metrics, counted in Redis so that every process is in one `/metrics`.

Why Redis and not prometheus_client's multiprocess mode: the web process and the workers are separate
processes, on separate hosts once scaled out (docker-compose.scale.yml), and any web replica answers
`/metrics`. Multiprocess mode shares files between the processes of one host only, so a scrape would see
one host's workers, and it needs a cleaned directory per start. Here a finished run adds its counts to
Redis hashes (a background thread sends a process's counts once a second, in one pipelined round trip),
and `/metrics` reads them back; gauges
(queue depth and age, open streams) are read at scrape time. Counters live as long as Redis keeps them
(Prometheus takes a reset, e.g. after a Redis restart, as counters do).

Label values are bounded: a model name is cut to 80 characters, and past 200 distinct values of a
label per metric in one process, new ones count as "other".
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import redis
from django.conf import settings
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from apps.observability.tracing import LoopSpan

logger = logging.getLogger(__name__)

KEY_PREFIX = "metrics:v1:"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, math.inf)
MAX_LABEL_VALUES = 200
LABEL_MAX_CHARS = 80

COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "letta_runs": ("Runs whose execution ended, by status and stop reason", ("status", "stop_reason")),
    "letta_llm_tokens": ("LLM tokens, by model and kind (prompt, completion)", ("model", "kind")),
    "letta_sandbox_calls": ("Custom tool calls in a sandbox, by backend and outcome", ("backend", "outcome")),
    "letta_tool_calls": ("Tool calls, by tool type and outcome", ("tool_type", "outcome")),
    "letta_errors": ("Errors, by kind (a failed run's stop reason, a failed span's error type)", ("kind",)),
}
HISTOGRAMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "letta_step_duration_seconds": ("Agent step wall time (LLM call, tools, persistence)", ()),
    "letta_llm_call_duration_seconds": ("LLM call wall time, by model", ("model",)),
    "letta_run_queue_wait_seconds": ("Run creation to claim by an executor", ()),
}
STREAM_KEY_PATTERN = "streams:user:*"  # apps.api.throttles' stream slots
SCAN_LIMIT = 10_000

_client: redis.Redis | None = None
_client_pid = 0
_seen: dict[tuple[str, int], set[str]] = defaultdict(set)
_seen_lock = threading.Lock()


def _redis() -> redis.Redis:
    """One client (and connection pool) per process, made again after a fork."""
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():
        _client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
        _client_pid = os.getpid()
    return _client


def _bounded(metric: str, index: int, value: str) -> str:
    value = (value or "")[:LABEL_MAX_CHARS]
    with _seen_lock:
        seen = _seen[(metric, index)]
        if value in seen:
            return value
        if len(seen) >= MAX_LABEL_VALUES:
            return "other"
        seen.add(value)
        return value


class Batch:
    """Counts of one run, added to Redis in one pipeline by `flush`."""

    def __init__(self) -> None:
        self.fields: dict[tuple[str, str], float] = defaultdict(float)

    def _field(self, metric: str, labels: Iterable[str]) -> str:
        return json.dumps([_bounded(metric, i, v) for i, v in enumerate(labels)])

    def inc(self, metric: str, *labels: str, value: float = 1.0) -> None:
        self.fields[(metric, self._field(metric, labels))] += value

    def observe(self, metric: str, seconds: float, *labels: str) -> None:
        key = self._field(metric, labels)
        bucket = next(i for i, le in enumerate(BUCKETS) if seconds <= le)
        self.fields[(metric, f"b{bucket}|{key}")] += 1
        self.fields[(metric, f"sum|{key}")] += seconds
        self.fields[(metric, f"count|{key}")] += 1

    def flush(self) -> None:
        if not self.fields:
            return
        pipe = _redis().pipeline(transaction=False)
        for (metric, name), value in self.fields.items():
            pipe.hincrbyfloat(KEY_PREFIX + metric, name, value)
        pipe.execute()
        self.fields.clear()

    def merge(self, other: Batch) -> None:
        for key, value in other.fields.items():
            self.fields[key] += value


# A process's counts since its last flush: added to Redis by a background thread every FLUSH_SECONDS (one
# pipeline for all the runs of that second, off the runs' own threads), at exit, and before this process
# answers /metrics.
FLUSH_SECONDS = 1.0
_pending = Batch()
_pending_lock = threading.Lock()
_flusher_pid = 0


def _record(batch: Batch) -> None:
    global _flusher_pid
    with _pending_lock:
        _pending.merge(batch)
        if _flusher_pid != os.getpid():
            _flusher_pid = os.getpid()
            threading.Thread(target=_flush_forever, name="metrics-flush", daemon=True).start()
            atexit.register(flush_pending)


def _flush_forever() -> None:
    while True:
        time.sleep(FLUSH_SECONDS)
        try:
            flush_pending()
        except redis.RedisError:
            logger.warning("observability.metrics_flush_failed")  # kept, tried again next time


def flush_pending() -> None:
    """Add this process's pending counts to Redis now (a failed flush keeps them for the next)."""
    global _pending
    with _pending_lock:
        batch, _pending = _pending, Batch()
    try:
        batch.flush()
    except redis.RedisError:
        with _pending_lock:
            _pending.merge(batch)
        raise


def count_run(run: Any, spans: list[LoopSpan]) -> None:
    """A run's execution ended: its status, and from its spans the steps, LLM calls, tokens, tools,
    sandbox calls and errors."""
    batch = Batch()
    status, reason = str(run.status), str(run.stop_reason or "")
    batch.inc("letta_runs", status, reason)
    if status == "failed":
        batch.inc("letta_errors", f"run:{reason}")
    for span in spans:
        seconds = ((span.end_time or 0) - (span.start_time or 0)) / 1e9
        attrs = span.attributes or {}
        name = span.name
        if name == "agent.step":
            batch.observe("letta_step_duration_seconds", seconds)
        elif name == "llm.call":
            model = str(attrs.get("gen_ai.request.model", ""))
            batch.observe("letta_llm_call_duration_seconds", seconds, model)
            batch.inc(
                "letta_llm_tokens", model, "prompt", value=float(attrs.get("gen_ai.usage.input_tokens", 0))
            )
            batch.inc(
                "letta_llm_tokens",
                model,
                "completion",
                value=float(attrs.get("gen_ai.usage.output_tokens", 0)),
            )
        elif name == "run.queue_wait":
            batch.observe("letta_run_queue_wait_seconds", seconds)
        elif name == "tool.call":
            outcome = str(attrs.get("tool.status", "error"))
            batch.inc("letta_tool_calls", str(attrs.get("tool.type", "")), outcome)
        elif name == "sandbox.run":
            batch.inc(
                "letta_sandbox_calls",
                str(attrs.get("sandbox.backend", "")),
                str(attrs.get("tool.status", "")),
            )
        if span.status_code is StatusCode.ERROR and name != "agent.run":
            batch.inc("letta_errors", f"{name}:{attrs.get('error.type', 'error')}")
    _record(batch)


class _Collector(Collector):
    def __init__(self, gauges: Gauges) -> None:
        self.gauges = gauges

    def collect(self) -> Iterator[Any]:
        flush_pending()
        client = _redis()
        pipe = client.pipeline(transaction=False)
        names = [*COUNTERS, *HISTOGRAMS]
        for name in names:
            pipe.hgetall(KEY_PREFIX + name)
        stored = dict(zip(names, pipe.execute(), strict=True))
        for name, (doc, labels) in COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=list(labels))
            for key, value in sorted(stored[name].items()):
                family.add_metric(json.loads(key), float(value))
            yield family
        for name, (doc, labels) in HISTOGRAMS.items():
            yield _histogram(name, doc, labels, stored[name])
        for gauge_name, (gauge_doc, samples) in self.gauges.items():
            label_names = sorted({k for sample_labels, _ in samples for k in sample_labels})
            gauge = GaugeMetricFamily(gauge_name, gauge_doc, labels=label_names)
            for sample_labels, value in samples:
                gauge.add_metric([sample_labels.get(k, "") for k in label_names], value)
            yield gauge


def _histogram(name: str, doc: str, labels: tuple[str, ...], fields: dict[str, str]) -> HistogramMetricFamily:
    series: dict[str, dict[str, float]] = defaultdict(dict)
    for field, value in fields.items():
        part, _, key = field.partition("|")
        series[key][part] = float(value)
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    for key, parts in sorted(series.items()):
        running, buckets = 0.0, []
        for i, le in enumerate(BUCKETS):
            running += parts.get(f"b{i}", 0.0)
            buckets.append(("+Inf" if le == math.inf else repr(le), running))
        family.add_metric(json.loads(key), buckets, parts.get("sum", 0.0))
    return family


def active_streams() -> float:
    """Open stream slots of all users (SSE streams, blocking sends, ADE relays), from at most
    SCAN_LIMIT users' keys."""
    client = _redis()
    now, total, keys = time.time(), 0, []
    for key in client.scan_iter(match=STREAM_KEY_PATTERN, count=500):
        keys.append(key)
        if len(keys) >= SCAN_LIMIT:
            break
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.zcount(key, f"({now}", "+inf")
    for count in pipe.execute() if keys else []:
        total += int(count)
    return float(total)


def celery_queue_lengths(queues: Iterable[str]) -> list[tuple[dict[str, str], float]]:
    """Messages waiting in each Celery queue (the Redis broker keeps a queue as a list)."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, decode_responses=True)
    try:
        pipe = client.pipeline(transaction=False)
        names = list(queues)
        for queue in names:
            pipe.llen(queue)
        return [({"queue": q}, float(n)) for q, n in zip(names, pipe.execute(), strict=True)]
    finally:
        client.close()


Gauges = dict[str, tuple[str, list[tuple[dict[str, str], float]]]]


def render(gauges: Gauges) -> bytes:
    """The Prometheus text exposition: the counters and histograms in Redis, and `gauges` (name ->
    (help, [(labels, value)])) the caller read now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(gauges))
    return generate_latest(registry)


def reset_for_tests() -> None:
    global _pending
    with _pending_lock:
        _pending = Batch()
    client = _redis()
    for key in client.scan_iter(match=KEY_PREFIX + "*"):
        client.delete(key)
    with _seen_lock:
        _seen.clear()
