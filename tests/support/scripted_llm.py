"""Scripted OpenAI-compatible HTTP server: a stand-in LLM for tests and offline demos. It is NOT an LLM.

Why: tests must never call a real provider, yet litellm, HTTP, SSE streaming and tool-call parsing should
all run for real. So tests start this server, point litellm at it (``api_base=server.url``) and script the
replies. Because Celery workers in other processes call it too, the script is programmable over HTTP
(``POST /_script``) as well as in-process, through the small :class:`ScriptedLLM` client.

Endpoints
    ``POST /v1/chat/completions``  blocking or ``stream: true`` (SSE, honours ``stream_options.include_usage``)
    ``POST /v1/embeddings``        deterministic bag-of-words hashing vectors (shared words => closer)
    ``GET  /v1/models``            the configured model names
    ``POST /_script``              append turns: ``{"turns": [turn, ...]}`` (or a bare list / one turn)
    ``GET  /_script``              turns still pending
    ``POST /_reset``               clear the script and the request log (``{"config": true}`` also resets config)
    ``POST /_config``              set ``strict``, ``default_turn``, ``models``, ``embedding_dimensions``,
                                   ``default_embedding_dimension``
    ``GET  /_requests``            the log of ``/v1`` requests (Authorization values redacted, with the
                                   caller's address as ``client``)
    ``GET  /_health``              liveness

Turn format (plain JSON, so it travels over HTTP; build them with :func:`text`, :func:`tool_calls`, ...)::

    {
      "content": "Hello!",                        # assistant text (optional)
      "reasoning": "thinking...",                 # emitted as message/delta ``reasoning_content``
      "tool_calls": [{"id": "call_1", "name": "send_message",
                      "arguments": "{\\"message\\": \\"hi\\"}"}],  # string sent verbatim, may be malformed;
                                                  # a dict/list is JSON-encoded by the server
      "finish_reason": "stop" | "tool_calls" | "length",  # default: tool_calls if any, else stop
      "usage": {"prompt_tokens": 10, "completion_tokens": 5},  # default ~ len(text)//4, never 0
      "error": {"status": 500, "message": "boom", "type": "server_error", "code": null},
      "headers": {"retry-after": "0"},            # extra response headers (any turn)
      "latency": 0.2,                             # seconds before responding
      "chunk_delay": 0.01,                        # seconds between streamed chunks
      "when_last_user_contains": "hiking",        # only matches if the last user message contains it
      "times": 1,                                 # serve this many times before removal (default 1)
      "persist": false                            # never removed (a standing responder rule)
    }

Selection: the first pending turn (FIFO order) whose ``when_*`` conditions match is served. When none
matches, the default turn (``{"content": "OK"}``) is served, or, in ``strict`` mode, HTTP 500 with
``scripted LLM: script exhausted``. Errors are returned before any stream starts, as OpenAI does.

litellm retries failed calls by default (the OpenAI SDK's ``max_retries=2``): pass ``max_retries=0`` or
script an error with ``times`` to cover the retries (add ``headers={"retry-after-ms": "10"}`` so the
SDK's back-off does not slow the test).

Embeddings: dimension = request ``dimensions``, else the per-model map (``text-embedding-small-384`` -> 384,
configurable), else 1536. Lowercase words minus common stopwords are hashed into 4 positive buckets each
(+ a small signed bucket), then L2-normalized, so a query sharing a word with a passage ranks it first;
chance bucket collisions are rarer at higher dimensions, so ranking tests should prefer >= 384.

Test advice: set ``LITELLM_LOCAL_MODEL_COST_MAP=True`` and ``LITELLM_OFFLINE_MODE=true`` before importing
litellm, and ``litellm.telemetry = False``, so nothing reaches the network.

Standalone: ``python -m tests.support.scripted_llm --port 8899 [--strict] [--script turns.json]``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import re
import struct
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Turn = dict[str, Any]

TURN_KEYS = frozenset(
    {
        "content",
        "reasoning",
        "tool_calls",
        "finish_reason",
        "usage",
        "error",
        "headers",
        "latency",
        "chunk_delay",
        "when_last_user_contains",
        "times",
        "persist",
    }
)
FINISH_REASONS = frozenset({"stop", "tool_calls", "length", "content_filter"})
REDACTED_HEADERS = frozenset({"authorization", "api-key", "x-api-key", "proxy-authorization"})
EXHAUSTED_MESSAGE = "scripted LLM: script exhausted"

DEFAULT_MODELS = ("scripted-chat", "text-embedding-3-small", "text-embedding-small-384")
DEFAULT_EMBEDDING_DIMENSION = 1536
DEFAULT_EMBEDDING_DIMENSIONS = {
    "text-embedding-small-384": 384,
    "text-embedding-3-small": 1536,
    "text-embedding-ada-002": 1536,
    "text-embedding-3-large": 3072,
}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_denied_error",
    404: "invalid_request_error",
    429: "requests",
    500: "server_error",
    503: "server_error",
}

# Common words are dropped so that "shares a meaningful word" drives embedding similarity, not "the".
STOPWORDS = frozenset(
    "a an and are as at be but by do does for from has have he her his i in is it its me my of on or our "  # noqa: SIM905
    "she so that the their them they this to was we were what when where which who why will with you your".split()
)


class TurnError(ValueError):
    """A turn is malformed; raised at push time so typos fail loudly instead of at call time."""


def validate_turn(turn: Any) -> Turn:
    """Check a turn and return a normalized copy (tool-call arguments as strings, ids filled in)."""
    if not isinstance(turn, dict):
        raise TurnError(f"turn must be an object, got {type(turn).__name__}")
    unknown = set(turn) - TURN_KEYS
    if unknown:
        raise TurnError(f"unknown turn keys {sorted(unknown)}; allowed: {sorted(TURN_KEYS)}")
    out: Turn = dict(turn)
    for key in ("content", "reasoning", "when_last_user_contains"):
        if out.get(key) is not None and not isinstance(out[key], str):
            raise TurnError(f"{key} must be a string")
    calls = []
    for i, call in enumerate(out.get("tool_calls") or []):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise TurnError(f"tool_calls[{i}] must be an object with a string 'name'")
        args = call.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args)
        calls.append({"id": call.get("id") or _call_id(), "name": call["name"], "arguments": args})
    if calls:
        out["tool_calls"] = calls
    else:
        out.pop("tool_calls", None)
    if out.get("finish_reason") is not None and out["finish_reason"] not in FINISH_REASONS:
        raise TurnError(f"finish_reason must be one of {sorted(FINISH_REASONS)}")
    if "error" in out:
        err = out["error"]
        if (
            not isinstance(err, dict)
            or not isinstance(err.get("status"), int)
            or not 400 <= err["status"] < 600
        ):
            raise TurnError("error must be an object with an integer 'status' in 400..599")
    for key in ("latency", "chunk_delay"):
        if key in out and (not isinstance(out[key], int | float) or out[key] < 0):
            raise TurnError(f"{key} must be a non-negative number")
    if "times" in out and (not isinstance(out["times"], int) or out["times"] < 1):
        raise TurnError("times must be an integer >= 1")
    if "headers" in out and not isinstance(out["headers"], dict):
        raise TurnError("headers must be an object")
    return out


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _estimate_tokens(text: str) -> int:
    """Rough ~4 chars/token estimate; never zero so usage-based code paths always see a count."""
    return max(1, len(text) // 4)


def _message_text(content: Any) -> str:
    """Flatten OpenAI message content (string or list of parts) to plain text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _last_user_text(body: dict[str, Any]) -> str:
    for msg in reversed(body.get("messages") or []):
        if isinstance(msg, dict) and msg.get("role") == "user":
            return _message_text(msg.get("content"))
    return ""


def _split_words(text: str) -> list[str]:
    """Split text into word-sized deltas whose concatenation is exactly the input."""
    parts = re.findall(r"\s*\S+|\s+$", text)
    return parts or [text]


def token_id(piece: str) -> int:
    """The made-up tokenizer's id of one output piece (stable across runs and processes)."""
    return int.from_bytes(hashlib.sha256(piece.encode()).digest()[:3], "big")


def _split_args(args: str) -> list[str]:
    """Split tool-call arguments into several pieces (at least 2 when long enough), like OpenAI does."""
    if len(args) <= 1:
        return [args]
    size = max(1, math.ceil(len(args) / 4))
    return [args[i : i + size] for i in range(0, len(args), size)]


def _tokens(text: str) -> list[str]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    meaningful = [w for w in words if w not in STOPWORDS]
    return meaningful or words


EMBEDDING_BUCKETS_PER_WORD = 4


def _word_hashes(token: str) -> list[int]:
    digest = hashlib.blake2b(token.encode(), digest_size=4 * (EMBEDDING_BUCKETS_PER_WORD + 1)).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, len(digest), 4)]


def embed_text(text: str, dimension: int) -> list[float]:
    """Deterministic L2-normalized bag-of-words hashing vector.

    Each word adds positive weight to several buckets (so texts sharing a word overlap strongly, and a
    single chance bucket collision between unrelated words matters far less) plus a small signed weight
    to one more bucket. Common stopwords are ignored unless the text has nothing else.
    """
    vec = [0.0] * dimension
    counts: dict[str, int] = {}
    for tok in _tokens(text):
        counts[tok] = counts.get(tok, 0) + 1
    for tok, n in counts.items():
        weight = 1.0 + math.log(n)
        *buckets, extra = _word_hashes(tok)
        for h in buckets:
            vec[h % dimension] += weight
        sign = 1.0 if extra & 1 else -1.0
        vec[(extra >> 1) % dimension] += 0.25 * sign * weight
    if not counts:
        vec[_word_hashes("")[0] % dimension] = 1.0  # empty text still gets a unit vector
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    return [x / norm for x in vec]


class _State:
    """Script, config and request log shared by all handler threads (guarded by one lock)."""

    def __init__(
        self,
        *,
        strict: bool,
        default_turn: Turn | None,
        models: list[str] | None,
        embedding_dimensions: dict[str, int] | None,
        default_embedding_dimension: int,
    ) -> None:
        self.lock = threading.Lock()
        self.script: list[Turn] = []
        self.log: list[dict[str, Any]] = []
        self._initial = {
            "strict": strict,
            "default_turn": validate_turn(default_turn if default_turn is not None else {"content": "OK"}),
            "models": list(models) if models is not None else list(DEFAULT_MODELS),
            "embedding_dimensions": {**DEFAULT_EMBEDDING_DIMENSIONS, **(embedding_dimensions or {})},
            "default_embedding_dimension": default_embedding_dimension,
        }
        self.config: dict[str, Any] = {}
        self.reset(config=True)

    def reset(self, *, config: bool = False) -> None:
        with self.lock:
            self.script.clear()
            self.log.clear()
            if config:
                self.config = json.loads(json.dumps(self._initial))

    def configure(self, changes: dict[str, Any]) -> None:
        allowed = {"strict", "default_turn", "models", "embedding_dimensions", "default_embedding_dimension"}
        unknown = set(changes) - allowed
        if unknown:
            raise TurnError(f"unknown config keys {sorted(unknown)}; allowed: {sorted(allowed)}")
        if "default_turn" in changes:
            changes = {**changes, "default_turn": validate_turn(changes["default_turn"])}
        with self.lock:
            for key, value in changes.items():
                if key == "embedding_dimensions":
                    self.config[key].update({k: int(v) for k, v in value.items()})
                else:
                    self.config[key] = value

    def push(self, turns: list[Any]) -> int:
        checked = [validate_turn(t) for t in turns]
        with self.lock:
            self.script.extend(checked)
            return len(self.script)

    def take(self, body: dict[str, Any]) -> tuple[str, Turn | None]:
        """Pick the turn for a chat request: ("script", turn), ("default", turn) or ("exhausted", None)."""
        last_user = _last_user_text(body).lower()
        with self.lock:
            for i, turn in enumerate(self.script):
                needle = turn.get("when_last_user_contains")
                if needle is not None and needle.lower() not in last_user:
                    continue
                if not turn.get("persist"):
                    remaining = turn.get("times", 1) - 1
                    if remaining <= 0:
                        del self.script[i]
                    else:
                        self.script[i] = {**turn, "times": remaining}
                return "script", turn
            if self.config["strict"]:
                return "exhausted", None
            return "default", self.config["default_turn"]

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.log.append(entry)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive for pooled httpx clients; streams use chunked encoding
    timeout = 60  # idle keep-alive connections do not pin a thread forever
    disable_nagle_algorithm = True  # a response written in two parts otherwise waits ~40 ms for an ACK
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request stderr lines; the request log is the record."""

    # -- plumbing -------------------------------------------------------------------------------------
    def _read_body(self) -> tuple[Any, str]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode("utf-8", "replace") if length else ""
        if not raw:
            return None, raw
        try:
            return json.loads(raw), raw
        except json.JSONDecodeError:
            return None, raw

    def _send_json(self, status: int, payload: Any, headers: dict[str, Any] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(str(key), str(value))
        self.end_headers()
        self.wfile.write(data)

    def _send_error_body(
        self, status: int, message: str, *, type_: str | None = None, code: Any = None
    ) -> None:
        self._send_json(status, _error_payload(status, message, type_=type_, code=code))

    def _record(self, body: Any, raw: str, **extra: Any) -> None:
        headers = {k: ("<redacted>" if k.lower() in REDACTED_HEADERS else v) for k, v in self.headers.items()}
        entry = {
            "method": self.command,
            "path": self.path,
            "headers": headers,
            "body": body,
            "time": time.time(),
            "client": self.client_address[0],  # which host called (the cluster tests tell workers apart)
        }
        if body is None and raw:
            entry["raw_body"] = raw
        entry.update(extra)
        self.server.state.record(entry)

    # -- routing --------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        state = self.server.state
        if path == "/v1/models":
            self._record(None, "")
            with state.lock:
                models = list(state.config["models"])
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "scripted-llm"} for m in models]
            self._send_json(200, {"object": "list", "data": data})
        elif path == "/_requests":
            with state.lock:
                log = list(state.log)
            self._send_json(200, {"requests": log})
        elif path == "/_script":
            with state.lock:
                pending = list(state.script)
            self._send_json(200, {"turns": pending})
        elif path == "/_health":
            self._send_json(200, {"status": "ok", "service": "scripted-llm"})
        else:
            self._send_error_body(404, f"scripted LLM: no route GET {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        body, raw = self._read_body()
        state = self.server.state
        try:
            if path == "/v1/chat/completions":
                self._chat(body, raw)
            elif path == "/v1/embeddings":
                self._embeddings(body, raw)
            elif path == "/_script":
                turns = body.get("turns") if isinstance(body, dict) and "turns" in body else body
                turns = turns if isinstance(turns, list) else [turns]
                self._send_json(200, {"pending": state.push(turns)})
            elif path == "/_reset":
                state.reset(config=bool(isinstance(body, dict) and body.get("config")))
                self._send_json(200, {"ok": True})
            elif path == "/_config":
                state.configure(body if isinstance(body, dict) else {})
                with state.lock:
                    config = dict(state.config)
                self._send_json(200, {"config": config})
            else:
                self._send_error_body(404, f"scripted LLM: no route POST {path}")
        except TurnError as exc:
            self._send_error_body(400, f"scripted LLM: {exc}")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # client went away mid-response (e.g. cancelled stream)

    # -- /v1/chat/completions -------------------------------------------------------------------------
    def _chat(self, body: Any, raw: str) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._record(body, raw, served="invalid")
            self._send_error_body(400, "scripted LLM: request body must be JSON with a 'messages' list")
            return
        source, turn = self.server.state.take(body)
        self._record(body, raw, served=source, turn=turn)
        if turn is None:
            self._send_error_body(500, EXHAUSTED_MESSAGE, code="script_exhausted")
            return
        if turn.get("latency"):
            time.sleep(float(turn["latency"]))
        if "error" in turn:
            err = turn["error"]
            status = int(err["status"])
            payload = _error_payload(
                status,
                err.get("message") or f"scripted error {status}",
                type_=err.get("type"),
                code=err.get("code"),
                param=err.get("param"),
            )
            self._send_json(status, payload, turn.get("headers"))
            return
        completion = _Completion(body, turn)
        if body.get("stream"):
            self._stream(completion, turn)
        else:
            self._send_json(200, completion.full(), turn.get("headers"))

    def _stream(self, completion: _Completion, turn: Turn) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for key, value in (turn.get("headers") or {}).items():
            self.send_header(str(key), str(value))
        self.end_headers()
        delay = float(turn.get("chunk_delay") or 0)
        for i, event in enumerate(completion.chunks()):
            if delay and i:
                time.sleep(delay)
            self._write_chunk(f"data: {json.dumps(event)}\n\n".encode())
        self._write_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    # -- /v1/embeddings -------------------------------------------------------------------------------
    def _embeddings(self, body: Any, raw: str) -> None:
        self._record(body, raw)
        if not isinstance(body, dict) or "input" not in body:
            self._send_error_body(400, "scripted LLM: embeddings body must be JSON with 'input'")
            return
        inputs = body["input"]
        inputs = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
            self._send_error_body(400, "scripted LLM: 'input' must be a string or a list of strings")
            return
        model = str(body.get("model") or "")
        dimension = body.get("dimensions")
        if dimension is None:
            with self.server.state.lock:
                dims = self.server.state.config["embedding_dimensions"]
                default = self.server.state.config["default_embedding_dimension"]
            dimension = dims.get(model, dims.get(model.rsplit("/", 1)[-1], default))
        dimension = int(dimension)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(inputs):
            vec = embed_text(text, dimension)
            emb: Any = base64.b64encode(struct.pack(f"<{dimension}f", *vec)).decode() if as_base64 else vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        tokens = max(1, sum(len(re.findall(r"\S+", t)) for t in inputs))
        self._send_json(
            200,
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )


def _error_payload(
    status: int, message: str, *, type_: str | None = None, code: Any = None, param: Any = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": type_
            or ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


class _Completion:
    """Renders one scripted turn as an OpenAI chat completion, blocking or as stream chunks."""

    def __init__(self, body: dict[str, Any], turn: Turn) -> None:
        self.body = body
        self.turn = turn
        self.id = "chatcmpl-scripted-" + uuid.uuid4().hex[:12]
        self.created = int(time.time())
        self.model = str(body.get("model") or "scripted-chat")
        self.calls: list[dict[str, str]] = turn.get("tool_calls") or []
        self.finish_reason = turn.get("finish_reason") or ("tool_calls" if self.calls else "stop")

    def usage(self) -> dict[str, Any]:
        given = self.turn.get("usage") or {}
        prompt_text = "".join(
            _message_text(m.get("content")) + json.dumps(m.get("tool_calls") or "")
            for m in self.body.get("messages", [])
            if isinstance(m, dict)
        )
        completion_text = (
            (self.turn.get("content") or "")
            + (self.turn.get("reasoning") or "")
            + "".join(c["name"] + c["arguments"] for c in self.calls)
        )
        prompt = int(
            given.get("prompt_tokens")
            or _estimate_tokens(prompt_text + json.dumps(self.body.get("tools") or ""))
        )
        completion = int(given.get("completion_tokens", _estimate_tokens(completion_text)))
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": int(given.get("total_tokens", prompt + completion)),
        }
        if self.turn.get("reasoning"):
            reasoning_tokens = int(given.get("reasoning_tokens", _estimate_tokens(self.turn["reasoning"])))
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        return usage

    def token_logprobs(self, piece: str, position: int) -> dict[str, Any]:
        """A made-up, deterministic log probability for one output word (as a provider's `logprobs`
        entry), with `top_logprobs` alternatives when the request asked for them."""
        logprob = -round(0.05 * (position + 1), 4)
        alternatives = [
            {
                "token": piece if rank == 0 else f"{piece.strip()}~{rank}",
                "logprob": logprob - rank,
                "bytes": None,
            }
            for rank in range(int(self.body.get("top_logprobs") or 0))
        ]
        return {
            "token": piece,
            "logprob": logprob,
            "bytes": list(piece.encode()),
            "top_logprobs": alternatives,
        }

    def output_pieces(self) -> list[str]:
        """The output as the made-up tokenizer splits it: content words, then each call's argument pieces."""
        pieces = _split_words(self.turn["content"]) if self.turn.get("content") else []
        return pieces + [piece for c in self.calls for piece in _split_args(c["arguments"])]

    def token_ids(self) -> list[int] | None:
        """vLLM's/SGLang's choice.token_ids, when the body asks (`return_token_ids`): a stable id per piece."""
        if not self.body.get("return_token_ids"):
            return None
        return [token_id(piece) for piece in self.output_pieces()]

    def logprobs(self) -> dict[str, Any] | None:
        if not self.body.get("logprobs"):
            return None
        pieces = _split_words(self.turn["content"]) if self.turn.get("content") else []
        return {"content": [self.token_logprobs(p, i) for i, p in enumerate(pieces)], "refusal": None}

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_scripted",
        }

    def full(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.turn.get("content")}
        if self.turn.get("reasoning") is not None:
            message["reasoning_content"] = self.turn["reasoning"]
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in self.calls
            ]
        return {
            **self._envelope("chat.completion"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": self.logprobs(),
                    "finish_reason": self.finish_reason,
                    **({"token_ids": ids} if (ids := self.token_ids()) is not None else {}),
                }
            ],
            "usage": self.usage(),
        }

    def chunks(self) -> Iterator[dict[str, Any]]:
        include_usage = bool((self.body.get("stream_options") or {}).get("include_usage"))

        def chunk(
            delta: dict[str, Any],
            finish: str | None = None,
            logprobs: dict[str, Any] | None = None,
            token_ids: list[int] | None = None,
        ) -> dict[str, Any]:
            out = {
                **self._envelope("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
            }
            if token_ids is not None and self.body.get("return_token_ids"):
                out["choices"][0]["token_ids"] = token_ids
            if include_usage:
                out["usage"] = None
            return out

        yield chunk({"role": "assistant", "content": ""})
        if self.turn.get("reasoning"):
            for piece in _split_words(self.turn["reasoning"]):
                yield chunk({"reasoning_content": piece})
        if self.turn.get("content"):
            for position, piece in enumerate(_split_words(self.turn["content"])):
                logprobs = (
                    {"content": [self.token_logprobs(piece, position)], "refusal": None}
                    if self.body.get("logprobs")
                    else None
                )
                yield chunk({"content": piece}, logprobs=logprobs, token_ids=[token_id(piece)])
        for index, call in enumerate(self.calls):
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["name"], "arguments": ""},
                        }
                    ]
                }
            )
            for piece in _split_args(call["arguments"]):
                yield chunk(
                    {"tool_calls": [{"index": index, "function": {"arguments": piece}}]},
                    token_ids=[token_id(piece)],
                )
        yield chunk({}, self.finish_reason)
        if include_usage:
            yield {**self._envelope("chat.completion.chunk"), "choices": [], "usage": self.usage()}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() must not wait for idle keep-alive connections
    state: _State


class ScriptedLLMServer:
    """The scripted OpenAI-compatible server, run on a background thread; use as a context manager."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        strict: bool = False,
        default_turn: Turn | None = None,
        models: list[str] | None = None,
        embedding_dimensions: dict[str, int] | None = None,
        default_embedding_dimension: int = DEFAULT_EMBEDDING_DIMENSION,
    ) -> None:
        self.host = host
        self.port = port
        self.state = _State(
            strict=strict,
            default_turn=default_turn,
            models=models,
            embedding_dimensions=embedding_dimensions,
            default_embedding_dimension=default_embedding_dimension,
        )
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """Root URL (control endpoints live here)."""
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """OpenAI-style base URL to pass as ``api_base`` / ``base_url``."""
        return self.base_url + "/v1"

    def start(self) -> ScriptedLLMServer:
        if self._httpd is not None:
            return self
        httpd = _Server((self.host, self.port), _Handler)
        httpd.state = self.state
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, name="scripted-llm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def client(self) -> ScriptedLLM:
        """An HTTP client for this server (same API that other processes use)."""
        return ScriptedLLM(self.url)

    def serve_forever(self) -> None:
        """Run in the foreground (standalone mode) until interrupted."""
        self.start()
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(timeout=0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def __enter__(self) -> ScriptedLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- turn builders (plain dicts, JSON-serializable) ------------------------------------------------------


def _with_options(turn: Turn, options: dict[str, Any]) -> Turn:
    turn.update({k: v for k, v in options.items() if v is not None})
    return validate_turn(turn)


def text(
    content: str,
    *,
    reasoning: str | None = None,
    usage: dict[str, int] | None = None,
    finish_reason: str | None = None,
    latency: float | None = None,
    chunk_delay: float | None = None,
    when_last_user_contains: str | None = None,
    times: int | None = None,
    persist: bool | None = None,
) -> Turn:
    """An assistant text reply (optionally with reasoning_content)."""
    return _with_options(
        {"content": content},
        {
            "reasoning": reasoning,
            "usage": usage,
            "finish_reason": finish_reason,
            "latency": latency,
            "chunk_delay": chunk_delay,
            "when_last_user_contains": when_last_user_contains,
            "times": times,
            "persist": persist,
        },
    )


def tool_call(name: str, arguments: dict[str, Any] | str, *, id: str | None = None) -> dict[str, str]:
    """One tool call; a str ``arguments`` is sent verbatim (use it for deliberately malformed JSON)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": id or _call_id(), "name": name, "arguments": args}


def tool_calls(
    *calls: dict[str, Any],
    text: str | None = None,
    reasoning: str | None = None,
    usage: dict[str, int] | None = None,
    finish_reason: str | None = None,
    latency: float | None = None,
    chunk_delay: float | None = None,
    when_last_user_contains: str | None = None,
    times: int | None = None,
    persist: bool | None = None,
) -> Turn:
    """A turn with one or several (parallel) tool calls built by :func:`tool_call`."""
    if not calls:
        raise TurnError("tool_calls() needs at least one call")
    return _with_options(
        {"tool_calls": list(calls)},
        {
            "content": text,
            "reasoning": reasoning,
            "usage": usage,
            "finish_reason": finish_reason,
            "latency": latency,
            "chunk_delay": chunk_delay,
            "when_last_user_contains": when_last_user_contains,
            "times": times,
            "persist": persist,
        },
    )


def error(
    status: int,
    message: str,
    *,
    code: str | None = None,
    type: str | None = None,
    headers: dict[str, str] | None = None,
    latency: float | None = None,
    when_last_user_contains: str | None = None,
    times: int | None = None,
    persist: bool | None = None,
) -> Turn:
    """An HTTP error reply with an OpenAI-style ``{"error": {...}}`` body."""
    err: dict[str, Any] = {"status": status, "message": message, "code": code}
    if type is not None:
        err["type"] = type
    return _with_options(
        {"error": err},
        {
            "headers": headers,
            "latency": latency,
            "when_last_user_contains": when_last_user_contains,
            "times": times,
            "persist": persist,
        },
    )


def context_length_exceeded(max_tokens: int = 8192, requested: int = 9000, **options: Any) -> Turn:
    """OpenAI's 400 ``context_length_exceeded`` error, with the message text litellm recognizes."""
    message = (
        f"This model's maximum context length is {max_tokens} tokens. However, your messages resulted in "
        f"{requested} tokens. Please reduce the length of the messages."
    )
    return error(400, message, code="context_length_exceeded", **options)


# -- client ------------------------------------------------------------------------------------------


class ScriptedLLM:
    """HTTP client for the control endpoints; works from any process that can reach the server."""

    text = staticmethod(text)
    tool_call = staticmethod(tool_call)
    tool_calls = staticmethod(tool_calls)
    error = staticmethod(error)
    context_length_exceeded = staticmethod(context_length_exceeded)

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        root = url.rstrip("/")
        self.root = root.removesuffix("/v1")
        self.url = self.root + "/v1"
        self.timeout = timeout

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.root + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            raise RuntimeError(
                f"scripted LLM control call {method} {path} failed: {exc.code} {detail}"
            ) from exc

    def push(self, *turns: Turn) -> int:
        """Append turns to the FIFO script; returns the number pending."""
        return int(self._call("POST", "/_script", {"turns": list(turns)})["pending"])

    def pending(self) -> list[Turn]:
        """Turns not yet served (assert ``== []`` to check a test consumed its script)."""
        return list(self._call("GET", "/_script")["turns"])

    def reset(self, *, config: bool = False) -> None:
        """Clear script and request log (and restore the server's start-up config if ``config``)."""
        self._call("POST", "/_reset", {"config": config})

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Change strict / default_turn / models / embedding_dimensions / default_embedding_dimension."""
        return dict(self._call("POST", "/_config", changes)["config"])

    def requests(self, path: str | None = None) -> list[dict[str, Any]]:
        """Recorded /v1 requests (oldest first), optionally only those to ``path`` (e.g. "/v1/embeddings")."""
        log = list(self._call("GET", "/_requests")["requests"])
        return [r for r in log if path is None or r["path"].split("?", 1)[0] == path]

    def chat_requests(self) -> list[dict[str, Any]]:
        """Bodies of recorded chat completion requests (oldest first)."""
        return [r["body"] for r in self.requests("/v1/chat/completions")]

    def last_chat_request(self) -> dict[str, Any]:
        bodies = self.chat_requests()
        if not bodies:
            raise AssertionError("scripted LLM: no chat completion request recorded")
        return bodies[-1]

    def health(self) -> bool:
        try:
            return self._call("GET", "/_health").get("status") == "ok"
        except (OSError, RuntimeError):
            return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Scripted OpenAI-compatible stand-in LLM for tests and offline demos (not an LLM)."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8899)
    parser.add_argument("--strict", action="store_true", help="HTTP 500 when the script is empty")
    parser.add_argument("--default-text", default="OK", help="reply when the script is empty")
    parser.add_argument("--script", help="JSON file with a list of turns to preload")
    args = parser.parse_args(argv)
    server = ScriptedLLMServer(
        args.host, args.port, strict=args.strict, default_turn={"content": args.default_text}
    )
    if args.script:
        with open(args.script, encoding="utf-8") as fh:
            loaded = json.load(fh)
        server.state.push(loaded if isinstance(loaded, list) else [loaded])
    server.start()
    sys.stderr.write(f"scripted LLM (test stand-in, not a real model) listening on {server.url}\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
