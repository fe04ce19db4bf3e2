"""Small statistics helpers: percentiles of one run, and the median and spread of repeated runs."""

from __future__ import annotations

import statistics
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
