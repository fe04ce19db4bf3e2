"""Fixtures for the sandbox tests: each backend in turn, a Docker engine (or a clear skip), the local base
image (built by scripts/build_sandbox_image.sh when missing or of an older recipe) and a leak check over
every container this process started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.sandbox import docker_sandbox
from apps.sandbox.docker_sandbox import LABEL_PID, docker_available, get_client

ROOT = Path(__file__).resolve().parents[2]
TEST_IMAGE = os.environ.get("SANDBOX_TEST_IMAGE", "letta-sandbox-base:py3")
OWN_REPOSITORY = "letta-sandbox-base"  # what scripts/build_sandbox_image.sh builds


def build_image(tag: str, *, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    """Run scripts/build_sandbox_image.sh for `tag` (nothing to do when it is present and current)."""
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "build_sandbox_image.sh"), tag],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="session")
def docker_image() -> Iterator[str]:
    """The sandbox base image for tests; skips when no Docker engine answers.

    Builds it on first use (minutes: debootstrap) or re-imports the cached rootfs (seconds). Our own
    image is always handed to the script, which rebuilds one of an older recipe (one without pydantic)
    and otherwise returns at once. At the end of the session, no container started by this process
    may remain.
    """
    if not docker_available(ttl_seconds=0):
        pytest.skip("no Docker engine answers (docker SDK ping failed): the Docker sandbox tests need one")
    client = get_client()
    if TEST_IMAGE.split(":")[0] == OWN_REPOSITORY or not client.images.list(name=TEST_IMAGE):
        built = build_image(TEST_IMAGE)
        if built.returncode != 0:
            pytest.fail(f"building {TEST_IMAGE} failed:\n{built.stderr[-3000:]}")
    yield TEST_IMAGE
    if docker_sandbox._pool is not None:
        docker_sandbox._pool.shutdown()
    leaked = own_containers()
    for container in leaked:
        container.remove(force=True)
    assert leaked == [], f"sandbox containers outlived the tests: {[c.short_id for c in leaked]}"


def own_containers() -> list:
    """Sandbox containers started by this test process (others may run tests on this engine too)."""
    return get_client().containers.list(all=True, filters={"label": f"{LABEL_PID}={os.getpid()}"})


@pytest.fixture(params=["local", "docker"])
def backend(request, settings) -> str:
    """Each test runs once per backend, the backend forced (no fallback can hide a failure)."""
    if request.param == "docker":
        settings.SANDBOX_BASE_IMAGE = request.getfixturevalue("docker_image")
        settings.SANDBOX_PULL_IMAGES = False
    elif shutil.which("bwrap") is None:
        if os.environ.get("CI"):
            pytest.fail("bubblewrap is missing: .ci/run must install it")
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    settings.SANDBOX_BACKEND = request.param
    return request.param


@pytest.fixture
def docker_settings(settings, docker_image: str):
    """Django settings that make custom tools run in Docker on the test image."""
    settings.SANDBOX_BACKEND = "auto"
    settings.SANDBOX_BASE_IMAGE = docker_image
    settings.SANDBOX_PULL_IMAGES = False
    return settings


def containers_of_pid(pid: int) -> list:
    """Sandbox containers labelled with another process's pid (a sandbox runner the tests started)."""
    return get_client().containers.list(all=True, filters={"label": f"{LABEL_PID}={pid}"})


def assert_no_containers_of(pid: int) -> None:
    """The leak check of a process that has exited: none of its containers may remain (removed if any)."""
    leaked = containers_of_pid(pid)
    for container in leaked:
        container.remove(force=True)
    assert leaked == [], f"containers of process {pid} outlived it: {[c.short_id for c in leaked]}"
