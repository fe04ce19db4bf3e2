"""Fixtures for the llm app: a scripted OpenAI-compatible server, fast retries, and a network guard."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings as django_settings

from apps.accounts.models import Organization
from apps.llm.handles import ModelTarget, resolve_model
from tests.support.scripted_llm import ScriptedLLM, ScriptedLLMServer

LOOPBACK = {"127.0.0.1", "::1", "localhost"}
MESSAGES = [{"role": "user", "content": "hi"}]


def _allowed_hosts() -> set[str]:
    """Loopback plus the database and Redis hosts (remote in CI), by name and by address."""
    names = {
        django_settings.DATABASES["default"].get("HOST") or "",
        urlsplit(django_settings.REDIS_URL).hostname or "",
    }
    allowed = set(LOOPBACK)
    for name in filter(None, names):
        allowed.add(name)
        with contextlib.suppress(OSError):
            allowed.update(info[4][0] for info in socket.getaddrinfo(name, None))
    return allowed


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail loudly if anything (cost map, telemetry, tokenizers) tries to reach another machine."""
    allowed = _allowed_hosts()
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in allowed:
            raise AssertionError(f"network access attempted: {address!r}")
        return real_connect(self, address)

    real_lookup = socket.getaddrinfo

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and host not in allowed:
            raise AssertionError(f"network name lookup attempted: {host!r}")
        return real_lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    monkeypatch.setattr(socket, "getaddrinfo", lookup)


@pytest.fixture(autouse=True)
def _fast_retries(settings) -> None:
    """Three attempts with millisecond backoff, so retry tests take no noticeable time."""
    settings.LLM_MAX_ATTEMPTS = 3
    settings.LLM_RETRY_BASE_DELAY = 0.001
    settings.LLM_RETRY_MAX_DELAY = 0.01
    settings.LLM_REQUEST_TIMEOUT = 10.0


@pytest.fixture
def allow_loopback(settings) -> None:
    """The operator opens 127.0.0.1 to organisations' providers (OUTBOUND_ALLOW), as for a model server
    on the same host: tests whose organisation provider is a loopback test server need it."""
    settings.OUTBOUND_ALLOW = ["127.0.0.1"]


@pytest.fixture(scope="session")
def server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as srv:
        yield srv


@pytest.fixture
def llm(server: ScriptedLLMServer) -> Iterator[ScriptedLLM]:
    client = server.client()
    client.reset(config=True)
    yield client
    client.reset(config=True)


@pytest.fixture
def env_openai(settings, server: ScriptedLLMServer) -> None:
    """The deployment's OPENAI_* settings point `openai/<any model>` at the scripted server."""
    settings.OPENAI_API_KEY = "sk-env"
    settings.OPENAI_BASE_URL = server.url
    settings.ANTHROPIC_API_KEY = ""
    settings.OLLAMA_BASE_URL = ""


@pytest.fixture
def target(env_openai: None, org: Organization) -> ModelTarget:
    return resolve_model("openai/scripted-chat", organization_id=org.id)


@pytest.fixture
def canned_server() -> Iterator[Callable[..., tuple[str, list[str]]]]:
    """Servers that answer every POST with one fixed body (200 JSON unless told); each yields its /v1
    URL and hits."""
    servers: list[ThreadingHTTPServer] = []

    def start(
        body: bytes, *, status: int = 200, content_type: str = "application/json"
    ) -> tuple[str, list[str]]:
        hits: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                hits.append(self.path)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}/v1", hits

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()
