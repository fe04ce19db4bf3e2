"""MCP servers with the official SDK against a real MCP server process (tests/support/mcp_server.py):
listing and calling over stdio (jailed, only commands the operator allows), SSE and Streamable HTTP,
failures, encryption at rest, tool registration, and an MCP tool called by the real agent loop."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.urls import reverse

from apps.accounts.models import Organization
from apps.core import outbound
from apps.core.actor import Actor, Role
from apps.core.errors import InvalidInput, PermissionDenied
from apps.core.outbound import OutboundRefused
from apps.sandbox import jail
from apps.tools.execution import ToolContext
from apps.tools.mcp import (
    McpServerError,
    McpTarget,
    McpToolSpec,
    fetch_tools,
    invoke_tool,
    mcp_server_create,
    mcp_server_delete,
    mcp_server_sync_tools,
    mcp_server_tools,
    mcp_server_update,
    mcp_tool_register,
    mcp_tool_schema,
    run_mcp_tool,
)
from apps.tools.models import MCPServer, Tool
from tests.factories import ToolFactory
from tests.support.mcp_server import McpHttpServer, free_port, stdio_launch
from tests.support.outbound import ConnectionRecorder, FakeResolver, loopback_only
from tests.support.scripted_llm import text, tool_call, tool_calls

LAUNCH = stdio_launch()
PYTHON = LAUNCH.command
STDIO = McpTarget(server_type="stdio", command=PYTHON, args=LAUNCH.args)
MISSING = "/nonexistent/mcp-server"
SERVER_TOOLS = ["add", "fail", "env_value", "auth_seen", "nap", "dotted.name", "jail_probe"]
REGISTRABLE = ["add", "auth_seen", "env_value", "fail", "jail_probe", "nap"]
PLATFORM_SECRETS = ["DJANGO_SECRET_KEY", "SECRETS_ENCRYPTION_KEY", "DATABASE_URL"]
NO_COMMANDS = (
    "stdio MCP servers are disabled on this server: the operator allows no commands (MCP_STDIO_COMMANDS)"
)


@pytest.fixture(autouse=True)
def _stdio_allowed(settings):
    """The operator allows the test server's interpreter (and a missing command) and binds what it needs."""
    settings.MCP_STDIO_COMMANDS = [PYTHON, MISSING]
    settings.MCP_STDIO_READ_PATHS = list(LAUNCH.read_paths)


@pytest.fixture(autouse=True)
def _outbound(settings, monkeypatch):
    """The test servers listen on 127.0.0.1, which the operator opens (OUTBOUND_ALLOW); the example.com
    servers are only stored (named in the allow-list, so never looked up; a connection would go to
    loopback); nothing may leave loopback."""
    settings.OUTBOUND_ALLOW = ["127.0.0.1", "mcp.example.com"]
    monkeypatch.setattr(outbound, "resolve", FakeResolver({"mcp.example.com": ["127.0.0.1"]}))
    loopback_only(monkeypatch)


def stdio_server(actor: Actor, **fields: object) -> MCPServer:
    fields.setdefault("register_tools", False)
    server, _ = mcp_server_create(
        actor=actor,
        server_name=str(fields.pop("server_name", "local")),
        server_type="stdio",
        command=PYTHON,
        args=list(LAUNCH.args),
        **fields,  # type: ignore[arg-type]
    )
    return server


@dataclass(frozen=True)
class HostProcess:
    pid: int
    uid: int
    cmdline: bytes
    environ: bytes


def jail_processes(marker: str) -> list[HostProcess]:
    """Every host process whose environment holds `marker`: the jail's setpriv/bwrap, its init and the
    server (a value of the server's env travels through all of them)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        folder = Path("/proc", entry)
        try:
            environ = (folder / "environ").read_bytes()
            if marker.encode() in environ:
                cmdline = (folder / "cmdline").read_bytes()
                found.append(HostProcess(int(entry), folder.stat().st_uid, cmdline, environ))
        except OSError:
            continue
    return found


def while_napping(target: McpTarget) -> list[HostProcess]:
    """The processes of `target`'s jail (its env has a MARKER) seen during a 2 s call."""
    marker = target.env["MARKER"]
    caller = threading.Thread(
        target=invoke_tool, args=(target, "nap", {"seconds": 2}), kwargs={"timeout": 20}
    )
    caller.start()
    seen: list[HostProcess] = []
    deadline = time.monotonic() + 15
    while len(seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = jail_processes(marker)
    caller.join()
    return seen


# --- the client over stdio --------------------------------------------------------------------------------


def test_list_tools_over_stdio():
    tools = fetch_tools(STDIO, timeout=20)

    assert [t.name for t in tools] == SERVER_TOOLS
    add = tools[0]
    assert add.description == "Add two integers."
    assert add.input_schema["properties"] == {
        "a": {"title": "A", "type": "integer"},
        "b": {"title": "B", "type": "integer"},
    }
    assert add.input_schema["required"] == ["a", "b"]


def test_calling_add_returns_the_text_of_its_content():
    output = invoke_tool(STDIO, "add", {"a": 2, "b": 3}, timeout=20)

    assert (output.is_error, output.text) == (False, "5")


def test_a_tool_that_raises_is_an_error_result_not_an_exception():
    output = invoke_tool(STDIO, "fail", {}, timeout=20)

    assert (output.is_error, output.text) == (True, "Error executing tool fail: this tool always fails")


def test_an_unknown_tool_is_an_error_result():
    output = invoke_tool(STDIO, "nope", {}, timeout=20)

    assert (output.is_error, output.text) == (True, "Unknown tool: nope")


def test_a_missing_command_fails_fast():
    target = McpTarget(server_type="stdio", command=MISSING)
    started = time.monotonic()

    with pytest.raises(McpServerError) as caught:
        invoke_tool(target, "add", {"a": 1, "b": 2}, timeout=20)

    assert time.monotonic() - started < 2
    assert caught.value.message == (
        "cannot start the MCP server command '/nonexistent/mcp-server': No such file or directory"
    )


def test_a_server_that_dies_fails_fast_and_keeps_its_stderr():
    target = McpTarget(
        server_type="stdio",
        command=PYTHON,
        args=("-c", "import sys; print('config missing', file=sys.stderr); sys.exit(3)"),
    )
    started = time.monotonic()

    with pytest.raises(McpServerError) as caught:
        fetch_tools(target, timeout=20)

    assert time.monotonic() - started < 5
    assert caught.value.message == f"the MCP server ({PYTHON}) failed: Connection closed"
    assert caught.value.stderr_tail == "config missing"


def test_a_slow_tool_times_out_and_its_jail_is_killed():
    marker = f"jail-{uuid.uuid4()}"
    target = McpTarget(server_type="stdio", command=PYTHON, args=LAUNCH.args, env={"MARKER": marker})
    started = time.monotonic()

    with pytest.raises(McpServerError) as caught:
        invoke_tool(target, "nap", {"seconds": 30}, timeout=2)

    assert time.monotonic() - started < 10  # the timeout, plus the SDK stopping the process
    assert caught.value.message == f"the MCP server ({PYTHON}) did not answer within 2 s"
    assert jail_processes(marker) == []


def test_the_server_gets_its_env_and_none_of_ours(monkeypatch):
    monkeypatch.setenv("HOST_ONLY_SECRET", "do-not-leak")
    target = McpTarget(server_type="stdio", command=PYTHON, args=LAUNCH.args, env={"API_KEY": "k-123"})

    values = [
        invoke_tool(target, "env_value", {"name": name}, timeout=20).text
        for name in ("API_KEY", "HOME", "HOST_ONLY_SECRET", "DJANGO_SECRET_KEY", "USER")
    ]

    assert values == ["k-123", "/tmp", "<unset>", "<unset>", "<unset>"]


def test_an_env_value_is_never_on_a_command_line_nor_under_its_name_outside_the_jail():
    """The jail's host processes (setpriv as root, then bwrap) must not act on a tenant's LD_PRELOAD."""
    marker = f"jail-{uuid.uuid4()}"
    target = McpTarget(
        server_type="stdio",
        command=PYTHON,
        args=LAUNCH.args,
        env={"LD_PRELOAD": "/nonexistent.so", "MARKER": marker},
    )

    running = while_napping(target)
    inside = invoke_tool(target, "env_value", {"name": "LD_PRELOAD"}, timeout=20)

    builders = [p for p in running if p.cmdline.startswith((b"/usr/bin/setpriv\0", b"/usr/bin/bwrap\0"))]
    assert builders
    for process in builders:
        assert not any(entry.startswith(b"LD_PRELOAD=") for entry in process.environ.split(b"\0"))
    assert not any(marker.encode() in p.cmdline for p in running)
    assert inside.text == "/nonexistent.so"


# --- the client over HTTP -----------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
def test_list_and_call_over_http_with_auth_and_custom_headers(transport):
    with McpHttpServer(transport) as http:
        target = McpTarget(
            server_type="sse" if transport == "sse" else "streamable_http",
            url=http.url,
            headers={"Authorization": "Bearer tok-1", "X-Team": "blue"},
        )

        names = [t.name for t in fetch_tools(target, timeout=20)]
        added = invoke_tool(target, "add", {"a": 2, "b": 3}, timeout=20)
        seen = invoke_tool(target, "auth_seen", {}, timeout=20)

    assert names == SERVER_TOOLS
    assert added.text == "5"
    assert seen.text == "Bearer tok-1 | blue"


def test_an_http_server_that_is_down_fails_fast_and_the_message_hides_the_path():
    port = free_port()
    target = McpTarget(server_type="streamable_http", url=f"http://127.0.0.1:{port}/s/secret-token/mcp")
    started = time.monotonic()

    with pytest.raises(McpServerError) as caught:
        fetch_tools(target, timeout=20)

    assert time.monotonic() - started < 5
    assert caught.value.message == f"cannot reach the MCP server (http://127.0.0.1:{port})"


# --- the outbound guard -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://169.254.169.254/mcp", "169.254.169.254 is a cloud metadata address"),
        ("http://127.0.0.1:8283/mcp", "127.0.0.1 is a loopback address"),
        ("http://[::1]:8283/mcp", "::1 is a loopback address"),
        ("http://localhost:8283/mcp", "localhost resolves to a loopback address"),
        ("https://mcp.corp.test/mcp", "mcp.corp.test resolves to a private (RFC 1918) address"),
    ],
)
def test_a_server_url_the_guard_refuses_is_refused_when_stored(actor, settings, monkeypatch, url, reason):
    settings.OUTBOUND_ALLOW = []
    monkeypatch.setattr(
        outbound, "resolve", FakeResolver({"localhost": ["127.0.0.1"], "mcp.corp.test": ["10.4.5.6"]})
    )

    with pytest.raises(OutboundRefused) as refused:
        mcp_server_create(
            actor=actor,
            server_name="remote",
            server_type="streamable_http",
            server_url=url,
            register_tools=True,
        )

    assert refused.value.message.startswith(f"server_url is not allowed: {reason}.")
    assert MCPServer.objects.for_actor(actor).count() == 0


@pytest.mark.parametrize(
    ("headers", "auth_header", "name"),
    [
        ({"Metadata-Flavor": "Google"}, "", "Metadata-Flavor"),
        ({"X-aws-ec2-metadata-token": "t"}, "", "X-aws-ec2-metadata-token"),
        ({"Proxy-Authorization": "Basic eA=="}, "", "Proxy-Authorization"),
        ({"Transfer-Encoding": "chunked"}, "", "Transfer-Encoding"),
        ({}, "Host", "Host"),
    ],
)
def test_metadata_and_hop_by_hop_headers_are_refused_when_stored(actor, headers, auth_header, name):
    with pytest.raises(OutboundRefused) as refused:
        mcp_server_create(
            actor=actor,
            server_name="remote",
            server_type="sse",
            server_url="https://mcp.example.com/sse",
            auth_header=auth_header,
            auth_token="tok" if auth_header else "",
            custom_headers=headers,
            register_tools=False,
        )

    assert refused.value.message == (
        f"The header '{name}' is not allowed (metadata and hop-by-hop headers are the server's to set)."
    )
    assert MCPServer.objects.for_actor(actor).count() == 0


@pytest.mark.parametrize("server_type", ["streamable_http", "sse"])
def test_a_stored_server_the_guard_refuses_is_never_connected(settings, server_type):
    settings.OUTBOUND_ALLOW = []
    with ConnectionRecorder() as platform:
        target = McpTarget(server_type=server_type, url=f"{platform.url}/mcp")

        with pytest.raises(McpServerError) as caught:
            fetch_tools(target, timeout=20)

    assert caught.value.message.startswith(
        f"the MCP server ({platform.url}) may not be reached: The URL is not allowed: 127.0.0.1 is a "
        "loopback address."
    )
    assert platform.connections == []


def test_a_stored_metadata_header_is_refused_before_connecting():
    with ConnectionRecorder() as server:
        target = McpTarget(
            server_type="streamable_http", url=f"{server.url}/mcp", headers={"Metadata-Flavor": "Google"}
        )

        with pytest.raises(InvalidInput, match="Metadata-Flavor"):
            invoke_tool(target, "add", {"a": 1, "b": 2}, timeout=20)

    assert server.connections == []


# --- rows: encryption at rest, policy, registration ------------------------------------------------------


def test_env_auth_token_and_header_values_are_encrypted_at_rest(actor):
    stdio = stdio_server(actor, env={"API_KEY": "env-secret-value"})
    http, _ = mcp_server_create(
        actor=actor,
        server_name="remote",
        server_type="streamable_http",
        server_url="https://mcp.example.com/mcp",
        auth_header="Authorization",
        auth_token="token-secret-value",
        custom_headers={"X-Api-Key": "header-secret-value"},
        register_tools=False,
    )

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT env_json, auth_token, custom_headers_json FROM tools_mcpserver WHERE id IN (%s, %s)",
            [stdio.id, http.id],
        )
        stored = " ".join(value for row in cursor.fetchall() for value in row)

    for secret in ("env-secret-value", "token-secret-value", "header-secret-value", "API_KEY", "X-Api-Key"):
        assert secret not in stored
    assert MCPServer.objects.for_actor(actor).get(id=stdio.id).env == {"API_KEY": "env-secret-value"}
    reread = MCPServer.objects.for_actor(actor).get(id=http.id)
    assert (reread.auth_token, reread.custom_headers) == (
        "token-secret-value",
        {"X-Api-Key": "header-secret-value"},
    )


def test_creating_a_server_registers_its_tools_as_external_mcp_tools(actor):
    server, summary = mcp_server_create(
        actor=actor, server_name="local", server_type="stdio", command=PYTHON, args=list(LAUNCH.args)
    )

    tools = {t.name: t for t in mcp_server_tools(actor=actor, server=server)}
    assert sorted(tools) == REGISTRABLE
    assert summary is not None
    assert summary.added == ["add", "fail", "env_value", "auth_seen", "nap", "jail_probe"]
    assert summary.skipped == [
        {
            "name": "dotted.name",
            "reason": "the name is not a valid function name (letters, digits, '_' and '-'; at most 64)",
        }
    ]
    add = tools["add"]
    assert add.tool_type == Tool.Type.EXTERNAL_MCP
    assert add.json_schema == {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}},
            "required": ["a", "b"],
        },
    }
    assert add.metadata == {"mcp": {"server_id": server.id, "server_name": "local", "tool_name": "add"}}
    assert add.tags == ["mcp:local"]


def test_a_server_that_is_down_is_still_created_without_tools(actor):
    server, summary = mcp_server_create(
        actor=actor, server_name="broken", server_type="stdio", command=MISSING
    )

    assert MCPServer.objects.for_actor(actor).filter(id=server.id).exists()
    assert mcp_server_tools(actor=actor, server=server).count() == 0
    assert summary is not None
    assert (
        summary.error
        == "cannot start the MCP server command '/nonexistent/mcp-server': No such file or directory"
    )


def test_a_tool_name_taken_by_another_tool_is_skipped_and_left_alone(actor):
    custom = ToolFactory(organization_id=actor.organization_id, name="add", description="mine")

    _, summary = mcp_server_create(
        actor=actor, server_name="local", server_type="stdio", command=PYTHON, args=list(LAUNCH.args)
    )

    assert summary is not None
    assert {
        "name": "add",
        "reason": "A tool named 'add' already exists in this organization and does not "
        "come from MCP server 'local'",
    } in summary.skipped
    custom.refresh_from_db()
    assert (custom.tool_type, custom.description) == (Tool.Type.CUSTOM, "mine")


def test_refresh_updates_changed_tools_and_deletes_tools_the_server_dropped(actor):
    server = stdio_server(actor)
    mcp_tool_register(actor=actor, server=server, tool_name="add")
    gone = Tool.objects.for_actor(actor).create(
        name="retired",
        tool_type=Tool.Type.EXTERNAL_MCP,
        json_schema=mcp_tool_schema(McpToolSpec("retired", "", {"type": "object"})),
        metadata={"mcp": {"server_id": server.id, "server_name": "local", "tool_name": "retired"}},
    )
    Tool.objects.for_actor(actor).filter(name="add").update(description="stale")

    summary = mcp_server_sync_tools(actor=actor, server=server)

    assert (summary.updated, summary.deleted) == (["add"], ["retired"])
    assert summary.added == ["fail", "env_value", "auth_seen", "nap", "jail_probe"]
    assert not Tool.objects.for_actor(actor).filter(id=gone.id).exists()
    assert Tool.objects.for_actor(actor).get(name="add").description == "Add two integers."


def test_registering_one_chosen_tool(actor):
    server = stdio_server(actor)

    tool = mcp_tool_register(actor=actor, server=server, tool_name="add")

    assert [t.name for t in mcp_server_tools(actor=actor, server=server)] == ["add"]
    assert tool.json_schema["parameters"]["required"] == ["a", "b"]


def test_renaming_a_server_follows_into_its_tools(actor):
    server = stdio_server(actor)
    mcp_tool_register(actor=actor, server=server, tool_name="add")

    mcp_server_update(actor=actor, server_id=server.id, server_name="renamed")

    tool = Tool.objects.for_actor(actor).get(name="add")
    assert tool.metadata["mcp"] == {"server_id": server.id, "server_name": "renamed", "tool_name": "add"}
    assert tool.tags == ["mcp:renamed"]


def test_deleting_a_server_deletes_its_tools_only(actor):
    server = stdio_server(actor)
    mcp_tool_register(actor=actor, server=server, tool_name="add")
    other = ToolFactory(organization_id=actor.organization_id, name="mine")

    mcp_server_delete(actor=actor, server_id=server.id)

    assert list(Tool.objects.for_actor(actor).values_list("id", flat=True)) == [other.id]


def test_members_cannot_create_servers(org, make_user):
    member = Actor(organization_id=org.id, user_id=make_user(org).id, role=Role.MEMBER)

    with pytest.raises(PermissionDenied):
        stdio_server(member)

    assert MCPServer.objects.for_org(org.id).count() == 0


def test_by_default_no_stdio_server_can_be_registered_nor_run(actor, settings, tmp_path):
    settings.MCP_STDIO_COMMANDS = []
    pwned = tmp_path / "pwned"
    http, _ = mcp_server_create(
        actor=actor,
        server_name="remote",
        server_type="streamable_http",
        server_url="https://mcp.example.com/mcp",
        register_tools=False,
    )

    with pytest.raises(InvalidInput) as created:
        mcp_server_create(
            actor=actor, server_name="x", server_type="stdio", command="sh", args=["-c", f"touch {pwned}"]
        )
    with pytest.raises(InvalidInput) as updated:
        mcp_server_update(actor=actor, server_id=http.id, server_type="stdio", command="sh", args=["-c"])
    with pytest.raises(InvalidInput) as invoked:
        invoke_tool(McpTarget(server_type="stdio", command="sh", args=("-c", f"touch {pwned}")), "add", {})

    assert created.value.message == updated.value.message == invoked.value.message == NO_COMMANDS
    assert list(MCPServer.objects.for_actor(actor).values_list("server_name", "server_type")) == [
        ("remote", "streamable_http")
    ]
    assert not pwned.exists()


def test_a_command_the_operator_does_not_allow_is_refused(actor, settings):
    settings.MCP_STDIO_COMMANDS = ["npx", "uvx"]

    with pytest.raises(InvalidInput) as caught:
        mcp_server_create(actor=actor, server_name="x", server_type="stdio", command="sh", args=["-c", "id"])

    assert caught.value.message == (
        "'sh' is not an allowed stdio MCP command on this server (MCP_STDIO_COMMANDS allows: npx, uvx)"
    )
    assert MCPServer.objects.for_actor(actor).count() == 0


def test_a_stored_server_whose_command_is_no_longer_allowed_gives_the_model_an_error(actor, settings):
    server = stdio_server(actor)
    tool = Tool.objects.for_actor(actor).create(
        name="add",
        tool_type=Tool.Type.EXTERNAL_MCP,
        metadata={"mcp": {"server_id": server.id, "server_name": "local", "tool_name": "add"}},
    )
    settings.MCP_STDIO_COMMANDS = ["npx"]

    result = run_mcp_tool(tool, {"a": 2, "b": 3}, ToolContext(actor=actor, agent_id="agent-x"))
    summary = mcp_server_sync_tools(actor=actor, server=server, raise_errors=False)

    refusal = (
        f"'{PYTHON}' is not an allowed stdio MCP command on this server (MCP_STDIO_COMMANDS allows: npx)"
    )
    assert (result.status, result.sandbox) == ("error", "mcp")
    assert result.return_value == f"Error calling MCP tool 'add' on server 'local': {refusal}"
    assert summary.error == refusal


def test_env_names_a_shell_cannot_set_are_refused(actor):
    with pytest.raises(InvalidInput) as caught:
        stdio_server(actor, env={"BAD-NAME": "x", "1ST": "y", "GOOD": "z"})

    assert caught.value.message == (
        "env names must be shell variable names (letters, digits and '_', not starting with a digit): "
        "1ST, BAD-NAME"
    )


def test_stdio_servers_do_not_depend_on_the_organisations_local_sandbox(actor, org):
    Organization.objects.filter(id=org.id).update(allow_local_sandbox=False)
    server = stdio_server(actor)

    tool = mcp_tool_register(actor=actor, server=server, tool_name="add")
    result = run_mcp_tool(tool, {"a": 2, "b": 3}, ToolContext(actor=actor, agent_id="agent-x"))

    assert (result.status, result.return_value) == ("success", "5")


def test_without_a_jail_stdio_servers_are_refused_never_run_unjailed(actor, monkeypatch):
    monkeypatch.setattr(jail, "unavailable_reason", lambda: "bubblewrap is not installed")

    with pytest.raises(InvalidInput) as caught:
        stdio_server(actor)

    assert caught.value.message == (
        "stdio MCP servers cannot run on this server, they need the local jail: bubblewrap is not installed"
    )
    assert MCPServer.objects.for_actor(actor).count() == 0


def test_a_command_outside_the_folders_the_jail_sees_fails_before_it_is_spawned(settings, tmp_path):
    server = tmp_path / "server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    settings.MCP_STDIO_COMMANDS = [str(server)]

    with pytest.raises(McpServerError) as caught:
        fetch_tools(McpTarget(server_type="stdio", command=str(server)), timeout=20)

    assert caught.value.message == (
        f"cannot start the MCP server command '{server}': {server} is outside the folders the jail sees "
        "(/usr and MCP_STDIO_READ_PATHS)"
    )


def test_an_allowed_stdio_server_runs_jailed(actor):
    """No root, no other process, no platform secret, no network (not even our loopback), no checkout."""
    server = stdio_server(actor)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # the host reaches it
        tool = mcp_tool_register(actor=actor, server=server, tool_name="jail_probe")
        result = run_mcp_tool(
            tool,
            {
                "port": port,
                "paths": [
                    str(django_settings.BASE_DIR / "config" / "settings.py"),
                    str(django_settings.DATA_DIR),
                    *LAUNCH.read_paths,
                ],
                "secrets": PLATFORM_SECRETS,
            },
            ToolContext(actor=actor, agent_id="agent-x"),
        )

    assert result.status == "success", result.return_value
    seen = json.loads(result.return_value)
    assert all(os.environ.get(name) for name in PLATFORM_SECRETS)  # the host process has them
    assert seen["uid"] not in (0, os.getuid())
    assert seen["pids"] < 10
    assert seen["environs_read"] >= 1
    assert seen["secrets_seen"] == []
    assert seen["loopback_connects"] is False
    assert seen["existing"] == list(LAUNCH.read_paths)


def test_no_process_of_a_jail_outlives_its_operation():
    marker = f"jail-{uuid.uuid4()}"
    target = McpTarget(server_type="stdio", command=PYTHON, args=LAUNCH.args, env={"MARKER": marker})

    running = while_napping(target)
    listed = fetch_tools(target, timeout=20)
    called = invoke_tool(target, "add", {"a": 1, "b": 2}, timeout=20)

    assert len(running) >= 3  # setpriv/bwrap, the jail's init, the server
    if os.geteuid() == 0:
        assert all(p.uid >= jail.HOST_UID_BASE for p in running)
    assert ([t.name for t in listed], called.text) == (SERVER_TOOLS, "3")
    assert jail_processes(marker) == []


def test_a_tool_whose_server_was_deleted_gives_an_error_result(actor):
    tool = Tool.objects.for_actor(actor).create(
        name="add",
        tool_type=Tool.Type.EXTERNAL_MCP,
        metadata={"mcp": {"server_id": "mcp_server-gone", "server_name": "gone", "tool_name": "add"}},
    )

    result = run_mcp_tool(tool, {}, ToolContext(actor=actor, agent_id="agent-x"))

    assert (result.status, result.sandbox) == ("error", "mcp")
    assert (
        result.return_value
        == "Tool 'add' belongs to an MCP server that no longer exists in this organization."
    )


def test_another_organisations_server_is_not_used(actor, other_org_actor):
    server = stdio_server(other_org_actor)
    tool = Tool.objects.for_actor(actor).create(
        name="add",
        tool_type=Tool.Type.EXTERNAL_MCP,
        metadata={"mcp": {"server_id": server.id, "server_name": "local", "tool_name": "add"}},
    )

    result = run_mcp_tool(tool, {"a": 2, "b": 3}, ToolContext(actor=actor, agent_id="agent-x"))

    assert result.status == "error"


# --- through the real agent loop ----------------------------------------------------------------------------


def test_the_agent_calls_an_mcp_tool_and_reads_its_return(actor, make_agent, send, llm):
    server = stdio_server(actor)
    tool = mcp_tool_register(actor=actor, server=server, tool_name="add")
    agent = make_agent(tool_ids=[tool.id])
    llm.push(tool_calls(tool_call("add", {"a": 2, "b": 3}, id="call_1")), text("2 + 3 = 5"))

    result = send(agent, "what is 2 + 3?")

    assert result.stop_reason == "end_turn"
    tool_return = next(m for m in result.messages if m.role == "tool").tool_returns[0]
    assert (tool_return["status"], tool_return["tool_return"], tool_return["sandbox"]) == (
        "success",
        "5",
        "mcp",
    )
    assert any(t["function"]["name"] == "add" for t in llm.chat_requests()[0]["tools"])


def test_an_mcp_error_result_reaches_the_model_as_an_error(actor, make_agent, send, llm):
    server = stdio_server(actor)
    tool = mcp_tool_register(actor=actor, server=server, tool_name="fail")
    agent = make_agent(tool_ids=[tool.id])
    llm.push(tool_calls(tool_call("fail", {}, id="call_1")), text("It failed."))

    result = send(agent, "try it")

    tool_return = next(m for m in result.messages if m.role == "tool").tool_returns[0]
    assert (tool_return["status"], tool_return["tool_return"], tool_return["sandbox"]) == (
        "error",
        "Error executing tool fail: this tool always fails",
        "mcp",
    )
    assert result.stop_reason == "end_turn"


def test_a_dead_server_gives_the_model_an_error_and_the_run_completes(actor, make_agent, send, llm):
    server = stdio_server(actor)
    tool = mcp_tool_register(actor=actor, server=server, tool_name="add")
    MCPServer.objects.for_actor(actor).filter(id=server.id).update(command=MISSING)
    agent = make_agent(tool_ids=[tool.id])
    llm.push(tool_calls(tool_call("add", {"a": 2, "b": 3}, id="call_1")), text("The tool is down."))

    result = send(agent, "what is 2 + 3?")

    tool_return = next(m for m in result.messages if m.role == "tool").tool_returns[0]
    assert tool_return["status"] == "error"
    assert tool_return["tool_return"] == (
        "Error calling MCP tool 'add' on server 'local': "
        "cannot start the MCP server command '/nonexistent/mcp-server': No such file or directory"
    )
    assert result.stop_reason == "end_turn"
    assert result.run.status == "completed"


# --- the admin ----------------------------------------------------------------------------------------------


@pytest.fixture
def admin_client(client, user):
    user.is_staff = user.is_superuser = True
    user.save()
    client.force_login(user)
    return client


def test_the_admin_shows_which_secrets_are_set_but_never_their_values(actor, admin_client):
    stdio = stdio_server(actor, env={"API_KEY": "env-secret-value"})
    http, _ = mcp_server_create(
        actor=actor,
        server_name="remote",
        server_type="sse",
        server_url="https://mcp.example.com/sse",
        auth_token="token-secret-value",
        custom_headers={"X-Team": "header-secret-value"},
        register_tools=False,
    )

    listing = admin_client.get(reverse("admin:tools_mcpserver_changelist"))
    pages = [admin_client.get(reverse("admin:tools_mcpserver_change", args=[s.id])) for s in (stdio, http)]

    html = "".join(page.content.decode() for page in pages)
    assert [listing.status_code, *(page.status_code for page in pages)] == [200, 200, 200]
    assert "API_KEY" in html
    assert "X-Team" in html
    for secret in ("env-secret-value", "token-secret-value", "header-secret-value"):
        assert secret not in html


def test_saving_in_the_admin_with_the_secret_fields_empty_keeps_them(actor, org, admin_client):
    server = stdio_server(actor, env={"API_KEY": "env-secret-value"})
    form = {
        "organization": org.id,
        "server_name": "renamed",
        "server_type": "stdio",
        "server_url": "",
        "command": PYTHON,
        "args": json.dumps(list(LAUNCH.args)),
        "env_json": "",
        "auth_header": "",
        "auth_token": "",
        "custom_headers_json": "",
    }

    response = admin_client.post(reverse("admin:tools_mcpserver_change", args=[server.id]), form)

    assert response.status_code == 302
    server.refresh_from_db()
    assert (server.server_name, server.env) == ("renamed", {"API_KEY": "env-secret-value"})


def test_the_admin_refuses_env_that_is_not_a_json_object_of_strings(org, admin_client):
    form = {
        "organization": org.id,
        "server_name": "local",
        "server_type": "stdio",
        "server_url": "",
        "command": "python",
        "args": "[]",
        "env_json": '{"PORT": 8080}',
        "auth_header": "",
        "auth_token": "",
        "custom_headers_json": "",
    }

    response = admin_client.post(reverse("admin:tools_mcpserver_add"), form)

    assert response.status_code == 200
    assert "must be a JSON object of strings" in response.content.decode()
    assert MCPServer.objects.for_org(org.id).count() == 0


def test_the_admin_refuses_a_stdio_command_the_operator_does_not_allow(org, admin_client):
    form = {
        "organization": org.id,
        "server_name": "local",
        "server_type": "stdio",
        "server_url": "",
        "command": "sh",
        "args": '["-c", "id"]',
        "env_json": "",
        "auth_header": "",
        "auth_token": "",
        "custom_headers_json": "",
    }

    response = admin_client.post(reverse("admin:tools_mcpserver_add"), form)

    assert response.status_code == 200
    assert "&#x27;sh&#x27; is not an allowed stdio MCP command on this server" in response.content.decode()
    assert MCPServer.objects.for_org(org.id).count() == 0
