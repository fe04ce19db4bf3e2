"""Tenant tool code never runs with host access, in either backend: a probe tool, run through
`POST /v1/tools/run` and through the agent loop, in the Docker sandbox and in the local bubblewrap jail.

What each backend must hold: not uid 0; no platform secret in its environment or in any /proc/*/environ
it can read; no connection to the platform's port, the Docker bridge or the metadata address; no Docker
socket; no write outside /tmp; fewer than 10 visible processes; a fork bomb and a setsid daemon are
contained and gone after the call; 100 MB of output is cut.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.sandbox.models import SandboxConfig
from tests.agents.test_loop import custom_tool
from tests.support.scripted_llm import text, tool_call, tool_calls

PROBE = '''
import json, os, socket, subprocess, sys, time

def probe(targets: str) -> dict:
    """Reports what this process can see and reach.

    Args:
        targets (str): JSON list of [host, port] pairs to try to connect to
    """
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    environs = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environs.append(handle.read().decode(errors="replace"))
        except OSError:
            pass
    reached = {}
    for host, port in json.loads(targets):
        sock = socket.socket()
        sock.settimeout(1.0)
        try:
            sock.connect((host, port))
            reached[f"{host}:{port}"] = "connected"
        except OSError as exc:
            reached[f"{host}:{port}"] = type(exc).__name__
        finally:
            sock.close()
    written = []
    for path in ("/etc/letta-probe", "/usr/letta-probe", "/letta-probe", "/root/letta-probe", "/tmp/letta-probe"):
        try:
            with open(path, "w") as handle:
                handle.write("x")
            written.append(path)
        except OSError:
            pass
    return {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "pids": len(pids),
        "environ": dict(os.environ),
        "proc_environs": environs,
        "reached": reached,
        "docker_socket": any(os.path.exists(p) for p in ("/var/run/docker.sock", "/run/docker.sock")),
        "written": written,
    }

BOMB = """
import os, time
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.01)
"""

def fork_bomb(marker: str) -> str:
    """Forks until something stops it, in a process whose command line carries `marker`.

    Args:
        marker (str): how the test finds what is left of it
    """
    subprocess.run([sys.executable, "-c", BOMB, marker])
    return "the bomb stopped"

def daemon(linger: bool, marker: str) -> str:
    """Leaves a daemon behind.

    Args:
        linger (bool): also wait past the sandbox's timeout
        marker (str): how the test finds the daemon
    """
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", marker], start_new_session=True)
    if linger:
        time.sleep(1000)
    return "left a daemon"

def flood() -> str:
    """Writes 100 MB to stdout."""
    chunk = "x" * 1_000_000
    for _ in range(100):
        sys.stdout.write(chunk)
    return "flooded"
'''

PLATFORM_SECRETS = ("DJANGO_SECRET_KEY", "SECRETS_ENCRYPTION_KEY", "DATABASE_URL", "REDIS_URL")


@pytest.fixture
def limits(org, backend: str) -> None:
    """Short timeouts, so that the containment tests are quick."""
    for sandbox_type in (SandboxConfig.Type.LOCAL, SandboxConfig.Type.DOCKER):
        SandboxConfig.all_objects.create(
            organization=org, sandbox_type=sandbox_type, timeout_seconds=3, pids_limit=64, memory_mb=256
        )


@pytest.fixture
def platform_port() -> Iterator[int]:
    """A port this host listens on, on every address: a stand-in for the platform's own port."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        yield listener.getsockname()[1]


def run(api_client_for, actor, name: str, args: dict, env: dict | None = None) -> dict:
    body = {"source_code": PROBE, "name": name, "args": args, "env_vars": env or {}}
    response = api_client_for(actor).post("/v1/tools/run", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def targets(port: int) -> str:
    return json.dumps([["127.0.0.1", port], ["172.17.0.1", port], ["169.254.169.254", 80]])


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line holds `marker` (a jail's or a container's processes are host
    processes too, whatever namespaces they are in)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def gone(marker: str, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while processes_with(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_the_probe_sees_no_host(backend, limits, actor, api_client_for, platform_port):
    result = run(api_client_for, actor, "probe", {"targets": targets(platform_port)})

    assert (result["status"], result["sandbox"]) == ("success", backend), result["tool_return"]
    seen = json.loads(result["tool_return"])
    assert seen["uid"] != 0
    assert seen["euid"] != 0
    assert seen["pids"] < 10
    assert seen["docker_socket"] is False
    assert seen["written"] == ["/tmp/letta-probe"]
    assert seen["reached"] == {
        f"127.0.0.1:{platform_port}": "ConnectionRefusedError",  # its own loopback: nobody listens
        f"172.17.0.1:{platform_port}": "OSError",  # no route: no network at all
        "169.254.169.254:80": "OSError",
    }
    visible = json.dumps([seen["environ"], seen["proc_environs"]])
    for name in PLATFORM_SECRETS:
        assert name not in seen["environ"]
        if os.environ.get(name):
            assert os.environ[name] not in visible, f"{name} is visible to tool code"


def test_a_fork_bomb_is_contained_and_gone_after_the_timeout(backend, limits, actor, api_client_for):
    marker = f"letta-probe-{uuid.uuid4().hex}"

    result = run(api_client_for, actor, "fork_bomb", {"marker": marker})

    assert (result["status"], result["sandbox"]) == ("error", backend)
    assert "timed out after 3 s" in result["tool_return"]
    assert gone(marker), f"fork bomb processes outlived the call: {processes_with(marker)}"


@pytest.mark.parametrize("linger", [False, True])
def test_a_setsid_daemon_is_gone_after_the_call(backend, limits, actor, api_client_for, linger):
    marker = f"letta-probe-{uuid.uuid4().hex}"

    result = run(api_client_for, actor, "daemon", {"linger": linger, "marker": marker})

    assert result["sandbox"] == backend
    assert result["status"] == ("error" if linger else "success")
    assert gone(marker), f"a daemon outlived the call: {processes_with(marker)}"


def test_100_mb_of_output_is_cut(backend, limits, actor, api_client_for, settings):
    result = run(api_client_for, actor, "flood", {})

    assert (result["status"], result["sandbox"]) == ("error", backend)
    assert f"wrote more than {settings.SANDBOX_MAX_OUTPUT_BYTES} bytes of output" in result["tool_return"]
    kept = "\n".join(result["stdout"])
    assert kept.startswith("x" * 50_000)  # what is kept is the tool's return limit (50,000 characters)
    assert kept.endswith("cut to 50000]")
    assert len(kept) < 50_200


def test_the_probe_in_the_agent_loop_sees_no_host(backend, limits, org, make_agent, send, llm, platform_port):
    tool = custom_tool(org, name="probe", source=PROBE, return_char_limit=1_000_000)
    agent = make_agent(tool_ids=[tool.id])
    llm.push(tool_calls(tool_call("probe", {"targets": targets(platform_port)}, id="call_1")), text("Done."))

    result = send(agent, "probe")

    tool_return = next(m for m in result.messages if m.role == "tool").tool_returns[0]
    assert (tool_return["status"], tool_return["sandbox"]) == ("success", backend)
    seen = json.loads(tool_return["tool_return"])
    assert (seen["uid"] != 0, seen["pids"] < 10, seen["docker_socket"]) == (True, True, False)
    assert set(seen["reached"].values()) <= {"ConnectionRefusedError", "OSError"}
    assert seen["environ"]["LETTA_AGENT_ID"] == agent.id
    for name in PLATFORM_SECRETS:
        if os.environ.get(name):
            assert os.environ[name] not in tool_return["tool_return"]
