"""`make run` end to end: embedded services, bootstrap, daphne + Celery, Ctrl-C, and a restart that keeps data.

Runs `scripts/devenv.py run` (what `make run` calls once the virtualenv exists) as a real process tree.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "sk-let-make-run-test-key-0001"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Inside the checkout, not pytest's tmp (mode 0700): the embedded PostgreSQL runs as its own user.
    path = ROOT / "var" / f"make-run-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_platform(
    data_dir: Path, port: int, *, startup_timeout: float = 120, **extra_env: str
) -> tuple[subprocess.Popen[str], Path]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "SECRETS_ENCRYPTION_KEY"}
    }
    env |= {
        "DATA_DIR": str(data_dir),
        "PORT": str(port),
        "BOOTSTRAP_API_KEY": API_KEY,
        "DJANGO_SUPERUSER_USERNAME": "root",
        "DJANGO_SUPERUSER_PASSWORD": "a-long-password-1",
        "WORKER_CONCURRENCY": "1",
        **extra_env,
    }
    log = data_dir.parent / f"{data_dir.name}.log"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "devenv.py"), "run"],
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health/", timeout=2).status_code == 200:
                return process, log
        except httpx.HTTPError:
            pass
        assert process.poll() is None, log.read_text()[-3000:]
        time.sleep(0.5)
    raise AssertionError(f"platform did not answer in time:\n{log.read_text()[-3000:]}")


def wait_for_log(log: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"{text!r} never appeared:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


def press_ctrl_c(process: subprocess.Popen[str]) -> int:
    os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C goes to the whole foreground group
    return process.wait(timeout=60)


TOOL = '''
def whoami() -> dict:
    """Says who runs it."""
    import os
    return {"uid": os.getuid()}
'''


def docker_answers() -> bool:
    docker = shutil.which("docker")
    return bool(docker) and subprocess.run([docker, "info"], capture_output=True, check=False).returncode == 0


def test_make_run_makes_the_sandbox_image_and_answers_the_first_tool_call_from_docker(data_dir):
    if not docker_answers():
        pytest.skip("no Docker engine answers")
    image = f"letta-sandbox-base:make-run-{uuid.uuid4().hex[:8]}"  # absent: as on a fresh engine
    port = free_port()
    data_dir.mkdir(parents=True)
    try:
        # Building the image comes first: allow for it on a loaded machine (CI once took over 120 s).
        process, log = start_platform(
            data_dir, port, startup_timeout=360, SANDBOX_BASE_IMAGE=image, SANDBOX_PULL_IMAGES="false"
        )
        ran = httpx.post(
            f"http://127.0.0.1:{port}/v1/tools/run",
            headers={"Authorization": f"Bearer {API_KEY}"},
            json={"source_code": TOOL, "args": {}},
            timeout=60,
        )
        press_ctrl_c(process)
    finally:
        subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True, check=False)

    assert f"building the sandbox image {image}" in log.read_text()
    assert ran.status_code == 200
    assert (ran.json()["status"], ran.json()["sandbox"]) == ("success", "docker")
    assert ran.json()["tool_return"] == '{"uid": 65534}'


def test_make_run_serves_stops_cleanly_and_keeps_data_between_runs(data_dir):
    port = free_port()
    data_dir.mkdir(parents=True)
    headers = {"Authorization": f"Bearer {API_KEY}"}

    process, log = start_platform(data_dir, port)
    wait_for_log(log, "celery@")  # the Celery worker is up as well
    wait_for_log(log, "ready.")
    created = httpx.post(
        f"http://127.0.0.1:{port}/v1/blocks/", headers=headers, json={"label": "human", "value": "Name: Sam"}
    ).json()
    admin_css = httpx.get(f"http://127.0.0.1:{port}/static/admin/css/base.css")
    login = httpx.get(f"http://127.0.0.1:{port}/admin/login/")
    first_exit = press_ctrl_c(process)
    first_log = log.read_text()

    assert created["id"].startswith("block-")
    assert admin_css.status_code == 200
    assert login.status_code == 200
    assert first_exit == 0
    assert f"API key (shown once, store it now): {API_KEY}" in first_log
    assert not (data_dir / "postgres" / "postmaster.pid").exists()  # PostgreSQL was stopped too
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/v1/health/", timeout=2)

    process, log = start_platform(data_dir, port)
    fetched = httpx.get(f"http://127.0.0.1:{port}/v1/blocks/{created['id']}", headers=headers)
    second_exit = press_ctrl_c(process)

    assert fetched.status_code == 200
    assert fetched.json()["value"] == "Name: Sam"
    assert second_exit == 0
    assert "shown once" not in log.read_text()


def test_a_crashed_worker_is_restarted_while_the_web_keeps_serving(data_dir):
    import psutil

    port = free_port()
    data_dir.mkdir(parents=True)
    process, log = start_platform(data_dir, port)
    try:
        wait_for_log(log, "celery@")
        platform = psutil.Process(process.pid)
        [worker] = [
            child
            for child in platform.children()
            if "worker" in child.cmdline() and any(part.endswith("celery") for part in child.cmdline())
        ]
        worker.kill()  # -9: no chance to clean up
        wait_for_log(log, "worker exited with -9; restarting it in 1 s")
        during = httpx.get(f"http://127.0.0.1:{port}/v1/health/", timeout=5)
        wait_for_log(log, "restarting worker")
        deadline = time.monotonic() + 60
        while log.read_text().count("celery@") < 2:  # the new worker's banner
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        after = httpx.get(f"http://127.0.0.1:{port}/v1/health/", timeout=5)
        alive = process.poll() is None
    finally:
        exit_code = press_ctrl_c(process)

    assert during.status_code == 200
    assert after.status_code == 200
    assert alive
    assert exit_code == 0
    assert "stopping the platform" not in log.read_text()


@pytest.mark.parametrize(
    ("runs", "delays"),
    [
        ([0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5], [1, 2, 4, 8, 16, 30, 30]),  # a crash loop backs off to 30 s
        ([0.5, 0.5, 120.0, 0.5], [1, 2, 1, 2]),  # a child that ran a while counts afresh
    ],
)
def test_restarts_back_off_and_forgive_a_child_that_ran_a_while(runs, delays):
    from scripts.devenv import Restarts

    restarts = Restarts()

    assert [restarts.after_exit(ran_for=seconds) for seconds in runs] == delays
