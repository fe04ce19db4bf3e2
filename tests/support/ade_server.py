"""The whole platform as a browser sees it: daphne (HTTP + WebSockets) as a child process on the test
database and Redis, plus helpers to find Debian's Chromium for Playwright."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.workers import ROOT, _die_with_parent

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AdeServer:
    """`daphne config.asgi:application` on a free port; `url` is its base address."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / "daphne.log"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "config.asgi:application",
            ],
            cwd=ROOT,
            env={
                **env,
                "WHITENOISE_USE_FINDERS": "true",  # static files straight from the apps
                "DATABASE_CONN_MAX_AGE": "0",
                "PYTHONUNBUFFERED": "1",
            },
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )

    def wait_ready(self, timeout: float = 60) -> AdeServer:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daphne did not start:\n{self.log.read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
