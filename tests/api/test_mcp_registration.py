"""Adding an MCP server never holds the request for a slow or silent server: its tools are registered
inline when it answers quickly, by a worker otherwise, and the server's sync_status says how it went."""

from __future__ import annotations

import time

import pytest

from apps.tools.models import MCPServer, Tool
from tests.api.test_mcp_api import LAUNCH, PYTHON, STDIO_CONFIG

SILENT = {"mcp_server_type": "stdio", "command": PYTHON, "args": ["-c", "import time; time.sleep(120)"]}
EXITS = {"mcp_server_type": "stdio", "command": PYTHON, "args": ["-c", "raise SystemExit(3)"]}


@pytest.fixture(autouse=True)
def _stdio(settings):
    settings.MCP_STDIO_COMMANDS = [PYTHON]
    settings.MCP_STDIO_READ_PATHS = list(LAUNCH.read_paths)
    settings.MCP_LIST_TOOLS_TIMEOUT = 8.0
    settings.MCP_REGISTER_INLINE_SECONDS = 3.0  # a quick server starts in about 1 s: room for a slow machine


def add(client, name: str, config: dict) -> tuple[dict, float]:
    started = time.monotonic()
    response = client.post("/v1/mcp-servers/", {"server_name": name, "config": config}, format="json")
    assert response.status_code == 200, response.content
    return response.json(), time.monotonic() - started


def test_a_quick_server_has_its_tools_when_the_request_answers(actor, api_client_for):
    server, _ = add(api_client_for(actor), "local", STDIO_CONFIG)

    assert server["sync_status"] == "ok"
    assert Tool.objects.for_actor(actor).filter(name="add", tool_type="external_mcp").exists()


def test_a_server_that_exits_at_once_is_stored_with_the_reason(actor, api_client_for):
    server, elapsed = add(api_client_for(actor), "broken", EXITS)

    assert server["sync_status"] == "error"
    assert "MCP server" in server["sync_error"]
    assert elapsed < 8.0  # answered before the list-tools timeout: nothing waited for a dead process


@pytest.mark.django_db(transaction=True)
def test_a_silent_server_is_answered_at_once_and_finished_by_a_worker(actor, api_client_for, celery_worker):
    client = api_client_for(actor)

    server, elapsed = add(client, "silent", SILENT)

    assert server["sync_status"] == "syncing"
    assert elapsed < 8.0  # the request did not wait for the server's whole timeout
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stored = MCPServer.objects.for_actor(actor).get(id=server["id"])
        if stored.sync_status != "syncing":
            break
        time.sleep(0.2)
    assert stored.sync_status == "error"
    assert "did not answer within 8 s" in stored.sync_error
    assert client.get(f"/v1/mcp-servers/{server['id']}").json()["sync_status"] == "error"
