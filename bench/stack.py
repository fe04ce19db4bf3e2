"""The platform as the benchmarks run it: the bench LLM server, daphne and Celery workers as subprocesses.

Every child runs in its own process group and gets SIGTERM if the benchmark process dies
(PR_SET_PDEATHSIG); `Platform.stop()` (also called on exit, on SIGTERM and on errors) stops each group,
then kills what is left after a grace period. Logs go to bench/results/logs/.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx

from bench.llm_server import BenchLLMClient

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LOG_DIR = ROOT / "bench" / "results" / "logs"
PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded here, not after fork
except OSError:
    _LIBC = None


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the benchmark process goes away (one syscall; no
    import or library loading happens between fork and exec)."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _service_pids() -> dict[str, int]:
    """The embedded PostgreSQL's postmaster (from its socket folder) and the Valkey server (by port)."""
    import psutil

    pids: dict[str, int] = {}
    query = parse_qs(urlparse(os.environ.get("DATABASE_URL", "")).query)
    with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
        pids["postgres"] = int((Path(query["host"][0]) / "postmaster.pid").read_text().split()[0])
    port = urlparse(os.environ.get("REDIS_URL", "")).port
    for process in psutil.process_iter(["name"]):
        if "valkey" not in (process.info["name"] or "") or port is None:
            continue
        with contextlib.suppress(psutil.Error):
            if any(c.laddr and c.laddr.port == port for c in process.net_connections()):
                pids["valkey"] = process.pid
    return pids


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class Platform:
    """daphne + `workers` Celery workers (`worker_concurrency` each) + the bench LLM server."""

    workers: int = 2
    worker_concurrency: int = 4
    worker_pool: str = "threads"
    log_level: str = "WARNING"
    # Under daphne requests run in as many threads as are served at once, each with its own Django
    # persistent connection (DATABASE_CONN_MAX_AGE, 300 s by default): without a bound they piled up
    # until PostgreSQL refused new clients (see bench/RESULTS.md). daphne gets a connection pool of
    # this size, as `make run` gives it; "0": no pool (web_conn_max_age then applies).
    web_db_pool: str = "16"
    web_conn_max_age: str = "0"
    children: list[Child] = field(default_factory=list)
    web_port: int = 0
    llm_port: int = 0

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def llm_root(self) -> str:
        return f"http://127.0.0.1:{self.llm_port}"

    @property
    def llm(self) -> BenchLLMClient:
        return BenchLLMClient(self.llm_root)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "OPENAI_BASE_URL": f"{self.llm_root}/v1",
            "OPENAI_API_KEY": "sk-bench",
            "RUN_EXECUTOR": "celery",
            "LOG_LEVEL": self.log_level,
            "LLM_MAX_ATTEMPTS": "2",
            "LLM_RETRY_BASE_DELAY": "0.01",
            "PYTHONUNBUFFERED": "1",
            # One key drives every agent at once: the per-key and per-organisation rates and the stream
            # cap (which their counters still cost, measured) must not be what the figures measure.
            "API_RATE_PER_KEY": os.environ.get("API_RATE_PER_KEY", "1000000/min"),
            "API_RATE_PER_ORG": os.environ.get("API_RATE_PER_ORG", "1000000/min"),
            "MAX_STREAMS_PER_USER": os.environ.get("MAX_STREAMS_PER_USER", "1000"),
        }

    def _spawn(self, name: str, command: list[str], **env: str) -> Child:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log = LOG_DIR / f"{name}.log"
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**self.env(), **env},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        child = Child(name, process, log)
        self.children.append(child)
        return child

    def start(self, timeout: float = 90.0) -> Platform:
        self.llm_port, self.web_port = free_port(), free_port()
        self._spawn("llm", [sys.executable, "-m", "bench.llm_server", "--port", str(self.llm_port)])
        self._spawn(
            "web",
            [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(self.web_port), "config.asgi:application"],
            DATABASE_CONN_MAX_AGE=self.web_conn_max_age,
            DATABASE_POOL_MAX_SIZE=self.web_db_pool,
        )
        for index in range(self.workers):
            self._spawn(
                f"worker{index + 1}",
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "config",
                    "worker",
                    "-l",
                    "info",
                    "-n",
                    f"bench{index + 1}-{os.getpid()}@%h",
                    "--concurrency",
                    str(self.worker_concurrency),
                    "--pool",
                    self.worker_pool,
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
                # prepared statements for the workers, as `make run` (config/settings.py)
                DATABASE_SERVER_SIDE_BINDING=os.environ.get("DATABASE_SERVER_SIDE_BINDING", "true"),
            )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = {child.name for child in self.children}
        while pending:
            for child in self.children:
                if child.name not in pending:
                    continue
                if not child.alive():
                    raise RuntimeError(f"{child.name} exited during start-up:\n{child.tail()}")
                if self._ready(child):
                    pending.discard(child.name)
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready after {timeout:.0f} s: {sorted(pending)}")
            time.sleep(0.2)

    def _ready(self, child: Child) -> bool:
        if child.name == "llm":
            return self.llm.healthy()
        if child.name == "web":
            try:
                return httpx.get(f"{self.web_url}/v1/health/", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        return "ready." in child.tail(20000)

    def pids(self, name: str) -> list[int]:
        """The child's process and its descendants (a prefork worker's pool processes)."""
        import psutil

        for child in self.children:
            if child.name == name and child.alive():
                process = psutil.Process(child.process.pid)
                return [process.pid, *(p.pid for p in process.children(recursive=True))]
        return []

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) used so far by each part of the platform, children included (a
        process tree's reaped children count through its `children_*` times): daphne, the workers, the
        LLM server, PostgreSQL (postmaster and backends), Valkey, and this benchmark process (the client)."""
        import psutil

        def tree(pid: int) -> float:
            try:
                root = psutil.Process(pid)
                t = root.cpu_times()
                total = t.user + t.system + t.children_user + t.children_system
                for child in root.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        c = child.cpu_times()
                        total += c.user + c.system
                return total
            except psutil.Error:
                return 0.0

        out = {c.name: tree(c.process.pid) for c in self.children if c.alive()}
        workers = [name for name in out if name.startswith("worker")]
        out["workers"] = sum(out.pop(name) for name in workers)
        for name, pid in _service_pids().items():
            out[name] = tree(pid)
        me = psutil.Process().cpu_times()
        out["client"] = me.user + me.system
        return out

    def check_alive(self) -> None:
        for child in self.children:
            if not child.alive():
                raise RuntimeError(f"{child.name} died (exit {child.process.returncode}):\n{child.tail()}")

    def stop(self, grace: float = 15.0, names: set[str] | None = None) -> None:
        """Stop the children (only those named, if given), group by group."""
        chosen = [c for c in self.children if names is None or c.name in names]
        for child in chosen:
            if child.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in chosen:
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait(timeout=5)
            # A prefork pool's children share the group; make sure none is left behind.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.process.pid, signal.SIGKILL)
        self.children = [c for c in self.children if c not in chosen]

    def stop_servers(self) -> None:
        """Stop daphne and the workers; keep the LLM server (in-process figures still call it)."""
        self.stop(names={c.name for c in self.children if c.name != "llm"})

    def __enter__(self) -> Platform:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
