"""The Docker sandbox: a tool's source runs in a locked-down, single-use container.

Isolation (every container, whatever the tool): no network unless the sandbox config opts in, memory,
CPU and pids limits, a read-only root filesystem with a small tmpfs /tmp, user 65534 (nobody), all
capabilities dropped, no-new-privileges, no host mounts, and an environment made only of what the
caller passes (the server's own environment never reaches the engine).

Speed: a warm pool keeps a few started, idle containers (`sleep infinity`) per container spec; a call
takes one, runs the runner in it with `docker exec` (payload on stdin), and the container is then
removed. A container therefore serves exactly one call: nothing a tool leaves behind (files in /tmp,
background processes) can be seen by the next call or tenant. The pool refills in the background.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.types import Ulimit

from apps.sandbox.outcome import (
    RUNNER_SOURCE,
    WRAPPER,
    SandboxOutcome,
    new_boundary,
    split_result,
    text,
    tool_payload,
)

logger = logging.getLogger(__name__)

LABEL = "letta.sandbox"  # every container we start carries it: the handle for cleanup and leak checks
LABEL_HOST = "letta.sandbox.host"
LABEL_PID = "letta.sandbox.pid"
SANDBOX_USER = "65534:65534"  # nobody:nogroup, present in every Debian-based image


class DockerUnavailable(Exception):
    """No Docker engine answers (or the docker SDK cannot reach it)."""


@dataclass(frozen=True)
class ContainerSpec:
    """Everything fixed when a container is created; the warm pool keeps containers per spec."""

    image: str
    network: str | None = None  # None = network_mode "none"; else a Docker network name
    memory_mb: int = 256
    cpus: float = 1.0
    pids_limit: int = 64
    tmpfs_mb: int = 64


@dataclass(frozen=True)
class DockerOutcome(SandboxOutcome):
    warm: bool = False  # the call used a pre-started container from the pool
    exec_ms: float = 0.0  # from exec start to the end of the tool's output
    total_ms: float = 0.0  # including taking (or starting) the container
    container_id: str = ""  # already removed (or being removed) when the caller sees it


def container_kwargs(spec: ContainerSpec, labels: dict[str, str]) -> dict[str, Any]:
    """The `containers.create` arguments: the isolation contract in one place (tests read it back)."""
    return {
        "image": spec.image,
        "command": ["sleep", "infinity"],
        "user": SANDBOX_USER,
        "working_dir": "/tmp",
        "hostname": "sandbox",
        "environment": {},
        "use_config_proxy": False,  # the server's ~/.docker/config.json proxies are not the tool's business
        "network_mode": spec.network or "none",
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,noexec,size={spec.tmpfs_mb}m,mode=1777"},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "mem_limit": f"{spec.memory_mb}m",
        "memswap_limit": f"{spec.memory_mb}m",  # equal to the memory limit: no swap on top
        "nano_cpus": int(spec.cpus * 1_000_000_000),
        "pids_limit": spec.pids_limit,
        "ulimits": [Ulimit(name="nofile", soft=1024, hard=1024)],
        "oom_score_adj": 500,  # under host memory pressure, a tool dies before the server does
        "labels": labels,
        "detach": True,
    }


# --- the engine: one client per process, a cached ping ------------------------------------------------

_client: docker.DockerClient | None = None
_client_lock = threading.Lock()
_ping: tuple[bool, float] | None = None


def get_client() -> docker.DockerClient:
    """This process's Docker client (never shared across a fork: see _after_fork). Raises DockerUnavailable."""
    global _client
    with _client_lock:
        if _client is None:
            try:
                _client = docker.from_env(timeout=60)
            except DockerException as exc:
                raise DockerUnavailable(str(exc)) from exc
        return _client


def docker_available(*, ttl_seconds: float = 30.0) -> bool:
    """Does a Docker engine answer? Cached for `ttl_seconds`, so tool calls do not each pay a ping."""
    global _ping
    now = time.monotonic()
    if _ping is not None and now - _ping[1] < ttl_seconds:
        return _ping[0]
    try:
        ok = bool(get_client().ping())
    except (DockerUnavailable, DockerException, OSError) as exc:
        logger.info("sandbox.docker_unavailable", extra={"error": str(exc)})
        ok = False
    _ping = (ok, now)
    return ok


def forget_ping() -> None:
    """Ask the engine again on the next call (after a call failed on a connection error)."""
    global _ping
    _ping = None


def reset_docker_state() -> None:
    """Forget the client, the ping and the pool (tests; after a fork). Does not remove containers."""
    global _client, _ping, _pool
    _client, _ping, _pool = None, None, None


# --- the warm pool ---------------------------------------------------------------------------------


@dataclass
class PoolStats:
    warm: int = 0  # calls served by an idle pooled container
    cold: int = 0  # calls that had to start their own container
    started: int = 0
    removed: int = 0


@dataclass
class _Idle:
    container_id: str
    started_at: float


@dataclass
class WarmPool:
    """Started, idle containers per ContainerSpec. Each is handed out once, then removed.

    Invariant: a container id leaves `_idle` exactly once (acquire or expiry), and every container
    this pool started is removed by `discard` or `shutdown`; the LABEL_PID label lets the next process
    on this host reap what a killed process left behind (`reap_orphans`).
    """

    size: int = 2
    idle_seconds: float = 600.0
    max_idle_total: int = 16
    _idle: dict[ContainerSpec, deque[_Idle]] = field(default_factory=dict)
    _filling: set[ContainerSpec] = field(default_factory=set)
    _pending: set[Future[None]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="sandbox-pool")
    )
    stats: PoolStats = field(default_factory=PoolStats)
    labels: dict[str, str] = field(
        default_factory=lambda: {LABEL: "1", LABEL_HOST: socket.gethostname(), LABEL_PID: str(os.getpid())}
    )

    def acquire(self, spec: ContainerSpec) -> tuple[str, bool]:
        """A started container for one call: (id, warm). The caller must `release` it afterwards."""
        expired: list[str] = []
        taken: _Idle | None = None
        with self._lock:
            now = time.monotonic()
            for key, queue in self._idle.items():
                while queue and now - queue[0].started_at > self.idle_seconds:
                    expired.append(queue.popleft().container_id)
                if key == spec and queue:
                    taken = queue.popleft()
            if taken:
                self.stats.warm += 1
            else:
                self.stats.cold += 1
        for container_id in expired:
            self.discard(container_id)
        container_id = taken.container_id if taken else self._start(spec)
        return container_id, taken is not None

    def acquire_cold(self, spec: ContainerSpec) -> tuple[str, bool]:
        """A container started for this call alone, bypassing the idle ones."""
        with self._lock:
            self.stats.cold += 1
        return self._start(spec), False

    def release(self, spec: ContainerSpec, container_id: str, *, kill_now: bool = False) -> None:
        """After a call: remove its container and top the pool up again.

        Both happen in the background, after the call rather than during it: on a small machine a
        container starting next to the tool's exec slows the exec down by about half.
        """
        self.discard(container_id, wait=kill_now)
        self._schedule_refill(spec)

    def fill(self, spec: ContainerSpec) -> None:
        """Top the spec's idle containers up to `size` now (what the background refill does)."""
        while True:
            with self._lock:
                idle = sum(len(q) for q in self._idle.values())
                if len(self._idle.get(spec, ())) >= self.size or idle >= self.max_idle_total:
                    return
            container_id = self._start(spec)
            with self._lock:
                self._idle.setdefault(spec, deque()).append(_Idle(container_id, time.monotonic()))

    def discard(self, container_id: str, *, wait: bool = False) -> None:
        """Kill and remove a used container; in the background unless `wait` (a timeout must stop now)."""
        if wait:
            self._remove(container_id)
            return
        self._submit(self._remove, container_id)

    def drain(self, timeout: float = 60.0) -> None:
        """Wait for background refills and removals (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return
            for future in pending:
                future.result(timeout=max(0.0, deadline - time.monotonic()))

    def idle_count(self, spec: ContainerSpec | None = None) -> int:
        with self._lock:
            if spec is not None:
                return len(self._idle.get(spec, ()))
            return sum(len(q) for q in self._idle.values())

    def shutdown(self) -> None:
        """Remove every idle container and wait for pending work; the pool can be used again after."""
        with contextlib.suppress(Exception):
            self.drain()
        with self._lock:
            idle = [item.container_id for queue in self._idle.values() for item in queue]
            self._idle.clear()
        for container_id in idle:
            self._remove(container_id)

    def _schedule_refill(self, spec: ContainerSpec) -> None:
        with self._lock:
            if spec in self._filling or self.size <= 0:
                return
            self._filling.add(spec)
        self._submit(self._refill, spec)

    def _refill(self, spec: ContainerSpec) -> None:
        try:
            self.fill(spec)
        except (DockerException, DockerUnavailable) as exc:
            logger.warning("sandbox.pool_refill_failed", extra={"image": spec.image, "error": str(exc)})
        finally:
            with self._lock:
                self._filling.discard(spec)

    def _submit(self, fn: Any, arg: Any) -> None:
        future: Future[None] = self._executor.submit(fn, arg)
        with self._lock:
            self._pending.add(future)

        def done(f: Future[None]) -> None:
            with self._lock:
                self._pending.discard(f)

        future.add_done_callback(done)

    def _start(self, spec: ContainerSpec) -> str:
        client = get_client()
        container = client.containers.create(**container_kwargs(spec, self.labels))
        try:
            container.start()
        except DockerException:
            self._remove(container.id)
            raise
        with self._lock:
            self.stats.started += 1
        return str(container.id)

    def _remove(self, container_id: str) -> None:
        try:
            get_client().api.remove_container(container_id, force=True)
        except NotFound:
            pass
        except (DockerException, DockerUnavailable) as exc:
            logger.warning("sandbox.remove_failed", extra={"container": container_id, "error": str(exc)})
            return
        with self._lock:
            self.stats.removed += 1


_pool: WarmPool | None = None
_pool_lock = threading.Lock()


def get_pool() -> WarmPool:
    """This process's warm pool, sized from settings; the first use also reaps orphans on this host."""
    global _pool
    with _pool_lock:
        if _pool is None:
            from django.conf import settings

            _pool = WarmPool(
                size=settings.SANDBOX_POOL_SIZE,
                idle_seconds=settings.SANDBOX_POOL_IDLE_SECONDS,
                max_idle_total=settings.SANDBOX_POOL_MAX_IDLE,
            )
            with contextlib.suppress(DockerException, DockerUnavailable):
                reap_orphans()
        return _pool


def reap_orphans() -> int:
    """Remove sandbox containers on this host whose owning process is gone (killed workers)."""
    client = get_client()
    removed = 0
    host = socket.gethostname()
    for container in client.containers.list(all=True, filters={"label": [LABEL, f"{LABEL_HOST}={host}"]}):
        pid = int(container.labels.get(LABEL_PID, "0") or 0)
        if pid and _alive(pid):
            continue
        with contextlib.suppress(NotFound):
            container.remove(force=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _shutdown_at_exit() -> None:
    if _pool is not None and _pool.labels.get(LABEL_PID) == str(os.getpid()):
        _pool.shutdown()


def _after_fork() -> None:
    # A forked worker must not use the parent's HTTP connections, threads or containers.
    global _client, _ping, _pool
    _client, _ping, _pool = None, None, None


atexit.register(_shutdown_at_exit)
os.register_at_fork(after_in_child=_after_fork)


# --- one call --------------------------------------------------------------------------------------


def run_tool_in_docker(
    *,
    source_code: str,
    name: str,
    arguments: dict[str, object],
    env: dict[str, str],
    spec: ContainerSpec,
    timeout_seconds: float = 30.0,
    max_output_bytes: int = 8 * 1024 * 1024,
    pool: WarmPool | None = None,
) -> DockerOutcome:
    """Call `name(**arguments)` from `source_code` in a fresh container; never raises for tool failures.

    `env` is the whole environment the tool gets (plus HOME=/tmp). The container is removed after the
    call; on a timeout it is killed before this returns. Raises DockerUnavailable / DockerException
    only when the engine itself fails (the caller turns that into an error result).
    """
    pool = pool or get_pool()
    started = time.perf_counter()
    container_id, warm = pool.acquire(spec)
    boundary = new_boundary()
    payload = tool_payload(boundary, source_code, name, arguments)
    exec_env = {"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", **env}
    api = get_client().api
    exec_started = time.perf_counter()
    kill_now = False
    try:
        try:
            exec_id = _exec_create(api, container_id, exec_env)
        except APIError:
            if not warm:
                raise
            # A pooled container that died while idle (engine restart, someone's `docker rm`): start one.
            pool.release(spec, container_id, kill_now=True)
            container_id, warm = pool.acquire_cold(spec)
            exec_id = _exec_create(api, container_id, exec_env)
        deadline = time.monotonic() + timeout_seconds
        stream = _exec_stream(api, exec_id, payload, deadline, max_output_bytes)
        exec_ms = round((time.perf_counter() - exec_started) * 1000, 3)

        def outcome(ok: bool, value: object, stdout: bytes, error: str | None) -> DockerOutcome:
            return DockerOutcome(
                ok,
                value,
                text(stdout),
                text(stream.stderr),
                error,
                warm,
                exec_ms,
                _ms(started),
                container_id,
            )

        if stream.timed_out:
            kill_now = True
            return outcome(
                False,
                None,
                stream.stdout,
                f"Tool '{name}' timed out after {timeout_seconds:g} s and was stopped.",
            )
        if stream.overflow:
            kill_now = True
            return outcome(
                False,
                None,
                stream.stdout,
                f"Tool '{name}' wrote more than {max_output_bytes} bytes of output and was stopped.",
            )
        printed, result, written = split_result(stream.stdout, boundary)
        if result is None:
            if written:
                return outcome(False, None, printed, f"Tool '{name}' returned an unreadable result.")
            exit_code = api.exec_inspect(exec_id).get("ExitCode")
            return outcome(False, None, printed, _early_exit_reason(api, container_id, name, exit_code, spec))
        return outcome(bool(result.get("ok")), result.get("value"), printed, result.get("error"))  # type: ignore[arg-type]
    finally:
        pool.release(spec, container_id, kill_now=kill_now)


def _exec_create(api: Any, container_id: str, env: dict[str, str]) -> str:
    return str(
        api.exec_create(
            container_id,
            ["python3", "-I", "-c", WRAPPER, RUNNER_SOURCE],
            stdin=True,
            stdout=True,
            stderr=True,
            user=SANDBOX_USER,
            workdir="/tmp",
            environment=env,
        )["Id"]
    )


@dataclass
class _Stream:
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    overflow: bool = False


def _exec_stream(api: Any, exec_id: str, payload: bytes, deadline: float, max_bytes: int) -> _Stream:
    """Start the exec, send the payload then EOF on stdin, and demultiplex its output until it ends."""
    result = _Stream()
    sock = api.exec_start(exec_id, socket=True)
    raw: socket.socket = getattr(sock, "_sock", sock)
    try:
        raw.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            raw.sendall(payload)
            raw.shutdown(socket.SHUT_WR)  # the daemon closes the process's stdin: the runner reads to EOF
        except TimeoutError:
            result.timed_out = True
            return result
        except OSError:
            pass  # the process exited before reading everything; its output says why
        chunks: dict[int, list[bytes]] = {1: [], 2: []}
        total = 0
        for kind, data in _frames(raw, deadline, result):
            chunks.setdefault(kind, []).append(data)
            total += len(data)
            if total > max_bytes:
                result.overflow = True
                break
        result.stdout = b"".join(chunks[1])
        result.stderr = b"".join(chunks[2])
        return result
    finally:
        with contextlib.suppress(OSError):
            sock.close()
        with contextlib.suppress(OSError):
            raw.close()


def _frames(raw: socket.socket, deadline: float, state: _Stream) -> Iterator[tuple[int, bytes]]:
    """Docker's multiplexed stream (tty off): 8-byte header (stream, 0, 0, 0, big-endian size), data."""
    buffer = b""
    while True:
        while len(buffer) >= 8:
            kind, size = struct.unpack(">BxxxL", buffer[:8])
            if len(buffer) < 8 + size:
                break
            yield kind, buffer[8 : 8 + size]
            buffer = buffer[8 + size :]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            state.timed_out = True
            return
        raw.settimeout(remaining)
        try:
            data = raw.recv(65536)
        except TimeoutError:
            state.timed_out = True
            return
        except OSError:
            return  # the engine dropped the stream; the missing result says the call failed
        if not data:
            return
        buffer += data


def _early_exit_reason(
    api: Any, container_id: str, name: str, exit_code: int | None, spec: ContainerSpec
) -> str:
    oom = False
    with contextlib.suppress(DockerException):
        oom = bool(api.inspect_container(container_id)["State"].get("OOMKilled"))
    if oom or exit_code == 137:
        return (
            f"Tool '{name}' was killed before returning (exit code {exit_code}): it went over the sandbox's "
            f"memory limit of {spec.memory_mb} MB."
            if oom
            else f"Tool '{name}' was killed before returning (exit code 137, SIGKILL): probably over the "
            f"sandbox's memory limit of {spec.memory_mb} MB."
        )
    return f"Tool '{name}' exited with code {exit_code} before returning."


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
