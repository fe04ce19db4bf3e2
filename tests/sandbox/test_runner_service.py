"""The sandbox runner (apps/sandbox/runner_service.py) as a real process on the real engine, and the Docker
backend through it: with SANDBOX_RUNNER_URL set, this (pytest) process makes no Docker call at all.

Every runner here gets a database URL nothing listens on: it must not need one.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from apps.agents.custom_tools import run_custom_tool
from apps.core.actor import Actor
from apps.sandbox import docker_sandbox, images, remote
from apps.sandbox.docker_sandbox import LABEL_PID, get_client
from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable
from apps.tools.execution import ToolContext
from tests.agents.test_loop import custom_tool
from tests.api.test_tools_api import ADD_SOURCE, GREET_SOURCE
from tests.sandbox.conftest import assert_no_containers_of, own_containers

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "runner-test-" + secrets.token_urlsafe(24)
# The main runner's maxima, low enough that the model's defaults are clamped too (cpus, pids, timeout).
MAXIMA = {"memory_mb": 300, "cpus": 0.5, "pids_limit": 50, "timeout_seconds": 5.0}

LIMITS_SOURCE = '''
def limits() -> dict:
    """The cgroup limits this sandbox runs under (cgroup v2 paths, else v1)."""
    def read(*paths):
        for path in paths:
            try:
                with open(path) as handle:
                    return handle.read().strip()
            except OSError:
                pass
        return None

    cpu = read("/sys/fs/cgroup/cpu.max") or " ".join(
        str(read(f"/sys/fs/cgroup/cpu/cpu.cfs_{part}_us")) for part in ("quota", "period")
    )
    return {
        "memory": read("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        "pids": read("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"),
        "cpu": cpu,
    }
'''

SLEEPY_SOURCE = '''
def sleepy(seconds: float) -> str:
    """Sleeps.

    Args:
        seconds (float): how long
    """
    import time
    time.sleep(seconds)
    return "awake"
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RunnerProcess:
    """`manage.py sandbox_runner` in a subprocess, its output in a log file; on a loopback port, or on the
    Unix socket `socket_path`."""

    def __init__(
        self, log_path: Path, *, token: str | None = TOKEN, socket_path: Path | None = None, **env: str
    ) -> None:
        if socket_path is None:
            self.port = free_port()
            bind = f"127.0.0.1:{self.port}"
            self.url = self.base = f"http://127.0.0.1:{self.port}"
            transport = None
        else:
            self.port = 0
            bind = f"unix:{socket_path}"  # the runner's spelling; the client's is unix:///path
            self.url = f"unix://{socket_path}"
            self.base = "http://runner"
            transport = httpx.HTTPTransport(uds=str(socket_path))
        self.socket_path = socket_path
        self.http = httpx.Client(transport=transport, trust_env=False)
        self.log_path = log_path
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": "postgres://nobody@127.0.0.1:1/nothing-listens-here",
            "REDIS_URL": "redis://127.0.0.1:1/0",
            "SANDBOX_BASE_IMAGE": "letta-sandbox-base:py3",
            "SANDBOX_PULL_IMAGES": "false",
            "SANDBOX_POOL_SIZE": "1",
            "SANDBOX_RUNNER_MAX_MEMORY_MB": str(MAXIMA["memory_mb"]),
            "SANDBOX_RUNNER_MAX_CPUS": str(MAXIMA["cpus"]),
            "SANDBOX_RUNNER_MAX_PIDS": str(MAXIMA["pids_limit"]),
            "SANDBOX_RUNNER_MAX_TIMEOUT": str(MAXIMA["timeout_seconds"]),
            "LOG_LEVEL": "DEBUG",  # the most the runner ever logs: still no secret may be in it
            **env,
        }
        environment.pop("SANDBOX_RUNNER_URL", None)
        environment.pop("SANDBOX_RUNNER_TOKEN", None)
        if token is not None:
            environment["SANDBOX_RUNNER_TOKEN"] = token
        self.log_file = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "sandbox_runner", "--bind", bind],
            cwd=ROOT,
            env=environment,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
        )
        self.pid = self.process.pid

    def wait_ready(self, timeout: float = 60.0) -> RunnerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the sandbox runner exited with {self.process.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if self.get("/v1/health").status_code == 200:
                    return self
            time.sleep(0.2)
        self.stop()
        pytest.fail(f"the sandbox runner did not become healthy:\n{self.log()}")

    def get(self, path: str, token: str | None = TOKEN) -> httpx.Response:
        return self.http.get(self.base + path, headers=auth(token), timeout=10)

    def post(self, body: object, token: str | None = TOKEN, path: str = "/v1/run") -> httpx.Response:
        return self.http.post(self.base + path, json=body, headers=auth(token), timeout=60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def runs(self) -> int:
        """Tool calls the runner has executed so far (its log line per call)."""
        return self.log().count("sandbox_runner.run\n")

    def stop(self) -> None:
        """SIGTERM, as `docker compose stop` sends; then none of its containers may remain."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()
        self.http.close()
        assert_no_containers_of(self.pid)
        assert self.process.returncode == 0, self.log()

    def kill(self) -> None:
        """SIGKILL: the runner cleans nothing up (its socket file stays)."""
        self.process.kill()
        self.process.wait(timeout=60)
        self.log_file.close()
        self.http.close()


def auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def body(**overrides: object) -> dict[str, object]:
    payload: dict[str, object] = {
        "source_code": ADD_SOURCE,
        "name": "add",
        "arguments": {"a": 2, "b": 3},
        "env": {},
        "pip_requirements": [],
        "image": None,
        "limits": {},
    }
    return payload | overrides


@pytest.fixture(scope="session")
def runner(docker_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerProcess]:
    process = RunnerProcess(tmp_path_factory.mktemp("runner") / "runner.log").wait_ready()
    yield process
    process.stop()


@pytest.fixture
def runner_settings(docker_settings, runner: RunnerProcess):
    """This process as web and worker are in production: Docker only, through the runner."""
    docker_settings.SANDBOX_BACKEND = "docker"
    docker_settings.SANDBOX_RUNNER_URL = runner.url
    docker_settings.SANDBOX_RUNNER_TOKEN = TOKEN
    remote.forget_health()
    yield docker_settings
    remote.forget_health()


@pytest.fixture
def no_engine_here() -> Iterator[None]:
    """Nothing in this process talks to an engine meanwhile: it has no Docker client before, nor after."""
    if docker_sandbox._pool is not None:
        docker_sandbox._pool.shutdown()
    docker_sandbox.reset_docker_state()
    images.forget_images()
    yield
    assert docker_sandbox._client is None, "this process created a Docker client of its own"
    assert docker_sandbox._pool is None
    assert own_containers() == []


def read_answer(sock: socket.socket) -> str:
    """Everything the server sends until it closes (a reset after its answer ends it, too)."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def execs_of(pid: int, since: float) -> list[dict[str, object]]:
    """`docker exec`s the engine ran since `since` in containers of process `pid` (tool calls)."""
    return list(
        get_client().events(
            since=since,
            until=time.time() + 0.5,
            decode=True,
            filters={"type": "container", "event": "exec_create", "label": f"{LABEL_PID}={pid}"},
        )
    )


# --- through the real entry point ---------------------------------------------------------------------


@pytest.mark.docker
def test_tools_run_in_the_runners_containers_and_not_from_this_process(
    runner, runner_settings, no_engine_here, actor, api_client_for
):
    before = runner.runs()

    response = api_client_for(actor).post(
        "/v1/tools/run", {"source_code": ADD_SOURCE, "args": {"a": 2, "b": 3}}, format="json"
    )

    body = response.json()
    assert response.status_code == 200
    assert (body["status"], body["tool_return"], body["stdout"], body["sandbox"]) == (
        "success",
        "5",
        ["adding 2 3"],
        "docker",
    )
    assert runner.runs() == before + 1


@pytest.mark.docker
def test_the_tenants_variables_reach_the_tool_and_neither_they_nor_the_token_reach_a_log(
    runner, runner_settings, no_engine_here, actor, api_client_for
):
    secret = "s3cret-" + secrets.token_hex(8)
    config = SandboxConfig.objects.for_actor(actor).create(sandbox_type=SandboxConfig.Type.DOCKER)
    SandboxEnvironmentVariable.objects.for_actor(actor).create(
        sandbox_config=config, key="GREETING", value=secret
    )
    client = api_client_for(actor)

    from_config = client.post(
        "/v1/tools/run", {"source_code": GREET_SOURCE, "args": {"name": "Ann"}}, format="json"
    ).json()
    overridden = client.post(
        "/v1/tools/run",
        {"source_code": GREET_SOURCE, "args": {"name": "Ann"}, "env_vars": {"GREETING": secret + "-2"}},
        format="json",
    ).json()

    assert (from_config["tool_return"], from_config["sandbox"]) == (f"{secret}, Ann!", "docker")
    assert overridden["tool_return"] == f"{secret}-2, Ann!"
    log = runner.log()
    assert "sandbox_runner.run" in log
    assert secret not in log
    assert TOKEN not in log


@pytest.mark.docker
def test_an_agents_tool_call_runs_on_the_runner(runner, runner_settings, no_engine_here, org):
    tool = custom_tool(org)

    result = run_custom_tool(tool, {"word": "x"}, ToolContext(actor=Actor.system(org.id), agent_id="agent-x"))

    assert (result.status, result.return_value, result.sandbox) == ("success", "X", "docker")


@pytest.mark.docker
def test_limits_above_the_runners_maxima_are_clamped_to_them(
    runner, runner_settings, no_engine_here, actor, api_client_for
):
    SandboxConfig.objects.for_actor(actor).create(
        sandbox_type=SandboxConfig.Type.DOCKER,
        memory_mb=4096,
        cpus=8.0,
        pids_limit=10_000,
        timeout_seconds=600,
    )
    client = api_client_for(actor)

    limits = client.post("/v1/tools/run", {"source_code": LIMITS_SOURCE, "args": {}}, format="json").json()
    started = time.monotonic()
    sleeper = client.post(
        "/v1/tools/run", {"source_code": SLEEPY_SOURCE, "args": {"seconds": 60}}, format="json"
    ).json()

    assert (limits["status"], limits["sandbox"]) == ("success", "docker")
    assert json.loads(limits["tool_return"]) == {
        "memory": str(MAXIMA["memory_mb"] * 1024 * 1024),
        "pids": str(MAXIMA["pids_limit"]),
        "cpu": "50000 100000",
    }
    assert (sleeper["status"], sleeper["sandbox"]) == ("error", "docker")
    assert "timed out after 5 s" in sleeper["tool_return"]
    assert time.monotonic() - started < 30


@pytest.mark.docker
def test_the_answer_says_which_limits_applied(runner):
    response = runner.post(
        body(limits={"memory_mb": 99_999, "cpus": 64, "pids_limit": 1_000_000, "timeout_seconds": 10**6})
    )

    assert response.status_code == 200
    assert response.json()["ok"] is True
    assert response.json()["return_value"] == 5
    assert response.json()["limits"] == {**MAXIMA, "network_enabled": False}


@pytest.mark.docker
def test_an_image_the_operator_did_not_allow_is_refused(
    runner, runner_settings, no_engine_here, actor, api_client_for
):
    SandboxConfig.objects.for_actor(actor).create(
        sandbox_type=SandboxConfig.Type.DOCKER, image="attacker/image:latest"
    )
    before = runner.runs()

    direct = runner.post(body(image="alpine:3"))
    through_the_api = api_client_for(actor).post(
        "/v1/tools/run", {"source_code": ADD_SOURCE, "args": {"a": 1}}, format="json"
    )

    assert direct.status_code == 400
    assert direct.json()["error"] == (
        "image 'alpine:3' is not allowed on this sandbox runner (allowed: letta-sandbox-base:py3)"
    )
    result = through_the_api.json()
    assert (through_the_api.status_code, result["status"], result["sandbox"]) == (200, "error", "docker")
    assert "image 'attacker/image:latest' is not allowed on this sandbox runner" in result["tool_return"]
    assert runner.runs() == before


# --- the service's own contract ---------------------------------------------------------------------


@pytest.mark.docker
def test_health_says_the_engine_answers_and_the_base_image_is_there(runner):
    response = runner.get("/v1/health")

    assert response.status_code == 200
    assert response.json() == {"ok": True, "engine": True, "image": True, "error": None}


@pytest.mark.docker
def test_a_wrong_or_missing_token_is_401_and_runs_nothing(runner, runner_settings, actor, api_client_for):
    since = time.time()
    before = runner.runs()

    wrong = runner.post(body(), token="not-" + TOKEN)
    missing = runner.post(body(), token=None)
    health = runner.get("/v1/health", token="not-" + TOKEN)
    runner_settings.SANDBOX_RUNNER_TOKEN = "not-" + TOKEN
    through_the_api = api_client_for(actor).post(
        "/v1/tools/run", {"source_code": ADD_SOURCE, "args": {"a": 1}}, format="json"
    )

    assert (wrong.status_code, missing.status_code, health.status_code) == (401, 401, 401)
    assert wrong.headers["WWW-Authenticate"] == "Bearer"
    assert TOKEN not in wrong.text
    assert through_the_api.status_code == 400  # in production (SANDBOX_BACKEND=docker): nowhere to run it
    assert "no Docker engine answers" in through_the_api.json()["detail"]
    assert TOKEN not in through_the_api.text
    assert runner.runs() == before
    assert execs_of(runner.pid, since) == []


@pytest.mark.docker
def test_an_oversized_body_is_413_without_being_read(runner):
    declared = 8 * 1024 * 1024 + 1
    with socket.create_connection(("127.0.0.1", runner.port), timeout=10) as sock:
        sock.sendall(
            (
                f"POST /v1/run HTTP/1.1\r\nHost: runner\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
            ).encode()
            + b'{"source_code": "'
        )
        answer = read_answer(sock)  # only 17 of the declared bytes were sent: no read may wait for more

    assert answer.startswith("HTTP/1.0 413 ")
    assert "larger than this sandbox runner accepts (8388608 bytes)" in answer


@pytest.mark.docker
@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"{not json", "the body is not JSON"),
        (b"[]", "the body must be a JSON object"),
        (json.dumps(body(extra=1)).encode(), "unknown field(s): extra"),
        (json.dumps(body(name="not a name")).encode(), "name must be the tool function's name"),
        (json.dumps(body(source_code=3)).encode(), "source_code must be a non-empty string"),
        (json.dumps(body(env={"A": 1})).encode(), "env must map non-empty names"),
        (json.dumps(body(env={"A=B": "x"})).encode(), "env must map non-empty names"),
        (json.dumps(body(limits={"memory_mb": 1})).encode(), "limits.memory_mb must be at least 6"),
        (json.dumps(body(limits={"cpus": "all"})).encode(), "limits.cpus must be a number"),
        (json.dumps(body(limits={"pids_limit": 1.5})).encode(), "limits.pids_limit must be an integer"),
        (json.dumps(body(limits={"network_enabled": "yes"})).encode(), "limits.network_enabled must be"),
        (json.dumps(body(limits={"swap": 1})).encode(), "unknown field(s) in limits: swap"),
        (json.dumps(body(pip_requirements="numpy")).encode(), "pip_requirements must be a list"),
    ],
)
def test_malformed_calls_are_400_naming_the_problem(runner, payload, message):
    response = httpx.post(
        runner.url + "/v1/run",
        content=payload,
        headers={**auth(TOKEN), "Content-Type": "application/json"},
        timeout=10,
    )

    assert response.status_code == 400
    assert response.json()["error"].startswith(message)


@pytest.mark.docker
def test_a_bad_requirement_is_the_in_process_error_as_an_outcome(runner):
    response = runner.post(body(pip_requirements=["--index-url http://evil"]))

    assert response.status_code == 200
    assert response.json()["ok"] is False
    assert response.json()["error"].startswith(
        "Tool 'add' could not run in the Docker sandbox: Invalid pip requirement '--index-url http://evil'"
    )


@pytest.mark.docker
@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/run", 405),
        ("DELETE", "/v1/run", 405),
        ("POST", "/v1/health", 405),
        ("GET", "/", 404),
        ("GET", "/v1/run/", 404),
        ("PURGE", "/v1/containers", 404),
    ],
)
def test_nothing_else_is_served(runner, method, path, status):
    response = httpx.request(method, runner.url + path, headers=auth(TOKEN), timeout=10)

    assert response.status_code == status


# --- a runner that is down ------------------------------------------------------------------------


@pytest.mark.docker
def test_a_runner_that_is_down_is_an_error_result_never_a_500(
    docker_image, runner_settings, actor, org, api_client_for, tmp_path
):
    second = RunnerProcess(tmp_path / "second.log").wait_ready()
    runner_settings.SANDBOX_RUNNER_URL = second.url
    client = api_client_for(actor)
    ran = client.post("/v1/tools/run", {"source_code": ADD_SOURCE, "args": {"a": 1}}, format="json")
    second.stop()  # after a call: its health answer is still cached

    gone = client.post("/v1/tools/run", {"source_code": ADD_SOURCE, "args": {"a": 1}}, format="json")
    asked_again = client.post("/v1/tools/run", {"source_code": ADD_SOURCE, "args": {"a": 1}}, format="json")
    agent_call = run_custom_tool(
        custom_tool(org), {"word": "x"}, ToolContext(actor=Actor.system(org.id), agent_id="agent-x")
    )

    assert (ran.status_code, ran.json()["tool_return"]) == (200, "3")
    result = gone.json()
    assert (gone.status_code, result["status"], result["sandbox"]) == (200, "error", "docker")
    assert result["tool_return"] == (
        "Error executing tool add: Tool 'add' could not run in the Docker sandbox: the sandbox runner "
        "could not be reached"
    )
    assert second.url not in gone.text  # the runner's internal address is for the server log only
    assert (asked_again.status_code, asked_again.json()["detail"]) == (
        400,
        "Tools cannot be run here: Tool 'add' cannot run: the Docker sandbox is required but no Docker "
        "engine answers.",
    )
    assert agent_call.status == "error"
    assert "no Docker engine answers" in agent_call.return_value
    for text in (gone.text, asked_again.text, str(agent_call.return_value)):
        assert TOKEN not in text


# --- starting it ------------------------------------------------------------------------------------


def test_the_runner_refuses_to_start_without_a_token(tmp_path):
    refused = RunnerProcess(tmp_path / "refused.log", token=None)
    refused.process.wait(timeout=60)
    refused.log_file.close()

    assert refused.process.returncode != 0
    assert (
        "SANDBOX_RUNNER_TOKEN is not set: the sandbox runner does not start without a token" in refused.log()
    )


# --- on a Unix socket (docker-compose.yml: the runner shares the host's network namespace) -----------

SOCKET_GID = 4242  # a group this process is not in: the runner (root here) gives the socket to it


@pytest.fixture
def unix_runner(docker_image: str, tmp_path: Path) -> Iterator[RunnerProcess]:
    process = RunnerProcess(
        tmp_path / "unix.log", socket_path=tmp_path / "r.sock", SANDBOX_RUNNER_SOCKET_GID=str(SOCKET_GID)
    ).wait_ready()
    yield process
    if process.process.poll() is None:
        process.stop()


@pytest.mark.docker
def test_tools_run_through_a_runner_on_a_unix_socket(
    unix_runner, docker_settings, no_engine_here, actor, api_client_for
):
    docker_settings.SANDBOX_BACKEND = "docker"
    docker_settings.SANDBOX_RUNNER_URL = unix_runner.url
    docker_settings.SANDBOX_RUNNER_TOKEN = TOKEN
    remote.forget_health()
    client = api_client_for(actor)
    before = unix_runner.runs()

    ran = client.post("/v1/tools/run", {"source_code": ADD_SOURCE, "args": {"a": 2, "b": 3}}, format="json")
    docker_settings.SANDBOX_RUNNER_TOKEN = "not-" + TOKEN
    remote.forget_health()
    refused = client.post("/v1/tools/run", {"source_code": ADD_SOURCE, "args": {"a": 1}}, format="json")
    remote.forget_health()

    assert unix_runner.url.startswith("unix:///")
    result = ran.json()
    assert (ran.status_code, result["status"], result["tool_return"], result["sandbox"]) == (
        200,
        "success",
        "5",
        "docker",
    )
    assert unix_runner.runs() == before + 1
    assert refused.status_code == 400  # the runner said 401 to the health call: no engine answers
    assert "no Docker engine answers" in refused.json()["detail"]
    assert TOKEN not in refused.text
    assert unix_runner.runs() == before + 1


@pytest.mark.docker
def test_a_unix_socket_runner_needs_the_token_and_serves_only_its_two_paths(unix_runner):
    wrong = unix_runner.post(body(), token="not-" + TOKEN)
    missing = unix_runner.get("/v1/health", token=None)
    elsewhere = unix_runner.get("/v1/containers")
    health = unix_runner.get("/v1/health")
    ran = unix_runner.post(body())

    assert (wrong.status_code, missing.status_code, elsewhere.status_code) == (401, 401, 404)
    assert wrong.headers["WWW-Authenticate"] == "Bearer"
    assert (health.status_code, health.json()["engine"]) == (200, True)
    assert (ran.status_code, ran.json()["return_value"]) == (200, 5)
    assert "sandbox_runner.request" in unix_runner.log()
    assert TOKEN not in unix_runner.log()


@pytest.mark.docker
def test_the_socket_is_0660_for_its_group_and_gone_after_the_runner(unix_runner):
    path = unix_runner.socket_path
    assert path is not None
    found = path.lstat()

    assert stat.S_ISSOCK(found.st_mode)
    assert stat.S_IMODE(found.st_mode) == 0o660
    assert (found.st_uid, found.st_gid) == (os.getuid(), SOCKET_GID)
    assert "sandbox runner on unix:" + str(path) in unix_runner.log()

    unix_runner.stop()

    assert not path.exists()


@pytest.mark.docker
def test_a_stale_socket_of_a_killed_runner_does_not_stop_the_next_one(docker_image, tmp_path):
    path = tmp_path / "r.sock"
    killed = RunnerProcess(tmp_path / "killed.log", socket_path=path).wait_ready()
    killed.kill()
    assert stat.S_ISSOCK(path.lstat().st_mode)  # left behind, nothing listens on it

    successor = RunnerProcess(tmp_path / "successor.log", socket_path=path).wait_ready()
    second = RunnerProcess(tmp_path / "second.log", socket_path=path)  # while the successor lives
    second.process.wait(timeout=60)
    second.log_file.close()
    second.http.close()
    health = successor.get("/v1/health")
    successor.stop()

    assert health.status_code == 200
    assert "stale_socket_removed" in successor.log()
    assert second.process.returncode != 0
    assert "another server is listening on this socket" in second.log()
    assert not path.exists()
    assert_no_containers_of(killed.pid)


def test_a_file_that_is_not_a_socket_is_never_removed(tmp_path):
    path = tmp_path / "r.sock"
    path.write_text("not a socket")

    refused = RunnerProcess(tmp_path / "refused.log", socket_path=path)
    refused.process.wait(timeout=60)
    refused.log_file.close()
    refused.http.close()

    assert refused.process.returncode != 0
    assert f"cannot listen on 'unix:{path}'" in refused.log()
    assert "it exists and is not a socket (not removed)" in refused.log()
    assert path.read_text() == "not a socket"


@pytest.mark.parametrize(
    ("address", "path"),
    [
        ("unix:///run/letta-sandbox/runner.sock", "/run/letta-sandbox/runner.sock"),
        ("unix:/run/letta-sandbox/runner.sock", "/run/letta-sandbox/runner.sock"),
        ("UNIX:/r.sock", "/r.sock"),
        ("http://sandbox-runner:8290", None),
        ("0.0.0.0:8290", None),
    ],
)
def test_unix_socket_addresses(address, path):
    assert remote.unix_socket_path(address) == path


@pytest.mark.parametrize("address", ["unix:relative.sock", "unix://host/r.sock", "unix:"])
def test_a_unix_address_without_an_absolute_path_is_refused(address):
    with pytest.raises(ValueError, match="unix:/absolute/path or unix:///absolute/path"):
        remote.unix_socket_path(address)


def test_a_runner_url_on_a_missing_socket_is_an_error_outcome(settings, tmp_path, caplog):
    settings.SANDBOX_RUNNER_URL = f"unix://{tmp_path}/nothing.sock"
    settings.SANDBOX_RUNNER_TOKEN = TOKEN
    remote.forget_health()

    answers = remote.runner_answers(ttl_seconds=0)
    outcome = remote.run_in_runner(
        source_code=ADD_SOURCE,
        name="add",
        arguments={},
        env={},
        image=None,
        requirements=[],
        limits=remote.RunLimits(),
    )
    remote.forget_health()

    assert answers is False
    assert outcome.ok is False
    assert (
        outcome.error
        == "Tool 'add' could not run in the Docker sandbox: the sandbox runner could not be reached"
    )
    assert str(tmp_path) not in outcome.error
    assert "ConnectError" not in outcome.error
    logged = [r.error for r in caplog.records if r.getMessage() == "sandbox.runner_failed"]
    assert logged
    assert f"unix://{tmp_path}/nothing.sock is unreachable (ConnectError" in logged[0]
    assert TOKEN not in outcome.error
