"""The platform's ASGI application (config.asgi) serves HTTP through apps.core.asgi: answers, errors,
and streams sent event by event."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core.signals import request_finished

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.streams.events import append_event
from config.asgi import application
from tests.api.test_messages_api import new_agent
from tests.api.test_runs_api import finish, make_run, message_event
from tests.factories import MessageFactory

pytestmark = pytest.mark.django_db(transaction=True)


def scope(method: str, path: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"localhost"), *((k.encode(), v.encode()) for k, v in (headers or {}).items())],
        "client": ("127.0.0.1", 1234),
        "server": ("localhost", 80),
    }


async def call(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple:
    app = ApplicationCommunicator(application, scope(method, path, headers))
    await app.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await app.receive_output(timeout=10)
    chunks = []
    while True:
        message = await app.receive_output(timeout=10)
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return start["status"], b"".join(chunks)


def key_for(actor) -> str:
    return api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="asgi").raw_key


def test_a_json_answer_and_a_json_error(actor):
    key = key_for(actor)

    ok_status, ok_body = async_to_sync(call)("GET", "/v1/health/")
    missing_status, missing_body = async_to_sync(call)(
        "GET", "/v1/agents/agent-missing", headers={"authorization": f"Bearer {key}"}
    )

    assert (ok_status, json.loads(ok_body)["status"]) == (200, "ok")
    assert missing_status == 404
    assert "agent-missing" in json.loads(missing_body)["detail"]


def test_requests_run_in_a_thread_kept_between_them():
    """A request's synchronous part (its view, then its closing) runs in a thread kept for the next
    request: none is started for each request (nor another to join it, as asgiref's own context does)."""
    served: list[threading.Thread] = []

    def record(**kwargs: Any) -> None:  # request_finished: sent when the response closes, in its thread
        served.append(threading.current_thread())

    async def health() -> int:
        app = ApplicationCommunicator(application, scope("GET", "/v1/health/"))
        await app.send_input({"type": "http.request", "body": b"", "more_body": False})
        start = await app.receive_output(timeout=10)
        while (await app.receive_output(timeout=10)).get("more_body"):
            pass
        await app.wait(timeout=10)  # the request's end: its response closed
        return int(start["status"])

    request_finished.connect(record)
    try:
        statuses = [async_to_sync(health)() for _ in range(5)]
    finally:
        request_finished.disconnect(record)

    assert statuses == [200] * 5
    assert len(served) == 5
    assert all(thread is served[0] for thread in served)
    assert served[0].name.startswith("request")


def test_a_stream_sends_each_event_as_it_comes(actor, fast_streams):
    agent = new_agent(actor)
    run = make_run(actor, agent, status="running")
    first = MessageFactory(organization_id=actor.organization_id, agent=agent, run=run, role="assistant")
    append_event(run.id, message_event(first))
    key = key_for(actor)

    async def attach() -> tuple[int, bytes, bytes]:
        app = ApplicationCommunicator(
            application,
            scope(
                "POST",
                f"/v1/runs/{run.id}/stream",
                {"authorization": f"Bearer {key}", "content-type": "application/json"},
            ),
        )
        await app.send_input({"type": "http.request", "body": b"{}", "more_body": False})
        start = await app.receive_output(timeout=10)
        before_the_end = b""
        while first.id.encode() not in before_the_end:  # a buffering server would wait for the run's end
            before_the_end += (await app.receive_output(timeout=10)).get("body", b"")
        await sync_to_async(finish, thread_sensitive=False)(run)
        rest = b""
        while True:
            message = await app.receive_output(timeout=10)
            rest += message.get("body", b"")
            if not message.get("more_body"):
                return start["status"], before_the_end, rest

    status, before_the_end, rest = async_to_sync(attach)()

    assert status == 200
    assert first.id.encode() in before_the_end
    assert rest.endswith(b"data: [DONE]\n\n")


# --- request bodies are bounded before anything reads them (issue 16) -------------------------------------


async def answer(app: ApplicationCommunicator) -> tuple[int, dict[bytes, bytes], bytes]:
    start = await app.receive_output(timeout=10)
    body = b""
    while True:
        message = await app.receive_output(timeout=10)
        body += message.get("body", b"")
        if not message.get("more_body"):
            return start["status"], dict(start["headers"]), body


def test_a_declared_body_over_the_limit_is_refused_before_any_of_it_is_read(settings):
    settings.MAX_REQUEST_BODY_BYTES = 1000

    async def post() -> tuple[int, dict[bytes, bytes], bytes]:
        # No body is ever sent: the answer must come from the Content-Length alone.
        app = ApplicationCommunicator(
            application, scope("POST", "/v1/tools/", {"content-length": str(10**9)})
        )
        return await answer(app)

    status, headers, body = async_to_sync(post)()

    assert status == 413
    assert headers[b"connection"] == b"close"
    assert (
        json.loads(body)["detail"]
        == "Request body too large: the limit is 1,000 bytes (MAX_REQUEST_BODY_BYTES)"
    )


def test_a_streamed_body_is_refused_when_it_crosses_the_limit(settings):
    settings.MAX_REQUEST_BODY_BYTES = 1000

    async def post() -> tuple[int, dict[bytes, bytes], bytes]:
        app = ApplicationCommunicator(application, scope("POST", "/v1/tools/"))
        for _ in range(3):
            await app.send_input({"type": "http.request", "body": b"x" * 400, "more_body": True})
        return await answer(app)  # answered without waiting for the end of the body

    status, _, body = async_to_sync(post)()

    assert status == 413
    assert "MAX_REQUEST_BODY_BYTES" in json.loads(body)["detail"]


def test_a_body_of_exactly_the_limit_is_served(settings):
    settings.MAX_REQUEST_BODY_BYTES = 1000

    async def get() -> tuple[int, dict[bytes, bytes], bytes]:
        app = ApplicationCommunicator(application, scope("GET", "/v1/health/", {"content-length": "1000"}))
        await app.send_input({"type": "http.request", "body": b"x" * 600, "more_body": True})
        await app.send_input({"type": "http.request", "body": b"x" * 400, "more_body": False})
        return await answer(app)

    status, _, body = async_to_sync(get)()

    assert (status, json.loads(body)["status"]) == (200, "ok")
