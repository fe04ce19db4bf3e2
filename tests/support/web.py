"""The web process (`python -m config.serve`, what `make run` and the compose files start) as a child
process, and URLs of other databases on the test's PostgreSQL server."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from django.db import connection

from tests.support.workers import ROOT, _die_with_parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def database_url(name: str) -> str:
    """The URL of database `name` on the server of the test database, for processes outside this one."""
    params = connection.settings_dict
    host = params.get("HOST") or params.get("OPTIONS", {}).get("host", "")
    password = params["PASSWORD"] or ""
    if host.startswith("/"):
        return f"postgresql://{params['USER']}:{password}@/{name}?host={host}"
    return f"postgresql://{params['USER']}:{password}@{host}:{params['PORT'] or 5432}/{name}"


class WebProcess:
    """`python -m config.serve` on a free port; `url` is its base address."""

    def __init__(self, env: dict[str, str], log_dir: Path, name: str = "web") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"{name}.log"
        command = ["-m", "config.serve", "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"]
        self.process = subprocess.Popen(
            [sys.executable, *command],
            cwd=ROOT,
            env={**env, "DATABASE_CONN_MAX_AGE": "0", "PYTHONUNBUFFERED": "1"},
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )

    def wait_ready(self, timeout: float = 60) -> WebProcess:
        """Until /v1/ready answers 200 (PostgreSQL, Redis, migrations)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the web process did not get ready:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/v1/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
