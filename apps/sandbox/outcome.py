"""What a sandboxed tool call gives back, and the in-sandbox wrapper both backends run it with."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

RUNNER_SOURCE = Path(__file__).with_name("tool_runner.py").read_text()

# Runs inside the sandbox as `python3 -I -c WRAPPER RUNNER_SOURCE`. It reads a per-call random boundary
# (the first line of stdin, so that not even /proc/self/environ shows it to the tool), runs the shared
# runner (tool_runner.py, which reads the rest of stdin), and then writes the boundary and the runner's
# JSON result to the original stdout, after everything the tool printed. The server splits stdout at
# the last boundary, so the tool's own output never needs a second channel.
WRAPPER = """\
import os, sys
boundary = sys.stdin.buffer.readline().decode().strip()
path = "/tmp/.letta-result-" + boundary[-16:]
os.environ["TOOL_RESULT_PATH"] = path
out = os.dup(1)
namespace = {"__name__": "letta_tool_runner"}
exec(compile(sys.argv[1], "tool_runner.py", "exec"), namespace)
namespace["main"]()
for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
    try:
        stream.flush()
    except Exception:
        pass
with open(path, "rb") as handle:
    data = handle.read()
os.unlink(path)
with os.fdopen(out, "wb") as handle:
    handle.write(boundary.encode() + data)
"""


@dataclass(frozen=True)
class SandboxOutcome:
    ok: bool
    return_value: object
    stdout: str
    stderr: str
    error: str | None = None  # exception text with traceback, or why the sandbox stopped it


def new_boundary() -> str:
    return "--letta-result-" + secrets.token_hex(16) + "--"


def tool_payload(
    boundary: str,
    source_code: str,
    name: str,
    arguments: dict[str, object],
    env: dict[str, str] | None = None,
    sys_path: list[str] | None = None,
) -> bytes:
    """The wrapper's stdin: the boundary line, then the runner's JSON (with `env`, set by the runner, and
    `sys_path`, folders it puts first on the module path)."""
    body = json.dumps(
        {
            "source": source_code,
            "name": name,
            "arguments": arguments,
            "env": env or {},
            "sys_path": sys_path or [],
        }
    )
    return (boundary + "\n" + body).encode()


def split_result(stdout: bytes, boundary: str) -> tuple[bytes, dict[str, object] | None, bool]:
    """(what the tool printed, the runner's result, whether a result was written at all). The result is
    None when the runner never wrote one (killed, crashed) or wrote something unreadable."""
    cut = stdout.rfind(boundary.encode())
    if cut < 0:
        return stdout, None, False
    try:
        result = json.loads(stdout[cut + len(boundary) :])
    except ValueError:
        return stdout[:cut], None, True
    return stdout[:cut], result if isinstance(result, dict) else None, True


def text(value: bytes) -> str:
    return value.decode("utf-8", errors="replace")
