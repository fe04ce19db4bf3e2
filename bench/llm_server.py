"""The scripted LLM server (tests/support/scripted_llm.py) with a benchmark policy and a timing log.

Same wire format, embeddings and SSE chunks as the scripted server; three things differ:

- **Policy instead of a FIFO script**, so any number of agents can run at once: a chat request whose
  last message is a tool return gets a short text reply; one whose new user input (the messages since the
  model last spoke) contains ``[remember]`` gets one ``memory_replace`` call that bumps ``Counter: N`` in the ``human`` block (it
  reads N from the system message, so the block keeps its size turn after turn); anything else gets a
  text reply. A turn is therefore "one LLM call" or "a memory-editing tool call, then a reply".
- **Timing log**: for every ``/v1`` request, when it started (wall clock), how long the server spent
  on it, and for streams the time to the first content chunk. ``GET /_bench/timings?since=N`` returns
  entries from index N; the benchmark subtracts this time from the client's wall time.
- **Lean**: request bodies are not kept and usage is estimated from the body size, so the stand-in
  costs the shared CPUs as little as possible.

``POST /_bench/config {"latency": 0.05}`` sets a fixed latency (seconds before the first byte) for
every chat completion. Run: ``python -m bench.llm_server --port 8899``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import scripted_llm as scripted

REMEMBER = "[remember]"
COUNTER = re.compile(r"Counter: (\d+)")
REPLY = "Noted, thanks."


class _BenchCompletion(scripted._Completion):
    """Usage from the request size: no re-serialisation of every message on each call."""

    def __init__(self, body: dict[str, Any], turn: scripted.Turn, raw_size: int) -> None:
        super().__init__(body, turn)
        self.raw_size = raw_size

    def usage(self) -> dict[str, Any]:
        prompt = max(1, self.raw_size // 4)
        return {"prompt_tokens": prompt, "completion_tokens": 8, "total_tokens": prompt + 8}


def choose_turn(body: dict[str, Any]) -> scripted.Turn:
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return {"content": REPLY}
    tools = {t.get("function", {}).get("name") for t in body.get("tools") or []}
    if "memory_replace" in tools and REMEMBER in _new_user_text(messages):
        system = scripted._message_text(messages[0].get("content")) if messages else ""
        found = COUNTER.search(system)
        current = int(found.group(1)) if found else 0
        arguments = {
            "label": "human",
            "old_string": f"Counter: {current}",
            "new_string": f"Counter: {current + 1}",
        }
        return {
            "tool_calls": [
                {"id": scripted._call_id(), "name": "memory_replace", "arguments": json.dumps(arguments)}
            ]
        }
    return {"content": REPLY}


def _new_user_text(messages: list[dict[str, Any]]) -> str:
    """The user messages since the model last spoke: the turn's input, plus any system alert (memory
    pressure) the platform added after it, which also goes in as a user message."""
    texts = []
    for message in reversed(messages):
        if message.get("role") in ("assistant", "tool", "system"):
            break
        texts.append(scripted._message_text(message.get("content")))
    return " ".join(texts)


class _Timings:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[list[Any]] = []  # [kind, started (epoch s), duration s, ttft s or None]
        self.latency = 0.0

    def add(self, kind: str, started: float, duration: float, ttft: float | None) -> None:
        with self.lock:
            self.entries.append([kind, started, duration, ttft])

    def since(self, index: int) -> list[list[Any]]:
        with self.lock:
            return self.entries[index:]


TIMINGS = _Timings()


class _BenchHandler(scripted._Handler):
    # The scripted server writes headers and body separately; with Nagle's algorithm on, the body then
    # waits for the client's delayed ACK (~40 ms a response). Real providers do not stall like that.
    disable_nagle_algorithm = True
    _started_wall = 0.0
    _started = 0.0
    _ttft: float | None = None

    def _record(self, body: Any, raw: str, **extra: Any) -> None:
        """No request log: bodies of long conversations would cost memory and CPU."""

    def parse_request(self) -> bool:
        # The request line has arrived: the server's time starts here, before it parses the headers (the
        # stand-in's own work, not the platform's).
        self._started_wall, self._started, self._ttft = time.time(), time.perf_counter(), None
        return super().parse_request()

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/_bench/timings":
            since = int(dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("since", 0))
            entries = TIMINGS.since(since)
            self._send_json(200, {"timings": entries, "next": since + len(entries)})
            return
        super().do_GET()

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/_bench/config":
            body, _ = self._read_body()
            if isinstance(body, dict) and "latency" in body:
                TIMINGS.latency = float(body["latency"])
            self._send_json(200, {"latency": TIMINGS.latency})
            return
        super().do_POST()
        if path.startswith("/v1/"):
            kind = "embed" if path.endswith("/embeddings") else "chat"
            TIMINGS.add(kind, self._started_wall, time.perf_counter() - self._started, self._ttft)

    def _chat(self, body: Any, raw: str) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._send_error_body(400, "bench LLM: request body must be JSON with a 'messages' list")
            return
        turn = scripted.validate_turn(choose_turn(body))
        if TIMINGS.latency:
            time.sleep(TIMINGS.latency)
        completion = _BenchCompletion(body, turn, len(raw))
        if body.get("stream"):
            self._stream(completion, turn)
        else:
            self._ttft = time.perf_counter() - self._started
            self._send_json(200, completion.full())

    def _write_chunk(self, data: bytes) -> None:
        if self._ttft is None and (
            (b'"content": "' in data and b'"content": ""' not in data) or b'"tool_calls"' in data
        ):
            self._ttft = time.perf_counter() - self._started
        super()._write_chunk(data)


class BenchLLMServer(scripted.ScriptedLLMServer):
    def start(self) -> BenchLLMServer:
        if self._httpd is not None:
            return self
        httpd = scripted._Server((self.host, self.port), _BenchHandler)
        httpd.state = self.state
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, name="bench-llm", daemon=True)
        self._thread.start()
        return self


class BenchLLMClient:
    """Control calls from the benchmark process."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.root + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def healthy(self) -> bool:
        try:
            return self._call("GET", "/_health").get("status") == "ok"
        except OSError:
            return False

    def set_latency(self, seconds: float) -> None:
        self._call("POST", "/_bench/config", {"latency": seconds})

    def timings(self, since: int = 0) -> list[list[Any]]:
        return list(self._call("GET", f"/_bench/timings?since={since}")["timings"])

    def mark(self) -> int:
        """The index of the next timing entry (to read only what a phase caused)."""
        return int(self._call("GET", "/_bench/timings?since=0")["next"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Scripted LLM stand-in for the benchmarks (not an LLM).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8899)
    args = parser.parse_args(argv)
    server = BenchLLMServer(args.host, args.port)
    server.start()
    sys.stderr.write(f"bench LLM (scripted stand-in) listening on {server.url}\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
