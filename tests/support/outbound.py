"""Helpers for the outbound guard's tests (apps/core/outbound.py): small real servers on loopback
addresses, a resolver the tests control, and a fence that fails a test before anything leaves loopback.

Nothing here talks to another machine: servers bind 127.0.0.x or ::1, and `loopback_only` turns any
connection to another address, or any lookup of a name other than localhost, into an AssertionError.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

CHAT_COMPLETION = {
    "id": "chatcmpl-guard",
    "object": "chat.completion",
    "created": 0,
    "model": "guard-test",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail loudly on a connection outside 127.0.0.0/8 and ::1, or a lookup of a name other than
    localhost (a DNS query would leave the machine)."""
    real_connect = socket.socket.connect
    real_lookup = socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(str(address[0])):
            raise AssertionError(f"network access attempted: {address!r}")
        return real_connect(self, address)

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name is not None and name != "localhost" and not _is_loopback(str(name)):
            try:
                ipaddress.ip_address(str(name).split("%", 1)[0])
            except ValueError:
                raise AssertionError(f"network name lookup attempted: {host!r}") from None
        return real_lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", lookup)


class FakeResolver:
    """Stands for apps.core.outbound.resolve: names answer from `answers` (a list of address lists is
    one answer per lookup, the last repeated), IP literals are themselves, other names do not resolve.
    `lookups` records every (host, port) asked."""

    def __init__(self, answers: dict[str, list[str] | list[list[str]]]) -> None:
        self.answers = {name.lower(): value for name, value in answers.items()}
        self.lookups: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append((host, port))
        name = host.strip("[]").lower()
        try:
            return [str(ipaddress.ip_address(name))]
        except ValueError:
            pass
        if name not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        answer = self.answers[name]
        if answer and isinstance(answer[0], list):
            asked = sum(1 for h, _ in self.lookups if h.strip("[]").lower() == name)
            return list(answer[min(asked, len(answer)) - 1])
        return list(answer)  # type: ignore[arg-type]


class ConnectionRecorder:
    """A TCP listener that only records who connected (and closes at once): "did anything reach it?"."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.host = host
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.connections: list[Any] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.connections.append(peer)
            conn.close()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> ConnectionRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Reply = tuple[int, dict[str, str], bytes]


class RecordingHTTPServer:
    """An HTTP server on a loopback address: `reply(method, path, headers, body) -> (status, headers,
    body)` decides each answer (by default an OpenAI chat completion or embedding); `requests` records
    (method, path, headers) of everything it got."""

    def __init__(
        self, host: str = "127.0.0.1", reply: Callable[[str, str, dict[str, str], bytes], Reply] | None = None
    ) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.reply = reply or openai_reply()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.requests.append((self.command, self.path, headers))
                status, extra, payload = server.reply(self.command, self.path, headers, body)
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _handle

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

        self.httpd = Server((host, 0), Handler)
        self.host = host
        self.port = int(self.httpd.server_address[1])
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def cookies_seen(self) -> list[str]:
        return [headers["cookie"] for _, _, headers in self.requests if "cookie" in headers]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> RecordingHTTPServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def openai_reply(
    *, status: int = 200, headers: dict[str, str] | None = None, body: bytes | None = None
) -> Callable[[str, str, dict[str, str], bytes], Reply]:
    """Answers like an OpenAI-compatible server (a chat completion, or one embedding per input), or
    always with `status`, `headers` and `body` when a body is given."""

    def reply(method: str, path: str, request_headers: dict[str, str], request_body: bytes) -> Reply:
        extra = {"Content-Type": "application/json", **(headers or {})}
        if body is not None:
            return status, extra, body
        if path.endswith("/embeddings"):
            inputs = json.loads(request_body or b"{}").get("input") or [""]
            data = [
                {"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]} for i in range(len(inputs))
            ]
            payload: dict[str, Any] = {"object": "list", "data": data, "model": "guard-test"}
        else:
            payload = CHAT_COMPLETION
        return status, extra, json.dumps(payload).encode()

    return reply
