"""The sandbox runner: a small internal HTTP service, in production the only process holding the Docker socket.

Holding the socket is root on the host, so the web and worker processes do not: they send the one
operation they need, "run this tool with these limits", here (apps/sandbox/remote.py). The service
accepts exactly that (`POST /v1/run`) and `GET /v1/health`; every other path is 404, every other method
405. Every request needs `Authorization: Bearer <SANDBOX_RUNNER_TOKEN>` (compared in constant time).

A call's limits are clamped to the operator's maxima (SANDBOX_RUNNER_MAX_*; the answer says which limits
applied), never refused for being too high: a tenant's config asking for more than this runner gives
still runs, within the runner's bounds. Malformed fields, limits below what Docker can apply and images
the operator did not allow are 400 naming the field. A body past SANDBOX_RUNNER_MAX_BODY_BYTES is 413 and
is not read. The tool runs through the same code path as the in-process Docker backend
(selection.run_docker_tool), with this runner's network, tmpfs and output settings.

A tool's environment holds tenant secrets: it is in no log line, repr or error message.
stdlib ThreadingHTTPServer is enough for this narrow service (one request per connection, one thread per
request, each bounded by the call's timeout); it is not exposed outside the deployment's internal network.

It listens on HOST:PORT or on a Unix socket (SANDBOX_RUNNER_BIND=unix:/path/runner.sock, or
unix:///path/runner.sock): the same HTTP and the same token over it. docker-compose.yml uses the socket,
because there the runner shares the host's network namespace (the egress filter's iptables rules are the
host's) and must expose no TCP port on it. See UnixRunnerServer for the socket file's life and mode.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import json
import logging
import math
import os
import signal
import socket
import socketserver
import stat
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from docker.errors import DockerException, NotFound

from apps.sandbox import docker_sandbox, images
from apps.sandbox.docker_sandbox import LABEL, LABEL_HOST, LABEL_PID, DockerOutcome, DockerUnavailable
from apps.sandbox.models import SandboxConfig
from apps.sandbox.remote import HEALTH_PATH, RUN_PATH, RunLimits, unix_socket_path
from apps.sandbox.selection import container_spec, run_docker_tool

logger = logging.getLogger(__name__)

MIN_TOKEN_LENGTH = 16
MIN_MEMORY_MB = 6  # Docker refuses less
MIN_CPUS = 0.01  # Docker's smallest CPU quota
# The Unix socket's mode: its owner (the runner) and its group (SANDBOX_RUNNER_SOCKET_GID, the app user's
# group in docker-compose.yml: web and worker) may connect, nobody else; the token is still required.
SOCKET_MODE = 0o660
FIELDS = frozenset({"source_code", "name", "arguments", "env", "pip_requirements", "image", "limits"})
LIMIT_FIELDS = frozenset(f.name for f in fields(RunLimits))


@dataclass(frozen=True)
class RunnerConfig:
    """What the operator decides (settings); the token never shows in a repr."""

    token: str = field(repr=False)
    base_image: str
    allowed_images: frozenset[str]
    pull: bool
    max_body_bytes: int
    max_memory_mb: int
    max_cpus: float
    max_pids: int
    max_timeout: float

    @classmethod
    def from_settings(cls) -> RunnerConfig:
        """Raises ImproperlyConfigured without a token of at least MIN_TOKEN_LENGTH characters."""
        token = settings.SANDBOX_RUNNER_TOKEN
        if not token:
            raise ImproperlyConfigured(
                "SANDBOX_RUNNER_TOKEN is not set: the sandbox runner does not start without a token"
            )
        if len(token) < MIN_TOKEN_LENGTH or not token.isprintable() or " " in token:
            raise ImproperlyConfigured(
                f"SANDBOX_RUNNER_TOKEN must be at least {MIN_TOKEN_LENGTH} printable characters without "
                "spaces (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return cls(
            token=token,
            base_image=settings.SANDBOX_BASE_IMAGE,
            allowed_images=frozenset(i for i in settings.SANDBOX_RUNNER_ALLOWED_IMAGES if i),
            pull=settings.SANDBOX_PULL_IMAGES,
            max_body_bytes=settings.SANDBOX_RUNNER_MAX_BODY_BYTES,
            max_memory_mb=settings.SANDBOX_RUNNER_MAX_MEMORY_MB,
            max_cpus=settings.SANDBOX_RUNNER_MAX_CPUS,
            max_pids=settings.SANDBOX_RUNNER_MAX_PIDS,
            max_timeout=settings.SANDBOX_RUNNER_MAX_TIMEOUT,
        )


class BadRequest(ValueError):
    """A 400: the message names the field and never quotes a value of `env`."""


@dataclass(frozen=True)
class RunRequest:
    source_code: str
    name: str
    arguments: dict[str, object]
    env: dict[str, str] = field(repr=False)  # tenant secrets
    pip_requirements: list[object]
    image: str
    limits: RunLimits  # already clamped


# --- the request: validation and clamping (pure) ---------------------------------------------------


def parse_run_request(body: bytes, config: RunnerConfig) -> RunRequest:
    """The body of `POST /v1/run` as a RunRequest with clamped limits; raises BadRequest."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    source_code = data.get("source_code")
    if not isinstance(source_code, str) or not source_code.strip():
        raise BadRequest("source_code must be a non-empty string")
    name = data.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise BadRequest("name must be the tool function's name (a Python identifier)")
    arguments = data.get("arguments", {})
    if not isinstance(arguments, dict):
        raise BadRequest("arguments must be a JSON object")
    return RunRequest(
        source_code=source_code,
        name=name,
        arguments=arguments,
        env=_env(data.get("env", {})),
        pip_requirements=_requirements(data.get("pip_requirements", [])),
        image=allowed_image(data.get("image"), config),
        limits=clamp_limits(data.get("limits", {}), config),
    )


def _env(raw: object) -> dict[str, str]:
    ok = isinstance(raw, dict) and all(
        isinstance(k, str) and k and "=" not in k and "\0" not in k and isinstance(v, str) and "\0" not in v
        for k, v in raw.items()
    )
    if not ok:
        raise BadRequest("env must map non-empty names without '=' or NUL to string values without NUL")
    return dict(raw)


def _requirements(raw: object) -> list[object]:
    """Only the shape here; run_docker_tool refuses what is not PEP 508, with the in-process message."""
    if not isinstance(raw, list) or not all(isinstance(item, str | dict) for item in raw):
        raise BadRequest("pip_requirements must be a list of strings or {name, version} objects")
    return raw


def allowed_image(raw: object, config: RunnerConfig) -> str:
    """The image a call names (None or empty: the base image); only the operator's images are allowed."""
    if raw is None or raw == "":
        return config.base_image
    if not isinstance(raw, str):
        raise BadRequest("image must be a string or null")
    if raw != config.base_image and raw not in config.allowed_images:
        allowed = ", ".join(sorted({config.base_image, *config.allowed_images}))
        raise BadRequest(f"image {raw!r} is not allowed on this sandbox runner (allowed: {allowed})")
    return raw


def clamp_limits(raw: object, config: RunnerConfig) -> RunLimits:
    """Missing limits take the model's defaults; each is then capped at the operator's maximum."""
    if not isinstance(raw, dict):
        raise BadRequest("limits must be a JSON object")
    unknown = sorted(set(raw) - LIMIT_FIELDS)
    if unknown:
        raise BadRequest(f"unknown field(s) in limits: {', '.join(unknown)}")
    defaults = RunLimits()
    network = raw.get("network_enabled", defaults.network_enabled)
    if not isinstance(network, bool):
        raise BadRequest("limits.network_enabled must be true or false")
    return RunLimits(
        memory_mb=min(
            int(_number(raw, "memory_mb", defaults.memory_mb, MIN_MEMORY_MB, integer=True)),
            config.max_memory_mb,
        ),
        cpus=min(float(_number(raw, "cpus", defaults.cpus, MIN_CPUS)), config.max_cpus),
        pids_limit=min(
            int(_number(raw, "pids_limit", defaults.pids_limit, 1, integer=True)), config.max_pids
        ),
        timeout_seconds=min(
            float(_number(raw, "timeout_seconds", defaults.timeout_seconds, 0.001)), config.max_timeout
        ),
        network_enabled=network,
    )


def _number(raw: dict[str, Any], key: str, default: float, minimum: float, *, integer: bool = False) -> float:
    value = raw.get(key, default)
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        raise BadRequest(f"limits.{key} must be {'an integer' if integer else 'a number'}")
    if value < minimum:
        raise BadRequest(f"limits.{key} must be at least {minimum:g}")
    return value


# --- the two operations --------------------------------------------------------------------------


def execute(request: RunRequest) -> dict[str, object]:
    """Run the call on this process's engine; the answer is the outcome (tool failures included)."""
    started = time.perf_counter()
    limits = request.limits
    spec = container_spec(  # the in-process backend's own mapping (network choice included)
        SandboxConfig(
            sandbox_type=SandboxConfig.Type.DOCKER,
            network_enabled=limits.network_enabled,
            memory_mb=limits.memory_mb,
            cpus=limits.cpus,
            pids_limit=limits.pids_limit,
        ),
        request.image,
    )
    outcome = run_docker_tool(
        source_code=request.source_code,
        name=request.name,
        arguments=request.arguments,
        env=request.env,
        limits=spec,
        requirements=request.pip_requirements,
        timeout_seconds=limits.timeout_seconds,
    )
    docker = outcome if isinstance(outcome, DockerOutcome) else None
    total_ms = docker.total_ms if docker else round((time.perf_counter() - started) * 1000, 3)
    logger.info(
        "sandbox_runner.run",
        extra={"tool": request.name, "ok": outcome.ok, "image": request.image, "total_ms": total_ms},
    )
    return {
        "ok": outcome.ok,
        "return_value": outcome.return_value,
        "stdout": outcome.stdout,
        "stderr": outcome.stderr,
        "error": outcome.error,
        "warm": docker.warm if docker else False,
        "exec_ms": docker.exec_ms if docker else 0.0,
        "total_ms": total_ms,
        "limits": asdict(limits),
    }


def health(config: RunnerConfig) -> tuple[int, dict[str, object]]:
    """(status, body): 200 when the engine answers and the base image is present (or pulled now)."""
    if not docker_sandbox.docker_available(ttl_seconds=0):
        return 503, {"ok": False, "engine": False, "image": False, "error": "no Docker engine answers"}
    try:
        images.ensure_image(config.base_image, pull=config.pull)
    except (images.ImageUnavailable, DockerException, DockerUnavailable) as exc:
        return 503, {"ok": False, "engine": True, "image": False, "error": str(exc)}
    return 200, {"ok": True, "engine": True, "image": True, "error": None}


def reap_predecessors() -> int:
    """Remove sandbox containers labelled with this host and this pid: a new runner has none yet, so they
    are a dead predecessor's (in a container the runner's pid is the same after every restart, which
    docker_sandbox.reap_orphans takes for alive)."""
    client = docker_sandbox.get_client()
    labels = [LABEL, f"{LABEL_HOST}={socket.gethostname()}", f"{LABEL_PID}={os.getpid()}"]
    removed = 0
    for container in client.containers.list(all=True, filters={"label": labels}):
        with contextlib.suppress(NotFound):
            container.remove(force=True)
            removed += 1
    return removed


# --- HTTP ----------------------------------------------------------------------------------------


class RunnerHandler(BaseHTTPRequestHandler):
    server: RunnerServer | UnixRunnerServer
    protocol_version = "HTTP/1.0"  # one request per connection: no idle keep-alive thread to wait for
    server_version = "letta-sandbox-runner"
    sys_version = ""
    timeout = 60  # seconds a client may take to send its request

    def __getattr__(self, name: str) -> Any:
        # Every method gets the routing below (404/405), not http.server's 501.
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)

    def handle_expect_100(self) -> bool:
        return True  # no "100 Continue": a body is invited only by being read, after the checks

    def _dispatch(self) -> None:
        self._started = time.perf_counter()
        if not self._authorized():
            self._send(
                401,
                {"error": "this sandbox runner needs Authorization: Bearer <SANDBOX_RUNNER_TOKEN>"},
                {"WWW-Authenticate": "Bearer"},
            )
            return
        routes = {RUN_PATH: ("POST", self._run), HEALTH_PATH: ("GET", self._health)}
        route = routes.get(urlsplit(self.path).path)
        if route is None:
            self._send(
                404, {"error": f"no such path; this service answers POST {RUN_PATH} and GET {HEALTH_PATH}"}
            )
            return
        method, operation = route
        if self.command != method:
            self._send(405, {"error": f"use {method}"}, {"Allow": method})
            return
        operation()

    def _authorized(self) -> bool:
        scheme, _, given = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), self.server.config.token.encode())

    def _health(self) -> None:
        status, body = health(self.server.config)
        self._send(status, body)

    def _run(self) -> None:
        body = self._body()
        if body is None:
            return
        try:
            request = parse_run_request(body, self.server.config)
        except BadRequest as exc:
            self._send(400, {"error": str(exc)})
            return
        try:
            answer = execute(request)
        except Exception:
            logger.exception("sandbox_runner.failed", extra={"tool": request.name})
            self._send(500, {"error": "the sandbox runner failed; its log says why"})
            return
        self._send(200, answer)

    def _body(self) -> bytes | None:
        """The request body, or None once an error was answered. Nothing past the cap is read."""
        cap = self.server.config.max_body_bytes
        declared = self.headers.get("Content-Length")
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower() or declared is None:
            self._send(411, {"error": "a Content-Length is required"})
            return None
        try:
            length = int(declared)
            if length < 0:
                raise ValueError
        except ValueError:
            self._send(400, {"error": "Content-Length must be a non-negative integer"})
            return None
        if length > cap:
            self._send(413, {"error": f"the body is larger than this sandbox runner accepts ({cap} bytes)"})
            return None
        body = self.rfile.read(length)
        if len(body) < length:
            self._send(400, {"error": "the body ended before its Content-Length"})
            return None
        return body

    def _send(self, status: int, body: dict[str, object], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Method, path and status only: headers (the token) and bodies (tenant env) are never logged.
        started = getattr(self, "_started", None)
        logger.info(
            "sandbox_runner.request",
            extra={
                "method": self.command,
                "path": urlsplit(self.path).path,
                "status": int(code) if str(code).isdigit() else code,
                "ms": round((time.perf_counter() - started) * 1000, 3) if started else None,
            },
        )

    def log_message(self, format: str, *args: Any) -> None:
        logger.info("sandbox_runner.http " + (format % args))

    def address_string(self) -> str:
        # A Unix socket's peer has no address (client_address is "" or a path, not (host, port)).
        if isinstance(self.client_address, tuple) and self.client_address:
            return str(self.client_address[0])
        return "unix-socket"


class _Serving:
    """What both servers share; first in their bases, so these win over socketserver's defaults."""

    daemon_threads = False  # server_close() waits for the calls in flight (each bounded by its timeout)
    block_on_close = True
    request_queue_size = 64
    config: RunnerConfig

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.warning("sandbox_runner.connection_error", exc_info=True)


class RunnerServer(_Serving, ThreadingHTTPServer):
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], config: RunnerConfig) -> None:
        self.config = config
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, RunnerHandler)


class UnixRunnerServer(_Serving, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The runner on a Unix socket file.

    At start a stale socket file (a killed runner's: nothing accepts on it) is removed; anything else at
    the path (a live runner, a file that is not a socket) is an error and is left alone. The new socket
    gets SOCKET_MODE and, with SANDBOX_RUNNER_SOCKET_GID, that group, before it listens: a connection
    cannot be made to it before then, so it is never reachable with a wider mode. At shutdown the file
    is removed, unless another runner has replaced it meanwhile.
    """

    def __init__(self, path: str, config: RunnerConfig, *, socket_gid: int | None = None) -> None:
        self.config = config
        self.socket_gid = socket_gid
        self._created: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket file this made
        remove_stale_socket(path)
        super().__init__(path, RunnerHandler)

    def server_bind(self) -> None:
        super().server_bind()  # creates the file (umask's mode); it accepts nothing before listen()
        path = str(self.server_address)
        created = os.lstat(path)
        self._created = (created.st_dev, created.st_ino)  # from now on server_close() removes it
        if self.socket_gid is not None:
            os.chown(path, -1, self.socket_gid)  # needs membership of the group (or CAP_CHOWN)
        os.chmod(path, SOCKET_MODE)

    def server_close(self) -> None:
        try:
            super().server_close()
        finally:
            self._remove_socket_file()

    def _remove_socket_file(self) -> None:
        if self._created is None:
            return
        path = str(self.server_address)
        with contextlib.suppress(FileNotFoundError):
            found = os.lstat(path)
            if (found.st_dev, found.st_ino) == self._created:
                os.unlink(path)
        self._created = None


def remove_stale_socket(path: str) -> None:
    """Remove the socket file at `path` if nothing accepts connections on it; raises OSError when the path
    is in use by a live server or is not a socket (neither is touched)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(errno.EEXIST, "it exists and is not a socket (not removed)")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:  # nothing listens: a dead runner's
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            logger.info("sandbox_runner.stale_socket_removed", extra={"socket": path})
            return
        except FileNotFoundError:
            return
        except TimeoutError:
            pass  # it listens, but its backlog is full: alive all the same
    raise OSError(errno.EADDRINUSE, "another server is listening on this socket")


def parse_bind(bind: str) -> tuple[str, int]:
    """ "HOST:PORT" or "[IPv6]:PORT" -> (host, port); raises ValueError."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"bind address must be HOST:PORT, unix:/path or unix:///path, not {bind!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def listening_on(server: RunnerServer | UnixRunnerServer) -> str:
    """Where `server` listens, as SANDBOX_RUNNER_BIND would say it."""
    if isinstance(server, UnixRunnerServer):
        return f"unix:{server.server_address}"
    host, port = server.server_address[:2]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def make_server(
    bind: str, config: RunnerConfig, *, socket_gid: int | None = None
) -> RunnerServer | UnixRunnerServer:
    """Listen on `bind` (HOST:PORT, or a Unix socket: `socket_gid` is then its group) and clear what a
    dead predecessor left on this engine."""
    path = unix_socket_path(bind)
    server: RunnerServer | UnixRunnerServer
    if path is not None:
        server = UnixRunnerServer(path, config, socket_gid=socket_gid)
    else:
        server = RunnerServer(parse_bind(bind), config)
    try:
        reaped = reap_predecessors()
        docker_sandbox.get_pool()  # reaps containers of dead processes on this host, too
    except (DockerException, DockerUnavailable) as exc:
        logger.warning("sandbox_runner.engine_unavailable", extra={"error": str(exc)})
    else:
        if reaped:
            logger.info("sandbox_runner.reaped", extra={"containers": reaped})
    return server


def serve(server: RunnerServer | UnixRunnerServer) -> None:
    """Serve until SIGTERM or SIGINT, then finish the calls in flight. The idle pooled containers are
    removed at exit (docker_sandbox's atexit hook)."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, name="sandbox-runner", daemon=True)
    thread.start()
    while not stop.wait(1.0):
        pass
    logger.info("sandbox_runner.stopping")
    server.shutdown()
    server.server_close()
