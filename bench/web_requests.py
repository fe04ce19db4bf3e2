"""The web process's CPU per request, by kind of request, with two checkouts alternated.

`echo ".venv/bin/python -m bench.web_requests --trees /work/main,/work/base" | DATA_DIR=var/bench
.venv/bin/python scripts/devenv.py shell` (after `devenv.py manage migrate` in that DATA_DIR): each round
starts the platform from one tree after the other (bench/stack.py: daphne, one Celery worker, the bench LLM
server; the order reversed every other round), then sends each kind of request back to back from one
keep-alive client (`--clients N`: N at once, each with its agent) and reads daphne's CPU time (user +
system, /proc) around them:

- `health`: `GET /v1/health/` (no authentication, no database);
- `retrieve`: `GET /v1/agents/{id}` with an API key (authentication, the agent's rows, JSON; httpx's
  User-Agent is a pre-1.0 client's, so the agent comes with every relationship);
- `send`: a blocking simple turn, `POST /v1/agents/{id}/messages` (the run's insert, the Celery publish,
  the wait for its events on the event loop, the answer): the web side of every SDK turn;
- `stream`: the same turn streamed with `stream_tokens` (`POST .../messages/stream`), read to `[DONE]`.

Prints, per tree and kind, the median of the rounds' microseconds of web CPU per request and their spread,
and PostgreSQL's (`<kind>_postgres`: every backend, so a send's includes its worker's statements).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import django

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench import stack, turns  # noqa: E402
from bench.run import Tenant, log  # noqa: E402
from bench.stats import machine_speed_ms  # noqa: E402

KINDS = ("health", "retrieve", "send", "stream")


def web_cpu_s(platform: stack.Platform) -> float:
    web = next(child for child in platform.children if child.name == "web")
    times = psutil.Process(web.process.pid).cpu_times()
    return times.user + times.system


def postgres_cpu_s() -> float:
    """PostgreSQL's CPU time so far: the postmaster and every backend (the workers' too)."""
    return stack.Platform().cpu_seconds()["postgres"]


def request(client: httpx.Client, kind: str, agent_id: str, index: int) -> None:
    if kind == "health":
        response = client.get("/v1/health/")
    elif kind == "retrieve":
        response = client.get(f"/v1/agents/{agent_id}")
    elif kind == "stream":
        body = {
            "messages": [{"role": "user", "content": turns.turn_text(turns.SIMPLE, index)}],
            "stream_tokens": True,
        }
        with client.stream("POST", f"/v1/agents/{agent_id}/messages/stream", json=body) as response:
            text = "".join(response.iter_text())
        if response.status_code == 200 and not text.rstrip().endswith("data: [DONE]"):
            raise RuntimeError(f"stream: no [DONE] in {text[-300:]!r}")
    else:
        body = {"messages": [{"role": "user", "content": turns.turn_text(turns.SIMPLE, index)}]}
        response = client.post(f"/v1/agents/{agent_id}/messages", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"{kind}: {response.status_code} {response.text[:300]}")


def one_round(tree: Path, tenant: Tenant, counts: dict[str, int], clients: int) -> dict[str, float]:
    stack.ROOT = tree  # the children run from this checkout (cwd), on the same databases
    platform = stack.Platform(workers=1, worker_concurrency=max(2, clients))
    out: dict[str, float] = {}
    headers = {"Authorization": f"Bearer {tenant.api_key}"}

    failures: list[BaseException] = []

    def requests(kind: str, agent_id: str, indexes: range) -> None:
        try:
            with httpx.Client(base_url=platform.web_url, headers=headers, timeout=60) as client:
                for index in indexes:
                    request(client, kind, agent_id, index)
        except BaseException as exc:  # raised after the join: a figure over failed requests is no figure
            failures.append(exc)

    try:
        platform.start()
        agent_ids = [tenant.agent() for _ in range(clients)]  # one run at a time per agent
        for kind in KINDS:
            # warm (the code paths, the connection pool, prepared statements), then measure: each client
            # its share of the requests, all at once
            for first, count in ((0, 20 * clients), (1000, counts[kind])):
                share = count // clients
                threads = [
                    threading.Thread(
                        target=requests,
                        args=(kind, agent_id, range(first + n * share, first + (n + 1) * share)),
                    )
                    for n, agent_id in enumerate(agent_ids)
                ]
                before, pg_before = web_cpu_s(platform), postgres_cpu_s()
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                if failures:
                    raise failures[0]
            out[kind] = (web_cpu_s(platform) - before) * 1e6 / (share * clients)
            out[f"{kind}_postgres"] = (postgres_cpu_s() - pg_before) * 1e6 / (share * clients)
        platform.check_alive()
    finally:
        platform.stop()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trees", default=str(ROOT), help="comma-separated checkouts to A/B")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=1000, help="health and retrieve requests a round")
    parser.add_argument("--sends", type=int, default=300, help="blocking sends (and streams) a round")
    parser.add_argument("--clients", type=int, default=1, help="clients sending at once (each its agent)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "web-requests.json"))
    args = parser.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    counts = {"health": args.requests, "retrieve": args.requests, "send": args.sends, "stream": args.sends}
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "speed_at_start_ms": machine_speed_ms(),
        "config": vars(args),
        "rounds": {str(t): [] for t in trees},
    }
    tenant = Tenant()
    try:
        for index in range(args.rounds):
            for tree in trees if index % 2 == 0 else trees[::-1]:
                got = one_round(tree, tenant, counts, args.clients)
                results["rounds"][str(tree)].append(got)
                log(
                    f"{tree.name} round {index + 1}: web CPU us/request "
                    + json.dumps({k: round(v) for k, v in got.items()})
                )
    finally:
        tenant.delete()
    results["speed_at_end_ms"] = machine_speed_ms()
    results["summary"] = {
        tree: {
            kind: {
                "median_us": round(statistics.median(r[kind] for r in rounds)),
                "spread_us": round(max(r[kind] for r in rounds) - min(r[kind] for r in rounds)),
            }
            for kind in (*KINDS, *(f"{kind}_postgres" for kind in KINDS))
        }
        for tree, rounds in results["rounds"].items()
        if rounds
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(json.dumps(results["summary"], indent=2))
    print(f"machine speed {results['speed_at_start_ms']} -> {results['speed_at_end_ms']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
