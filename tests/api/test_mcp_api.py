"""/v1/mcp-servers and the legacy /v1/tools/mcp/servers routes, against the real test MCP server
(tests/support/mcp_server.py, jailed): CRUD, secrets never returned, tools, run, refresh, the operator's
stdio commands, roles and tenancy."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from letta_client import Letta
from rest_framework.test import APIClient

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.models import AgentTool
from apps.core import outbound
from apps.core.actor import Actor, Role
from apps.tools.mcp import mcp_server_create, mcp_tool_register
from apps.tools.models import MCPServer, Tool
from tests.factories import AgentFactory
from tests.support.mcp_server import McpHttpServer, stdio_launch
from tests.support.outbound import ConnectionRecorder, FakeResolver, loopback_only

LAUNCH = stdio_launch()
PYTHON = LAUNCH.command
STDIO_CONFIG = {"mcp_server_type": "stdio", "command": PYTHON, "args": list(LAUNCH.args)}
REGISTRABLE = ["add", "auth_seen", "env_value", "fail", "jail_probe", "nap"]


@pytest.fixture(autouse=True)
def _stdio_allowed(settings):
    """The operator allows the test server's interpreter and binds what it needs into the jail."""
    settings.MCP_STDIO_COMMANDS = [PYTHON]
    settings.MCP_STDIO_READ_PATHS = list(LAUNCH.read_paths)
    # These tests register a quick server inline (it starts in about 1 s); the default 2 s wait before a
    # worker takes over was too short on a loaded 2-core machine, and no worker runs here to take over.
    # Deferral itself is tested in test_mcp_registration.py.
    settings.MCP_REGISTER_INLINE_SECONDS = 15.0


@pytest.fixture(autouse=True)
def _outbound(settings, monkeypatch):
    """The test servers listen on 127.0.0.1, which the operator opens (OUTBOUND_ALLOW); the example.com
    servers are only stored (named in the allow-list, so never looked up; a connection would go to
    loopback); nothing may leave loopback."""
    settings.OUTBOUND_ALLOW = ["127.0.0.1", "mcp.example.com", "other.example.com"]
    names = {"mcp.example.com": ["127.0.0.1"], "other.example.com": ["127.0.0.1"]}
    monkeypatch.setattr(outbound, "resolve", FakeResolver(names))
    loopback_only(monkeypatch)


def stdio_server(actor: Actor, name: str = "local", *, register_tools: bool = False) -> MCPServer:
    server, _ = mcp_server_create(
        actor=actor,
        server_name=name,
        server_type="stdio",
        command=PYTHON,
        args=list(LAUNCH.args),
        env={"API_KEY": "k-123"},
        register_tools=register_tools,
    )
    return server


def http_server(actor: Actor, url: str = "https://mcp.example.com/mcp") -> MCPServer:
    server, _ = mcp_server_create(
        actor=actor,
        server_name="remote",
        server_type="streamable_http",
        server_url=url,
        auth_header="Authorization",
        auth_token="tok-1",
        custom_headers={"X-Team": "blue"},
        register_tools=False,
    )
    return server


# --- servers ----------------------------------------------------------------------------------------------


def test_create_a_stdio_server_registers_its_tools_and_hides_env_values(actor, api_client_for):
    body = {"server_name": "local", "config": {**STDIO_CONFIG, "env": {"API_KEY": "k-123"}}}

    response = api_client_for(actor).post("/v1/mcp-servers/", body, format="json")

    assert response.status_code == 200
    data = response.json()
    server = MCPServer.objects.for_actor(actor).get()
    assert data == {
        "id": server.id,
        "server_name": "local",
        "mcp_server_type": "stdio",
        "command": PYTHON,
        "args": list(LAUNCH.args),
        "env": {"API_KEY": None},
        "created_at": data["created_at"],
        "updated_at": data["updated_at"],
        "sync_status": "ok",
        "sync_error": "",
        "synced_at": data["synced_at"],
    }
    assert server.id.startswith("mcp_server-")
    assert server.env == {"API_KEY": "k-123"}
    assert sorted(
        Tool.objects.for_actor(actor).filter(tool_type="external_mcp").values_list("name", flat=True)
    ) == (REGISTRABLE)


def test_create_an_http_server_never_returns_its_token_or_header_values(actor, api_client_for):
    body = {
        "server_name": "remote",
        "config": {
            "mcp_server_type": "streamable_http",
            "server_url": "http://127.0.0.1:9/mcp",
            "auth_header": "Authorization",
            "auth_token": "Bearer tok-1",
            "custom_headers": {"X-Team": "blue"},
        },
    }

    response = api_client_for(actor).post("/v1/mcp-servers/", body, format="json")

    data = response.json()
    assert response.status_code == 200
    assert {key: data[key] for key in data if key not in ("id", "created_at", "updated_at", "synced_at")} == {
        "sync_status": "error",  # nothing listens on the discard port
        "sync_error": "cannot reach the MCP server (http://127.0.0.1:9)",
        "server_name": "remote",
        "mcp_server_type": "streamable_http",
        "server_url": "http://127.0.0.1:9/mcp",
        "auth_header": "Authorization",
        "auth_token": None,
        "custom_headers": {"X-Team": None},
    }
    assert "tok-1" not in response.content.decode()
    server = MCPServer.objects.for_actor(actor).get(id=data["id"])
    assert (server.auth_token, server.custom_headers) == ("Bearer tok-1", {"X-Team": "blue"})


def test_the_server_type_may_be_left_out(actor, api_client_for, settings):
    settings.MCP_STDIO_COMMANDS = ["/bin/false"]
    client = api_client_for(actor)

    stdio = client.post(
        "/v1/mcp-servers/",
        {"server_name": "a", "config": {"command": "/bin/false", "args": []}},
        format="json",
    )
    sse = client.post(
        "/v1/mcp-servers/",
        {"server_name": "b", "config": {"server_url": "http://127.0.0.1:9/sse"}},
        format="json",
    )
    http = client.post(
        "/v1/mcp-servers/",
        {"server_name": "c", "config": {"server_url": "http://127.0.0.1:9/mcp"}},
        format="json",
    )

    assert [r.json()["mcp_server_type"] for r in (stdio, sse, http)] == ["stdio", "sse", "streamable_http"]


@pytest.mark.parametrize(
    ("config", "detail"),
    [
        ({"mcp_server_type": "stdio", "args": []}, "config.command: This field is required."),
        ({"mcp_server_type": "sse"}, "config.server_url: This field is required."),
        (
            {"mcp_server_type": "websocket", "server_url": "ws://x"},
            "config: mcp_server_type must be one of stdio, sse, streamable_http",
        ),
    ],
)
def test_an_invalid_config_is_422(actor, api_client_for, config, detail):
    response = api_client_for(actor).post(
        "/v1/mcp-servers/", {"server_name": "x", "config": config}, format="json"
    )

    assert response.status_code == 422
    assert response.json()["detail"] == detail
    assert MCPServer.objects.for_actor(actor).count() == 0


def test_a_url_that_is_not_http_is_400(actor, api_client_for):
    body = {"server_name": "x", "config": {"mcp_server_type": "sse", "server_url": "file:///etc/passwd"}}

    response = api_client_for(actor).post("/v1/mcp-servers/", body, format="json")

    assert response.status_code == 400
    assert (
        response.json()["detail"] == "server_url must be an http:// or https:// URL, got 'file:///etc/passwd'"
    )


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://169.254.169.254/computeMetadata/v1/", "169.254.169.254 is a cloud metadata address"),
        ("http://10.0.0.8:8080/mcp", "10.0.0.8 is a private (RFC 1918) address"),
        ("http://[fd00:ec2::254]/mcp", "fd00:ec2::254 is a cloud metadata address"),
    ],
)
def test_a_server_url_that_is_not_public_is_400_with_the_reason(actor, api_client_for, url, reason):
    body = {"server_name": "x", "config": {"mcp_server_type": "sse", "server_url": url}}

    response = api_client_for(actor).post("/v1/mcp-servers/", body, format="json")

    assert response.status_code == 400
    assert response.json()["detail"] == (
        f"server_url is not allowed: {reason}. Only public addresses can be reached; the operator can "
        "allow a private server with OUTBOUND_ALLOW."
    )
    assert MCPServer.objects.for_actor(actor).count() == 0


def test_the_web_process_connects_to_nothing_it_refuses(actor, api_client_for, settings):
    """Creating a server lists its tools at once: a refused URL is refused before that."""
    settings.OUTBOUND_ALLOW = ["mcp.example.com"]  # not 127.0.0.1
    client = api_client_for(actor)
    with ConnectionRecorder() as platform:
        created = client.post(
            "/v1/mcp-servers/",
            {
                "server_name": "x",
                "config": {"mcp_server_type": "streamable_http", "server_url": platform.url},
            },
            format="json",
        )
        server = http_server(actor, url="https://mcp.example.com/mcp")
        updated = client.patch(
            f"/v1/mcp-servers/{server.id}", {"config": {"server_url": f"{platform.url}/mcp"}}, format="json"
        )

    assert (created.status_code, updated.status_code) == (400, 400)
    assert "127.0.0.1 is a loopback address" in updated.json()["detail"]
    server.refresh_from_db()
    assert server.server_url == "https://mcp.example.com/mcp"
    assert platform.connections == []


@pytest.mark.parametrize("header", ["Metadata-Flavor", "X-Google-Metadata-Request", "Proxy-Authorization"])
def test_a_metadata_or_hop_by_hop_header_is_400(actor, api_client_for, header):
    config = {
        "mcp_server_type": "streamable_http",
        "server_url": "https://mcp.example.com/mcp",
        "custom_headers": {header: "Google"},
    }

    response = api_client_for(actor).post(
        "/v1/mcp-servers/", {"server_name": "x", "config": config}, format="json"
    )

    assert response.status_code == 400
    assert response.json()["detail"] == (
        f"The header '{header}' is not allowed (metadata and hop-by-hop headers are the server's to set)."
    )
    assert MCPServer.objects.for_actor(actor).count() == 0


def test_a_taken_name_is_409(actor, api_client_for):
    http_server(actor)
    body = {"server_name": "remote", "config": {"server_url": "https://other.example.com/mcp"}}

    response = api_client_for(actor).post("/v1/mcp-servers/", body, format="json")

    assert response.status_code == 409
    assert response.json()["detail"] == "MCP server with name 'remote' already exists"


def test_list_servers_with_a_fixed_number_of_queries(actor, api_client_for, django_assert_num_queries):
    client = api_client_for(actor)
    client.get("/v1/mcp-servers/")  # records the key's use
    http_server(actor)
    stdio_server(actor)

    with django_assert_num_queries(2):  # the key with its membership, the servers
        response = client.get("/v1/mcp-servers/")

    assert [(s["server_name"], s["mcp_server_type"]) for s in response.json()] == [
        ("local", "stdio"),
        ("remote", "streamable_http"),
    ]


def test_retrieve_a_server(actor, api_client_for):
    server = stdio_server(actor)

    response = api_client_for(actor).get(f"/v1/mcp-servers/{server.id}")

    assert response.status_code == 200
    assert (response.json()["id"], response.json()["env"]) == (server.id, {"API_KEY": None})


def test_update_keeps_what_is_not_sent_and_clears_what_is_null(actor, api_client_for):
    server = http_server(actor)
    body = {
        "server_name": "renamed",
        "config": {"mcp_server_type": "streamable_http", "custom_headers": None},
    }

    response = api_client_for(actor).patch(f"/v1/mcp-servers/{server.id}", body, format="json")

    assert response.status_code == 200
    server.refresh_from_db()
    assert (server.server_name, server.server_url, server.auth_token, server.custom_headers) == (
        "renamed",
        "https://mcp.example.com/mcp",
        "tok-1",
        {},
    )
    assert response.json()["custom_headers"] == {}


def test_update_can_switch_the_transport(actor, api_client_for):
    server = http_server(actor)
    body = {"config": STDIO_CONFIG}

    response = api_client_for(actor).patch(f"/v1/mcp-servers/{server.id}", body, format="json")

    server.refresh_from_db()
    assert response.json()["mcp_server_type"] == "stdio"
    assert (server.server_type, server.command, server.server_url, server.auth_token) == (
        "stdio",
        PYTHON,
        "",
        "",
    )


def test_delete_a_server_and_its_tools(actor, api_client_for):
    server = stdio_server(actor, register_tools=True)

    response = api_client_for(actor).delete(f"/v1/mcp-servers/{server.id}")

    assert response.status_code == 204
    assert response.content == b""
    assert MCPServer.objects.for_actor(actor).count() == 0
    assert Tool.objects.for_actor(actor).filter(tool_type="external_mcp").count() == 0


# --- the operator's stdio commands ------------------------------------------------------------------------


def test_by_default_a_stdio_server_is_refused_and_leaves_no_trace(actor, api_client_for, settings):
    settings.MCP_STDIO_COMMANDS = []
    marker = Path(f"/tmp/letta-mcp-pwned-{uuid.uuid4()}")
    body = {
        "server_name": "pwn",
        "config": {"mcp_server_type": "stdio", "command": "sh", "args": ["-c", f"touch {marker}"]},
    }

    response = api_client_for(actor).post("/v1/mcp-servers/", body, format="json")

    assert response.status_code == 400
    assert response.json()["detail"] == (
        "stdio MCP servers are disabled on this server: the operator allows no commands (MCP_STDIO_COMMANDS)"
    )
    assert MCPServer.objects.for_actor(actor).count() == 0
    assert Tool.objects.for_actor(actor).count() == 0
    assert not marker.exists()


def test_a_command_the_operator_does_not_allow_is_refused(actor, api_client_for, settings):
    settings.MCP_STDIO_COMMANDS = ["npx", "uvx"]
    server = http_server(actor)
    client = api_client_for(actor)
    stdio = {"mcp_server_type": "stdio", "command": "sh", "args": ["-c", "id"]}

    created = client.post("/v1/mcp-servers/", {"server_name": "x", "config": stdio}, format="json")
    updated = client.patch(f"/v1/mcp-servers/{server.id}", {"config": stdio}, format="json")

    refusal = "'sh' is not an allowed stdio MCP command on this server (MCP_STDIO_COMMANDS allows: npx, uvx)"
    assert (created.status_code, created.json()["detail"]) == (400, refusal)
    assert (updated.status_code, updated.json()["detail"]) == (400, refusal)
    server.refresh_from_db()
    assert (server.server_type, server.command) == ("streamable_http", "")
    assert list(MCPServer.objects.for_actor(actor).values_list("server_name", flat=True)) == ["remote"]


def test_a_stored_server_whose_command_is_no_longer_allowed_is_refused(actor, api_client_for, settings):
    server = stdio_server(actor)
    tool = mcp_tool_register(actor=actor, server=server, tool_name="add")
    settings.MCP_STDIO_COMMANDS = []
    client = api_client_for(actor)

    ran = client.post(
        f"/v1/mcp-servers/{server.id}/tools/{tool.id}/run", {"args": {"a": 2, "b": 3}}, format="json"
    )
    listed = client.get("/v1/tools/mcp/servers/local/tools")

    refusal = (
        "stdio MCP servers are disabled on this server: the operator allows no commands (MCP_STDIO_COMMANDS)"
    )
    assert (ran.status_code, ran.json()["status"]) == (200, "error")
    assert ran.json()["func_return"] == f"Error calling MCP tool 'add' on server 'local': {refusal}"
    assert (listed.status_code, listed.json()["detail"]) == (400, refusal)


# --- a server's tools -------------------------------------------------------------------------------------


def test_list_a_servers_registered_tools(actor, api_client_for):
    server = stdio_server(actor, register_tools=True)

    response = api_client_for(actor).get(f"/v1/mcp-servers/{server.id}/tools")

    assert response.status_code == 200
    tools = response.json()
    assert [t["name"] for t in tools] == REGISTRABLE
    assert {t["tool_type"] for t in tools} == {"external_mcp"}
    assert tools[0]["metadata_"] == {
        "mcp": {"server_id": server.id, "server_name": "local", "tool_name": "add"}
    }


def test_retrieve_one_tool_of_a_server(actor, api_client_for):
    server = stdio_server(actor)
    tool = mcp_tool_register(actor=actor, server=server, tool_name="add")

    response = api_client_for(actor).get(f"/v1/mcp-servers/{server.id}/tools/{tool.id}")

    assert response.status_code == 200
    assert (response.json()["id"], response.json()["json_schema"]["name"]) == (tool.id, "add")


def test_a_tool_of_another_server_is_404_under_this_one(actor, api_client_for):
    first = stdio_server(actor, "first")
    second = stdio_server(actor, "second")
    tool = mcp_tool_register(actor=actor, server=first, tool_name="add")

    response = api_client_for(actor).get(f"/v1/mcp-servers/{second.id}/tools/{tool.id}")

    assert response.status_code == 404


def test_run_a_tool(actor, api_client_for):
    server = stdio_server(actor)
    tool = mcp_tool_register(actor=actor, server=server, tool_name="add")

    response = api_client_for(actor).post(
        f"/v1/mcp-servers/{server.id}/tools/{tool.id}/run", {"args": {"a": 2, "b": 3}}, format="json"
    )

    assert response.status_code == 200
    assert response.json() == {
        "status": "success",
        "func_return": "5",
        "stdout": [],
        "stderr": [],
        "sandbox_config_fingerprint": None,
        "agent_state": None,
    }


def test_run_a_tool_that_fails(actor, api_client_for):
    server = stdio_server(actor)
    tool = mcp_tool_register(actor=actor, server=server, tool_name="fail")

    response = api_client_for(actor).post(
        f"/v1/mcp-servers/{server.id}/tools/{tool.id}/run", {}, format="json"
    )

    assert (response.json()["status"], response.json()["func_return"]) == (
        "error",
        "Error executing tool fail: this tool always fails",
    )


def test_refresh_adds_new_tools_and_attaches_them_to_an_agent(actor, api_client_for):
    server = stdio_server(actor)
    mcp_tool_register(actor=actor, server=server, tool_name="add")
    agent = AgentFactory(organization_id=actor.organization_id)

    response = api_client_for(actor).patch(f"/v1/mcp-servers/{server.id}/refresh?agent_id={agent.id}")

    assert response.status_code == 200
    assert response.json() == {
        "added": ["fail", "env_value", "auth_seen", "nap", "jail_probe"],
        "updated": [],
        "unchanged": ["add"],
        "deleted": [],
        "skipped": [
            {
                "name": "dotted.name",
                "reason": "the name is not a valid function name (letters, digits, '_' and '-'; at most 64)",
            }
        ],
        "attached_to_agent": ["fail", "env_value", "auth_seen", "nap", "jail_probe"],
    }
    attached = AgentTool.objects.filter(agent=agent).values_list("tool__name", flat=True)
    assert sorted(attached) == ["auth_seen", "env_value", "fail", "jail_probe", "nap"]


def test_refreshing_a_server_that_is_down_is_502_and_changes_nothing(actor, api_client_for):
    server, _ = mcp_server_create(
        actor=actor,
        server_name="broken",
        server_type="stdio",
        command=PYTHON,
        args=["-c", "import sys; print('missing API_KEY', file=sys.stderr); sys.exit(1)"],
        register_tools=False,
    )

    response = api_client_for(actor).patch(f"/v1/mcp-servers/{server.id}/refresh")

    assert response.status_code == 502
    assert response["x-should-retry"] == "false"
    assert response.json() == {
        "detail": f"the MCP server ({PYTHON}) failed: Connection closed\n"
        "The server's stderr ends with:\nmissing API_KEY",
        "code": "mcp_server_error",
    }
    assert Tool.objects.for_actor(actor).count() == 0


def test_legacy_live_listing_shows_every_tool_and_its_health(actor, api_client_for):
    stdio_server(actor)

    response = api_client_for(actor).get("/v1/tools/mcp/servers/local/tools")

    assert response.status_code == 200
    tools = {t["name"]: t for t in response.json()}
    assert list(tools) == ["add", "fail", "env_value", "auth_seen", "nap", "dotted.name", "jail_probe"]
    assert tools["add"]["inputSchema"]["required"] == ["a", "b"]
    assert tools["add"]["health"] == {"status": "VALID", "reasons": []}
    assert tools["dotted.name"]["health"]["status"] == "INVALID"
    assert Tool.objects.for_actor(actor).count() == 0


def test_legacy_add_registers_one_chosen_tool(actor, api_client_for):
    stdio_server(actor)

    response = api_client_for(actor).post("/v1/tools/mcp/servers/local/add")

    assert response.status_code == 200
    assert (response.json()["name"], response.json()["tool_type"]) == ("add", "external_mcp")
    assert list(Tool.objects.for_actor(actor).values_list("name", flat=True)) == ["add"]


def test_legacy_add_of_a_tool_the_server_does_not_have_is_404(actor, api_client_for):
    stdio_server(actor)

    response = api_client_for(actor).post("/v1/tools/mcp/servers/local/nope")

    assert response.status_code == 404
    assert response.json()["detail"] == "MCP server 'local' has no tool 'nope'"


def test_streamable_http_server_end_to_end_sends_the_token(actor, api_client_for):
    with McpHttpServer("streamable-http") as mcp:
        body = {
            "server_name": "remote",
            "config": {
                "mcp_server_type": "streamable_http",
                "server_url": mcp.url,
                "auth_header": "Authorization",
                "auth_token": "tok-1",
                "custom_headers": {"X-Team": "blue"},
            },
        }
        client = api_client_for(actor)
        server_id = client.post("/v1/mcp-servers/", body, format="json").json()["id"]
        tool = Tool.objects.for_actor(actor).get(name="auth_seen")

        response = client.post(
            f"/v1/mcp-servers/{server_id}/tools/{tool.id}/run", {"args": {}}, format="json"
        )

    assert response.json()["func_return"] == "Bearer tok-1 | blue"


# --- roles, tenancy, authentication ----------------------------------------------------------------------


@pytest.fixture
def member(org, make_user) -> Actor:
    return Actor(organization_id=org.id, user_id=make_user(org).id, role=Role.MEMBER)


def test_members_can_read_but_not_change(actor, member, api_client_for):
    server = stdio_server(actor, register_tools=True)
    tool = Tool.objects.for_actor(actor).get(name="add")
    client = api_client_for(member)

    reads = [
        client.get("/v1/mcp-servers/").status_code,
        client.get(f"/v1/mcp-servers/{server.id}").status_code,
        client.get(f"/v1/mcp-servers/{server.id}/tools").status_code,
    ]
    writes = [
        client.post(
            "/v1/mcp-servers/", {"server_name": "x", "config": STDIO_CONFIG}, format="json"
        ).status_code,
        client.patch(f"/v1/mcp-servers/{server.id}", {"server_name": "hacked"}, format="json").status_code,
        client.delete(f"/v1/mcp-servers/{server.id}").status_code,
        client.post(f"/v1/mcp-servers/{server.id}/tools/{tool.id}/run", {}, format="json").status_code,
        client.patch(f"/v1/mcp-servers/{server.id}/refresh").status_code,
        client.get("/v1/tools/mcp/servers/local/tools").status_code,
    ]

    assert reads == [200, 200, 200]
    assert writes == [403, 403, 403, 403, 403, 403]
    assert list(MCPServer.objects.for_actor(actor).values_list("server_name", flat=True)) == ["local"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", "/v1/mcp-servers/{server}", None),
        ("patch", "/v1/mcp-servers/{server}", {"server_name": "hacked"}),
        ("delete", "/v1/mcp-servers/{server}", None),
        ("get", "/v1/mcp-servers/{server}/tools", None),
        ("get", "/v1/mcp-servers/{server}/tools/{tool}", None),
        ("post", "/v1/mcp-servers/{server}/tools/{tool}/run", {"args": {"a": 1, "b": 2}}),
        ("patch", "/v1/mcp-servers/{server}/refresh", None),
        ("get", "/v1/tools/mcp/servers/local/tools", None),
        ("post", "/v1/tools/mcp/servers/local/add", None),
    ],
)
def test_another_organisation_gets_404_and_changes_nothing(
    actor, other_org_actor, api_client_for, method, path, body
):
    server = stdio_server(actor)
    tool = mcp_tool_register(actor=actor, server=server, tool_name="add")

    response = getattr(api_client_for(other_org_actor), method)(
        path.format(server=server.id, tool=tool.id), body, format="json"
    )

    assert response.status_code == 404
    server.refresh_from_db()
    assert server.server_name == "local"
    assert list(Tool.objects.for_actor(actor).values_list("name", flat=True)) == ["add"]
    assert Tool.objects.for_actor(other_org_actor).filter(tool_type="external_mcp").count() == 0


def test_another_organisations_servers_are_not_listed(actor, other_org_actor, api_client_for):
    stdio_server(actor)

    response = api_client_for(other_org_actor).get("/v1/mcp-servers/")

    assert response.json() == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/v1/mcp-servers/"),
        ("post", "/v1/mcp-servers/"),
        ("get", "/v1/mcp-servers/mcp_server-1"),
        ("patch", "/v1/mcp-servers/mcp_server-1"),
        ("delete", "/v1/mcp-servers/mcp_server-1"),
        ("get", "/v1/mcp-servers/mcp_server-1/tools"),
        ("get", "/v1/mcp-servers/mcp_server-1/tools/tool-1"),
        ("post", "/v1/mcp-servers/mcp_server-1/tools/tool-1/run"),
        ("patch", "/v1/mcp-servers/mcp_server-1/refresh"),
        ("get", "/v1/tools/mcp/servers/local/tools"),
        ("post", "/v1/tools/mcp/servers/local/add"),
    ],
)
@pytest.mark.django_db
def test_requests_without_a_key_are_401(method, path):
    response = getattr(APIClient(), method)(path, {}, format="json")

    assert response.status_code == 401
    assert MCPServer.objects.unscoped().count() == 0


# --- the official SDK ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_mcp_server_lifecycle_through_the_sdk(live_server, actor):
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk").raw_key
    client = Letta(base_url=live_server.url, api_key=key, max_retries=0)

    created = client.mcp_servers.create(server_name="local", config={**STDIO_CONFIG, "env": {"API_KEY": "k"}})
    listed = client.mcp_servers.list()
    fetched = client.mcp_servers.retrieve(created.id)
    tools = client.mcp_servers.tools.list(created.id)
    add = next(t for t in tools if t.name == "add")
    ran = client.mcp_servers.tools.run(add.id, mcp_server_id=created.id, args={"a": 2, "b": 3})
    updated = client.mcp_servers.update(
        created.id, server_name="renamed", config={"mcp_server_type": "stdio"}
    )
    client.mcp_servers.delete(created.id)

    assert (created.server_name, created.mcp_server_type, created.env) == (
        "local",
        "stdio",
        {"API_KEY": None},
    )
    assert [s.id for s in listed] == [created.id]
    assert fetched.command == PYTHON
    assert sorted(t.name for t in tools) == REGISTRABLE
    assert (ran.status, ran.func_return) == ("success", "5")
    assert updated.server_name == "renamed"
    assert MCPServer.objects.for_actor(actor).count() == 0


class _NotAnMcpServer:
    """An HTTP server on loopback that answers every request 200 with JSON that is no MCP message (an
    internal service a tenant pointed a server at): its body must not come back to the tenant."""

    BODY = b'{"internal": "MARKER-7731 not for tenants"}'

    def __enter__(self) -> str:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        body = self.BODY

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_port}/mcp"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("server_type", ["streamable_http", "sse"])
def test_a_server_that_answers_no_mcp_is_a_plain_502_without_its_body(
    actor, api_client_for, settings, server_type, caplog
):
    settings.MCP_LIST_TOOLS_TIMEOUT = 5
    with _NotAnMcpServer() as url:
        server, _ = mcp_server_create(
            actor=actor,
            server_name="internal",
            server_type=server_type,
            server_url=url,
            register_tools=False,
        )
        response = api_client_for(actor).patch(f"/v1/mcp-servers/{server.id}/refresh")

    assert response.status_code == 502
    assert "MARKER-7731" not in response.text
    origin = url.removesuffix("/mcp")
    assert response.json() == {
        "detail": f"the MCP server ({origin}) could not be reached or did not answer as an MCP server"
        if server_type == "streamable_http"
        else f"the connection to the MCP server ({origin}) failed",  # SSE: not an event stream at all
        "code": "mcp_server_error",
    }
    if server_type == "streamable_http":
        logged = [r for r in caplog.records if r.getMessage() == "mcp.failure_detail"]
        assert logged
        assert "MARKER-7731" in str(logged[0].exc_info[1])
