"""Where an upload is parsed: HTML, PDF and DOCX in the parser jail, plain text in this process.

An uploaded PDF or DOCX is a tenant's input to third-party parsers (pypdf; python-docx over lxml, which is
C). A parser bug must not become a way into the platform, so those files are parsed by `parsing.main` in
the local jail (apps/sandbox/jail.py): its own uid (when we are root), no network at all (not even this
host's loopback, so no Postgres, Redis or provider), none of the platform's environment, a read-only /usr
plus the site-packages that hold the parsers, nothing of DATA_DIR, the checkout or home, and limits on
memory, CPU, processes and output, killed as a whole at FOLDER_PARSE_TIMEOUT. Plain text (txt, md, json,
csv, source code) is only decoded, by our own linear code, so it needs no child process.

FOLDER_PARSE_ISOLATION says what to do when no jail can be made here (no bubblewrap, or user namespaces
refused, as in an unprivileged container): `jail` (the default) fails such files with a reason naming the
fix; `process` is the operator's explicit choice of a weaker child process as the platform's own uid
(memory, CPU and time limits, an empty environment, but the host's network and files).
"""

from __future__ import annotations

import functools
import json
import os
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path

from django.conf import settings

from apps.folders import parsing
from apps.folders.parsing import ParseFailed
from apps.sandbox import jail

ISOLATION_JAIL = "jail"
ISOLATION_PROCESS = "process"
PARSER_LIMITS = jail.JailLimits(
    memory_mb=parsing.PARSE_MEMORY_BYTES // 1024**2,
    max_processes=8,
    file_size_mb=1,  # the parsers write nothing; their text leaves on stdout
    open_files=64,
    tmpfs_mb=8,
)
MAX_STDERR_BYTES = 64 * 1024
PARSER_SOURCE = Path(parsing.__file__).read_text(encoding="utf-8")
"""What the jailed interpreter runs (`-c`): the parsing module alone, which imports only the standard
library at load time, so nothing of the checkout needs to be visible inside."""


def parse_bounded(data: bytes, media_type: str, *, timeout: float) -> str:
    """The file's text, parsed where FOLDER_PARSE_ISOLATION allows, within `timeout` seconds and
    parsing.MAX_TEXT_BYTES of text. Raises ParseFailed with a reason a user can read."""
    if parsing.file_type(media_type).kind == "text":
        return parsing.parse(data, media_type)
    mode = settings.FOLDER_PARSE_ISOLATION
    if mode == ISOLATION_PROCESS:
        return _parse_in_process_child(data, media_type, timeout=timeout)
    reason = unavailable_reason()
    if reason:
        raise ParseFailed(
            f"{_label(media_type)} files cannot be parsed on this server: {reason}. The operator can "
            "install it, or set FOLDER_PARSE_ISOLATION=process to parse them without the jail"
        )
    launch = parser_launch()
    header = {"media_type": media_type, "sys_path": list(launch.site_paths)}
    output = run_jailed_python(
        PARSER_SOURCE,
        json.dumps(header).encode() + b"\n" + data,
        timeout=timeout,
        max_bytes=parsing.MAX_TEXT_BYTES + MAX_STDERR_BYTES,
    )
    if output.timed_out:
        raise ParseFailed(f"Parsing took longer than {timeout:g} seconds (FOLDER_PARSE_TIMEOUT)")
    if output.overflow:
        raise ParseFailed(f"The file's text is larger than {parsing.MAX_TEXT_BYTES:,} bytes once parsed")
    return _text_of(output.returncode, output.stdout, output.stderr)


def _label(media_type: str) -> str:
    return parsing.file_type(media_type).kind.upper()  # PDF, DOCX, HTML


@functools.cache
def unavailable_reason() -> str | None:
    """Why the parser jail cannot run here (None: it can): the jail's own needs, then an interpreter it
    can see. Cached: the answer does not change while the process runs."""
    reason = jail.unavailable_reason()
    if reason:
        return reason.replace("the local sandbox", "the parser jail")
    try:
        parser_launch()
    except ParseFailed as exc:
        return exc.reason
    return None


@dataclass(frozen=True)
class ParserLaunch:
    """The interpreter the jail runs, the site-packages on its path, and what to bind for both."""

    python: str
    site_paths: tuple[str, ...]
    read_only: tuple[str, ...]


@functools.cache
def parser_launch() -> ParserLaunch:
    """This interpreter and its site-packages, as the jail can reach them. As root a jail runs as a fresh
    unprivileged uid, which cannot enter a private home (pyenv under /root, mode 700): then the system
    python3 of the same version (SANDBOX_LOCAL_PYTHON) runs our site-packages, whose compiled parsers
    (lxml) need that same version. Raises ParseFailed when neither can."""
    paths = sysconfig.get_paths()
    site_paths = tuple(dict.fromkeys((paths["purelib"], paths["platlib"])))
    own = str(Path(sys.executable).resolve())
    own_prefix = str(Path(own).parent.parent)
    needs_entry = os.geteuid() == 0
    if needs_entry and not all(map(_others_can_enter, site_paths)):
        raise ParseFailed(
            f"the parsers' site-packages ({', '.join(site_paths)}) are not readable by other users, "
            "which the parser jail runs as"
        )
    if not needs_entry or _others_can_enter(own_prefix):
        prefixes = () if own.startswith("/usr/") else (own_prefix, sys.base_prefix)
        return ParserLaunch(own, site_paths, tuple(dict.fromkeys((*prefixes, *site_paths))))
    system = settings.SANDBOX_LOCAL_PYTHON
    version = "{}.{}".format(*sys.version_info[:2])
    if not Path(system).is_file() or _version(system) != version:
        raise ParseFailed(
            f"this interpreter ({own}) is not reachable by the jail's unprivileged user and "
            f"{system} (SANDBOX_LOCAL_PYTHON) is not Python {version}"
        )
    return ParserLaunch(system, site_paths, site_paths)


def run_jailed_python(source: str, stdin: bytes, *, timeout: float, max_bytes: int) -> jail.JailOutput:
    """Run `source` with the parser interpreter inside the parser jail, `stdin` fed to it. The
    parsers' own entry point and the tests' probes of the jail both come through here."""
    launch = parser_launch()
    limits = replace(PARSER_LIMITS, cpu_seconds=int(timeout) + 1)
    hidden = (str(settings.BASE_DIR), str(settings.DATA_DIR), str(Path.home()))
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    return jail.run(
        [launch.python, "-I", "-S", "-c", source],
        limits=limits,
        read_only=launch.read_only,
        hidden=hidden,
        env=env,
        stdin=stdin,
        timeout=timeout,
        max_bytes=max_bytes,
    )


def _parse_in_process_child(data: bytes, media_type: str, *, timeout: float) -> str:
    """FOLDER_PARSE_ISOLATION=process: the same parser in a plain child process that limits itself."""
    header = json.dumps(
        {"media_type": media_type, "memory": parsing.PARSE_MEMORY_BYTES, "cpu": int(timeout) + 1}
    )
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", PARSER_SOURCE],
            input=header.encode() + b"\n" + data,
            capture_output=True,
            timeout=timeout,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ParseFailed(f"Parsing took longer than {timeout:g} seconds (FOLDER_PARSE_TIMEOUT)") from exc
    if len(done.stdout) > parsing.MAX_TEXT_BYTES:
        raise ParseFailed(f"The file's text is larger than {parsing.MAX_TEXT_BYTES:,} bytes once parsed")
    return _text_of(done.returncode, done.stdout, done.stderr)


def _text_of(returncode: int | None, stdout: bytes, stderr: bytes) -> str:
    if returncode == parsing.EXIT_PARSE_FAILED:
        raise ParseFailed(
            stderr.decode("utf-8", errors="replace").strip()[:2000] or "The file could not be parsed"
        )
    if returncode != 0:
        raise ParseFailed(_crash_reason(returncode, stderr))
    return stdout.decode("utf-8", errors="replace")


def _crash_reason(code: int | None, stderr: bytes) -> str:
    if b"MemoryError" in stderr:
        return f"Parsing needed more than {parsing.PARSE_MEMORY_BYTES // 1024**2} MiB of memory (a decompression bomb?)"
    if stderr.startswith(b"bwrap: "):  # the jail itself could not be set up (user namespaces refused?)
        return f"The parser jail could not be set up ({stderr.decode(errors='replace').strip()[:300]})"
    if code is not None and code < 0:
        return f"Parsing was stopped (signal {-code}): it exceeded its CPU time or memory limit"
    return "The file could not be parsed (the parser failed unexpectedly)"


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
            [python, "-I", "-c", "import sys; print(*sys.version_info[:2], sep='.')"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()
