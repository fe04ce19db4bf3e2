"""Sandbox figures: what a custom-tool call costs in Docker, cold and warm, and in the local bubblewrap jail
(its first call in a process, then steady state).

`sandbox_figures()` returns a dict (milliseconds, p50/p95/spread over `repeat` calls); bench/run.py
adds it to its table. Needs no database. Without a Docker engine it says so instead of failing.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

from apps.sandbox.docker_sandbox import (
    ContainerSpec,
    WarmPool,
    docker_available,
    get_client,
    run_tool_in_docker,
)
from apps.sandbox.local import run_tool_locally

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "letta-sandbox-base:py3"
SOURCE = '''
def echo(word: str) -> str:
    """Repeat a word back.

    Args:
        word (str): the word
    """
    print("echoing", word)
    return word.upper()
'''


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 1),
        "p95_ms": round(ordered[max(0, int(len(ordered) * 0.95) - 1)], 1),
        "spread_ms": round(ordered[-1] - ordered[0], 1),
        "n": len(ordered),
    }


def _timed_call(pool: WarmPool, spec: ContainerSpec) -> tuple[float, bool]:
    started = time.perf_counter()
    outcome = run_tool_in_docker(
        source_code=SOURCE, name="echo", arguments={"word": "x"}, env={}, spec=spec, pool=pool
    )
    if not outcome.ok:
        raise RuntimeError(f"sandbox bench call failed: {outcome.error}")
    return (time.perf_counter() - started) * 1000, outcome.warm


def sandbox_figures(repeat: int = 20, image: str = IMAGE) -> dict[str, object]:
    """Cold (start a container for the call) vs warm (take one from the pool) vs local subprocess.

    Warm calls wait for the pool's background refill between calls, so each finds a warm container:
    this is the latency of a call on an idle server, not throughput under load.
    """
    local = _local_figures(repeat)
    if not docker_available(ttl_seconds=0):
        return {**local, "docker": "no Docker engine answers"}
    if not get_client().images.list(name=image):
        subprocess.run(["bash", str(ROOT / "scripts" / "build_sandbox_image.sh"), image], check=True)
    spec = ContainerSpec(image=image)
    cold_pool, warm_pool = WarmPool(size=0), WarmPool(size=1)
    try:
        cold = []
        for _ in range(repeat):
            cold.append(_timed_call(cold_pool, spec)[0])
            cold_pool.drain()
        warm_pool.fill(spec)
        warm = []
        for _ in range(repeat):
            elapsed, was_warm = _timed_call(warm_pool, spec)
            if not was_warm:
                raise RuntimeError("the warm pool was empty: the refill did not finish")
            warm.append(elapsed)
            warm_pool.drain()
        start = []
        for _ in range(min(repeat, 10)):
            started = time.perf_counter()
            warm_pool.fill(spec)  # one container: create + start
            start.append((time.perf_counter() - started) * 1000)
            container_id, _ = warm_pool.acquire(spec)
            warm_pool.discard(container_id)
            warm_pool.drain()
    finally:
        cold_pool.shutdown()
        warm_pool.shutdown()
    return {
        "sandbox_docker_cold": _summary(cold),
        "sandbox_docker_warm": _summary(warm),
        "sandbox_docker_container_start": _summary(start),
        **local,
        "sandbox_image": image,
    }


def _local_figures(repeat: int) -> dict[str, object]:
    """A jailed call costs the same every time (no pool: a new jail per call); the first call of a
    process also pays for reading the interpreter from disk into the page cache, if it was not there."""
    samples = []
    for _ in range(repeat + 1):
        started = time.perf_counter()
        outcome = run_tool_locally(source_code=SOURCE, name="echo", arguments={"word": "x"}, env={})
        if not outcome.ok:
            raise RuntimeError(f"local sandbox bench call failed: {outcome.error}")
        samples.append((time.perf_counter() - started) * 1000)
    return {"sandbox_local_first": round(samples[0], 1), "sandbox_local": _summary(samples[1:])}


if __name__ == "__main__":
    import json
    import sys

    sys.path.insert(0, str(ROOT))
    print(json.dumps(sandbox_figures(), indent=2))
