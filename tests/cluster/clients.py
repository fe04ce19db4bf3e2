"""Clients of the cluster, as the Letta SDK and its users behave: sends that are resent with the same
`otid` when a web host fails them (the API answers a resend from the run that took it), status polls that
go to the other web host, SSE readers that resume from their last `seq_id` on the other web host; and the
checks every scenario ends with."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import itertools
import json
import os
import re
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from tests.cluster.harness import ADMIN_USERNAME, API_KEY, WEB_PORT, WEBS, Cluster
from tests.support.scripted_llm import ScriptedLLMServer, Turn, text, tool_call, tool_calls

TERMINAL = frozenset({"completed", "failed", "cancelled"})
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
SHARED_BLOCK = "shared"


def wait_until(condition: Callable[[], Any], timeout: float, what: str, poll: float = 0.1) -> Any:
    """The first truthy value of `condition()`; AssertionError past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(poll)


class Api:
    """The /v1 API through either web host."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def call(
        self,
        method: str,
        path: str,
        *,
        web: str = "web1",
        json_body: Any = None,
        failover: bool = True,
        within: float = 30.0,
        timeout: float = 10.0,
    ) -> httpx.Response:
        """The first answer below 500 from `web`, else (failover) from the other web host, trying both in
        turn until `within` seconds have passed; the last failure is raised (or returned, for a 5xx)."""
        deadline = time.monotonic() + within
        order = [web, *(other for other in WEBS if other != web)] if failover else [web]
        attempt = 0
        while True:
            target = order[attempt % len(order)]
            attempt += 1
            try:
                response = httpx.request(
                    method,
                    self.cluster.web_url(target) + path,
                    headers=HEADERS,
                    json=json_body,
                    timeout=timeout,
                )
                if response.status_code < 500:
                    return response
                failure: Exception | httpx.Response = response
            except httpx.TransportError as exc:
                failure = exc
            if time.monotonic() > deadline:
                if isinstance(failure, httpx.Response):
                    return failure
                raise failure
            time.sleep(0.2)

    def create_block(self, label: str) -> str:
        response = self.call("POST", "/v1/blocks/", json_body={"label": label, "value": "", "limit": 100_000})
        assert response.status_code == 200, response.text
        return str(response.json()["id"])

    def create_agent(self, name: str, *, block_ids: list[str]) -> str:
        body = {
            "name": name,
            "model": "openai/gpt-4o-mini",
            "embedding": None,
            "memory_blocks": [{"label": "human", "value": "Name: unknown", "limit": 5000}],
            "block_ids": block_ids,
        }
        response = self.call("POST", "/v1/agents/", json_body=body)
        assert response.status_code == 200, response.text
        return str(response.json()["id"])

    def send(self, agent_id: str, content: str, otid: str, *, web: str = "web1", within: float = 30.0) -> str:
        """POST .../messages/async, resent with the same otid on failure; the run id."""
        body = {"messages": [{"role": "user", "content": content, "otid": otid}]}
        response = self.call(
            "POST", f"/v1/agents/{agent_id}/messages/async", web=web, json_body=body, within=within
        )
        assert response.status_code == 200, response.text
        run_id = str(response.json()["id"])
        self.cluster.event(f"{content!r} accepted as {run_id} (sent to {web})", fault=False)
        return run_id

    def run(self, run_id: str, *, web: str = "web1") -> dict[str, Any]:
        response = self.call("GET", f"/v1/runs/{run_id}", web=web)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def ade_session(self, web: str = "web1") -> str:
        """The session cookie of the organisation's owner, signed in through the ADE's sign-in page (the
        session is in the database: every web host knows it)."""
        with httpx.Client(base_url=self.cluster.web_url(web), timeout=10) as client:
            page = client.get("/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
            assert page.status_code == 200, page.text[:500]
            assert token, page.text[:500]
            form = {
                "username": ADMIN_USERNAME,
                "password": self.cluster.admin_password,
                "csrfmiddlewaretoken": token.group(1),
            }
            response = client.post("/login/", data=form)
            assert response.status_code == 302, response.text[:500]
            return str(client.cookies["sessionid"])

    def wait_run(self, run_id: str, timeout: float, *, web: str = "web1") -> dict[str, Any]:
        """The run once it has ended (polled through either web host)."""
        return dict(
            wait_until(
                lambda: (run := self.run(run_id, web=web))["status"] in TERMINAL and run,
                timeout,
                f"run {run_id} ends",
                poll=0.2,
            )
        )


def memory_turns(token: str, fact: str, *, latency: float = 0.0, reply_latency: float = 0.0) -> list[Turn]:
    """A memory turn: memory_insert of `fact` into the shared block, then a reply; both only for the user
    message that contains `token`."""
    return [
        tool_calls(
            tool_call("memory_insert", {"label": SHARED_BLOCK, "new_string": fact}),
            latency=latency or None,
            when_last_user_contains=token,
        ),
        text(f"Noted {token}.", latency=reply_latency or None, when_last_user_contains=token),
    ]


def fact_of(token: str) -> str:
    return f"fact {token}."


@dataclasses.dataclass
class Sent:
    """One user message a client sent (and resent): accepted once a web host answered with its run."""

    agent_id: str
    token: str
    otid: str
    memory: bool
    run_id: str | None = None
    status: str = ""
    sent_at: float = 0.0
    ended_at: float = 0.0


class Traffic:
    """Background clients, one thread per agent, each sending its next message (every third one a memory
    turn) once the last has ended, alternating the web hosts; think time between turns. `quiet()` holds new
    sends while a fault is injected, so that no run is between its send and its claim at that instant (see
    the module docstring of test_cluster for why)."""

    THINK = 0.4
    RUN_TIMEOUT = 90.0

    def __init__(self, api: Api, llm: ScriptedLLMServer, agent_ids: list[str], tag: str) -> None:
        self.api, self.llm, self.agent_ids, self.tag = api, llm, agent_ids, tag
        self.sent: list[Sent] = []
        self.errors: list[str] = []
        self._state = threading.Condition()
        self._open = True  # new sends may start; guarded by _state, as is _sending
        self._sending = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._client, args=(index, agent_id), daemon=True, name=f"traffic-{index}"
            )
            for index, agent_id in enumerate(agent_ids)
        ]
        self._round = uuid.uuid4().hex[:6]

    def start(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[Sent]:
        self._stop.set()
        self._set_open(True)
        for thread in self._threads:
            thread.join(timeout=self.RUN_TIMEOUT + 40)
        assert not any(thread.is_alive() for thread in self._threads), "a traffic client is stuck"
        assert not self.errors, self.errors
        return list(self.sent)

    def _set_open(self, value: bool) -> None:
        with self._state:
            self._open = value
            self._state.notify_all()

    @contextlib.contextmanager
    def quiet(self, timeout: float = 10.0, *, hold_after: float = 0.0) -> Iterator[None]:
        """No send in flight and no run waiting for its worker while the body runs, nor for `hold_after`
        seconds after it."""
        self._set_open(False)
        try:
            with self._state:
                settled = self._state.wait_for(lambda: self._sending == 0, timeout)
            assert settled, "traffic sends did not settle"
            wait_until(
                lambda: not self.api.cluster.query("SELECT 1 FROM agents_run WHERE status = 'created'"),
                timeout,
                "no run waits for a worker",
            )
            self.api.cluster.event(
                f"traffic quiet; runs not ended: {unfinished_runs(self.api.cluster)}", fault=False
            )
            yield
            time.sleep(hold_after)
        finally:
            self._set_open(True)

    def _client(self, index: int, agent_id: str) -> None:
        web = WEBS[index % 2]
        turn = 0
        while not self._stop.is_set():
            with self._state:  # passing the gate and counting the send are one step (see quiet)
                self._state.wait_for(lambda: self._open)
                if self._stop.is_set():
                    return
                self._sending += 1
            turn += 1
            token = f"bg{self._round}a{index}t{turn}"
            sent = Sent(agent_id, token, str(uuid.uuid4()), memory=turn % 3 == 0, sent_at=time.time())
            self.sent.append(sent)
            try:
                if sent.memory:
                    self.llm.state.push(memory_turns(token, fact_of(token)))
                sent.run_id = self.api.send(agent_id, f"Message {token}", sent.otid, web=web, within=60)
            except Exception as exc:  # never accepted: recorded, the checks say whether it was stored
                self.errors.append(f"{token}: send failed: {exc!r}")
                return
            finally:
                with self._state:
                    self._sending -= 1
                    self._state.notify_all()
            try:
                sent.status = self.api.wait_run(sent.run_id, self.RUN_TIMEOUT, web=web)["status"]
            except Exception as exc:
                stored = self.api.cluster.query(
                    "SELECT status, started_at, completed_at FROM agents_run WHERE id = %s", [sent.run_id]
                )
                self.errors.append(f"{token}: run {sent.run_id} {stored}: {exc!r}")
                return
            sent.ended_at = time.time()
            web = WEBS[(WEBS.index(web) + 1) % 2]
            self._stop.wait(self.THINK)


class SseReader(threading.Thread):
    """A streaming send, read to its end; when the connection is cut before `[DONE]`, the stream is
    resumed on the other web host from the last seq_id read (GET /v1/runs/{id}/stream?starting_after=N).
    `connections` lists (web host, how the connection ended); `first_resumed` is the first message read
    after a resume and when it arrived (time.time())."""

    def __init__(self, api: Api, agent_id: str, content: str, *, web: str) -> None:
        super().__init__(daemon=True)
        self.api, self.agent_id, self.content, self.web = api, agent_id, content, web
        self.items: list[Any] = []
        self.run_id: str | None = None
        self.connections: list[tuple[str, str]] = []
        self.cut_at: float | None = None
        self.first_resumed: tuple[float, dict[str, Any]] | None = None
        self.error: str | None = None

    @property
    def last_seq(self) -> int:
        return max((item["seq_id"] for item in self.messages()), default=0)

    def messages(self) -> list[dict[str, Any]]:
        return [
            i for i in self.items if isinstance(i, dict) and isinstance(i.get("seq_id"), int) and i.get("id")
        ]

    def seen(self, message_type: str) -> bool:
        return any(isinstance(i, dict) and i.get("message_type") == message_type for i in self.items)

    def run(self) -> None:
        body = {
            "messages": [{"role": "user", "content": self.content, "otid": str(uuid.uuid4())}],
            "stream_tokens": False,
        }
        web, deadline = self.web, time.monotonic() + 90
        request: tuple[str, str, Any] = ("POST", f"/v1/agents/{self.agent_id}/messages/stream", body)
        while time.monotonic() < deadline:
            ended = self._read(web, *request)
            self.connections.append((web, ended))
            if ended == "done":
                return
            if self.run_id is None:
                self.error = f"cut before the run id was known ({ended})"
                return
            if self.cut_at is None:
                self.cut_at = time.time()
            web = WEBS[(WEBS.index(web) + 1) % 2]
            request = ("GET", f"/v1/runs/{self.run_id}/stream?starting_after={self.last_seq}", None)
            time.sleep(0.1)
        self.error = "no [DONE] within 90 s"

    def _read(self, web: str, method: str, path: str, body: Any) -> str:
        try:
            url = self.api.cluster.web_url(web) + path
            with httpx.stream(
                method, url, headers=HEADERS, json=body, timeout=httpx.Timeout(10, read=30)
            ) as response:
                if response.status_code != 200:
                    return f"status {response.status_code}"
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line.removeprefix("data: ")
                    if data == "[DONE]":
                        self.items.append(data)
                        return "done"
                    item = json.loads(data)
                    self.items.append(item)
                    if self.run_id is None and item.get("run_id"):
                        self.run_id = item["run_id"]
                    if self.cut_at is not None and self.first_resumed is None and item.get("date"):
                        self.first_resumed = (time.time(), item)
            return "ended without [DONE]"
        except httpx.HTTPError as exc:
            return f"cut ({type(exc).__name__})"


class WebSocketClosed(Exception):
    """The server closed the WebSocket (a close frame): `code` is its close code."""

    def __init__(self, code: int | None) -> None:
        super().__init__(f"closed with {code}")
        self.code = code


class WebSocket:
    """A WebSocket client in a few lines (RFC 6455: the handshake, the server's unmasked frames, masked
    pongs and a close), so that the cluster tests need no client library."""

    def __init__(self, host: str, path: str, headers: dict[str, str], *, timeout: float) -> None:
        self.sock = socket.create_connection((host, WEB_PORT), timeout=10)
        self.sock.settimeout(timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {host}:{WEB_PORT}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self._recv()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            self.sock.close()
            raise ConnectionError(f"handshake refused: {head.splitlines()[0]!r}")

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("the connection ended without a close frame")
        return chunk

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self.buffer += self._recv()
        taken, self.buffer = self.buffer[:n], self.buffer[n:]
        return taken

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)  # payload < 126

    def receive(self) -> str:
        """The next text message; pings are answered; WebSocketClosed on a close frame."""
        while True:
            first, second = self._take(2)
            length = second & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", self._take(2))
            elif length == 127:
                (length,) = struct.unpack("!Q", self._take(8))
            opcode, payload = first & 0x0F, self._take(length)
            if opcode == 0x1:
                return payload.decode()
            if opcode == 0x9:
                self._send(0xA, payload[:125])
            elif opcode == 0x8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                with contextlib.suppress(OSError):
                    self._send(0x8, payload[:2])
                raise WebSocketClosed(code)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send(0x8, struct.pack("!H", 1000))
        self.sock.close()


class WsFollower(threading.Thread):
    """An ADE page following a run over the WebSocket relay, as apps/ade/static/ade/conversation.js does:
    `ws/runs/<id>/?after=<cursor>`, keeping each frame's cursor; when the socket drops before the run's
    end it connects again from the last cursor after the page's first retry delay (600 ms), here to the
    other web host, as a load balancer would send it. `connections` lists (web host, how it ended: "end",
    "close <code>" or "cut (<error>)"); `frames` are the relayed events ({"cursor", "event"}) in order."""

    RETRY_DELAY = 0.6
    READ_TIMEOUT = 30.0
    """The relay sends {"type": "ping"} after 15 s without an event: silence past this is a dead peer."""

    def __init__(
        self, api: Api, session: str, run_id: str, *, web: str, retry_delay: float = RETRY_DELAY
    ) -> None:
        super().__init__(daemon=True)
        self.api, self.session, self.run_id, self.web = api, session, run_id, web
        self.retry_delay = retry_delay
        self.frames: list[dict[str, Any]] = []
        self.reconnected_at: float | None = None
        self.replayed = 0
        """Events the reconnected socket relayed that the stream held before it connected (missed ones)."""
        self.connections: list[tuple[str, str]] = []
        self.cut_at: float | None = None
        self.first_resumed: tuple[float, dict[str, Any]] | None = None
        self.error: str | None = None

    @property
    def cursor(self) -> str:
        return str(self.frames[-1]["cursor"]) if self.frames else "0-0"

    def events(self) -> list[dict[str, Any]]:
        return [frame["event"] for frame in self.frames]

    def seen(self, message_type: str) -> bool:
        return any(event.get("message_type") == message_type for event in self.events())

    def run(self) -> None:
        web, deadline = self.web, time.monotonic() + 90
        while time.monotonic() < deadline:
            ended = self._follow(web)
            self.connections.append((web, ended))
            if ended == "end":
                return
            if self.cut_at is None:
                self.cut_at = time.time()
            web = WEBS[(WEBS.index(web) + 1) % 2]
            time.sleep(self.retry_delay)
        self.error = "no run_end within 90 s"

    def _follow(self, web: str) -> str:
        host = self.api.cluster.hosts[web].address
        headers = {"Cookie": f"sessionid={self.session}", "Origin": f"http://{host}:{WEB_PORT}"}
        try:
            ws = WebSocket(
                host, f"/ws/runs/{self.run_id}/?after={self.cursor}", headers, timeout=self.READ_TIMEOUT
            )
        except (OSError, ConnectionError) as exc:
            return f"refused ({exc})"
        connected_ms = time.time() * 1000
        if self.cut_at is not None and self.reconnected_at is None:
            self.reconnected_at = connected_ms / 1000
        try:
            while True:
                data = json.loads(ws.receive())
                if "event" not in data:  # {"type": "ping"}
                    continue
                self.frames.append(data)
                if self.cut_at is not None and int(str(data["cursor"]).split("-")[0]) < connected_ms:
                    self.replayed += 1
                if self.cut_at is not None and self.first_resumed is None and data["event"].get("date"):
                    self.first_resumed = (time.time(), data["event"])
                if data["event"].get("message_type") == "run_end":
                    return "end"
        except WebSocketClosed as closed:
            return f"close {closed.code}"
        except OSError as exc:
            return f"cut ({type(exc).__name__})"
        finally:
            ws.close()


# --- what every scenario ends with -------------------------------------------------------------------------


@dataclasses.dataclass
class RunRow:
    id: str
    agent_id: str
    conversation_id: str | None
    status: str
    stop_reason: str
    error: dict[str, Any] | None
    started_at: float | None
    completed_at: float | None


def runs(cluster: Cluster, where: str = "TRUE", params: list[Any] | None = None) -> list[RunRow]:
    rows = cluster.query(
        "SELECT id, agent_id, conversation_id, status, stop_reason, error, started_at, completed_at "
        f"FROM agents_run WHERE {where} ORDER BY created_at",
        params or [],
    )
    return [
        RunRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6] and r[6].timestamp(), r[7] and r[7].timestamp())
        for r in rows
    ]


def unfinished_runs(cluster: Cluster) -> list[str]:
    return [
        row[0] for row in cluster.query("SELECT id FROM agents_run WHERE status IN ('created', 'running')")
    ]


def shared_block_value(cluster: Cluster, block_id: str) -> str:
    return str(cluster.query("SELECT value FROM memory_block WHERE id = %s", [block_id])[0][0])


def check_invariants(cluster: Cluster, sent: list[Sent], block_id: str, *, settle: float = 60.0) -> None:
    """What must hold after any fault: every run ends; every accepted user message is stored exactly once
    (one that was never accepted at most once); no conversation ran two turns at once; every memory edit of
    a completed run is in the shared block, once, and no edit is there twice."""
    wait_until(
        lambda: not unfinished_runs(cluster), settle, f"every run ends ({unfinished_runs(cluster)})", poll=0.5
    )

    otids = [s.otid for s in sent]
    stored = dict(
        cluster.query(
            "SELECT otid, count(*) FROM agents_message WHERE role = 'user' AND otid = ANY(%s) GROUP BY otid",
            [otids],
        )
    )
    for s in sent:
        if s.run_id is not None:
            assert stored.get(s.otid) == 1, f"accepted message {s.token} stored {stored.get(s.otid, 0)} times"
        else:
            assert stored.get(s.otid, 0) <= 1, f"message {s.token} stored {stored[s.otid]} times"

    all_runs = runs(cluster)
    for run in all_runs:
        if run.status == "failed":
            assert run.stop_reason, f"run {run.id} failed without a stop reason"
            assert (run.error or {}).get("message"), f"run {run.id} failed without an error message"
    by_thread: dict[tuple[str, str | None], list[RunRow]] = {}
    for run in all_runs:
        if run.started_at is not None:
            by_thread.setdefault((run.agent_id, run.conversation_id), []).append(run)
    for thread, thread_runs in by_thread.items():
        thread_runs.sort(key=lambda r: r.started_at or 0)
        for before, after in itertools.pairwise(thread_runs):
            started = after.started_at
            assert before.completed_at is not None, f"run {before.id} has no end"
            assert started is not None
            assert started >= before.completed_at, (
                f"{thread}: run {after.id} started before {before.id} ended"
            )

    value = shared_block_value(cluster, block_id)
    statuses = {run.id: run.status for run in all_runs}
    for s in sent:
        if not s.memory:
            continue
        count = value.count(fact_of(s.token))
        if s.run_id is not None and statuses.get(s.run_id) == "completed":
            assert count == 1, (
                f"the memory edit of completed run {s.run_id} ({s.token}) is there {count} times"
            )
        else:
            assert count <= 1, f"the memory edit of {s.token} is there {count} times"
