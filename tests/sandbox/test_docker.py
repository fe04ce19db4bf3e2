"""The Docker sandbox: tool code runs in a locked-down, single-use container, fast from a warm pool.

Tests marked `docker` need a Docker engine and skip without one (the `docker_image` fixture says why);
the selection rule's tests run everywhere.
"""

import base64
import contextlib
import hashlib
import json
import os
import socket
import statistics
import time
import uuid
import zipfile
from pathlib import Path

import pytest
from docker.errors import ImageNotFound, NotFound

from apps.agents.custom_tools import run_custom_tool
from apps.agents.models import AgentSecret
from apps.core.actor import Actor
from apps.sandbox import docker_sandbox, images
from apps.sandbox.docker_sandbox import (
    LABEL,
    LABEL_PID,
    ContainerSpec,
    WarmPool,
    get_client,
    run_tool_in_docker,
)
from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable
from apps.sandbox.selection import decide_backend
from apps.tools.execution import ToolContext
from tests.agents.test_loop import custom_tool
from tests.support.scripted_llm import text, tool_call, tool_calls

SOURCE = '''
import os, socket, sys, time

def talk(word: str) -> dict:
    """Prints to both streams and returns JSON.

    Args:
        word (str): what to print
    """
    print("to stdout", word)
    print("to stderr", file=sys.stderr)
    return {"word": word.upper(), "n": 3}

def boom(word: str) -> str:
    """Raises.

    Args:
        word (str): the missing word
    """
    raise ValueError("no such word: " + word)

def env(names: list) -> dict:
    """Which of these variables the tool can see.

    Args:
        names (list): variable names
    """
    return {name: os.environ.get(name, "<unset>") for name in names}

def network(port: int) -> dict:
    """Interfaces, and a TCP connect to a port the test listens on (127.0.0.1, host side).

    Args:
        port (int): the port
    """
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        reached = "connected"
    except OSError as exc:
        reached = type(exc).__name__
    return {"interfaces": sorted(os.listdir("/sys/class/net")), "connect": reached}

def files() -> dict:
    """Write to / (must fail) and to /tmp (must work)."""
    try:
        open("/evil", "w").write("x")
        root = "written"
    except OSError as exc:
        root = exc.strerror
    with open("/tmp/scratch", "w") as handle:
        handle.write("ok")
    return {"root": root, "tmp": open("/tmp/scratch").read()}

def who() -> dict:
    """User, capabilities and privilege flags of the tool's process."""
    status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
    return {"uid": os.getuid(), "gid": os.getgid(), "cap_eff": status["CapEff"].strip(),
            "no_new_privs": status["NoNewPrivs"].strip()}

def hog(megabytes: int) -> int:
    """Touches that much memory.

    Args:
        megabytes (int): how much
    """
    return len(b"x" * (megabytes * 1024 * 1024))

def sleepy(seconds: float) -> str:
    """Sleeps.

    Args:
        seconds (float): how long
    """
    time.sleep(seconds)
    return "woke"

def shout(kilobytes: int) -> str:
    """Prints a lot.

    Args:
        kilobytes (int): how much
    """
    sys.stdout.write("x" * (kilobytes * 1024))
    return "done"

def probe() -> str:
    """Imports the package that only the derived image has."""
    import letta_sandbox_probe
    return letta_sandbox_probe.VALUE
'''


@pytest.fixture
def pool(docker_image):
    """A warm pool of one container per spec, its own label for exact container counts."""
    warm_pool = WarmPool(size=1)
    warm_pool.labels["letta.sandbox.test"] = uuid.uuid4().hex
    yield warm_pool
    warm_pool.shutdown()


@pytest.fixture
def spec(docker_image) -> ContainerSpec:
    return ContainerSpec(image=docker_image)


def call(pool: WarmPool, spec: ContainerSpec, name: str, timeout: float = 30.0, **arguments: object):
    return run_tool_in_docker(
        source_code=SOURCE,
        name=name,
        arguments=arguments,
        env={},
        spec=spec,
        timeout_seconds=timeout,
        pool=pool,
    )


def labelled(pool: WarmPool) -> list:
    return get_client().containers.list(
        all=True, filters={"label": f"letta.sandbox.test={pool.labels['letta.sandbox.test']}"}
    )


@pytest.mark.docker
def test_a_tool_returns_its_value_and_its_output(pool, spec):
    outcome = call(pool, spec, "talk", word="hi")

    assert (outcome.ok, outcome.return_value, outcome.error) == (True, {"word": "HI", "n": 3}, None)
    assert outcome.stdout == "to stdout hi\n"
    assert outcome.stderr == "to stderr\n"


@pytest.mark.docker
def test_a_tool_that_raises_gives_the_traceback(pool, spec):
    outcome = call(pool, spec, "boom", word="x")

    assert outcome.ok is False
    assert outcome.error.startswith("Traceback (most recent call last):")
    line = SOURCE.splitlines().index('    raise ValueError("no such word: " + word)') + 1
    assert f'File "<tool>", line {line}, in boom' in outcome.error
    assert outcome.error.endswith("ValueError: no such word: x\n")


@pytest.mark.docker
def test_the_network_is_off_by_default_and_opt_in_per_config(pool, spec, docker_settings):
    from apps.sandbox.egress import require_egress_filter
    from apps.sandbox.selection import container_spec

    off = container_spec(SandboxConfig(sandbox_type=SandboxConfig.Type.DOCKER), spec.image)
    networked = SandboxConfig(sandbox_type=SandboxConfig.Type.DOCKER, network_enabled=True)
    on = container_spec(networked, spec.image)
    if os.geteuid() != 0:
        pytest.skip("a network-enabled config runs behind the egress filter, which needs root (iptables)")
    require_egress_filter(on.network)  # what run_docker_tool does before a network-enabled call
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    with listener:
        isolated = call(pool, off, "network", port=port)
        opted_in = call(pool, on, "network", port=port)

    assert (off.network, on.network) == (None, "letta-sandbox-egress")  # filtered: see test_egress.py
    assert isolated.return_value == {"interfaces": ["lo"], "connect": "ConnectionRefusedError"}
    assert "eth0" in opted_in.return_value["interfaces"]


@pytest.mark.docker
def test_the_root_filesystem_is_read_only_and_tmp_is_writable(pool, spec):
    outcome = call(pool, spec, "files")

    assert outcome.return_value == {"root": "Read-only file system", "tmp": "ok"}


@pytest.mark.docker
def test_the_tool_runs_as_nobody_without_capabilities(pool, spec):
    outcome = call(pool, spec, "who")

    assert outcome.return_value == {
        "uid": 65534,
        "gid": 65534,
        "cap_eff": "0000000000000000",
        "no_new_privs": "1",
    }


@pytest.mark.docker
def test_a_memory_hog_is_killed_at_the_limit(pool, docker_image):
    outcome = call(pool, ContainerSpec(image=docker_image, memory_mb=64), "hog", megabytes=256)

    assert outcome.ok is False
    assert "memory limit of 64 MB" in outcome.error


@pytest.mark.docker
def test_a_sleeper_is_killed_at_the_timeout_and_its_container_removed(pool, spec):
    started = time.monotonic()

    outcome = call(pool, spec, "sleepy", timeout=1.0, seconds=60)

    assert time.monotonic() - started < 10
    assert (outcome.ok, outcome.error) == (False, "Tool 'sleepy' timed out after 1 s and was stopped.")
    with pytest.raises(NotFound):
        get_client().containers.get(outcome.container_id)


@pytest.mark.docker
def test_a_tool_that_floods_its_output_is_stopped(pool, spec):
    outcome = run_tool_in_docker(
        source_code=SOURCE,
        name="shout",
        arguments={"kilobytes": 4096},
        env={},
        spec=spec,
        max_output_bytes=1024 * 1024,
        pool=pool,
    )

    assert (outcome.ok, outcome.error) == (
        False,
        "Tool 'shout' wrote more than 1048576 bytes of output and was stopped.",
    )
    with pytest.raises(NotFound):
        get_client().containers.get(outcome.container_id)


@pytest.mark.docker
def test_each_call_gets_a_fresh_container_and_none_outlives_the_pool(pool, spec):
    first = call(pool, spec, "files")
    pool.drain()
    second = call(pool, spec, "talk", word="again")
    pool.drain()

    assert first.container_id != second.container_id
    assert [c.id for c in labelled(pool)] == [pool._idle[spec][0].container_id]  # only the refill
    pool.shutdown()
    assert labelled(pool) == []


@pytest.mark.docker
def test_a_warm_call_is_faster_than_a_cold_one(spec, capsys):
    cold_pool, warm_pool = WarmPool(size=0), WarmPool(size=1)
    try:
        cold = [call(cold_pool, spec, "talk", word="cold") for _ in range(3)]
        cold_pool.drain()
        warm_pool.fill(spec)
        warm = []
        for _ in range(5):
            warm.append(call(warm_pool, spec, "talk", word="warm"))
            warm_pool.drain()  # the refill finishes before the next call: each call finds a warm container
    finally:
        cold_pool.shutdown()
        warm_pool.shutdown()

    cold_ms = statistics.median(o.total_ms for o in cold)
    warm_ms = statistics.median(o.total_ms for o in warm)
    with capsys.disabled():
        print(f"\nsandbox call, median total: cold {cold_ms:.0f} ms (n=3), warm {warm_ms:.0f} ms (n=5)")  # noqa: T201
    assert [o.warm for o in cold] == [False, False, False]
    assert [o.warm for o in warm] == [True] * 5
    assert warm_ms < cold_ms


def make_wheel(folder: Path, name: str = "letta_sandbox_probe", version: str = "1.0") -> Path:
    """A pure-Python wheel made by hand, byte-for-byte the same each time (stable image tag)."""
    files = {
        f"{name}/__init__.py": b"VALUE = 'installed from a local wheel'\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()
    )
    files[f"{name}-{version}.dist-info/RECORD"] = (record + f"{name}-{version}.dist-info/RECORD,,\n").encode()
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return wheel


@pytest.mark.docker
def test_pip_requirements_are_installed_once_into_an_image_tagged_by_their_hash(
    pool, docker_image, docker_settings, org, tmp_path, capsys
):
    make_wheel(tmp_path)
    base_id = images.ensure_image(docker_image, pull=False)
    plan = images.plan_image(
        base=docker_image,
        base_id=base_id,
        requirements=[{"name": "letta-sandbox-probe", "version": "1.0"}],
        wheelhouse=tmp_path,
        no_index=True,
    )
    same = images.plan_image(
        base=docker_image,
        base_id=base_id,
        requirements=["letta_sandbox_probe==1.0", ""],
        wheelhouse=tmp_path,
        no_index=True,
    )
    client = get_client()
    with contextlib.suppress(ImageNotFound):  # a leftover from an interrupted run would hide the build
        client.images.remove(plan.tag, force=True)
    images.forget_images()
    builds = images.build_count
    try:
        started = time.monotonic()
        image = images.resolve_image(plan, pull=False, wheelhouse=tmp_path, no_index=True)
        build_s = time.monotonic() - started
        started = time.monotonic()
        again = images.resolve_image(same, pull=False, wheelhouse=tmp_path, no_index=True)
        cached_ms = (time.monotonic() - started) * 1000
        outcome = call(pool, ContainerSpec(image=image), "probe")
        docker_settings.SANDBOX_WHEELHOUSE = str(tmp_path)
        docker_settings.SANDBOX_PIP_NO_INDEX = True
        SandboxConfig.all_objects.create(
            organization=org,
            sandbox_type=SandboxConfig.Type.DOCKER,
            pip_requirements=["Letta-Sandbox-Probe==1.0"],
        )
        tool = custom_tool(org, name="probe", source=SOURCE)
        through_config = run_custom_tool(
            tool, {}, ToolContext(actor=Actor.system(org.id), agent_id="agent-x")
        )
        extra_mb = (
            client.images.get(image).attrs["Size"] - client.images.get(docker_image).attrs["Size"]
        ) / 1e6
    finally:
        pool.shutdown()
        if docker_sandbox._pool is not None:
            docker_sandbox._pool.shutdown()  # no container may hold the image, or its layers stay behind
        client.images.remove(plan.tag)

    with capsys.disabled():
        print(  # noqa: T201  (the figures are the point)
            f"\nderived image: built in {build_s:.1f} s (+{extra_mb:.2f} MB), found again in {cached_ms:.1f} ms"
        )
    assert plan.tag == same.tag
    assert plan.tag.startswith("letta-sandbox-deps:")
    assert (image, again) == (plan.tag, plan.tag)
    assert images.build_count == builds + 1
    assert outcome.return_value == "installed from a local wheel"
    assert (through_config.return_value, through_config.sandbox) == ("installed from a local wheel", "docker")


def test_pip_requirements_refuse_pip_options():
    with pytest.raises(images.BadRequirement):
        images.normalize_requirements(["--index-url=https://evil.example/simple requests"])


@pytest.mark.parametrize(
    ("mode", "allow_local", "local_config_only", "docker_answers", "expected"),
    [
        ("auto", True, False, True, "docker"),
        ("auto", False, False, True, "docker"),
        ("auto", True, True, True, "local"),
        ("auto", True, False, False, "local"),
        ("auto", False, False, False, None),
        ("docker", True, True, True, "docker"),
        ("docker", True, False, False, None),
        ("local", True, False, True, "local"),
        ("local", False, False, True, None),
    ],
)
def test_the_selection_rule(mode, allow_local, local_config_only, docker_answers, expected):
    backend, reason = decide_backend(
        mode=mode, allow_local=allow_local, local_config_only=local_config_only, docker_answers=docker_answers
    )

    assert backend == expected
    assert bool(reason) == (expected is None)


def test_a_tool_that_no_sandbox_may_run_is_an_error_result(db, org, settings):
    settings.SANDBOX_BACKEND = "local"
    org.allow_local_sandbox = False
    org.save()
    tool = custom_tool(org)

    result = run_custom_tool(tool, {"word": "x"}, ToolContext(actor=Actor.system(org.id), agent_id="agent-x"))

    assert result.status == "error"
    assert result.return_value == (
        "Tool 'echo' cannot run: this organization does not allow the local sandbox and no Docker sandbox is "
        "available."
    )


@pytest.mark.docker
def test_the_tool_sees_the_sandbox_variables_and_agent_secrets_but_not_the_server_environment(
    docker_settings, org, make_agent, monkeypatch
):
    monkeypatch.setenv("SERVER_SECRET", "do-not-leak")
    config = SandboxConfig.all_objects.create(organization=org, sandbox_type=SandboxConfig.Type.DOCKER)
    SandboxEnvironmentVariable.all_objects.create(
        organization=org, sandbox_config=config, key="ORG_TOKEN", value="org-123"
    )
    agent = make_agent()
    AgentSecret.all_objects.create(organization=org, agent=agent, key="AGENT_TOKEN", value="agent-456")
    tool = custom_tool(org, name="env", source=SOURCE)
    names = [
        "ORG_TOKEN",
        "AGENT_TOKEN",
        "LETTA_AGENT_ID",
        "SERVER_SECRET",
        "DATABASE_URL",
        "DJANGO_SECRET_KEY",
    ]

    result = run_custom_tool(
        tool, {"names": names}, ToolContext(actor=Actor.system(org.id), agent_id=agent.id)
    )

    assert (result.status, result.sandbox) == ("success", "docker")
    assert json.loads(result.return_value) == {
        "ORG_TOKEN": "org-123",
        "AGENT_TOKEN": "agent-456",
        "LETTA_AGENT_ID": agent.id,
        "SERVER_SECRET": "<unset>",
        "DATABASE_URL": "<unset>",
        "DJANGO_SECRET_KEY": "<unset>",
    }
    assert os.environ["SERVER_SECRET"] == "do-not-leak"


@pytest.mark.docker
def test_an_org_whose_only_config_is_local_runs_locally(docker_settings, org):
    SandboxConfig.all_objects.create(organization=org, sandbox_type=SandboxConfig.Type.LOCAL)
    tool = custom_tool(org)

    result = run_custom_tool(tool, {"word": "x"}, ToolContext(actor=Actor.system(org.id), agent_id="agent-x"))

    assert (result.status, result.return_value, result.sandbox) == ("success", "X", "local")


@pytest.mark.docker
def test_a_custom_tool_call_in_the_agent_loop_runs_in_docker(docker_settings, make_agent, send, llm, org):
    tool = custom_tool(org)
    agent = make_agent(tool_ids=[tool.id])
    llm.push(tool_calls(tool_call("echo", {"word": "hiking"}, id="call_1")), text("It says HIKING."))

    result = send(agent, "echo hiking")

    assert result.stop_reason == "end_turn"
    tool_message = next(m for m in result.messages if m.role == "tool")
    assert tool_message.tool_returns[0]["tool_return"] == "HIKING"
    assert tool_message.tool_returns[0]["stdout"] == ["echoing hiking"]
    assert tool_message.tool_returns[0]["sandbox"] == "docker"


@pytest.mark.docker
def test_containers_are_created_locked_down_and_labelled_for_cleanup(pool, docker_image):
    spec = ContainerSpec(image=docker_image, memory_mb=128, cpus=0.5, pids_limit=32)
    container_id, _ = pool.acquire(spec)
    try:
        attrs = get_client().containers.get(container_id).attrs
    finally:
        pool.release(spec, container_id, kill_now=True)
    host = attrs["HostConfig"]

    assert attrs["Config"]["User"] == "65534:65534"
    assert (host["NetworkMode"], host["ReadonlyRootfs"], host["Privileged"]) == ("none", True, False)
    assert (host["CapDrop"], host["CapAdd"], host["SecurityOpt"]) == (["ALL"], None, ["no-new-privileges"])
    assert (host["Memory"], host["MemorySwap"]) == (128 * 1024 * 1024, 128 * 1024 * 1024)
    assert (host["NanoCpus"], host["PidsLimit"]) == (500_000_000, 32)
    assert host["Tmpfs"] == {"/tmp": "rw,nosuid,nodev,noexec,size=64m,mode=1777"}
    assert (host["Binds"], attrs["Mounts"]) == (None, [])
    assert attrs["Config"]["Labels"][LABEL] == "1"
    assert attrs["Config"]["Labels"][LABEL_PID] == str(os.getpid())


@pytest.mark.docker
def test_a_pooled_container_that_died_while_idle_is_replaced_for_the_call(pool, spec):
    pool.fill(spec)
    get_client().containers.get(pool._idle[spec][0].container_id).remove(force=True)

    outcome = call(pool, spec, "talk", word="still")

    assert (outcome.ok, outcome.return_value, outcome.warm) == (True, {"word": "STILL", "n": 3}, False)


@pytest.mark.docker
def test_an_engine_without_the_base_image_is_an_error_never_a_run_elsewhere(docker_settings, org):
    docker_settings.SANDBOX_BASE_IMAGE = "letta-sandbox-absent:none"
    tool = custom_tool(org)

    result = run_custom_tool(tool, {"word": "x"}, ToolContext(actor=Actor.system(org.id), agent_id="agent-x"))

    assert (result.status, result.sandbox) == ("error", "docker")
    assert "Sandbox image 'letta-sandbox-absent:none' is not present" in result.return_value
    assert "scripts/build_sandbox_image.sh" in result.return_value
