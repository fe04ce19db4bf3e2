"""Graceful shutdown through the real entry points: the web process (`python -m config.serve`, what `make
run` and the compose files start), a Celery worker, and `make run` itself, each stopped with SIGTERM as an
orchestrator stops them.

- web: stops accepting at once; a stream in flight ends as usual when its run ends within
  WEB_SHUTDOWN_TIMEOUT, else it is closed after whole events and the client resumes it on another web
  process from its cursor;
- worker: finishes a run within WORKER_SHUTDOWN_TIMEOUT, else hands it back, and another worker resumes it
  from its last stored step (nothing stored twice, nothing half-written);
- `make run`: passes SIGTERM on and waits for both.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.test import Client

from apps.accounts.services import api_key_provision
from apps.agents.models import Message, Run, Step
from apps.agents.services import MessageIn, run_create
from apps.agents.tasks import execute_run_task
from apps.memory.models import Block, BlockHistory
from apps.streams.events import append_event
from tests.factories import AgentFactory
from tests.support.scripted_llm import text, tool_call, tool_calls
from tests.support.web import WebProcess, free_port
from tests.support.workers import ROOT, WorkerProcess, worker_env
from tests.test_make_run import API_KEY, start_platform, wait_for_log

pytestmark = pytest.mark.django_db(transaction=True)


class SseReader(threading.Thread):
    """Reads one SSE response to its end in a thread: `items` are the data lines (JSON, or "[DONE]");
    `cut` says the server closed the connection before the response's end."""

    def __init__(self, method: str, url: str, key: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(daemon=True)
        self.method, self.url, self.key, self.body = method, url, key, body
        self.items: list[Any] = []
        self.status: int | None = None
        self.cut = False

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        try:
            with httpx.stream(self.method, self.url, headers=headers, json=self.body, timeout=60) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        data = line.removeprefix("data: ")
                        self.items.append(data if data == "[DONE]" else json.loads(data))
        except httpx.RemoteProtocolError:  # the body ended before its last chunk
            self.cut = True

    def wait_for(self, message_type: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            found = [i for i in self.items if isinstance(i, dict) and i.get("message_type") == message_type]
            if found:
                return found[-1]
            assert self.is_alive(), self.items
            assert time.monotonic() < deadline, self.items
            time.sleep(0.05)

    def messages(self) -> list[dict[str, Any]]:
        return [i for i in self.items if isinstance(i, dict) and "seq_id" in i and i.get("id")]


def wait_until(condition: Any, timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def wait_for_exit(process: subprocess.Popen[Any], timeout: float) -> tuple[int, float]:
    """(exit code, seconds since now) of a process told to stop."""
    started = time.monotonic()
    code = process.wait(timeout=timeout)
    return code, time.monotonic() - started


@pytest.fixture
def api_key(org, user):
    return api_key_provision(organization=org, user=user, name="shutdown").raw_key


@pytest.fixture
def web_env(scripted_server):
    return worker_env(scripted_server.url)


def stream_body(content: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "stream_tokens": False}


def test_a_draining_web_process_refuses_new_connections_and_lets_a_stream_end(
    make_agent, llm, celery_worker, web_env, api_key, tmp_path
):
    web = WebProcess({**web_env, "WEB_SHUTDOWN_TIMEOUT": "20"}, tmp_path, "web").wait_ready()
    agent = make_agent(embedding="")
    llm.push(text("Here I am", latency=2.0))
    reader = SseReader(
        "POST", f"{web.url}/v1/agents/{agent.id}/messages/stream", api_key, stream_body("hello")
    )
    reader.start()
    wait_until(
        lambda: Run.all_objects.filter(agent=agent, status=Run.Status.RUNNING).exists(), what="running"
    )

    web.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{web.url}/v1/live", timeout=2)
    code, took = wait_for_exit(web.process, timeout=30)
    reader.join(timeout=10)

    assert (code, reader.status, reader.cut) == (0, 200, False)
    assert [i["content"] for i in reader.messages() if i["message_type"] == "assistant_message"] == [
        "Here I am"
    ]
    assert {"message_type": "stop_reason", "stop_reason": "end_turn"} in reader.items
    assert reader.items[-1] == "[DONE]"
    assert took < 15  # when the stream ended (its run: ~2 s), not at WEB_SHUTDOWN_TIMEOUT (20 s)
    assert "web.drained" in web.log.read_text()


def test_a_stream_that_outlasts_the_drain_is_resumed_by_cursor_on_another_web_process(
    make_agent, llm, celery_worker, web_env, api_key, tmp_path
):
    leaving = WebProcess({**web_env, "WEB_SHUTDOWN_TIMEOUT": "1"}, tmp_path, "leaving").wait_ready()
    staying = WebProcess(web_env, tmp_path, "staying").wait_ready()
    agent = make_agent(embedding="")
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        text("Noted, Sam.", latency=4.0),
    )
    first = SseReader(
        "POST", f"{leaving.url}/v1/agents/{agent.id}/messages/stream", api_key, stream_body("I'm Sam")
    )
    first.start()
    first.wait_for("tool_return_message")

    started = time.monotonic()
    leaving.process.send_signal(signal.SIGTERM)
    first.join(timeout=10)
    cut_after = time.monotonic() - started
    code = leaving.process.wait(timeout=10)
    run_id = first.messages()[-1]["run_id"]
    cursor = first.messages()[-1]["seq_id"]
    second = SseReader("GET", f"{staying.url}/v1/runs/{run_id}/stream?starting_after={cursor}", api_key)
    second.start()
    second.join(timeout=30)
    staying.stop()

    assert (code, first.cut, "[DONE]" in first.items) == (0, True, False)
    assert 0.9 < cut_after < 4  # WEB_SHUTDOWN_TIMEOUT, then the close
    assert [i["message_type"] for i in first.messages()] == ["tool_call_message", "tool_return_message"]
    assert [i["message_type"] for i in second.messages()] == ["assistant_message"]
    assert second.messages()[0]["content"] == "Noted, Sam."
    assert second.items[-1] == "[DONE]"
    produced = Message.all_objects.filter(run_id=run_id).exclude(role="user")
    streamed = {i["id"] for i in first.messages() + second.messages()}
    assert streamed == set(produced.values_list("id", flat=True))  # every message once, none lost
    assert Run.all_objects.get(id=run_id).status == Run.Status.COMPLETED


def websocket_frames(port: int, path: str, headers: dict[str, str]) -> Iterator[tuple[int, bytes]]:
    """A WebSocket client in a few lines (the handshake, then the server's unmasked frames as (opcode,
    payload)), so that the test needs no client library."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(4096)
    head, buffer = buffer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 101"), head

    def take(n: int) -> bytes:
        nonlocal buffer
        while len(buffer) < n:
            chunk = sock.recv(4096)
            assert chunk, "the connection closed without a close frame"
            buffer += chunk
        taken, buffer = buffer[:n], buffer[n:]
        return taken

    with sock:
        while True:
            first, second = take(2)
            length = second & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", take(2))
            elif length == 127:
                (length,) = struct.unpack("!Q", take(8))
            yield first & 0x0F, take(length)


def test_a_draining_web_process_closes_websockets_saying_it_restarts(org, user, web_env, tmp_path):
    web = WebProcess({**web_env, "WEB_SHUTDOWN_TIMEOUT": "20"}, tmp_path, "web").wait_ready()
    run = Run.all_objects.create(organization=org, agent=AgentFactory(organization=org))
    append_event(run.id, {"message_type": "assistant_message", "content": "so far"})  # and no end yet
    browser = Client()
    browser.force_login(user)
    headers = {"Cookie": f"sessionid={browser.session.session_key}", "Origin": "http://127.0.0.1"}
    frames = websocket_frames(web.port, f"/ws/runs/{run.id}/", headers)
    opcode, first = next(frames)

    started = time.monotonic()
    web.process.send_signal(signal.SIGTERM)
    closing = next(payload for opcode, payload in frames if opcode == 0x8)
    closed_after = time.monotonic() - started
    code, took = wait_for_exit(web.process, timeout=30)

    assert (opcode, b"so far" in first) == (0x1, True)
    assert struct.unpack("!H", closing[:2]) == (4503,)  # server restarting: the ADE reconnects elsewhere
    assert closed_after < 3
    assert code == 0
    assert took < 5  # nothing else in flight: no waiting for WEB_SHUTDOWN_TIMEOUT


@pytest.fixture
def shutdown_queue_worker(scripted_server, tmp_path, request):
    """A worker on its own queue, to be stopped by the test; (WORKER_SHUTDOWN_TIMEOUT, pool) by indirect
    parametrization."""
    timeout, pool = request.param
    env = worker_env(scripted_server.url, WORKER_SHUTDOWN_TIMEOUT=str(timeout))
    worker = WorkerProcess("stopping", env, tmp_path, queues="shutdown", pool=pool).wait_ready()
    yield worker
    worker.stop()


def start_on_shutdown_queue(actor, agent, content: str) -> Run:
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content=content)])
    execute_run_task.apply_async(args=[run.id, agent.id, None], queue="shutdown")
    wait_until(lambda: Run.all_objects.get(id=run.id).status == Run.Status.RUNNING, what="running")
    return run


@pytest.mark.parametrize("shutdown_queue_worker", [(20, "threads")], indirect=True)
def test_a_stopped_worker_finishes_its_run_within_the_timeout(make_agent, actor, llm, shutdown_queue_worker):
    agent = make_agent(embedding="")
    llm.push(text("Finished before leaving", latency=2.0))
    run = start_on_shutdown_queue(actor, agent, "hello")

    shutdown_queue_worker.process.send_signal(signal.SIGTERM)  # the main process only, as Docker does
    code, took = wait_for_exit(shutdown_queue_worker.process, timeout=30)

    finished = Run.all_objects.get(id=run.id)
    assert (code, finished.status, finished.error) == (0, Run.Status.COMPLETED, None)
    assert Message.all_objects.get(run=run, role="assistant").text == "Finished before leaving"
    assert took < 20  # within WORKER_SHUTDOWN_TIMEOUT: the run, then Celery's own shutdown (3 s idle)
    assert "handed_back" not in shutdown_queue_worker.log.read_text()


@pytest.mark.parametrize(
    "shutdown_queue_worker", [(1, "threads"), (1, "prefork")], indirect=True, ids=["threads", "prefork"]
)
def test_a_stopped_worker_hands_back_a_run_that_outlasts_the_timeout_and_it_resumes_elsewhere(
    make_agent, actor, llm, shutdown_queue_worker, celery_worker
):
    agent = make_agent(embedding="")
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        text("never delivered", latency=30),
    )
    run = start_on_shutdown_queue(actor, agent, "I'm Sam")
    wait_until(lambda: Step.all_objects.filter(run=run).count() == 1, what="the first step stored")
    wait_until(lambda: len(llm.chat_requests()) == 2, what="the second LLM call in flight")
    llm.push(text("Resumed, Sam."))

    shutdown_queue_worker.process.send_signal(signal.SIGTERM)
    code, took = wait_for_exit(shutdown_queue_worker.process, timeout=30)
    wait_until(lambda: Run.all_objects.get(id=run.id).status == Run.Status.COMPLETED, what="resumed")

    assert code == 0
    assert took < 5  # WORKER_SHUTDOWN_TIMEOUT (1 s), the hand-back, the exit
    assert "agents.shutdown_handed_back runs=" + run.id in shutdown_queue_worker.log.read_text()
    stored = list(Message.all_objects.filter(run=run).order_by("sequence_id").values_list("role", "text"))
    assert [role for role, _ in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[-1] == ("assistant", "Resumed, Sam.")
    assert Step.all_objects.filter(run=run).count() == 2  # the interrupted step left nothing behind
    human = Block.all_objects.get(agent_attachments__agent=agent, label="human")
    assert human.value == "Name: Sam"
    assert BlockHistory.all_objects.filter(block=human, actor_type="agent").count() == 1  # edited once
    agent.refresh_from_db()
    in_context = Message.all_objects.filter(id__in=agent.message_ids, run=run)
    assert in_context.count() == 4  # each of the run's messages once in the conversation


@pytest.mark.parametrize("shutdown_queue_worker", [(1, "threads")], indirect=True)
def test_a_stopped_worker_hands_back_the_run_it_executes_inline_for_a_wait_for_reply(
    make_agent, actor, llm, shutdown_queue_worker, celery_worker
):
    """send_message_to_agent_and_wait_for_reply executes the other agent's run inline, in the sender's task:
    a stop hands both back (not only the task's own run), and another worker completes both."""
    asker = make_agent(name="Asker", embedding="", tools=["send_message_to_agent_and_wait_for_reply"])
    helper = make_agent(name="Helper", embedding="")
    llm.push(
        tool_calls(
            tool_call(
                "send_message_to_agent_and_wait_for_reply",
                {"message": "capital of France?", "other_agent_id": helper.id},
            )
        ),
        text("never delivered", latency=30, when_last_user_contains="Incoming message from agent"),
    )
    run = start_on_shutdown_queue(actor, asker, "ask the helper")
    wait_until(lambda: len(llm.chat_requests()) == 2, what="the helper's inline run waits for the model")
    [inline] = Run.all_objects.filter(agent_id=helper.id)
    assert inline.status == Run.Status.RUNNING
    llm.configure(strict=False, default_turn={"content": "Paris."})

    shutdown_queue_worker.process.send_signal(signal.SIGTERM)
    code, took = wait_for_exit(shutdown_queue_worker.process, timeout=30)
    log = shutdown_queue_worker.log.read_text()
    done = (Run.Status.COMPLETED, Run.Status.FAILED, Run.Status.CANCELLED)
    wait_until(
        lambda: all(r.status in done for r in Run.all_objects.filter(agent_id__in=[asker.id, helper.id])),
        what="both resumed and ended",
    )

    assert code == 0
    assert took < 5
    handed = log.split("agents.shutdown_handed_back runs=", 1)[1].split()[0].split(",")
    assert sorted(handed) == sorted([run.id, inline.id])
    inline.refresh_from_db()
    assert (inline.status, inline.error) == (Run.Status.COMPLETED, None)  # resumed, not failed as lost
    assert Run.all_objects.get(id=run.id).status == Run.Status.COMPLETED


def test_make_run_stops_gracefully_on_sigterm_letting_the_turn_in_flight_finish(scripted_server, llm):
    data_dir = ROOT / "var" / f"make-run-stop-{os.getpid()}"
    data_dir.mkdir(parents=True)
    port = free_port()
    process, log = start_platform(
        data_dir, port, OPENAI_BASE_URL=scripted_server.url, OPENAI_API_KEY="sk-test"
    )
    try:
        wait_for_log(log, "celery@")
        wait_for_log(log, "ready.")
        created = httpx.post(
            f"http://127.0.0.1:{port}/v1/agents/",
            headers={"Authorization": f"Bearer {API_KEY}"},
            json={
                "name": "Stopper",
                "model": "openai/gpt-4o-mini",
                "embedding": "openai/text-embedding-3-small",
            },
            timeout=30,
        )
        llm.push(text("Made it", latency=2.0))
        url = f"http://127.0.0.1:{port}/v1/agents/{created.json()['id']}/messages/stream"
        reader = SseReader("POST", url, API_KEY, stream_body("hi"))
        reader.start()
        wait_until(lambda: len(llm.chat_requests()) == 1, what="the LLM call in flight")

        process.send_signal(signal.SIGTERM)  # to `make run` alone, as a service manager does
        code, took = wait_for_exit(process, timeout=60)
        reader.join(timeout=10)
        text_log = log.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(data_dir, ignore_errors=True)

    assert created.status_code == 200
    assert code == 0
    assert reader.items[-1] == "[DONE]"
    assert [i["content"] for i in reader.messages() if i["message_type"] == "assistant_message"] == [
        "Made it"
    ]
    assert "web stopped (exit 0)" in text_log
    assert "worker stopped (exit 0)" in text_log
    assert "killed" not in text_log
    assert took < 25  # before the worker's WORKER_SHUTDOWN_TIMEOUT (25 s): it finished the turn
