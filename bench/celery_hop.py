"""What the Celery hop of a turn costs: publishing a task (the web process's `send_task`) and a worker taking
it (`celery -A config worker --pool threads`, as `make run` starts it) for a task that does nothing
(bench.celery_noop), one at a time, on the platform's own Celery app and broker settings.

    echo ".venv/bin/python -m bench.celery_hop [--tasks 2000] [--rounds 3] [--trees A,B]" | \\
        DATA_DIR=var/bench python scripts/devenv.py shell

Per round: the publisher's CPU per publish (thread time, this process) and the worker's CPU per task
(/proc: every thread of the worker process), after a warm-up. `--trees A,B`: other checkouts of the code
(the same Celery settings module), each round alternating which tree's worker and publisher run first,
so the machine's slow phases fall on both. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKER_ARGS = (
    *("-A", "config", "worker", "-l", "warning", "--include", "bench.celery_noop"),
    *(
        "--pool",
        "threads",
        "--concurrency",
        "4",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ),
)

_PUBLISHER = """
import json, os, sys, time
sys.path.insert(0, os.getcwd())
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django; django.setup()
import redis
from django.conf import settings
from config.celery import app
client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
worker, count = int(sys.argv[1]), int(sys.argv[2])

def worker_cpu():
    return sum(
        int(open(f"/proc/{worker}/task/{t}/schedstat").read().split()[0]) for t in os.listdir(f"/proc/{worker}/task")
    )

def one():
    started = time.thread_time_ns()
    app.send_task("bench.celery_noop", args=["run-x", "agent-y", None])
    spent = time.thread_time_ns() - started
    deadline = time.monotonic() + 10
    while client.llen("celery") or client.hlen("unacked"):
        if time.monotonic() > deadline:
            raise SystemExit("the worker took no task for 10 s")
        time.sleep(0.0002)
    return spent

for _ in range(50):
    one()
time.sleep(0.5)
before, publish = worker_cpu(), 0
for _ in range(count):
    publish += one()
time.sleep(0.2)
print(json.dumps({"publish_us": publish / count / 1000, "worker_task_us": (worker_cpu() - before) / count / 1000}))
"""


def _round(tree: Path, tasks: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    log = ROOT / "bench" / "results" / "logs" / "celery-hop-worker.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", *WORKER_ARGS],
        cwd=tree,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        time.sleep(6)  # the worker starts (Django, litellm)
        out = subprocess.run(
            [sys.executable, "-c", _PUBLISHER, str(worker.pid), str(tasks)],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        ).stdout
        return {k: round(v, 1) for k, v in json.loads(out.strip().splitlines()[-1]).items()}
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--trees", default="", help="comma-separated checkouts to compare (default: this one)"
    )
    args = parser.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",") if t] or [ROOT]
    runs: dict[str, list[dict[str, float]]] = {str(t): [] for t in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else list(reversed(trees)):
            runs[str(tree)].append(_round(tree, args.tasks))
    summary: dict[str, Any] = {}
    for name, got in runs.items():
        summary[name] = {
            key: {"median": round(statistics.median(g[key] for g in got), 1), "runs": [g[key] for g in got]}
            for key in ("publish_us", "worker_task_us")
        }
    print(
        json.dumps({"tasks": args.tasks, "rounds": args.rounds, "load": os.getloadavg(), **summary}, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
