"""Operators provision from a shell while the platform runs (issue 17): `manage.py create_organization`,
`create_user`, `add_member` and `create_api_key` against a real `scripts/devenv.py run` process tree.

The commands run as `manage.py` does for an operator: no DATABASE_URL / REDIS_URL, only DATA_DIR. They must
use the running platform's embedded services (DATA_DIR/run/services.env), never start a second set.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOTSTRAP_KEY = "sk-let-provisioning-test-key-01"
PASSWORD = "a-long-password-for-carol-1"
# Variables the commands and the platform must not inherit from the test run (its own services and keys).
INHERITED_SERVICES = {
    "DATABASE_URL",
    "REDIS_URL",
    "DJANGO_SECRET_KEY",
    "SECRETS_ENCRYPTION_KEY",
    "XDG_RUNTIME_DIR",
}
STARTED_OWN_SERVICES = ("embedded PostgreSQL", "embedded Valkey")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in INHERITED_SERVICES}
    return env | {"DATA_DIR": str(data_dir), **extra}


@dataclass
class Platform:
    process: subprocess.Popen[bytes]
    data_dir: Path
    base_url: str
    log: Path

    def manage(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=clean_env(self.data_dir),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def stop(self) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
        return self.process.wait(timeout=60)


def service_processes(data_dir: Path) -> list[int]:
    """PostgreSQL postmasters (`postgres -D DATA_DIR/postgres`) and Valkey servers (working directory in
    DATA_DIR) of this data directory."""
    found = []
    for proc in psutil.process_iter(attrs=("name", "cmdline")):
        try:
            name, cmdline = proc.info["name"] or "", " ".join(proc.info["cmdline"] or [])
            postmaster = name == "postgres" and str(data_dir) in cmdline
            if postmaster or (name.startswith("valkey-server") and str(data_dir) in proc.cwd()):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sorted(found)


@pytest.fixture(scope="module")
def platform() -> Iterator[Platform]:
    # Inside the checkout, not pytest's tmp (mode 0700): the embedded PostgreSQL runs as its own user.
    data_dir = ROOT / "var" / f"provisioning-{uuid.uuid4().hex[:8]}"
    data_dir.mkdir(parents=True)
    port = free_port()
    log = data_dir.parent / f"{data_dir.name}.log"
    env = clean_env(
        data_dir,
        PORT=str(port),
        BOOTSTRAP_API_KEY=BOOTSTRAP_KEY,
        DJANGO_SUPERUSER_USERNAME="root",
        DJANGO_SUPERUSER_PASSWORD="a-long-password-1",
        WORKER_CONCURRENCY="1",
        SANDBOX_BACKEND="local",  # no sandbox image to build: no tool runs here
    )
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "devenv.py"), "run"],
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    running = Platform(process=process, data_dir=data_dir, base_url=f"http://127.0.0.1:{port}", log=log)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{running.base_url}/v1/health/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"platform did not answer in time:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield running
    finally:
        running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
        log.unlink(missing_ok=True)


def assert_used_the_platforms_services(result: subprocess.CompletedProcess[str]) -> None:
    output = result.stdout + result.stderr
    assert not any(line in output for line in STARTED_OWN_SERVICES), output
    assert "using the running platform's DATABASE_URL and REDIS_URL" in result.stderr, output


def test_the_platform_records_its_services_for_management_commands(platform):
    services = platform.data_dir / "run" / "services.env"

    recorded = dict(line.split("=", 1) for line in services.read_text().splitlines())

    assert services.stat().st_mode & 0o777 == 0o600
    assert recorded["PLATFORM_PID"] == str(platform.process.pid)
    assert recorded["DATABASE_URL"].startswith("postgresql://")
    assert recorded["REDIS_URL"].startswith("redis://127.0.0.1:")


def test_operators_provision_an_organisation_its_user_and_key_while_the_platform_runs(platform):
    bootstrap = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    body = {
        "name": "default-org-agent",
        "model": "openai/gpt-4o-mini",
        "embedding": "openai/text-embedding-3-small",
    }
    existing = httpx.post(f"{platform.base_url}/v1/agents/", headers=bootstrap, json=body, timeout=30)
    assert existing.status_code in (200, 201), existing.text
    services_before = service_processes(platform.data_dir)

    user = platform.manage("create_user", "carol", "--password", PASSWORD, "--email", "carol@example.com")
    generated = platform.manage("create_user", "dave")
    organization = platform.manage("create_organization", "Initech", "--owner", "dave")
    added = platform.manage("add_member", "Initech", "carol", "--role", "member")
    organization_id = re.search(r"\((org-[^,)]+)", organization.stdout).group(1)
    promoted = platform.manage("add_member", organization_id, "carol", "--role", "admin")
    again = platform.manage("add_member", "Initech", "carol", "--role", "admin")
    key = platform.manage("create_api_key", "Initech", "carol", "--name", "ci")

    for result in (user, generated, organization, added, promoted, again, key):
        assert result.returncode == 0, result.stdout + result.stderr
        assert_used_the_platforms_services(result)
    assert re.fullmatch(r"User 'carol' created \(user-[0-9a-f-]+\)\n", user.stdout)
    assert "Password" not in user.stdout
    password_line = generated.stdout.strip().splitlines()[-1]
    assert password_line.startswith("Password (shown once, store it now): ")
    assert len(password_line.rsplit(" ", 1)[-1]) >= 12
    assert organization.stdout.startswith("Organization 'Initech' created (org-")
    assert "owner dave" in organization.stdout
    assert added.stdout.strip() == "Added 'carol' to 'Initech' as member"
    assert promoted.stdout.strip() == (
        "'carol' was already a member of 'Initech': role changed from member to admin"
    )
    assert again.stdout.strip() == "'carol' is already admin of 'Initech': nothing changed"
    raw_key = key.stdout.strip().splitlines()[-1]
    assert key.stdout == raw_key + "\n"  # only the key, on the last (only) line
    assert raw_key.startswith("sk-let-")
    assert "shown once" in key.stderr

    # The new key authenticates against the running platform, for the new organisation: no agents yet.
    headers = {"Authorization": f"Bearer {raw_key}"}
    agents = httpx.get(f"{platform.base_url}/v1/agents/", headers=headers, timeout=30)
    assert agents.status_code == 200, agents.text
    assert agents.json() == []
    default_agents = httpx.get(f"{platform.base_url}/v1/agents/", headers=bootstrap, timeout=30).json()
    assert [agent["name"] for agent in default_agents] == ["default-org-agent"]

    # carol signs in to the ADE with her password, and acts for Initech (her only organisation).
    with httpx.Client(base_url=platform.base_url, timeout=30) as browser:
        form = browser.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        signed_in = browser.post(
            "/login/",
            data={"csrfmiddlewaretoken": token, "username": "carol", "password": PASSWORD},
            headers={"Referer": f"{platform.base_url}/login/"},
        )
        assert signed_in.status_code == 302, signed_in.text[-2000:]
        agent_list = browser.get("/agents/", follow_redirects=True)
        assert agent_list.status_code == 200
        assert "Initech" in agent_list.text
        assert "default-org-agent" not in agent_list.text

    # No second PostgreSQL or Valkey: the same service processes as before the commands.
    assert service_processes(platform.data_dir) == services_before
    assert len(services_before) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("add_member", "No Such Org", "root", "--role", "member"), "no organization with the id or name"),
        (("create_api_key", "org-00000000-0000-0000-0000-000000000000", "root"), "no organization"),
        (("create_api_key", "default", "nobody"), "There is no user named 'nobody'"),
        (("add_member", "default", "root", "--role", "superhero"), "Choose a role: owner, admin or member"),
        (("create_user", "root", "--password", PASSWORD), "A user named 'root' already exists"),
        (("create_organization", "default"), "An organization named 'default' already exists"),
        (("create_organization", "Umbrella", "--owner", "nobody"), "There is no user named 'nobody'"),
        (("add_member", "default", "root", "--role", "member"), "root is the last owner of default"),
    ],
    ids=[
        "unknown-org-name",
        "unknown-org-id",
        "unknown-user",
        "unknown-role",
        "taken-username",
        "taken-org",
        "unknown-owner",
        "last-owner",
    ],
)
def test_provisioning_errors_exit_non_zero_with_a_message(platform, args, message):
    result = platform.manage(*args)

    assert result.returncode != 0
    assert message in result.stderr, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert_used_the_platforms_services(result)


def test_without_a_running_platform_a_command_starts_its_own_services_and_the_record_is_gone(platform):
    assert platform.stop() == 0
    assert not (platform.data_dir / "run" / "services.env").exists()

    result = platform.manage("add_member", "default", "root", "--role", "owner")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "embedded PostgreSQL" in result.stdout
    assert "embedded Valkey" in result.stdout
    assert "'root' is already owner of 'default': nothing changed" in result.stdout
    assert service_processes(platform.data_dir) == []  # and stopped them again
