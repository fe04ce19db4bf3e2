"""Reads of the observability app: a run's spans, for the API and the ADE."""

from __future__ import annotations

from typing import Any

from apps.core.actor import Actor
from apps.observability.models import RunTrace
from apps.observability.tracing import expand


def run_spans(*, actor: Actor, run_id: str, limit: int = 1000) -> list[dict[str, Any]]:
    """The stored spans of a run of the actor's organisation, oldest first, at most `limit`; [] when
    none were stored (the caller checks the run exists and is the actor's)."""
    row = RunTrace.objects.for_actor(actor).filter(run_id=run_id).values_list("spans", flat=True).first()
    if not row:
        return []
    ordered = sorted(row, key=lambda s: (s.get("Timestamp", ""), s.get("SpanName", "")))[:limit]
    return [expand(s) for s in ordered]


WATERFALL_GROUPS = {
    "run.queue_wait": "queue",
    "agent.load": "load",
    "agent.step": "step",
    "llm.call": "llm",
    "tool.call": "tool",
    "memory.edit": "tool",
    "sandbox.run": "tool",
    "agent.persist": "persist",
    "agent.run": "run",
}


def run_waterfall(*, actor: Actor, run_id: str, max_rows: int = 200) -> list[dict[str, Any]]:
    """The run's own spans as waterfall rows: group (queue, load, step, llm, tool, persist), name, offset
    and width in percent of the whole, duration in ms, depth. Database, Redis and HTTP spans (recorded
    with OTLP on) are left out: they are in the API's answer."""
    spans = [
        s for s in run_spans(actor=actor, run_id=run_id, limit=5000) if s.get("SpanName") in WATERFALL_GROUPS
    ]
    if not spans:
        return []
    from datetime import datetime

    starts = {s["SpanId"]: datetime.fromisoformat(s["Timestamp"]).timestamp() * 1e9 for s in spans}
    begin = min(starts.values())
    end = max(starts[s["SpanId"]] + s["Duration"] for s in spans)
    total = max(end - begin, 1.0)
    parents = {s["SpanId"]: s.get("ParentSpanId", "") for s in spans}

    def depth(span_id: str) -> int:
        level, seen = 0, set()
        while parents.get(span_id) in parents and span_id not in seen:
            seen.add(span_id)
            span_id = parents[span_id]
            level += 1
        return level

    rows = []
    for s in sorted(spans, key=lambda s: starts[s["SpanId"]])[:max_rows]:
        attrs = s.get("SpanAttributes", {})
        label = (
            attrs.get("tool.name") or attrs.get("gen_ai.request.model") or attrs.get("letta.persist") or ""
        )
        rows.append(
            {
                "group": WATERFALL_GROUPS[s["SpanName"]],
                "name": s["SpanName"],
                "label": label,
                "offset_pct": round(100 * (starts[s["SpanId"]] - begin) / total, 2),
                "width_pct": max(0.3, round(100 * s["Duration"] / total, 2)),
                "duration_ms": round(s["Duration"] / 1e6, 2),
                "depth": min(depth(s["SpanId"]), 4),
                "error": s.get("StatusCode") == "Error",
            }
        )
    return rows


def oldest_queued_run_age(queue: str = "celery") -> float | None:
    """Seconds since the oldest run still waiting in the Celery queue was created: the queue's oldest
    message (the Redis broker pops from the list's right end) names its run, read by primary key. None
    when the queue is empty or its oldest task is not a run."""
    import base64
    import json

    import redis
    from django.apps import apps  # agents sits above this app: its model by name, no import
    from django.conf import settings
    from django.utils import timezone

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, decode_responses=True)
    try:
        raw = client.lindex(queue, -1)
    finally:
        client.close()
    if not raw:
        return None
    try:
        message = json.loads(raw)
        if message.get("headers", {}).get("task") != "agents.execute_run":
            return None
        args = json.loads(base64.b64decode(message["body"]))[0]
        run_id = str(args[0])
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    run_model = apps.get_model("agents", "Run")
    created = run_model.all_objects.filter(id=run_id).values_list("created_at", flat=True).first()
    return (timezone.now() - created).total_seconds() if created else None


def metrics_text(*, queues: tuple[str, ...] = ("celery",)) -> bytes:
    """The whole /metrics page: counters and histograms from Redis, gauges read now."""
    from apps.observability import metrics

    ages = [({"queue": q}, age) for q in queues if (age := oldest_queued_run_age(q)) is not None]
    gauges: metrics.Gauges = {
        "letta_queue_depth": ("Tasks waiting in each Celery queue", metrics.celery_queue_lengths(queues)),
        "letta_queue_oldest_run_age_seconds": ("Age of the oldest run waiting in each queue", ages),
        "letta_active_streams": (
            "Open SSE streams, blocking sends and ADE relays (all users)",
            [({}, metrics.active_streams())],
        ),
    }
    return metrics.render(gauges)
