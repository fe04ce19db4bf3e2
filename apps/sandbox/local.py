"""The local sandbox: a tool's source runs in a separate Python process with a timeout and resource
limits, a scrubbed environment and an empty working directory. Weaker than a container (same kernel,
same filesystem view, network not cut off); used where no Docker engine answers, and labelled "local".
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

RUNNER = Path(__file__).with_name("tool_runner.py")


@dataclass(frozen=True)
class SandboxOutcome:
    ok: bool
    return_value: object
    stdout: str
    stderr: str
    error: str | None = None  # exception text with traceback, or why the sandbox stopped it


@dataclass(frozen=True)
class Limits:
    timeout_seconds: float = 30.0
    memory_mb: int = 512
    max_processes: int = 64


def _limit(limits: Limits) -> None:  # runs in the child before exec
    memory = limits.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    cpu = int(limits.timeout_seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    os.setsid()


def run_tool_locally(
    *,
    source_code: str,
    name: str,
    arguments: dict[str, object],
    env: dict[str, str],
    limits: Limits | None = None,
) -> SandboxOutcome:
    """Call `name(**arguments)` from `source_code` in a child process; never raises for tool failures."""
    limits = limits or Limits()
    payload = json.dumps({"source": source_code, "name": name, "arguments": arguments})
    with tempfile.TemporaryDirectory(prefix="tool-") as workdir:
        result_path = Path(workdir) / ".result.json"
        child_env = {
            "PATH": "/usr/bin:/bin",
            "HOME": workdir,
            "PYTHONDONTWRITEBYTECODE": "1",
            **env,
            "TOOL_RESULT_PATH": str(result_path),
        }
        try:
            completed = subprocess.run(
                [sys.executable, "-I", str(RUNNER)],
                input=payload,
                capture_output=True,
                text=True,
                cwd=workdir,
                env=child_env,
                timeout=limits.timeout_seconds,
                preexec_fn=lambda: _limit(limits),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            return SandboxOutcome(
                False,
                None,
                _text(exc.stdout),
                _text(exc.stderr),
                f"Tool '{name}' timed out after {limits.timeout_seconds:g} s and was stopped.",
            )
        if not result_path.exists():
            return SandboxOutcome(
                False,
                None,
                completed.stdout,
                completed.stderr,
                f"Tool '{name}' exited with code {completed.returncode} before returning "
                "(killed by a resource limit?).",
            )
        result = json.loads(result_path.read_text())
    return SandboxOutcome(
        result["ok"], result.get("value"), completed.stdout, completed.stderr, result.get("error")
    )


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value
