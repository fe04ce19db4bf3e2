"""Small statistics helpers: percentiles of one run, and the median and spread of repeated runs."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.4999)))
    return ordered[rank - 1]


def summary(samples: Sequence[float], digits: int = 2) -> dict[str, float]:
    """p50 / p95 / spread (max - min) / n of one run's samples (milliseconds)."""
    return {
        "p50_ms": round(statistics.median(samples), digits),
        "p95_ms": round(percentile(samples, 95), digits),
        "spread_ms": round(max(samples) - min(samples), digits),
        "n": len(samples),
    }


def across(values: Sequence[float], digits: int = 2) -> dict[str, float | list[float]]:
    """A figure measured in several runs: the median, the spread (max - min) and the runs' values."""
    return {
        "median": round(statistics.median(values), digits),
        "spread": round(max(values) - min(values), digits),
        "runs": [round(v, digits) for v in values],
    }


def machine_speed_ms(repeats: int = 7) -> dict[str, float]:
    """A fixed CPU-bound workload (JSON round trips of a message-like document), timed `repeats` times:
    the minimum is the machine's speed, the median shows contention. Compare runs with it: these
    machines are virtual and their speed changes with their neighbours' load."""
    document = [{"role": "user", "content": f"Message number {i} " * 4, "id": i} for i in range(400)]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(20):
            json.loads(json.dumps(document))
        times.append((time.perf_counter() - started) * 1000)
    return {"min": round(min(times), 2), "median": round(percentile(times, 50), 2)}
