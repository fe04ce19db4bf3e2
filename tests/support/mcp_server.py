"""A tiny MCP server for tests, on the official SDK (`MCPServer`, mcp 2's name for FastMCP).

Run it as a script: `python tests/support/mcp_server.py` speaks stdio; `... sse PORT` and
`... streamable-http PORT` serve HTTP on 127.0.0.1. `McpHttpServer` runs those in a subprocess.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

SCRIPT = str(Path(__file__).resolve())


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

    return server


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
