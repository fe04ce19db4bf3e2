"""The streams bench's garbage-collector log: what it reports of the web process's pauses."""

from __future__ import annotations

from pathlib import Path

from bench.streams_bench import gc_pauses


def test_gc_pauses_reports_only_the_collections_of_the_window(tmp_path: Path) -> None:
    log = tmp_path / "web.gc"
    log.write_text("100.000 2 500.00\n105.500 0 1.50\n106.000 2 42.25\n110.000 1 3.00\n120.000 2 700.00\n")

    writing = gc_pauses(log, 105.0, 111.0)

    assert writing == {
        "collections_by_generation": {0: 1, 1: 1, 2: 1},
        "longest_ms": 42.25,
        "total_ms": 46.8,
    }
    assert gc_pauses(tmp_path / "missing.gc", 0, 1)["longest_ms"] == 0.0
