"""MCP (Model Context Protocol) servers: the client side, and MCP tools as Letta tools.

Three parts, in the order of this file:

* `fetch_tools` / `invoke_tool`: one short-lived connection per operation with the official `mcp` SDK,
  driven synchronously (see `_run_sync`) under one overall timeout. A stdio server's command must be
  one the operator allows (MCP_STDIO_COMMANDS) and always runs in the local jail (apps/sandbox/jail.py:
  its own uid, no network at all, read-only /usr and MCP_STDIO_READ_PATHS, none of our environment);
  servers elsewhere are reached over SSE or Streamable HTTP, through the outbound guard
  (apps.core.outbound: public addresses or the operator's OUTBOUND_ALLOW, checked when the URL is stored
  and where each connection is made; no cookies; no metadata or hop-by-hop headers);
* services and selectors for `MCPServer` rows (create, update, delete, sync the server's tools into
  `Tool` rows of type `external_mcp`), org-scoped like every other tenant model;
* `run_mcp_tool` / `mcp_tool_execute`: what the agent loop and the run endpoint call; they never raise,
  every failure is an error `ToolResult` (sandbox "mcp") the model can read.

Services and selectors live here rather than in services.py/selectors.py to keep MCP in one module;
they follow the same rules (keyword-only, `actor` first, org-scoped, domain errors).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypedDict, TypeVar, cast
from urllib.parse import urlsplit

import anyio
import httpx2
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone
from mcp import Client
from mcp.client import Transport
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import PARSE_ERROR, CallToolResult

from apps.core import permissions
from apps.core.actor import Actor
from apps.core.errors import Conflict, InvalidInput, NotFound
from apps.core.outbound import OutboundRefused, check_headers, check_url, guarded_async_client
from apps.core.permissions import Action
from apps.sandbox import jail
from apps.tools.errors import McpServerError, McpToolNameConflict
from apps.tools.execution import ToolContext, ToolResult
from apps.tools.models import MCPServer, Tool

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_LIST_TOOLS_TIMEOUT = 30.0
"""Seconds for one listing: start or reach the server, handshake, list every page (Letta: 30)."""
DEFAULT_CALL_TOOL_TIMEOUT = 60.0
"""Seconds for one call: start or reach the server, handshake, call (Letta: 60)."""
SHUTDOWN_GRACE = 15.0
"""Extra seconds the calling thread waits past the timeout while the SDK stops a stdio process
(close stdin, 2 s, SIGTERM, 2 s, SIGKILL) or closes HTTP streams."""
MAX_TOOL_PAGES = 20
STDERR_TAIL_CHARS = 1000
MCP_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""What a model provider accepts as a function name (OpenAI's rule); MCP allows more."""
STDIO_MEMORY_MB = 1024
"""RLIMIT_AS of a jailed stdio server: node reserves more address space than tool code (512 MB: it
does not start)."""
STDIO_SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
STDIO_ENV_CARRIER = "LETTA_MCP_ENV_"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def list_tools_timeout() -> float:
    return float(getattr(settings, "MCP_LIST_TOOLS_TIMEOUT", DEFAULT_LIST_TOOLS_TIMEOUT))


def register_inline_seconds() -> float:
    """How long adding a server waits for its tool list before the request answers and a worker goes on
    waiting (MCP_REGISTER_INLINE_SECONDS): a slow or silent server never holds the request."""
    return min(float(getattr(settings, "MCP_REGISTER_INLINE_SECONDS", 2.0)), list_tools_timeout())


def call_tool_timeout() -> float:
    return float(getattr(settings, "MCP_CALL_TOOL_TIMEOUT", DEFAULT_CALL_TOOL_TIMEOUT))


def stdio_commands() -> list[str]:
    """The commands the operator allows stdio servers (MCP_STDIO_COMMANDS), in its order."""
    return _setting_list("MCP_STDIO_COMMANDS")


def stdio_read_paths() -> list[str]:
    """Host folders bound read-only into a stdio server's jail besides /usr (MCP_STDIO_READ_PATHS)."""
    return [str(Path(p)) for p in _setting_list("MCP_STDIO_READ_PATHS")]


def _setting_list(name: str) -> list[str]:
    value = getattr(settings, name, None) or []
    items = value.split(",") if isinstance(value, str) else value
    return [str(item).strip() for item in items if str(item).strip()]


# --- the client: one connection per operation -----------------------------------------------------------


@dataclass(frozen=True)
class McpTarget:
    """Where and how to connect, secrets decrypted. Built per operation, never stored or logged."""

    server_type: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        """For messages (a model may read them): the command without its arguments, or the URL's origin.
        Arguments, paths and query strings often carry keys (`--api-key=...`, `/s/<token>/mcp`)."""
        return self.command if self.server_type == MCPServer.Type.STDIO else _origin(self.url)


@dataclass(frozen=True)
class McpToolSpec:
    """One tool as an MCP server lists it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None = None


@dataclass(frozen=True)
class McpCallOutput:
    is_error: bool
    text: str


def fetch_tools(target: McpTarget, *, timeout: float | None = None) -> list[McpToolSpec]:
    """Every tool the server lists (all pages). Raises McpServerError, InvalidInput (a stdio server
    this host does not allow)."""
    seconds = list_tools_timeout() if timeout is None else timeout
    _check_target(target)

    async def work(client: Client) -> list[McpToolSpec]:
        specs: list[McpToolSpec] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            page = await client.list_tools(cursor=cursor)
            specs.extend(
                McpToolSpec(
                    name=tool.name,
                    description=tool.description or "",
                    input_schema=dict(tool.input_schema or {}),
                    annotations=tool.annotations.model_dump(by_alias=True, exclude_none=True)
                    if tool.annotations
                    else None,
                )
                for tool in page.tools
            )
            cursor = page.next_cursor
            if cursor is None:
                break
        return specs

    return _run_sync(lambda: _with_client(target, seconds, work), timeout=seconds)


def invoke_tool(
    target: McpTarget, name: str, arguments: dict[str, Any], *, timeout: float | None = None
) -> McpCallOutput:
    """Call one tool; an MCP error result is `is_error=True`, not an exception. Raises McpServerError,
    InvalidInput (a stdio server this host does not allow)."""
    seconds = call_tool_timeout() if timeout is None else timeout
    _check_target(target)

    async def work(client: Client) -> McpCallOutput:
        result = await client.call_tool(name, arguments)
        return McpCallOutput(is_error=result.is_error, text=result_text(result))

    return _run_sync(lambda: _with_client(target, seconds, work), timeout=seconds)


def result_text(result: CallToolResult) -> str:
    """The text parts joined by newlines (non-text parts named); structured content when there is no text."""
    parts: list[str] = []
    for block in result.content:
        text = getattr(block, "text", None)
        resource_text = getattr(getattr(block, "resource", None), "text", None)
        if isinstance(text, str):
            parts.append(text)
        elif isinstance(resource_text, str):
            parts.append(resource_text)
        else:
            parts.append(f"[{block.type} content omitted]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(parts)


def _run_sync(operation: Callable[[], Awaitable[T]], *, timeout: float) -> T:
    """Run an async SDK operation to completion from synchronous code (Celery task, request thread).

    The operation gets its own thread and event loop: the caller may be a thread that already runs a
    loop (ASGI), where `anyio.run` would refuse. The operation bounds itself with `timeout`; the join
    adds SHUTDOWN_GRACE for the SDK's process shutdown, and a thread still alive after that is left
    behind (daemon) rather than blocking the agent's run.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = anyio.run(operation)
        except BaseException as exc:  # handed over to the calling thread below
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="mcp-client", daemon=True)
    thread.start()
    thread.join(timeout + SHUTDOWN_GRACE)
    if thread.is_alive():
        raise McpServerError(f"the MCP server did not finish within {timeout:g} s", timed_out=True)
    if "error" in outcome:
        raise outcome["error"]
    return cast(T, outcome["value"])


async def _with_client(target: McpTarget, seconds: float, work: Callable[[Client], Awaitable[T]]) -> T:
    """Connect (spawn or dial), handshake, `work`, disconnect, all within `seconds`."""
    errlog = (
        tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed below)
        if target.server_type == MCPServer.Type.STDIO
        else None
    )
    try:
        with anyio.fail_after(seconds):
            client = Client(_transport(target, seconds, errlog), read_timeout_seconds=seconds, cache=None)
            async with client:
                return await work(client)
    except McpServerError:
        raise
    except Exception as exc:
        # The boundary to another process or host: the SDK raises OS, HTTP, protocol and validation
        # errors, often wrapped in exception groups. Each becomes one readable McpServerError.
        timed_out = any(isinstance(leaf, TimeoutError) for leaf in _leaves(exc))
        raise McpServerError(
            _describe_failure(exc, target, seconds), stderr_tail=_tail(errlog), timed_out=timed_out
        ) from exc
    finally:
        if errlog is not None:
            errlog.close()


def _transport(target: McpTarget, timeout: float, errlog: IO[str] | None) -> Transport:
    if target.server_type == MCPServer.Type.STDIO:
        return cast(Transport, stdio_client(_jailed(target, timeout), errlog=cast(Any, errlog)))
    if target.server_type == MCPServer.Type.SSE:
        return cast(
            Transport,
            sse_client(
                target.url,
                headers=target.headers or None,
                timeout=timeout,
                sse_read_timeout=timeout,
                httpx_client_factory=guarded_async_client,
            ),
        )
    return cast(Transport, _streamable_http(target.url, target.headers, timeout))


def _jailed(target: McpTarget, timeout: float) -> StdioServerParameters:
    """The stdio server as a jailed process: bubblewrap's setpriv/bwrap argv around `command args`.

    The SDK stops it like any server (stdin closed, then SIGTERM and SIGKILL to its process group,
    bwrap's): `--die-with-parent` then ends the jail's PID namespace, so nothing of it outlives the
    operation. No more CPU than the operation's wall time. Raises FileNotFoundError, McpServerError.
    """
    read_paths = stdio_read_paths()
    hidden = [str(settings.BASE_DIR), str(settings.DATA_DIR), str(Path.home())]
    path = [*(f"{p}/bin" for p in read_paths if Path(p, "bin").is_dir()), *STDIO_SYSTEM_PATH]
    executable = _jail_executable(target.command, ":".join(path), read_paths, hidden)
    handover, env = _env_handover(target.env, {"PATH": ":".join(path), "HOME": "/tmp", "LANG": "C.UTF-8"})
    argv = jail.jail_command(
        [*handover, executable, *target.args],
        limits=jail.JailLimits(memory_mb=STDIO_MEMORY_MB, cpu_seconds=math.ceil(timeout) + 1),
        read_only=read_paths,
        hidden=hidden,
    )
    return StdioServerParameters(command=argv[0], args=argv[1:], env=env)


def _jail_executable(command: str, path: str, read_paths: list[str], hidden: list[str]) -> str:
    """`command` as an absolute path the jail can see: looked up on the jail's PATH here, so a missing
    or unbound command fails before anything is spawned. Raises FileNotFoundError, McpServerError."""
    found = command if "/" in command else shutil.which(command, path=path)
    if not found or not os.path.isabs(found) or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
    bound = ["/usr", *jail.MERGED_USR_LINKS, *read_paths]
    if not _under(found, bound) or _under(found, [h for h in hidden if _under(h, bound)]):
        raise McpServerError(
            f"cannot start the MCP server command '{command}': {found} is outside the folders the "
            "jail sees (/usr and MCP_STDIO_READ_PATHS)"
        )
    return found


def _env_handover(env: dict[str, str], base: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command prefix and the host environment that give the server exactly `base` and its `env`.

    setpriv (as root) and bwrap start on the host with the environment the SDK passes, so the tenant's
    variables must not reach them under their own names (LD_PRELOAD, GCONV_PATH, ... act on any
    program), nor their values go on a command line: each value travels under an inert name and a
    shell inside the jail renames it. What the SDK adds of ours (USER, SHELL, ...) is unset there.
    """
    bad = _bad_env_names(env)
    if bad:
        raise McpServerError(f"the MCP server's env has names a shell cannot set: {', '.join(bad)}")
    host = dict(base)
    script = []
    for index, (name, value) in enumerate(env.items()):
        host[f"{STDIO_ENV_CARRIER}{index}"] = value
        script.append(f'export {name}="${STDIO_ENV_CARRIER}{index}"')
    unset = [
        *(f"{STDIO_ENV_CARRIER}{index}" for index in range(len(env))),
        *(name for name in get_default_environment() if name not in base and name not in env),
    ]
    if unset:
        script.append(f"unset {' '.join(unset)}")
    script.append('exec "$@"')
    return ["/bin/sh", "-c", "; ".join(script), "sh"], host


def _bad_env_names(env: dict[str, str]) -> list[str]:
    return sorted(name for name in env if not ENV_NAME.match(name) or name.startswith(STDIO_ENV_CARRIER))


def _under(path: str, prefixes: list[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


@asynccontextmanager
async def _streamable_http(url: str, headers: dict[str, str], seconds: float) -> AsyncIterator[Any]:
    """Over the outbound guard's client (apps.core.outbound), as SSE: public addresses or the operator's
    OUTBOUND_ALLOW only, no cookies; the SDK follows a redirect only within the URL's origin."""
    async with (
        guarded_async_client(headers=headers, timeout=httpx2.Timeout(seconds)) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _describe_failure(exc: BaseException, target: McpTarget, timeout: float) -> str:
    leaves = _leaves(exc)
    first = next((leaf for leaf in leaves if not isinstance(leaf, anyio.get_cancelled_exc_class())), exc)
    if isinstance(first, TimeoutError):
        return f"the MCP server ({target.label}) did not answer within {timeout:g} s"
    if isinstance(first, OSError) and target.server_type == MCPServer.Type.STDIO:
        return f"cannot start the MCP server command '{target.command}': {first.strerror or first}"
    if isinstance(first, OutboundRefused):
        return f"the MCP server ({target.label}) may not be reached: {first.message}"
    if isinstance(first, httpx2.HTTPStatusError):
        return f"the MCP server ({target.label}) answered HTTP {first.response.status_code}"
    # The network's own words (refused, reset, unreachable) would map ports for whoever chose the URL.
    if isinstance(first, httpx2.ConnectError | httpx2.ConnectTimeout):
        return f"cannot reach the MCP server ({target.label})"
    if isinstance(first, httpx2.TransportError):
        return f"the connection to the MCP server ({target.label}) failed"
    if isinstance(first, MCPError) and first.code != PARSE_ERROR:
        return f"the MCP server ({target.label}) failed: {first}"
    # Anything else (an answer that is no MCP message: the SDK's parse error quotes it; a library's own
    # error) may carry what came back, e.g. an internal service's body: the detail is for the server log.
    logger.warning("mcp.failure_detail", exc_info=first, extra={"mcp_target": target.label})
    return f"the MCP server ({target.label}) could not be reached or did not answer as an MCP server"


def _tail(errlog: IO[str] | None) -> str:
    if errlog is None:
        return ""
    try:
        errlog.seek(0)
        return errlog.read()[-STDERR_TAIL_CHARS:].strip()
    except (OSError, ValueError):
        return ""


def _origin(url: str) -> str:
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}" if parts.scheme and parts.hostname else "the server URL"


# --- targets from rows: decrypt, and apply the organisation's policy ---------------------------------------


def mcp_target(*, server: MCPServer) -> McpTarget:
    """The decrypted connection for `server`. Raises InvalidInput for a stdio server this host does not
    allow (any more): see `stdio_refusal`."""
    if server.server_type == MCPServer.Type.STDIO:
        _check_stdio_allowed(server.command)
        return McpTarget(
            server_type=server.server_type, command=server.command, args=tuple(server.args), env=server.env
        )
    headers = dict(server.custom_headers)
    if server.auth_token:
        headers[server.auth_header or "Authorization"] = _auth_value(server.auth_header, server.auth_token)
    return McpTarget(server_type=server.server_type, url=server.server_url, headers=headers)


def _auth_value(header: str, token: str) -> str:
    """A bare token in an Authorization header gets the Bearer scheme; anything else is sent as given."""
    if (header or "Authorization").lower() == "authorization" and " " not in token.strip():
        return f"Bearer {token.strip()}"
    return token


def stdio_refusal(command: str) -> str | None:
    """Why a stdio server with `command` may not run on this host (None: it may). A stdio server is a
    process on this host, so a tenant only ever picks one of the operator's commands, and nothing runs
    when the jail cannot be made (never unjailed)."""
    allowed = stdio_commands()
    if not allowed:
        return (
            "stdio MCP servers are disabled on this server: the operator allows no commands "
            "(MCP_STDIO_COMMANDS)"
        )
    if command not in allowed:
        return (
            f"'{command}' is not an allowed stdio MCP command on this server "
            f"(MCP_STDIO_COMMANDS allows: {', '.join(allowed)})"
        )
    reason = jail.unavailable_reason()
    if reason is not None:
        return f"stdio MCP servers cannot run on this server, they need the local jail: {reason}"
    return None


def _check_stdio_allowed(command: str) -> None:
    reason = stdio_refusal(command)
    if reason is not None:
        raise InvalidInput(reason)


def _check_target(target: McpTarget) -> None:
    if target.server_type == MCPServer.Type.STDIO:
        _check_stdio_allowed(target.command)
    else:
        check_headers(target.headers)  # rows stored before the rule; the address is checked on connect


# --- selectors --------------------------------------------------------------------------------------------


class McpToolMetadata(TypedDict):
    """`Tool.metadata["mcp"]` of an external_mcp tool (Letta's shape, plus the MCP-side tool name)."""

    server_id: str
    server_name: str
    tool_name: str


def mcp_metadata(tool: Tool) -> dict[str, Any]:
    """`tool.metadata["mcp"]`, or {} when absent or not an object (metadata is user-editable)."""
    meta = tool.metadata.get("mcp") if isinstance(tool.metadata, dict) else None
    return meta if isinstance(meta, dict) else {}


def mcp_server_list(*, actor: Actor) -> QuerySet[MCPServer]:
    return MCPServer.objects.for_actor(actor).order_by("server_name")


def mcp_server_get(*, actor: Actor, server_id: str) -> MCPServer:
    """The organisation's server; raises NotFound (also for another organisation's)."""
    server = MCPServer.objects.for_actor(actor).filter(id=server_id).first()
    if server is None:
        raise NotFound(f"MCP server with id '{server_id}' not found")
    return server


def mcp_server_get_by_name(*, actor: Actor, server_name: str) -> MCPServer:
    server = MCPServer.objects.for_actor(actor).filter(server_name=server_name).first()
    if server is None:
        raise NotFound(f"MCP server '{server_name}' not found")
    return server


def mcp_server_tools(*, actor: Actor, server: MCPServer) -> QuerySet[Tool]:
    """The Tool rows registered from `server`."""
    return Tool.objects.for_actor(actor).filter(
        tool_type=Tool.Type.EXTERNAL_MCP, metadata__mcp__server_id=server.id
    )


def mcp_server_tool_get(*, actor: Actor, server: MCPServer, tool_id: str) -> Tool:
    tool = mcp_server_tools(actor=actor, server=server).filter(id=tool_id).first()
    if tool is None:
        raise NotFound(f"Tool with id '{tool_id}' not found on MCP server '{server.server_name}'")
    return tool


@dataclass(frozen=True)
class RemoteTool:
    """A tool as the server lists it, with whether it can become a Letta tool and why not."""

    spec: McpToolSpec
    problems: tuple[str, ...]


def mcp_server_remote_tools(*, actor: Actor, server: MCPServer) -> list[RemoteTool]:
    """List the server's tools live. Owners and admins only. Raises McpServerError, InvalidInput."""
    _require_manager(actor)
    return [RemoteTool(spec, tuple(_problems(spec))) for spec in fetch_tools(mcp_target(server=server))]


def _problems(spec: McpToolSpec) -> list[str]:
    problems = []
    if not MCP_TOOL_NAME.match(spec.name):
        problems.append("the name is not a valid function name (letters, digits, '_' and '-'; at most 64)")
    schema = spec.input_schema
    if schema.get("type", "object") != "object" or not isinstance(schema.get("properties", {}), dict):
        problems.append("the input schema is not a JSON schema object")
    return problems


# --- services ---------------------------------------------------------------------------------------------


def _require_manager(actor: Actor) -> None:
    permissions.require(actor, Action.MCP_SERVER_MANAGE)


def _validated_url(url: str) -> str:
    """http(s) to a host the outbound guard lets tenants reach (apps.core.outbound). Raises InvalidInput."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"server_url must be an http:// or https:// URL, got '{url}'")
    check_url(url, what="server_url")
    return url


def http_target_refusal(url: str, header_names: list[str]) -> str | None:
    """Why an HTTP MCP server with this URL and these headers may not be stored (None: it may): the same
    checks as mcp_server_create, for forms that save rows themselves (the admin)."""
    try:
        check_headers(header_names)  # first: it needs no name lookup
        _validated_url(url)
    except InvalidInput as exc:
        return exc.message
    return None


@dataclass
class SyncSummary:
    """What a sync of a server's tools changed (Letta's refresh summary, plus what was skipped)."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    added_tools: list[Tool] = field(default_factory=list)
    error: str | None = None
    timed_out: bool = False


def mcp_server_create(
    *,
    actor: Actor,
    server_name: str,
    server_type: str,
    command: str = "",
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    server_url: str = "",
    auth_header: str = "",
    auth_token: str = "",
    custom_headers: dict[str, str] | None = None,
    register_tools: bool = True,
) -> tuple[MCPServer, SyncSummary | None]:
    """Store a server, then (Letta's behaviour) register every tool it lists as an external_mcp Tool.

    The registration is optimistic: a server that is down is still created, the summary says why.
    Owners and admins only. Raises InvalidInput, Conflict (the name is taken), PermissionDenied.
    """
    _require_manager(actor)
    server = MCPServer(organization_id=actor.organization_id, server_name=server_name.strip())
    _apply_config(
        server,
        server_type=server_type,
        command=command,
        args=args or [],
        env=env,
        server_url=server_url,
        auth_header=auth_header,
        auth_token=auth_token,
        custom_headers=custom_headers,
    )
    if server.server_type == MCPServer.Type.STDIO:
        _check_stdio_allowed(server.command)
    try:
        with transaction.atomic():
            server.save()
    except IntegrityError as exc:
        raise Conflict(f"MCP server with name '{server.server_name}' already exists") from exc
    if not register_tools:
        return server, None
    summary = mcp_server_sync_tools(
        actor=actor, server=server, prune=False, raise_errors=False, timeout=register_inline_seconds()
    )
    if summary.timed_out and register_inline_seconds() < list_tools_timeout():
        # The rest of the wait is a worker's: the server is stored, its tools come when it answers.
        _record_sync(server, status="syncing", error="")
        transaction.on_commit(lambda: _enqueue_sync(actor.organization_id, server.id))
        summary.error = None
    return server, summary


def _enqueue_sync(organization_id: str, server_id: str) -> None:
    from apps.tools.tasks import sync_mcp_server_tools

    sync_mcp_server_tools.delay(organization_id, server_id)


def _record_sync(server: MCPServer, *, status: str, error: str) -> None:
    server.sync_status, server.sync_error, server.synced_at = status, error, timezone.now()
    MCPServer.objects.for_org(server.organization_id).filter(id=server.id).update(
        sync_status=status, sync_error=error, synced_at=server.synced_at
    )


_CONFIG_FIELDS = ("command", "args", "env", "server_url", "auth_header", "auth_token", "custom_headers")


def _apply_config(server: MCPServer, *, server_type: str, **fields: Any) -> None:
    """Set the connection fields; fields of the other transport are cleared. Raises InvalidInput."""
    if server_type not in MCPServer.Type.values:
        raise InvalidInput(f"mcp_server_type must be one of {', '.join(MCPServer.Type.values)}")
    if not server.server_name:
        raise InvalidInput("server_name must not be empty")
    server.server_type = server_type
    if server_type == MCPServer.Type.STDIO:
        command = (fields.get("command") or "").strip()
        if not command:
            raise InvalidInput("A stdio MCP server needs a command")
        bad = _bad_env_names(fields.get("env") or {})
        if bad:
            raise InvalidInput(
                f"env names must be shell variable names (letters, digits and '_', not starting with a "
                f"digit): {', '.join(bad)}"
            )
        server.command, server.args, server.env = command, list(fields.get("args") or []), fields.get("env")
        server.server_url, server.auth_header, server.auth_token, server.custom_headers = "", "", "", None
    else:
        server.server_url = _validated_url((fields.get("server_url") or "").strip())
        server.auth_header = (fields.get("auth_header") or "").strip()
        server.auth_token = fields.get("auth_token") or ""
        server.custom_headers = fields.get("custom_headers")
        check_headers([*(server.custom_headers or {}), *([server.auth_header] if server.auth_header else [])])
        server.command, server.args, server.env = "", [], None


_UNSET: Any = object()


@transaction.atomic
def mcp_server_update(*, actor: Actor, server_id: str, server_name: str = _UNSET, **config: Any) -> MCPServer:
    """Change a server's name and/or connection (keys of `config` as in mcp_server_create, plus
    `server_type`; a field not given keeps its value, a given None clears it). A rename is carried into
    its tools' metadata and tags. Owners and admins only. Raises NotFound, InvalidInput, Conflict."""
    _require_manager(actor)
    unknown = set(config) - {*_CONFIG_FIELDS, "server_type"}
    if unknown:
        raise InvalidInput(f"unknown MCP server fields: {', '.join(sorted(unknown))}")
    server = MCPServer.objects.for_actor(actor).select_for_update().filter(id=server_id).first()
    if server is None:
        raise NotFound(f"MCP server with id '{server_id}' not found")
    old_name = server.server_name
    if server_name is not _UNSET and server_name is not None:
        server.server_name = server_name.strip()
    if config:
        server_type = config.pop("server_type", None) or server.server_type
        current: dict[str, Any] = {
            "command": server.command,
            "args": server.args,
            "env": server.env,
            "server_url": server.server_url,
            "auth_header": server.auth_header,
            "auth_token": server.auth_token,
            "custom_headers": server.custom_headers,
        }
        _apply_config(server, server_type=server_type, **(current | config))
    elif not server.server_name:
        raise InvalidInput("server_name must not be empty")
    if server.server_type == MCPServer.Type.STDIO:
        _check_stdio_allowed(server.command)
    try:
        with transaction.atomic():
            server.save()
    except IntegrityError as exc:
        raise Conflict(f"MCP server with name '{server.server_name}' already exists") from exc
    if server.server_name != old_name:
        for tool in mcp_server_tools(actor=actor, server=server):
            _stamp(tool, server, mcp_metadata(tool).get("tool_name", tool.name))
            tool.save(update_fields=["metadata", "tags", "updated_at"])
    return server


@transaction.atomic
def mcp_server_delete(*, actor: Actor, server_id: str) -> None:
    """Delete a server and the tools registered from it (they leave every agent). Owners and admins
    only. Raises NotFound."""
    _require_manager(actor)
    server = mcp_server_get(actor=actor, server_id=server_id)
    mcp_server_tools(actor=actor, server=server).delete()
    server.delete()


def mcp_server_sync_tools(
    *,
    actor: Actor,
    server: MCPServer,
    prune: bool = True,
    raise_errors: bool = True,
    timeout: float | None = None,
) -> SyncSummary:
    """Fetch the server's tools and make the Tool rows match: add new ones, update changed schemas and,
    with `prune`, delete tools the server no longer lists (Letta's refresh). Tools whose name is taken
    by another tool, or that cannot be a function, are skipped and said so.

    The network call happens before any transaction; the outcome is recorded on the server
    (sync_status, sync_error, synced_at). Owners and admins only. Raises McpServerError (unless
    `raise_errors` is False: the summary's `error` says it), InvalidInput, PermissionDenied.
    """
    _require_manager(actor)
    try:
        remote = fetch_tools(mcp_target(server=server), timeout=timeout)
    except (McpServerError, InvalidInput) as exc:
        timed_out = isinstance(exc, McpServerError) and exc.timed_out
        _record_sync(server, status="error", error=exc.message)
        if raise_errors:
            raise
        logger.warning(
            "mcp.sync_failed",
            extra={
                "mcp_server_id": server.id,
                "error": exc.message,
                "stderr": getattr(exc, "stderr_tail", ""),
            },
        )
        return SyncSummary(error=exc.message, timed_out=timed_out)
    summary = SyncSummary()
    with transaction.atomic():
        for spec in remote:
            problems = _problems(spec)
            if problems:
                summary.skipped.append({"name": spec.name, "reason": "; ".join(problems)})
                continue
            try:
                tool, change = _register(actor=actor, server=server, spec=spec)
            except McpToolNameConflict as exc:
                summary.skipped.append({"name": spec.name, "reason": exc.message})
                continue
            getattr(summary, change).append(tool.name)
            if change == "added":
                summary.added_tools.append(tool)
        if prune:
            listed = {spec.name for spec in remote}
            for tool in mcp_server_tools(actor=actor, server=server):
                if mcp_metadata(tool).get("tool_name", tool.name) not in listed:
                    summary.deleted.append(tool.name)
                    tool.delete()
        _record_sync(server, status="ok", error="")
    return summary


def mcp_tool_register(*, actor: Actor, server: MCPServer, tool_name: str) -> Tool:
    """Register one of the server's tools (listed live) as an external_mcp Tool, or refresh it.
    Owners and admins only. Raises NotFound (no such tool on the server), InvalidInput (it cannot be a
    function), McpToolNameConflict (another tool has the name), McpServerError."""
    _require_manager(actor)
    spec = next((s for s in fetch_tools(mcp_target(server=server)) if s.name == tool_name), None)
    if spec is None:
        raise NotFound(f"MCP server '{server.server_name}' has no tool '{tool_name}'")
    problems = _problems(spec)
    if problems:
        raise InvalidInput(f"MCP tool '{tool_name}' cannot be registered: {'; '.join(problems)}")
    with transaction.atomic():
        tool, _ = _register(actor=actor, server=server, spec=spec)
    return tool


def mcp_tool_schema(spec: McpToolSpec) -> dict[str, Any]:
    """Letta's json_schema for an MCP tool: the name, the description, the input schema as parameters."""
    parameters = {key: value for key, value in spec.input_schema.items() if key != "title"}
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    return {"name": spec.name, "description": spec.description, "parameters": parameters}


def _stamp(tool: Tool, server: MCPServer, tool_name: str) -> None:
    meta: McpToolMetadata = {
        "server_id": server.id,
        "server_name": server.server_name,
        "tool_name": tool_name,
    }
    tool.metadata = {**tool.metadata, "mcp": meta}
    tool.tags = [*[t for t in tool.tags if not t.startswith("mcp:")], f"mcp:{server.server_name}"]


def _register(*, actor: Actor, server: MCPServer, spec: McpToolSpec) -> tuple[Tool, str]:
    """Create or update the Tool for `spec`; returns it and "added", "updated" or "unchanged".
    Call inside a transaction. Raises McpToolNameConflict."""
    tools = Tool.objects.for_actor(actor)
    schema = mcp_tool_schema(spec)
    existing = tools.select_for_update().filter(name=spec.name).first()
    if existing is None:
        tool = Tool(
            organization_id=actor.organization_id,
            name=spec.name,
            tool_type=Tool.Type.EXTERNAL_MCP,
            description=spec.description,
            json_schema=schema,
            created_by_id=actor.user_id,
            last_updated_by_id=actor.user_id,
        )
        _stamp(tool, server, spec.name)
        try:
            with transaction.atomic():
                tool.save()
        except IntegrityError:  # registered concurrently under the same name: treat it as existing
            existing = tools.select_for_update().get(name=spec.name)
        else:
            return tool, "added"
    if existing.tool_type != Tool.Type.EXTERNAL_MCP or mcp_metadata(existing).get("server_id") != server.id:
        raise McpToolNameConflict(
            f"A tool named '{spec.name}' already exists in this organization and does not come from "
            f"MCP server '{server.server_name}'"
        )
    before = (existing.description, existing.json_schema, existing.metadata, existing.tags)
    existing.description, existing.json_schema = spec.description, schema
    _stamp(existing, server, spec.name)
    if (existing.description, existing.json_schema, existing.metadata, existing.tags) == before:
        return existing, "unchanged"
    existing.last_updated_by_id = actor.user_id
    existing.save()
    return existing, "updated"


# --- execution: the agent loop and the run endpoint ------------------------------------------------------


def mcp_tool_execute(*, server: MCPServer, tool_name: str, arguments: dict[str, Any]) -> ToolResult:
    """Call `tool_name` on `server`. Never raises: a down or slow server, a refused stdio server and an
    MCP error result all become error results (sandbox "mcp") the model can read."""
    try:
        output = invoke_tool(mcp_target(server=server), tool_name, arguments)
    except (McpServerError, InvalidInput) as exc:
        logger.warning(
            "mcp.call_failed",
            extra={
                "mcp_server_id": server.id,
                "tool": tool_name,
                "error": exc.message,
                "stderr": getattr(exc, "stderr_tail", ""),
            },
        )
        return ToolResult.error(
            f"Error calling MCP tool '{tool_name}' on server '{server.server_name}': {exc.message}",
            sandbox="mcp",
        )
    if output.is_error:
        return ToolResult.error(output.text or f"MCP tool '{tool_name}' failed", sandbox="mcp")
    return ToolResult.ok(output.text, sandbox="mcp")


def mcp_tool_run(*, actor: Actor, server: MCPServer, tool: Tool, arguments: dict[str, Any]) -> ToolResult:
    """Run a registered tool outside an agent (the API's run endpoint). Owners and admins only."""
    _require_manager(actor)
    meta = mcp_metadata(tool)
    return mcp_tool_execute(server=server, tool_name=meta.get("tool_name", tool.name), arguments=arguments)


def run_mcp_tool(tool: Tool, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """The agent loop's entry point for an external_mcp tool: find its server in the agent's
    organisation and call it. Never raises."""
    meta = mcp_metadata(tool)
    servers = MCPServer.objects.for_actor(ctx.actor)
    server_id, server_name = meta.get("server_id"), meta.get("server_name")
    server = (
        servers.filter(id=server_id).first()
        if server_id
        else servers.filter(server_name=server_name).first()
        if server_name
        else None
    )
    if server is None:
        return ToolResult.error(
            f"Tool '{tool.name}' belongs to an MCP server that no longer exists in this organization.",
            sandbox="mcp",
        )
    return mcp_tool_execute(server=server, tool_name=meta.get("tool_name", tool.name), arguments=arguments)
