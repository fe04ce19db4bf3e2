"""A tarpit LLM for tests: an OpenAI-compatible server that answers too slowly on purpose. It is NOT an LLM.

It stands for the provider of issue 16, which sends a byte every 100 s: every read gets something, so a
per-read timeout never fires, and only a deadline for the whole call ends it. The test owns the server
(in-process); a worker in another process reaches it at `url` like any provider.

Modes (`server.mode`, read by each request when it arrives; the test may change it at any time):
    ``trickle``  headers at once, then one byte of a body that never ends every `interval` seconds: a
                 stream (``stream: true``) gets an SSE ``data:`` line, a blocking call a JSON object
    ``silent``   reads the request and never answers (not even headers)
    ``answer``   answers at once with `answer_text`, blocking or streamed, as any server would
    ``tool``     answers at once with a call of `tool_name` (not attached to the agent: the loop reads
                 the error tool-return and goes on), so a run's steps keep coming

Every chat request is recorded (`requests`): when it arrived, whether it streamed, and when the client
hung up (`hung_up_at`), which is how a test sees that a call was not only abandoned but its connection
closed. ``/v1/embeddings`` trickles in ``trickle`` mode and is a 404 otherwise (tests give agents no
embedding handle).
"""

from __future__ import annotations

import json
import select
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import chain, repeat
from typing import Any

from tests.support.scripted_llm import _Completion, text, tool_call, tool_calls

MODES = ("trickle", "silent", "answer", "tool")
SSE_PREFIX = b'data: {"id": "chatcmpl-tarpit", "choices": ['
JSON_PREFIX = b'{"id": "chatcmpl-tarpit", "choices": ['


@dataclass
class TarpitRequest:
    arrived_at: float  # time.monotonic() of this process
    mode: str
    streamed: bool
    hung_up_at: float | None = None
    bytes_sent: int = 0
    body: dict[str, Any] = field(default_factory=dict, repr=False)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/").endswith("/embeddings") and self.server.tarpit.mode == "trickle":
            request = TarpitRequest(time.monotonic(), "trickle", False)
            try:
                self._trickle(request)
            except (BrokenPipeError, ConnectionResetError):
                request.hung_up_at = time.monotonic()
            self.close_connection = True
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, "application/json", b'{"error": {"message": "tarpit: chat completions only"}}')
            return
        body = json.loads(raw or b"{}")
        tarpit = self.server.tarpit
        request = TarpitRequest(time.monotonic(), tarpit.mode, bool(body.get("stream")), body=body)
        with tarpit.lock:
            tarpit.requests.append(request)
        try:
            if request.mode == "trickle":
                self._trickle(request)
            elif request.mode == "silent":
                self._wait_for_hangup(request, forever=True)
            else:
                self._answer(request, body)
        except (BrokenPipeError, ConnectionResetError):
            request.hung_up_at = request.hung_up_at or time.monotonic()
        self.close_connection = True

    def _send(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _trickle(self, request: TarpitRequest) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if request.streamed else "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        body = chain(SSE_PREFIX if request.streamed else JSON_PREFIX, repeat(ord(" ")))
        for byte in body:
            if self._wait_for_hangup(request, forever=False):
                return
            self.wfile.write(b"1\r\n" + bytes([byte]) + b"\r\n")
            self.wfile.flush()
            request.bytes_sent += 1

    def _wait_for_hangup(self, request: TarpitRequest, *, forever: bool) -> bool:
        """Wait `interval` (or until the server stops, with `forever`); True once the client hung up."""
        tarpit = self.server.tarpit
        while not tarpit.stopping.is_set():
            readable, _, _ = select.select([self.connection], [], [], tarpit.interval)
            if readable and not self.connection.recv(1):
                request.hung_up_at = time.monotonic()
                return True
            if not forever:
                return False
        return True

    def _answer(self, request: TarpitRequest, body: dict[str, Any]) -> None:
        tarpit = self.server.tarpit
        if request.mode == "tool":
            turn = tool_calls(tool_call(tarpit.tool_name, {"again": True}))
        else:
            turn = text(tarpit.answer_text)
        if tarpit.answer_delay:
            time.sleep(tarpit.answer_delay)
        completion = _Completion(body, turn)
        if not request.streamed:
            self._send(200, "application/json", json.dumps(completion.full()).encode())
            return
        events = [f"data: {json.dumps(chunk)}\n\n".encode() for chunk in completion.chunks()]
        self._send(200, "text/event-stream", b"".join([*events, b"data: [DONE]\n\n"]))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    tarpit: TarpitLLMServer


class TarpitLLMServer:
    """The tarpit on a background thread; use as a context manager."""

    def __init__(self, *, interval: float = 0.5, mode: str = "trickle") -> None:
        self.interval = interval
        self.mode = mode
        self.answer_text = "OK"
        self.answer_delay = 0.0
        self.tool_name = "keep_going"
        self.requests: list[TarpitRequest] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._httpd: _Server | None = None

    @property
    def url(self) -> str:
        """The OpenAI-style base URL (``api_base``)."""
        assert self._httpd is not None, "start the tarpit first"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode = mode

    def reset(self, *, mode: str = "trickle") -> None:
        self.set_mode(mode)
        with self.lock:
            self.requests.clear()

    def chat_requests(self) -> list[TarpitRequest]:
        with self.lock:
            return list(self.requests)

    def wait_for_hangup(self, request: TarpitRequest, timeout: float = 10.0) -> float:
        """When the client of `request` hung up (waits for it)."""
        deadline = time.monotonic() + timeout
        while request.hung_up_at is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"the client never hung up: {request}")
            time.sleep(0.02)
        return request.hung_up_at

    def start(self) -> TarpitLLMServer:
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.tarpit = self
        self._httpd = httpd
        threading.Thread(target=httpd.serve_forever, name="tarpit-llm", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def __enter__(self) -> TarpitLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
