"""Real Celery workers for tests: separate processes on the test database and the test Redis."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def test_database_url() -> str:
    """The URL of the database pytest-django created, for processes outside this one."""
    params = connection.settings_dict
    host = params.get("HOST") or params.get("OPTIONS", {}).get("host", "")
    if host.startswith("/"):
        return f"postgresql://{params['USER']}:{params['PASSWORD'] or ''}@/{params['NAME']}?host={host}"
    return (
        f"postgresql://{params['USER']}:{params['PASSWORD']}@{host}:{params['PORT'] or 5432}/{params['NAME']}"
    )


def _die_with_parent() -> None:  # runs in the child before exec
    """Own process group (so kill() reaches the pool), and SIGKILL when the test process dies, so an
    interrupted test run never leaves a worker consuming the next run's queue."""
    os.setsid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


PR_SET_PDEATHSIG = 1
DEFAULT_POOL = os.environ.get("WORKER_POOL", "threads")
"""The pool `make run` uses (scripts/devenv.py); tests of crashes and ordering also run the other."""


class WorkerProcess:
    """`celery worker` as a child process; `kill()` sends SIGKILL, as a crashing machine would."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        log_dir: Path,
        concurrency: int = 1,
        queues: str = "celery",
        pool: str = DEFAULT_POOL,
    ) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        self.process = subprocess.Popen(
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
                f"{name}@%h",
                "--concurrency",
                str(concurrency),
                "--pool",
                pool,
                "--without-gossip",
                "--without-mingle",
                "-Q",
                queues,
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )

    def wait_ready(self, timeout: float = 60) -> WorkerProcess:
        deadline = time.monotonic() + timeout
        while "ready." not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.name} did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        return self

    @property
    def hostname(self) -> str:
        return f"{self.name}@{socket.gethostname()}"

    def wait_idle(self, timeout: float = 20) -> None:
        """Until the worker has no task running or reserved (asked over the broker; each answer comes at
        once: one destination, limit 1). A worker that does not answer is taken as idle."""
        from config.celery import app

        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            inspect = app.control.inspect(destination=[self.hostname], timeout=2.0, limit=1)
            replies = (inspect.active() or {}, inspect.reserved() or {})
            if not any(tasks for reply in replies for tasks in reply.values()):
                return
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the whole process group (main process and its pool children)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def worker_env(llm_url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": test_database_url(),
        "OPENAI_BASE_URL": llm_url,
        "OPENAI_API_KEY": "sk-test",
        "LLM_MAX_ATTEMPTS": "3",
        "LLM_RETRY_BASE_DELAY": "0.001",
        "LLM_RETRY_MAX_DELAY": "0.01",
        "RUN_EXECUTOR": "celery",
        # prepared statements, as `make run` starts its workers (scripts/devenv.py)
        "DATABASE_SERVER_SIDE_BINDING": os.environ.get("WORKER_DATABASE_SERVER_SIDE_BINDING", "true"),
        **extra,
    }
