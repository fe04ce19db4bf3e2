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

``POST /_bench/config {"latency": 0.3, "tokens_per_s": 50, "reply_tokens": 50}`` sets a fixed latency
(seconds before the first token) for every chat completion, and optionally a generation rate: a stream
then sends its tokens (reply words, tool-call argument pieces) that many a second after the first, and a
blocking call answers after latency + tokens / rate; ``reply_tokens`` makes text replies that many words
long (default: the short reply). Each key is optional; 0 turns it off (the default: no latency, every
token at once). Run: ``python -m bench.llm_server --port 8899`` (``--latency`` etc. set the same at start,
for a server another platform is pointed at before a comparison run).
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


def reply_text(words: int) -> str:
    """The text reply: the short one, or `words` words (one token each for the scripted tokenizer)."""
    if words <= 0:
        return REPLY
    filler = ["and", "that", "is", "all", "I", "have", "to", "say", "about", "it", "for", "now"]
    return " ".join(["Noted,", "thanks."][:words] + [filler[i % len(filler)] for i in range(words - 2)])


def choose_turn(body: dict[str, Any], reply: str = REPLY) -> scripted.Turn:
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return {"content": reply}
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
    return {"content": reply}


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
        self.tokens_per_s = 0.0  # 0: every token at once
        self.reply_tokens = 0  # 0: the short reply

    def configure(self, changes: dict[str, Any]) -> dict[str, Any]:
        if "latency" in changes:
            self.latency = max(0.0, float(changes["latency"]))
        if "tokens_per_s" in changes:
            self.tokens_per_s = max(0.0, float(changes["tokens_per_s"]))
        if "reply_tokens" in changes:
            self.reply_tokens = max(0, int(changes["reply_tokens"]))
        return self.config()

    def config(self) -> dict[str, Any]:
        return {"latency": self.latency, "tokens_per_s": self.tokens_per_s, "reply_tokens": self.reply_tokens}

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
    close_after_response = False  # --close-connections

    def end_headers(self) -> None:
        if self.close_after_response:
            # Letta 0.16.7 makes a new OpenAI client per LLM call and never closes it: with keep-alive,
            # its connections linger and a later turn stalls for about a minute (seen on its first turn).
            self.send_header("Connection", "close")
            self.close_connection = True
        super().end_headers()

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
            self._send_json(200, TIMINGS.configure(body if isinstance(body, dict) else {}))
            return
        super().do_POST()
        if path.startswith("/v1/"):
            kind = "embed" if path.endswith("/embeddings") else "chat"
            TIMINGS.add(kind, self._started_wall, time.perf_counter() - self._started, self._ttft)

    def _chat(self, body: Any, raw: str) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._send_error_body(400, "bench LLM: request body must be JSON with a 'messages' list")
            return
        turn = scripted.validate_turn(choose_turn(body, reply_text(TIMINGS.reply_tokens)))
        if TIMINGS.latency:
            time.sleep(TIMINGS.latency)
        completion = _BenchCompletion(body, turn, len(raw))
        rate = TIMINGS.tokens_per_s
        if body.get("stream"):
            self._stream(completion, turn)
        else:
            if rate:  # the whole answer is generated before a blocking call returns
                time.sleep(len(completion.output_pieces()) / rate)
            self._ttft = time.perf_counter() - self._started
            self._send_json(200, completion.full())

    def _stream(self, completion: scripted._Completion, turn: scripted.Turn) -> None:
        """The scripted server's stream, with the tokens paced at `tokens_per_s` after the first one
        (on a schedule from the first, so sleep overruns do not add up)."""
        rate = TIMINGS.tokens_per_s
        if not rate:
            super()._stream(completion, turn)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        first: float | None = None
        sent = 0
        for event in completion.chunks():
            if _carries_token(event):
                if first is None:
                    first = time.perf_counter()
                else:
                    delay = first + sent / rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                sent += 1
            self._write_chunk(f"data: {json.dumps(event)}\n\n".encode())
        self._write_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _write_chunk(self, data: bytes) -> None:
        if self._ttft is None and (
            (b'"content": "' in data and b'"content": ""' not in data) or b'"tool_calls"' in data
        ):
            self._ttft = time.perf_counter() - self._started
        super()._write_chunk(data)


def _carries_token(event: dict[str, Any]) -> bool:
    """A stream chunk with a generated token: a content word or a piece of a tool call's arguments."""
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content"):
            return True
        if any((call.get("function") or {}).get("arguments") for call in delta.get("tool_calls") or []):
            return True
    return False


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

    def configure(self, **changes: float) -> dict[str, Any]:
        """latency (s), tokens_per_s, reply_tokens; returns the server's whole configuration."""
        return dict(self._call("POST", "/_bench/config", changes))

    def timings(self, since: int = 0) -> list[list[Any]]:
        return list(self._call("GET", f"/_bench/timings?since={since}")["timings"])

    def mark(self) -> int:
        """The index of the next timing entry (to read only what a phase caused)."""
        return int(self._call("GET", "/_bench/timings?since=0")["next"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Scripted LLM stand-in for the benchmarks (not an LLM).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8899)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before the first token")
    parser.add_argument("--tokens-per-s", type=float, default=0.0, help="generation rate (0: all at once)")
    parser.add_argument("--reply-tokens", type=int, default=0, help="words in a text reply (0: short)")
    parser.add_argument(
        "--close-connections",
        action="store_true",
        help="close each connection after its response (for a Letta server: see _BenchHandler)",
    )
    args = parser.parse_args(argv)
    TIMINGS.configure(
        {"latency": args.latency, "tokens_per_s": args.tokens_per_s, "reply_tokens": args.reply_tokens}
    )
    _BenchHandler.close_after_response = args.close_connections
    # Letta lists an OpenAI-compatible endpoint's models and knows a context window only for names it
    # knows: the chat model the benchmarks use is listed under its own name.
    server = BenchLLMServer(args.host, args.port, models=[*scripted.DEFAULT_MODELS, "gpt-4o-mini"])
    server.start()
    sys.stderr.write(f"bench LLM (scripted stand-in) listening on {server.url}\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
