"""The local sandbox: a tool's source runs on this host inside a bubblewrap jail (apps/sandbox/jail.py).

The jail has no network, its own PID namespace and /proc, an unprivileged uid, a read-only view of
/usr only, a private /tmp of fixed size and process, memory, CPU and file-size limits. A wall-clock
timeout or output past `max_output_bytes` kills the whole process tree. The tool runs on the system
interpreter (`SANDBOX_LOCAL_PYTHON`: its standard library, plus pydantic; pip requirements need the
Docker sandbox). Without bubblewrap nothing runs: the outcome says how to install it.

pydantic (custom tools take pydantic models as arguments, as in Letta) is the platform's own: the files of
pydantic and of what it requires, and nothing else of this environment, bound read-only at JAIL_SITE and
put first on the tool's module path. They are library code that any pip install gives; the jail sees no
other file of the checkout or the environment, and not where they live on the host.
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import sysconfig
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

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
JAIL_SITE = "/opt/letta-site"
"""Where the jail sees the platform's pydantic; first on the tool's sys.path."""


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
    site = pydantic_site(python)
    stream = jail.run(
        [python, "-I", "-c", WRAPPER, RUNNER_SOURCE],
        limits=jail_limits,
        read_only=_interpreter_paths(python),
        hidden=(*hidden, str(Path.home())),
        env=jail_env,
        stdin=tool_payload(
            boundary, source_code, name, arguments, env, sys_path=[JAIL_SITE] if site.binds else []
        ),
        timeout=limits.timeout_seconds,
        max_bytes=limits.max_output_bytes,
        binds=site.binds,
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
    error = result.get("error")
    if site.reason and isinstance(error, str) and "No module named 'pydantic'" in error:
        error += f"\n(The local sandbox offers no pydantic here: {site.reason}.)"
    return LocalOutcome(
        bool(result.get("ok")),
        result.get("value"),
        text(printed),
        text(stream.stderr),
        error,  # type: ignore[arg-type]
        _ms(started),
    )


@dataclass(frozen=True)
class JailSite:
    """What the jail binds to offer pydantic: (host path, path under JAIL_SITE), read-only; or why not."""

    binds: tuple[tuple[str, str], ...] = ()
    reason: str = ""


@functools.cache
def pydantic_site(python: str) -> JailSite:
    """The platform's pydantic for a jail running `python`: the top-level files and folders of pydantic's
    distribution and of those it requires (recursively, extras left out), which the jail binds at
    JAIL_SITE. Offered only to an interpreter that loads this environment's compiled modules (the same
    Python version: pydantic_core is one) and, as root, only when the jail's own uid can read them."""
    try:
        entries = _distribution_entries("pydantic")
    except LookupError as exc:
        return JailSite(reason=str(exc))
    ours = sysconfig.get_config_var("EXT_SUFFIX")
    theirs = _extension_suffix(python)
    if theirs != ours:
        return JailSite(
            reason=f"its interpreter {python} is not the platform's Python version (extension modules "
            f"{theirs or 'unknown'}, the platform's pydantic is built for {ours}); install pydantic for "
            "it, or set SANDBOX_LOCAL_PYTHON to an interpreter of that version"
        )
    if os.geteuid() == 0:  # the jail runs as a fresh uid, which must reach the files itself
        unreadable = [host for host, _ in entries if not _others_can_read(host)]
        if unreadable:
            return JailSite(reason=f"the jail's user cannot read {unreadable[0]}")
    return JailSite(binds=tuple(entries))


def _distribution_entries(root: str) -> list[tuple[str, str]]:
    """(host path, path in the jail) of every top-level entry of `root`'s distribution and of what it
    requires: packages, modules, their .dist-info, a top-level __pycache__ file; never a .pth or a script."""
    entries: dict[str, str] = {}
    seen: set[str] = set()
    queue = [root]
    while queue:
        name = canonicalize_name(queue.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError as exc:
            raise LookupError(f"the platform's environment has no {name}") from exc
        for line in distribution.requires or ():
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                queue.append(requirement.name)
        for file in distribution.files or ():
            parts = file.parts
            if not parts or parts[0] == ".." or Path(parts[0]).is_absolute() or file.suffix == ".pth":
                continue
            top = "/".join(parts[:2]) if parts[0] == "__pycache__" else parts[0]
            host = Path(str(distribution.locate_file(top)))
            if host.exists():
                entries[str(host)] = f"{JAIL_SITE}/{top}"
    return sorted(entries.items(), key=lambda entry: entry[1])


def _extension_suffix(python: str) -> str:
    """The interpreter's suffix of compiled modules (`.cpython-311-x86_64-linux-gnu.so`); "" if unknown.
    Runs the operator's interpreter, never tenant code."""
    try:
        done = subprocess.run(
            [python, "-I", "-S", "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def _others_can_read(path: str) -> bool:
    """Whether a uid of no group of ours can read `path` (and search every folder on the way)."""
    target = Path(path)
    try:
        mode = target.stat().st_mode
        searchable = all(folder.stat().st_mode & stat.S_IXOTH for folder in target.parents)
    except OSError:
        return False
    wanted = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return searchable and mode & wanted == wanted


def _interpreter_paths(python: str) -> tuple[str, ...]:
    """What the interpreter needs besides /usr: its own prefix when it lives elsewhere (/opt/python)."""
    real = Path(python).resolve()
    prefix = real.parent.parent
    return () if str(real).startswith("/usr/") else (str(prefix),)


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
