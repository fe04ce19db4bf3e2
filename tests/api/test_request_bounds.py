"""Bounded work (issue 16): what one request may make the server read, parse or run.

Tool source is parsed in linear time and capped (TOOL_SOURCE_MAX_BYTES); request bodies are capped before
authentication (MAX_REQUEST_BODY_BYTES, through daphne as `make run` serves); agent files are capped
(AGENT_FILE_MAX_BYTES); JSON nests at most JSON_MAX_DEPTH deep. Only loopback is contacted.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connections

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents import services as agent_services
from apps.tools.models import Tool
from tests.support.ade_server import AdeServer
from tests.support.workers import worker_env

ADD_SOURCE = '''
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a (int): The first number.
        b (int): The second number.
    """
    return a + b
'''
SOURCE_LIMIT = 64 * 1024


def key_for(actor: Any) -> str:
    return api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="bounds").raw_key


def pathological_source(size: int) -> str:
    """A valid tool whose first Args line is the old parser's worst case: a name, then blanks (tabs: 8
    columns each once expanded) and no colon. Before issue 16, 60 KB of it held the GIL for minutes."""
    head = 'def slow(x: str) -> str:\n    """Summary.\n\n    Args:\n        y'
    tail = 'z\n        x: The x.\n    """\n    return x\n'
    return head + "\t" * (size - len(head) - len(tail)) + tail


def oversized_source() -> str:
    return ADD_SOURCE + "#" * (SOURCE_LIMIT - len(ADD_SOURCE)) + "\n"


def agent_file(**extra: Any) -> dict[str, Any]:
    return {
        "agents": [{"id": "agent-0", "name": "Imported", "model": "openai/gpt-4o-mini", **extra}],
        "blocks": [],
        "tools": [],
    }


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


# --- tool source: a linear parser, a size cap -------------------------------------------------------------


@pytest.fixture
def no_persistent_connections_in_server_threads() -> Iterator[None]:
    """The live server answers each request in a thread of its own: with persistent connections each one
    would leave a database session open, and the test database could not be dropped."""
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


@pytest.mark.django_db(transaction=True)
def test_a_pathological_docstring_does_not_hold_up_other_requests(
    live_server, actor, no_persistent_connections_in_server_threads
):
    headers = {"Authorization": f"Bearer {key_for(actor)}"}
    source = pathological_source(60 * 1024)

    with ThreadPoolExecutor(1) as pool:
        posted = pool.submit(
            httpx.post,
            f"{live_server.url}/v1/tools/",
            json={"source_code": source},
            headers=headers,
            timeout=60,
        )
        time.sleep(0.3)  # the server is reading and parsing it
        started = time.monotonic()
        health = httpx.get(f"{live_server.url}/v1/health/", timeout=10)
        waited = time.monotonic() - started
        created = posted.result(timeout=60)

    assert health.status_code == 200
    assert waited < 1.0
    assert created.status_code == 200, created.text
    assert created.json()["json_schema"]["parameters"]["properties"]["x"]["description"] == "The x."


@pytest.mark.django_db
def test_tool_source_over_the_limit_is_refused_wherever_it_enters(api_client_for, actor, client, user):
    api = api_client_for(actor)
    tool = api.post("/v1/tools/", {"source_code": ADD_SOURCE}, format="json").json()
    big = oversized_source()
    message = f"tool source is {len(big):,} bytes; the limit is 65,536 bytes (TOOL_SOURCE_MAX_BYTES)"

    created = api.post("/v1/tools/", {"source_code": big}, format="json")
    upserted = api.put("/v1/tools/", {"source_code": big}, format="json")
    updated = api.patch(f"/v1/tools/{tool['id']}", {"source_code": big}, format="json")
    ran = api.post("/v1/tools/run", {"source_code": big, "args": {"a": 1, "b": 2}}, format="json")
    client.force_login(user)
    preview = client.post("/tools/schema/", {"source_code": big}, HTTP_HX_REQUEST="true")

    for response in (created, upserted, updated, ran):
        assert response.status_code == 400, response.content
        assert response.json() == {"detail": message, "code": "tool_source_too_large"}
    assert preview.status_code == 422
    assert message in preview.content.decode()
    assert Tool.objects.for_actor(actor).get(id=tool["id"]).source_code == ADD_SOURCE


@pytest.mark.django_db
def test_tool_source_of_exactly_the_limit_is_accepted(api_client_for, actor):
    source = ADD_SOURCE + "#" * (SOURCE_LIMIT - len(ADD_SOURCE) - 1) + "\n"

    response = api_client_for(actor).post("/v1/tools/", {"source_code": source}, format="json")

    assert len(source.encode()) == SOURCE_LIMIT
    assert response.status_code == 200, response.content


@pytest.mark.django_db
def test_an_agent_file_with_oversized_tool_source_is_refused_and_imports_nothing(api_client_for, actor):
    document = agent_file(tool_ids=["tool-0"])
    document["tools"] = [
        {"id": "tool-0", "name": "add", "tool_type": "custom", "source_code": oversized_source()}
    ]
    upload = SimpleUploadedFile("agent.af", json.dumps(document).encode(), content_type="application/json")

    response = api_client_for(actor).post("/v1/agents/import", {"file": upload}, format="multipart")

    assert response.status_code == 400
    assert response.json()["detail"].startswith("Invalid agent file: tool tool-0 ('add'): tool source is ")
    assert "TOOL_SOURCE_MAX_BYTES" in response.json()["detail"]
    assert not Tool.objects.for_actor(actor).filter(name="add").exists()


# --- agent files: a size cap, checked before the file is read ------------------------------------------------


@pytest.mark.django_db
def test_an_agent_file_over_its_limit_is_413_before_it_is_read(api_client_for, actor, settings, monkeypatch):
    settings.AGENT_FILE_MAX_BYTES = 1000
    read: list[object] = []
    monkeypatch.setattr(agent_services, "parse_agent_file", read.append)
    raw = json.dumps(agent_file(description="x" * 1000)).encode()
    upload = SimpleUploadedFile("agent.af", raw, content_type="application/json")

    response = api_client_for(actor).post("/v1/agents/import", {"file": upload}, format="multipart")

    assert response.status_code == 413
    assert response.json() == {
        "detail": "The agent file is larger than 1,000 bytes (the limit, AGENT_FILE_MAX_BYTES)",
        "code": "agent_file_too_large",
    }
    assert read == []


@pytest.mark.django_db
def test_an_import_whose_body_declares_more_than_the_limit_is_413_before_it_is_parsed(
    api_client_for, actor, settings, monkeypatch
):
    from rest_framework.request import Request

    settings.AGENT_FILE_MAX_BYTES = 1000
    parsed: list[int] = []
    original = Request._parse
    monkeypatch.setattr(Request, "_parse", lambda self: parsed.append(1) or original(self))
    upload = SimpleUploadedFile("agent.af", b"x" * (2 * 1024 * 1024), content_type="application/json")

    response = api_client_for(actor).post("/v1/agents/import", {"file": upload}, format="multipart")

    assert response.status_code == 413
    assert parsed == []


# --- JSON nesting ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_json_nested_past_any_stack_is_a_400_not_a_500(api_client_for, actor):
    response = api_client_for(actor).post("/v1/tools/", "[" * 100_000, content_type="application/json")

    assert response.status_code == 400
    assert response.json() == {
        "detail": "JSON parse error - arrays and objects nest more than 64 deep (the limit, JSON_MAX_DEPTH)"
    }


@pytest.mark.django_db
def test_json_nested_past_the_limit_is_a_400_and_up_to_it_is_served(api_client_for, actor):
    api = api_client_for(actor)

    # The body's object is one level, args_json_schema's the other 64 (or 63).
    too_deep = api.post(
        "/v1/tools/", {"source_code": ADD_SOURCE, "args_json_schema": nested(64)}, format="json"
    )
    deep = api.post("/v1/tools/", {"source_code": ADD_SOURCE, "args_json_schema": nested(63)}, format="json")

    assert too_deep.status_code == 400
    assert "JSON_MAX_DEPTH" in too_deep.json()["detail"]
    assert deep.status_code == 200, deep.content
    assert deep.json()["args_json_schema"] == nested(63)


@pytest.mark.django_db
@pytest.mark.parametrize("raw", [b"[" * 100_000, json.dumps(agent_file(metadata=nested(80))).encode()])
def test_an_agent_file_nested_too_deep_is_a_400(api_client_for, actor, raw):
    upload = SimpleUploadedFile("agent.af", raw, content_type="application/json")

    response = api_client_for(actor).post("/v1/agents/import", {"file": upload}, format="multipart")

    assert response.status_code == 400
    assert response.json()["detail"] == "The agent file nests more than 64 deep (the limit, JSON_MAX_DEPTH)"


# --- request bodies, through daphne as `make run` serves -------------------------------------------------------

BODY_LIMIT = 4 * 1024 * 1024
FILE_LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def daphne(django_db_setup, tmp_path_factory) -> Iterator[AdeServer]:
    """`daphne config.asgi:application` on the test database, with small limits (so tests send little)."""
    env = worker_env(
        "http://127.0.0.1:9/v1",
        MAX_REQUEST_BODY_BYTES=str(BODY_LIMIT),
        AGENT_FILE_MAX_BYTES=str(FILE_LIMIT),
    )
    server = AdeServer(env, Path(tmp_path_factory.mktemp("daphne-bounds"))).wait_ready()
    yield server
    server.stop()


def raw_request(server: AdeServer, head: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """Send `head` (request line and headers) and nothing else; the whole answer, and how long it took."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer, time.monotonic() - started


def assert_healthy(server: AdeServer) -> None:
    response = httpx.get(f"{server.url}/v1/health/", timeout=5)
    assert (response.status_code, response.json()["status"]) == (200, "ok")


@pytest.mark.django_db(transaction=True)
def test_an_unauthenticated_1_gb_post_is_413_at_once_without_its_body(daphne):
    head = (
        b"POST /v1/agents/import HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1073741824\r\n\r\n"
    )

    answer, took = raw_request(daphne, head)

    status_line, _, rest = answer.partition(b"\r\n")
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert status_line == b"HTTP/1.1 413 Request Entity Too Large"
    assert body["detail"] == "Request body too large: the limit is 4,194,304 bytes (MAX_REQUEST_BODY_BYTES)"
    assert took < 2.0
    assert_healthy(daphne)


@pytest.mark.django_db(transaction=True)
def test_an_oversized_chunked_body_is_413(daphne):
    def chunks() -> Iterator[bytes]:
        for _ in range(BODY_LIMIT // 65536 + 16):
            yield b"x" * 65536

    response = httpx.post(
        f"{daphne.url}/v1/tools/", content=chunks(), headers={"Content-Type": "application/json"}, timeout=10
    )

    assert response.status_code == 413
    assert "MAX_REQUEST_BODY_BYTES" in response.json()["detail"]
    assert_healthy(daphne)


@pytest.mark.django_db(transaction=True)
def test_a_body_under_the_limit_still_reaches_the_api(daphne, actor):
    headers = {"Authorization": f"Bearer {key_for(actor)}"}

    response = httpx.post(
        f"{daphne.url}/v1/tools/",
        json={"source_code": ADD_SOURCE, "description": "y" * 100_000},
        headers=headers,
    )

    assert response.status_code == 200, response.text
    assert response.json()["name"] == "add"


@pytest.mark.django_db(transaction=True)
def test_an_oversized_import_is_413_quickly(daphne, actor):
    headers = {"Authorization": f"Bearer {key_for(actor)}"}
    raw = json.dumps(agent_file(description="x" * FILE_LIMIT)).encode()

    started = time.monotonic()
    response = httpx.post(
        f"{daphne.url}/v1/agents/import",
        files={"file": ("agent.af", raw, "application/json")},
        headers=headers,
    )
    took = time.monotonic() - started

    assert response.status_code == 413
    assert (
        response.json()["detail"]
        == "The agent file is larger than 262,144 bytes (the limit, AGENT_FILE_MAX_BYTES)"
    )
    assert took < 2.0
