"""The Docker backend through the sandbox runner (apps/sandbox/runner_service.py), when SANDBOX_RUNNER_URL
is set: this process then never talks to a Docker engine, so the web and worker processes do not hold
the engine's socket (which is root on the host).

"Does Docker answer" is a cached health call to the runner, and a tool call is one POST to it. The runner
is at an HTTP URL (`http://sandbox-runner:8290`) or on a Unix socket (`unix:///run/letta-sandbox/runner.sock`;
the same requests, to the same paths, over the socket). Every failure (runner down, refused, unreadable answer) is an error outcome naming the problem; the runner's
token (SANDBOX_RUNNER_TOKEN) is a secret and appears in no message or log line.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.conf import settings

from apps.sandbox.docker_sandbox import DockerOutcome
from apps.sandbox.outcome import SandboxOutcome

logger = logging.getLogger(__name__)

RUN_PATH = "/v1/run"
HEALTH_PATH = "/v1/health"
HEALTH_TIMEOUT_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 5.0
UNIX_BASE_URL = "http://sandbox-runner"  # the URL of a request over a Unix socket (only its path matters)


@dataclass(frozen=True)
class RunLimits:
    """The limits a call asks the runner for (it clamps them to its own maxima)."""

    memory_mb: int = 256
    cpus: float = 1.0
    pids_limit: int = 64
    timeout_seconds: float = 30.0
    network_enabled: bool = False


class RunnerProblem(Exception):
    """The runner could not be asked, or refused. The message is what a tool result may say (no token, no
    runner address, no network error text); `detail`, for the server log only, says more."""

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


UNREACHABLE = "the sandbox runner could not be reached"


_clients: dict[str | None, httpx.Client] = {}  # by Unix socket path (None: TCP)
_client_lock = threading.Lock()
_health: tuple[str, bool, float] | None = None  # (runner url, answers, when)


def unix_socket_path(address: str) -> str | None:
    """The socket path of a Unix socket address, `unix:/path` or `unix:///path`; None for any other address.

    Used for both ends: SANDBOX_RUNNER_URL here, SANDBOX_RUNNER_BIND in the runner. Raises ValueError for
    a `unix:` address that is not an absolute path (`unix://host/...` names no socket).
    """
    if address[:5].lower() != "unix:":
        return None
    path = address[5:]
    if path.startswith("//"):
        path = path[2:]
    if not path.startswith("/") or "\0" in path:
        raise ValueError(
            f"a Unix socket address is unix:/absolute/path or unix:///absolute/path, not {address!r}"
        )
    return path


def _http(uds: str | None = None) -> httpx.Client:
    """One client per process and socket (connection setup is not free); never shared across a fork."""
    with _client_lock:
        client = _clients.get(uds)
        if client is None:
            transport = httpx.HTTPTransport(uds=uds) if uds else None
            client = httpx.Client(trust_env=False, follow_redirects=False, transport=transport)
            _clients[uds] = client
        return client


def _after_fork() -> None:
    global _clients, _health
    _clients, _health = {}, None


os.register_at_fork(after_in_child=_after_fork)


def shown_url(url: str) -> str:
    """The runner URL without any user:password part, for messages."""
    try:
        uds = unix_socket_path(url)
    except ValueError:
        uds = None
    if uds is not None:
        return f"unix://{uds}"
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def _headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.SANDBOX_RUNNER_TOKEN}"}


def _endpoint(path: str) -> tuple[httpx.Client, str]:
    """The client and the URL for `path` on the runner: the base URL's own path, then `path` (over a Unix
    socket there is no base path: the request goes to `path`)."""
    url = settings.SANDBOX_RUNNER_URL
    try:
        uds = unix_socket_path(url)
    except ValueError as exc:
        raise RunnerProblem(UNREACHABLE, detail=f"SANDBOX_RUNNER_URL is not usable: {exc}") from None
    if uds is None:
        return _http(), url.rstrip("/") + path
    return _http(uds), UNIX_BASE_URL + path


def runner_answers(*, ttl_seconds: float = 30.0) -> bool:
    """Does the runner answer, with an engine behind it? Cached for `ttl_seconds` per runner URL.

    A missing base image does not make the answer no (the call then fails naming the image, as in
    process: a missing image is never a reason to run the tool elsewhere).
    """
    global _health
    url = settings.SANDBOX_RUNNER_URL
    now = time.monotonic()
    cached = _health
    if cached is not None and cached[0] == url and now - cached[2] < ttl_seconds:
        return cached[1]
    try:
        answers = _health_call()
    except RunnerProblem as exc:
        logger.warning("sandbox.runner_unavailable", extra={"runner": shown_url(url), "error": exc.detail})
        answers = False
    _health = (url, answers, now)
    return answers


def _health_call() -> bool:
    client, url = _endpoint(HEALTH_PATH)
    try:
        response = client.get(url, headers=_headers(), timeout=HEALTH_TIMEOUT_SECONDS)
    except httpx.HTTPError as exc:
        raise RunnerProblem(UNREACHABLE, detail=_unreachable(exc)) from None
    if response.status_code not in (200, 503):
        raise RunnerProblem(_refused(response))
    try:
        body = response.json()
    except ValueError:
        raise RunnerProblem("the sandbox runner's health answer is not JSON") from None
    if not isinstance(body, dict):
        raise RunnerProblem("the sandbox runner's health answer is not a JSON object")
    if body.get("engine") is not True:
        logger.warning("sandbox.runner_engine_unavailable", extra={"error": str(body.get("error", ""))})
    return body.get("engine") is True


def forget_health() -> None:
    """Ask the runner again on the next call (after a call could not reach it)."""
    global _health
    _health = None


def run_in_runner(
    *,
    source_code: str,
    name: str,
    arguments: dict[str, object],
    env: dict[str, str],
    image: str | None,
    requirements: list[object],
    limits: RunLimits,
) -> SandboxOutcome:
    """One tool call on the runner; never raises. `image` None or empty: the runner's base image."""
    payload = {
        "source_code": source_code,
        "name": name,
        "arguments": arguments,
        "env": env,
        "pip_requirements": list(requirements),
        "image": image or None,
        "limits": asdict(limits),
    }
    timeout = httpx.Timeout(
        limits.timeout_seconds + settings.SANDBOX_RUNNER_TIMEOUT_MARGIN, connect=CONNECT_TIMEOUT_SECONDS
    )
    try:
        client, url = _endpoint(RUN_PATH)
        try:
            response = client.post(url, json=payload, headers=_headers(), timeout=timeout)
        except httpx.TimeoutException:
            raise RunnerProblem(
                f"the sandbox runner did not answer within {timeout.read:g} s",
                detail=f"the sandbox runner at {shown_url(settings.SANDBOX_RUNNER_URL)} did not answer "
                f"within {timeout.read:g} s",
            ) from None
        except httpx.HTTPError as exc:
            forget_health()  # the runner went away: the next call asks again (and may fall back)
            raise RunnerProblem(UNREACHABLE, detail=_unreachable(exc)) from None
        if response.status_code != 200:
            raise RunnerProblem(_refused(response))
        return _outcome(response)
    except RunnerProblem as exc:
        logger.warning("sandbox.runner_failed", extra={"tool": name, "error": exc.detail})
        return SandboxOutcome(
            False, None, "", "", f"Tool '{name}' could not run in the Docker sandbox: {exc}"
        )
    except (TypeError, ValueError) as exc:  # arguments or env that JSON cannot carry
        return SandboxOutcome(
            False, None, "", "", f"Tool '{name}' could not run in the Docker sandbox: {exc}"
        )


def _outcome(response: httpx.Response) -> DockerOutcome:
    try:
        body = response.json()
    except ValueError:
        raise RunnerProblem("the sandbox runner's answer is not JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("ok"), bool):
        raise RunnerProblem("the sandbox runner's answer has no outcome")
    error = body.get("error")
    return DockerOutcome(
        body["ok"],
        body.get("return_value"),
        str(body.get("stdout") or ""),
        str(body.get("stderr") or ""),
        None if error is None else str(error),
        warm=bool(body.get("warm")),
        exec_ms=float(body.get("exec_ms") or 0.0),
        total_ms=float(body.get("total_ms") or 0.0),
    )


def _unreachable(exc: httpx.HTTPError) -> str:
    return (
        f"the sandbox runner at {shown_url(settings.SANDBOX_RUNNER_URL)} is unreachable "
        f"({type(exc).__name__}: {scrub(str(exc))})"
    )


def scrub(text: str) -> str:
    """`text` without the token (an HTTP library may quote a header it could not send)."""
    token = settings.SANDBOX_RUNNER_TOKEN
    return text.replace(token, "<SANDBOX_RUNNER_TOKEN>") if token else text


def _refused(response: httpx.Response) -> str:
    """Why the runner said no, from its JSON `error` (the runner never echoes the token)."""
    if response.status_code == 401:
        return "the sandbox runner refused this server's token (401): SANDBOX_RUNNER_TOKEN differs from the runner's"
    detail = ""
    try:
        body = response.json()
        if isinstance(body, dict):
            detail = str(body.get("error") or "")
    except ValueError:
        pass
    detail = detail[:500] or response.reason_phrase
    return f"the sandbox runner refused the call ({response.status_code}): {detail}"
