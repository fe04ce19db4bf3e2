"""A tiny MCP server for tests, on the official SDK (`MCPServer`, mcp 2's name for FastMCP).

Run it as a script: `python tests/support/mcp_server.py` speaks stdio; `... sse PORT` and
`... streamable-http PORT` serve HTTP on 127.0.0.1. `McpHttpServer` runs those in a subprocess.
`--sys-path DIR` first puts DIR (a site-packages with the SDK) on the path; `stdio_launch` says how
the MCP jail runs it over stdio.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import stat
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

if __name__ == "__main__" and sys.argv[1:2] == ["--sys-path"]:  # before the SDK is imported
    sys.path.insert(0, sys.argv[2])
    del sys.argv[1:3]

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

SCRIPT = str(Path(__file__).resolve())
SYSTEM_PYTHON = "/usr/bin/python3"


def build_server() -> MCPServer:
    """The server and its tools. Built on demand: constructing an MCPServer configures logging."""
    server = MCPServer("letta-test-server")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def fail() -> str:
        """Always fails."""
        raise ToolError("this tool always fails")

    @server.tool()
    def env_value(name: str) -> str:
        """Read one environment variable of the server process."""
        return os.environ.get(name, "<unset>")

    @server.tool()
    def auth_seen(ctx: Context) -> str:
        """The Authorization and X-Team headers of the HTTP request that called this tool."""
        headers = ctx.headers or {}
        return f"{headers.get('authorization', '<none>')} | {headers.get('x-team', '<none>')}"

    @server.tool()
    def nap(seconds: float) -> str:
        """Sleep, then answer."""
        time.sleep(seconds)
        return "awake"

    @server.tool(name="dotted.name")
    def dotted() -> str:
        """A name a model provider refuses as a function name."""
        return "ok"

    @server.tool()
    def jail_probe(port: int, paths: list[str], secrets: list[str]) -> str:
        """What this process sees (JSON): its uid, the processes it can see, whether 127.0.0.1:`port`
        answers, which of `paths` exist, and which `secrets` names any readable /proc/*/environ holds."""
        pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
        environs = []
        for pid in pids:
            try:
                environs.append(Path(f"/proc/{pid}/environ").read_bytes())
            except OSError:
                continue
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            connects = True
        except OSError:
            connects = False
        return json.dumps(
            {
                "uid": os.getuid(),
                "pids": len(pids),
                "environs_read": len(environs),
                "loopback_connects": connects,
                "existing": [p for p in paths if os.path.exists(p)],
                "secrets_seen": [n for n in secrets if any(f"{n}=".encode() in e for e in environs)],
            }
        )

    return server


@dataclass(frozen=True)
class StdioLaunch:
    """How the MCP jail runs this server over stdio: the command to allow, its args, what to bind."""

    command: str
    args: tuple[str, ...]
    read_paths: tuple[str, ...]


@functools.cache
def stdio_launch() -> StdioLaunch:
    """This interpreter, with its venv, its base installation and this folder bound into the jail
    (the checkout itself stays hidden: only these subfolders show). As root a jail runs as a fresh
    unprivileged uid, which cannot enter a private home (pyenv under /root, mode 700); then the
    system python3 of the same version runs this server with this venv's site-packages on its path."""
    here = str(Path(SCRIPT).parent)
    own = StdioLaunch(sys.executable, (SCRIPT,), tuple(dict.fromkeys((sys.prefix, sys.base_prefix, here))))
    if os.geteuid() != 0 or all(map(_others_can_enter, own.read_paths)):
        return own
    site = sysconfig.get_paths()["purelib"]
    same_version = _version(SYSTEM_PYTHON) == "{}.{}".format(*sys.version_info[:2])
    if not same_version or not _others_can_enter(site):
        return own  # then the stdio tests fail with bwrap's "Permission denied" in the stderr
    return StdioLaunch(SYSTEM_PYTHON, (SCRIPT, "--sys-path", site), (site, here))


def _others_can_enter(path: str) -> bool:
    """Whether a uid of no group of ours reaches `path` (every folder on the way searchable)."""
    folder = Path(path)
    try:
        return all(p.stat().st_mode & stat.S_IXOTH for p in (folder, *folder.parents))
    except OSError:
        return False


def _version(python: str) -> str:
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2], sep='.')"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class McpHttpServer:
    """This server over SSE or Streamable HTTP in a subprocess on a free loopback port."""

    def __init__(self, transport: str) -> None:
        self.transport = transport
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        path = "/sse" if self.transport == "sse" else "/mcp"
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> McpHttpServer:
        self.process = subprocess.Popen(
            [sys.executable, SCRIPT, self.transport, str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.__exit__(None, None, None)
        raise RuntimeError(f"the MCP test server ({self.transport}) did not start")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


if __name__ == "__main__":
    transport = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if transport == "stdio":
        build_server().run()
    else:
        build_server().run(transport, host="127.0.0.1", port=int(sys.argv[2]))  # type: ignore[call-overload]
