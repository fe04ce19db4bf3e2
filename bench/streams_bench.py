"""Concurrent SSE streams on one web process: memory per 1,000 clients and write -> arrival latency.

    echo "python -m bench.streams_bench" | python scripts/devenv.py shell
    python -m bench.streams_bench --clients 2000 --runs 200 --rounds 3 --web-root /tmp/old-checkout

One daphne process (config.asgi, a pool of 16 database connections, MAX_STREAMS_PER_USER=0 and the
request rates raised: one user opens every stream). 200 agents each get a running Run; the clients (a
separate asyncio process, raw HTTP/1.1 with chunked decoding, so that it is not the bottleneck) attach
to GET /v1/runs/{id}/stream with the API key, spread evenly over the runs. The bench then writes events
straight into the runs' Redis Streams (apps.streams.events.append_events, as a worker would), each
carrying its write time, paced evenly over the runs, and the clients record time of arrival - write time
(same host clock). At the end every run gets its end event and each client must see [DONE] and every
event written to its run exactly once.

Per round: the web process's RSS before any client, with half and with all of them connected; its
threads and the Redis connections then; latency p50/p95/p99 over every delivery; CPU seconds of the web
process and of the client process while writing; the web process's garbage-collector pauses of 1 ms or
more while connecting and while writing (longest, sum, count by generation: the latency tail).
`--web-root` runs daphne from another checkout (e.g. `git archive HEAD | tar -x -C /tmp/old`) to compare
code paths.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONNECT_CONCURRENCY = 64


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))


# --- the client process -----------------------------------------------------------------------------


class Clients:
    def __init__(self, port: int, key: str, run_ids: list[str]) -> None:
        self.port, self.key, self.run_ids = port, key, run_ids
        self.tasks: list[asyncio.Task[None]] = []
        self.connected = 0
        self.failed: list[str] = []
        self.latencies: list[float] = []
        self.received: dict[int, list[str]] = {}  # client -> event ids, in order
        self.done = 0
        self.gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def connect(self, n: int) -> None:
        """Open n more streams; returns once their requests are sent (daphne sends the headers with the
        first bytes of the body: see wait_connected)."""
        sent = []
        for _ in range(n):
            index = len(self.tasks)
            requested = asyncio.get_running_loop().create_future()
            sent.append(requested)
            self.tasks.append(
                asyncio.create_task(self.one(index, self.run_ids[index % len(self.run_ids)], requested))
            )
        await asyncio.gather(*sent)

    async def wait_connected(self, n: int, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while self.connected + len(self.failed) < n and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def one(self, index: int, run_id: str, requested: asyncio.Future[None]) -> None:
        try:
            async with self.gate:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port, limit=2**20)
                writer.write(
                    f"GET /v1/runs/{run_id}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {self.key}\r\nAccept: text/event-stream\r\n\r\n".encode()
                )
                await writer.drain()
            requested.set_result(None)
            status = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            if b" 200 " not in status:
                raise RuntimeError(status.decode(errors="replace").strip() or "no answer")
            self.connected += 1
        except Exception as exc:  # counted, reported
            self.failed.append(repr(exc))
            if not requested.done():
                requested.set_result(None)
            return
        ids = self.received.setdefault(index, [])
        try:
            while True:
                size = int((await reader.readline()).strip() or b"0", 16)
                if size == 0:
                    break
                data = await reader.readexactly(size + 2)
                now = time.time()
                for line in data.split(b"\n"):
                    if line.startswith(b"data: {"):
                        item = json.loads(line[6:])
                        if "bench_t" in item:
                            self.latencies.append(now - item["bench_t"])
                            ids.append(item["id"])
                    elif line.startswith(b"data: [DONE]"):
                        self.done += 1
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            self.failed.append(repr(exc))
        finally:
            writer.close()


def client_main(conn: Any, port: int, key: str, run_ids: list[str]) -> None:
    _raise_fd_limit()

    async def serve() -> None:
        clients = Clients(port, key, run_ids)
        loop = asyncio.get_running_loop()
        while True:
            command, arg = await loop.run_in_executor(None, conn.recv)
            if command == "connect":
                await clients.connect(arg)
                conn.send({"requested": len(clients.tasks)})
            elif command == "wait_connected":
                await clients.wait_connected(*arg)
                conn.send(
                    {
                        "connected": clients.connected,
                        "failed": clients.failed[:5],
                        "n_failed": len(clients.failed),
                    }
                )
            elif command == "collect":
                latencies, clients.latencies = clients.latencies, []
                conn.send({"latencies": latencies, "cpu_s": sum(os.times()[:2])})
            elif command == "finish":
                await asyncio.wait(clients.tasks, timeout=arg)  # a client's task ends with its stream
                conn.send(
                    {
                        "done": clients.done,
                        "received": clients.received,
                        "n_failed": len(clients.failed),
                        "failed": clients.failed[:5],
                    }
                )
                for task in clients.tasks:
                    task.cancel()
                return

    asyncio.run(serve())


# --- the bench ---------------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# daphne with a garbage-collector probe (gc_log), and under pyinstrument for --profile: SIGUSR1 starts
# sampling (the event loop's thread), SIGUSR2 stops it and writes the report to the path given (one run
# per writing phase).
DAPHNE = """
import gc, os, signal, sys, time
from daphne.cli import CommandLineInterface
# Every collection of 1 ms or more, to BENCH_GC_LOG: the pauses every stream's events wait behind.
log, began = open(os.environ["BENCH_GC_LOG"], "a", buffering=1), [0.0]
def timed(phase, info):
    if phase == "start":
        began[0] = time.perf_counter()
    elif (pause := time.perf_counter() - began[0]) >= 0.001:
        log.write(f"{time.time():.3f} {info['generation']} {pause * 1000:.2f}\\n")
gc.callbacks.append(timed)
out = sys.argv.pop(1)
if out:
    from pyinstrument import Profiler
    profiler = Profiler(interval=0.0005, async_mode="disabled")
    def start(*_): profiler.start()
    def stop(*_):
        profiler.stop()
        profiler.last_session.save(out + ".pyisession")  # pyinstrument --load=... for other views
        with open(out, "w") as f: f.write(profiler.output_text(unicode=False, color=False, show_all=False))
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
sys.argv[0] = "daphne"
CommandLineInterface.entrypoint()
"""


def gc_log(web_log: Path) -> Path:
    """Where DAPHNE writes the collections of the web process that logs to web_log."""
    return web_log.with_suffix(".gc")


def gc_pauses(log: Path, since: float, until: float) -> dict[str, Any]:
    """The web process's collections of 1 ms or more between two times (DAPHNE's log): how many of each
    generation, the longest and their sum."""
    pauses = []
    for line in log.read_text().splitlines() if log.exists() else ():
        at, generation, ms = line.split()
        if since <= float(at) <= until:
            pauses.append((int(generation), float(ms)))
    return {
        "collections_by_generation": {g: sum(1 for p in pauses if p[0] == g) for g in (0, 1, 2)},
        "longest_ms": max((ms for _, ms in pauses), default=0.0),
        "total_ms": round(sum(ms for _, ms in pauses), 1),
    }


def start_web(web_root: Path, port: int, log: Path, profile: str = "") -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "MAX_STREAMS_PER_USER": "0",
        "API_RATE_PER_KEY": "100000000/min",
        "API_RATE_PER_ORG": "100000000/min",
        "DATABASE_POOL_MAX_SIZE": "16",
        "DATABASE_CONN_MAX_AGE": "0",
        "LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(web_root),
    }
    env["BENCH_GC_LOG"] = str(gc_log(log))
    gc_log(log).unlink(missing_ok=True)
    command = [sys.executable, "-c", DAPHNE, profile]
    process = subprocess.Popen(
        [
            *command,
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "config.asgi:application",
        ],
        cwd=web_root,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_raise_fd_limit,
    )
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"daphne exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health/", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("daphne not ready")


def redis_clients() -> dict[str, int]:
    from apps.streams.redis_client import get_redis

    clients = get_redis().client_list()
    return {
        "total": len(clients),
        "blocked_in_xread": sum(1 for c in clients if c.get("cmd") == "xread" and "b" in c.get("flags", "")),
        "hub": sum(1 for c in clients if c.get("name", "").startswith("stream-hub")),
    }


def one_round(args: argparse.Namespace, tenant: Any, agents: list[str], round_no: int) -> dict[str, Any]:
    import psutil

    from apps.agents.models import Run
    from apps.streams.events import append_events, end_stream, stream_key
    from apps.streams.redis_client import get_redis

    runs = [
        Run.objects.for_actor(tenant.actor).create(agent_id=agent_id, status=Run.Status.RUNNING).id
        for agent_id in agents
    ]
    port = free_port()
    log_dir = ROOT / "bench" / "results" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    profile = f"{args.profile}.{round_no}" if args.profile else ""
    web_log = log_dir / f"streams-web-{round_no}.log"
    web = start_web(Path(args.web_root), port, web_log, profile)
    web_ps = psutil.Process(web.pid)
    parent, child = multiprocessing.get_context("spawn").Pipe()
    client = multiprocessing.get_context("spawn").Process(
        target=client_main, args=(child, port, tenant.api_key, runs), daemon=True
    )
    client.start()
    client_ps = psutil.Process(client.pid)
    result: dict[str, Any] = {"load_before": os.getloadavg()}
    try:
        time.sleep(1.0)
        result["rss_base_mib"] = web_ps.memory_info().rss / 2**20
        result["threads_base"] = web_ps.num_threads()
        half = args.clients // 2
        started = time.monotonic()

        def connect(total: int) -> dict[str, Any]:
            parent.send(("connect", total - (half if total > half else 0)))
            parent.recv()
            time.sleep(1.0)
            # A first event on every run: daphne sends a stream's headers with its first bytes.
            for run in runs:
                append_events(run, [{"message_type": "assistant_message", "id": f"message-{uuid.uuid4()}"}])
            parent.send(("wait_connected", (total, 120.0)))
            return dict(parent.recv())

        first = connect(half)
        time.sleep(2.0)
        result["rss_half_mib"] = web_ps.memory_info().rss / 2**20
        second = connect(args.clients)
        result["connect_s"] = time.monotonic() - started
        result["connected"] = second["connected"]
        result["connect_failures"] = second["n_failed"]
        result["connect_failure_examples"] = second["failed"]
        time.sleep(3.0)
        result["rss_all_mib"] = web_ps.memory_info().rss / 2**20
        result["threads_all"] = web_ps.num_threads()
        result["redis_clients"] = redis_clients()
        result["connected_half"] = first["connected"]

        # Writing: `rate` events per second per run, paced evenly over the runs.
        parent.send(("collect", None))
        parent.recv()
        if profile:
            web.send_signal(signal.SIGUSR1)
        web_cpu, client_cpu = sum(web_ps.cpu_times()[:2]), sum(client_ps.cpu_times()[:2])
        written: dict[str, list[str]] = {run: [] for run in runs}
        interval = 1.0 / (args.rate * len(runs))
        began, began_at = time.monotonic(), time.time()
        n = 0
        while time.monotonic() - began < args.seconds:
            run = runs[n % len(runs)]
            event_id = f"message-{uuid.uuid4()}"
            append_events(
                run,
                [
                    {
                        "message_type": "assistant_message",
                        "id": event_id,
                        "content": "tick",
                        "bench_t": time.time(),
                    }
                ],
            )
            written[run].append(event_id)
            n += 1
            pause = began + n * interval - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        time.sleep(1.0)
        elapsed = time.monotonic() - began
        result["web_gc_connecting"] = gc_pauses(gc_log(web_log), 0.0, began_at)
        result["web_gc_writing"] = writing = gc_pauses(gc_log(web_log), began_at, time.time())
        result["gc_longest_pause_writing_ms"] = writing["longest_ms"]
        result["gc_paused_writing_ms"] = writing["total_ms"]
        parent.send(("collect", None))
        latencies = parent.recv()["latencies"]
        result["web_cpu_s_per_s"] = (sum(web_ps.cpu_times()[:2]) - web_cpu) / elapsed
        result["client_cpu_s_per_s"] = (sum(client_ps.cpu_times()[:2]) - client_cpu) / elapsed
        if profile:
            web.send_signal(signal.SIGUSR2)
        result["events_written"] = n
        result["deliveries"] = len(latencies)
        ordered = sorted(latencies)
        if ordered:
            for q in (50, 95, 99):
                result[f"latency_p{q}_ms"] = (
                    ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] * 1000
                )
            result["latency_max_ms"] = ordered[-1] * 1000

        for run in runs:
            end_stream(run, status="completed", stop_reason="end_turn")
        parent.send(("finish", 60.0))
        finished = parent.recv()
        result["done"] = finished["done"]
        result["stream_failures"] = finished["n_failed"]
        expected = {index: written[runs[index % len(runs)]] for index in range(result["connected"])}
        result["clients_with_every_event_once"] = sum(
            1 for index, ids in expected.items() if finished["received"].get(index) == ids
        )
    finally:
        client.join(timeout=10)
        if client.is_alive():
            client.kill()
        web.terminate()
        try:
            web.wait(timeout=15)
        except subprocess.TimeoutExpired:
            web.kill()
        get_redis().delete(*(stream_key(run) for run in runs))
        Run.all_objects.filter(id__in=runs).delete()
    result["load_after"] = os.getloadavg()
    half_clients = max(1, result.get("connected_half", 1))
    result["rss_per_1000_mib"] = (
        (result["rss_all_mib"] - result["rss_base_mib"]) / max(1, result["connected"]) * 1000
    )
    result["rss_per_1000_first_half_mib"] = (
        (result["rss_half_mib"] - result["rss_base_mib"]) / half_clients * 1000
    )
    # The second half alone: what each further client costs, past the first requests' one-off growth.
    result["rss_per_1000_second_half_mib"] = (
        (result["rss_all_mib"] - result["rss_half_mib"]) / max(1, result["connected"] - half_clients) * 1000
    )
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=200, help="agents, one running run each")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1.0, help="events per second per run")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long events are written")
    parser.add_argument("--web-root", default=str(ROOT), help="the checkout daphne runs from")
    parser.add_argument("--out", default="")
    parser.add_argument(
        "--profile", default="", help="sample daphne with pyinstrument while writing; report to PATH.<round>"
    )
    args = parser.parse_args(argv)
    _raise_fd_limit()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from bench.run import Tenant

    tenant = Tenant()
    rounds = []
    try:
        started = time.monotonic()
        agents = [tenant.agent() for _ in range(args.runs)]
        print(f"{args.runs} agents in {time.monotonic() - started:.1f} s", flush=True)
        for round_no in range(1, args.rounds + 1):
            result = one_round(args, tenant, agents, round_no)
            rounds.append(result)
            print(json.dumps({"round": round_no, **result}, default=str), flush=True)
    finally:
        tenant.delete()

    def fig(name: str) -> str:
        values = [r[name] for r in rounds if name in r]
        if not values:
            return "-"
        return f"{statistics.median(values):.2f} (spread {max(values) - min(values):.2f}, runs {[round(v, 2) for v in values]})"

    summary = {
        "clients": args.clients,
        "runs": args.runs,
        "rate_per_run": args.rate,
        "web_root": args.web_root,
        **{
            name: fig(name)
            for name in (
                "connected",
                "rss_base_mib",
                "rss_all_mib",
                "rss_per_1000_mib",
                "rss_per_1000_second_half_mib",
                "threads_all",
                "latency_p50_ms",
                "latency_p95_ms",
                "latency_p99_ms",
                "latency_max_ms",
                "web_cpu_s_per_s",
                "gc_longest_pause_writing_ms",
                "gc_paused_writing_ms",
                "client_cpu_s_per_s",
                "clients_with_every_event_once",
                "done",
                "connect_s",
            )
        },
        "redis_clients": [r.get("redis_clients") for r in rounds],
    }
    print(json.dumps(summary, indent=2), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "rounds": rounds}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
