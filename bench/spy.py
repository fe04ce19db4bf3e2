"""py-spy profiles of the running platform (daphne, the workers) while a series of turns runs.

`python scripts/devenv.py bench --py-spy` (which measures nothing else; `--only` does not apply) records,
for each kind of turn, every platform process at once (on-CPU samples only) and writes collapsed stacks
(`pyspy-<kind>-<process>.txt`, for flamegraph.pl or speedscope) and a summary of the hottest frames by
own and inclusive time.
"""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench import turns
from bench.stack import Platform

RATE = 500  # samples a second


def record_turns(
    client: httpx.Client, platform: Platform, agent_id: str, *, kind: str, count: int, out_dir: Path
) -> dict[str, Path]:
    """Run `count` sequential turns of `kind` while py-spy samples each platform process."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out_dir.mkdir(parents=True, exist_ok=True)
    turns.sequential_turns(client, platform.llm, agent_id, kind=kind, count=10)  # warm
    recorders: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    for child in platform.children:
        if child.name == "llm" or not child.alive():
            continue
        path = out_dir / f"pyspy-{kind}-{child.name}.txt"
        recorders[child.name] = (
            subprocess.Popen(
                [
                    *(spy, "record", "--pid", str(child.process.pid), "--subprocesses"),
                    *("--rate", str(RATE), "--format", "raw", "--output", str(path), "--nonblocking"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            path,
        )
    time.sleep(1.0)  # py-spy attaches
    turns.sequential_turns(client, platform.llm, agent_id, kind=kind, count=count)
    for process, _ in recorders.values():
        process.send_signal(signal.SIGINT)
    for process, _ in recorders.values():
        process.wait(timeout=30)
    return {name: path for name, (_, path) in recorders.items()}


def summary(path: Path, *, top: int = 25, turn_count: int = 1) -> str:
    """The frames with the most own time and the most inclusive time, in ms per turn."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    per_turn = 1000 / RATE / max(1, turn_count)
    lines = [f"{path.name}: {total * per_turn:.1f} ms of CPU samples per turn"]
    lines.append("  own:")
    lines += [f"    {n * per_turn:7.2f}  {frame}" for frame, n in own.most_common(top)]
    lines.append("  inclusive:")
    lines += [f"    {n * per_turn:7.2f}  {frame}" for frame, n in inclusive.most_common(top * 2)]
    return "\n".join(lines)
