"""The local sandbox: a tool's source runs on this host inside a bubblewrap jail (apps/sandbox/jail.py).

The jail has no network, its own PID namespace and /proc, an unprivileged uid, a read-only view of
/usr only, a private /tmp of fixed size and process, memory, CPU and file-size limits. A wall-clock
timeout or output past `max_output_bytes` kills the whole process tree. The tool runs on the system
interpreter (`SANDBOX_LOCAL_PYTHON`, standard library only: pip requirements need the Docker sandbox).
Without bubblewrap nothing runs: the outcome says how to install it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from apps.sandbox import jail
from apps.sandbox.outcome import (
    RUNNER_SOURCE,
    WRAPPER,
    SandboxOutcome,
    new_boundary,
    split_result,
    text,
    tool_payload,
)

DEFAULT_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class Limits:
    timeout_seconds: float = 30.0
    memory_mb: int = 512
    max_processes: int = 64
    tmpfs_mb: int = 64
    max_output_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True)
class LocalOutcome(SandboxOutcome):
    total_ms: float = 0.0


def run_tool_locally(
    *,
    source_code: str,
    name: str,
    arguments: dict[str, object],
    env: dict[str, str],
    limits: Limits | None = None,
    python: str = DEFAULT_PYTHON,
    hidden: tuple[str, ...] = (),
) -> LocalOutcome:
    """Call `name(**arguments)` from `source_code` in a fresh jail; never raises for tool failures.

    `env` is the tool's whole environment (plus PATH, HOME and LANG), set inside the jail. `hidden`: host folders
    that must not show inside even if they sit under /usr (DATA_DIR, the checkout).
    """
    limits = limits or Limits()
    started = time.perf_counter()

    def failed(why: str, stdout: bytes = b"", stderr: bytes = b"") -> LocalOutcome:
        return LocalOutcome(False, None, text(stdout), text(stderr), why, _ms(started))

    reason = jail.unavailable_reason()
    if reason is None and not Path(python).is_file():
        reason = (
            f"its interpreter {python} does not exist (SANDBOX_LOCAL_PYTHON; Debian: apt-get install python3)"
        )
    if reason:
        return failed(f"Tool '{name}' cannot run in the local sandbox: {reason}.")
    boundary = new_boundary()
    jail_limits = jail.JailLimits(
        memory_mb=limits.memory_mb,
        cpu_seconds=int(limits.timeout_seconds) + 1,
        max_processes=limits.max_processes,
        file_size_mb=limits.tmpfs_mb,
        tmpfs_mb=limits.tmpfs_mb,
    )
    # The tool's variables travel in the payload, set by the runner inside the jail: setpriv and bwrap
    # run on the host (as root, when we are) and must never see a tenant's LD_PRELOAD or LD_DEBUG_OUTPUT.
    jail_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    jail_env["PYTHONDONTWRITEBYTECODE"] = "1"
    stream = jail.run(
        [python, "-I", "-c", WRAPPER, RUNNER_SOURCE],
        limits=jail_limits,
        read_only=_interpreter_paths(python),
        hidden=(*hidden, str(Path.home())),
        env=jail_env,
        stdin=tool_payload(boundary, source_code, name, arguments, env),
        timeout=limits.timeout_seconds,
        max_bytes=limits.max_output_bytes,
    )
    if stream.timed_out:
        return failed(
            f"Tool '{name}' timed out after {limits.timeout_seconds:g} s and was stopped.",
            stream.stdout,
            stream.stderr,
        )
    if stream.overflow:
        return failed(
            f"Tool '{name}' wrote more than {limits.max_output_bytes} bytes of output and was stopped.",
            stream.stdout,
            stream.stderr,
        )
    printed, result, written = split_result(stream.stdout, boundary)
    if result is None:
        jail_error = text(stream.stderr).strip() if stream.stderr.startswith(b"bwrap: ") else ""
        if written:
            why = f"Tool '{name}' returned an unreadable result."
        elif jail_error:  # e.g. user namespaces disabled by the kernel or a security module
            why = (
                f"Tool '{name}' cannot run in the local sandbox: the jail could not be set up ({jail_error})."
            )
        else:
            why = (
                f"Tool '{name}' exited with code {stream.returncode} before returning "
                "(killed by a resource limit?)."
            )
        return failed(why, printed, stream.stderr)
    return LocalOutcome(
        bool(result.get("ok")),
        result.get("value"),
        text(printed),
        text(stream.stderr),
        result.get("error"),  # type: ignore[arg-type]
        _ms(started),
    )


def _interpreter_paths(python: str) -> tuple[str, ...]:
    """What the interpreter needs besides /usr: its own prefix when it lives elsewhere (/opt/python)."""
    real = Path(python).resolve()
    prefix = real.parent.parent
    return () if str(real).startswith("/usr/") else (str(prefix),)


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
