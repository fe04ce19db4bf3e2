"""The local jail: tenant code on this host, isolated with Linux namespaces by bubblewrap (Debian's `bwrap`).

What a jailed process gets (tool code of the local sandbox, stdio MCP servers):
- its own user, PID, IPC, UTS, cgroup and network namespaces: uid 65534 inside; no network at all, not
  even this host's loopback; a /proc that shows only its own processes;
- a read-only view of the system's /usr (and the merged-usr links to it) and of nothing else unless the
  caller names it (no DATA_DIR, no checkout, no home: those are covered by an empty tmpfs even when they
  sit under a bound folder), a read-only root and /dev, and a private /tmp of a fixed size;
- when this process is root, a host uid of its own per jail (setpriv), so it is not root on the host
  and its process limit is not shared with anyone else's;
- RLIMIT_NPROC, AS, CPU, FSIZE, NOFILE and no core files (util-linux prlimit, inside the jail, before
  the command starts);
- `--die-with-parent`: killing the bwrap process ends the whole process tree, daemons included, because
  the PID namespace dies with its first process.

The environment is whatever the caller passes to the process (never on the command line, where other
host users could read it). Nothing here runs without bwrap: `unavailable_reason()` says why not.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

INSIDE_UID = 65534  # nobody, inside the jail's user namespace
HOST_UID_BASE = 1_500_000  # per-jail host uids (when root): far above any real account or subuid range
HOST_UID_SLOTS = 1_000_000
MERGED_USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
INSTALL_HINT = "install bubblewrap (Debian: apt-get install bubblewrap)"
SEARCH_PATH = "/usr/bin:/bin:/usr/local/bin"  # where bwrap is looked for: never the tenant-writable /tmp


def kill_jail(child_pid: int | None, bwrap_pid: int) -> None:
    """End a jail now. SIGKILL to its first process makes the kernel end every process of its PID
    namespace, and bwrap then exits by itself; killing bwrap first would orphan the jail's init. When
    the first process is not known yet, bwrap's process group is killed instead."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if child_pid:
            os.kill(child_pid, signal.SIGKILL)
        else:
            os.killpg(bwrap_pid, signal.SIGKILL)


@dataclass(frozen=True)
class JailLimits:
    memory_mb: int = 512  # RLIMIT_AS
    cpu_seconds: int = 31  # RLIMIT_CPU
    max_processes: int = 64  # RLIMIT_NPROC, counted in the jail's own user namespace
    file_size_mb: int = 64  # RLIMIT_FSIZE: no single file larger than /tmp anyway
    open_files: int = 256  # RLIMIT_NOFILE
    tmpfs_mb: int = 64  # the private /tmp


def bwrap_path() -> str | None:
    return shutil.which("bwrap", path=SEARCH_PATH)


def unavailable_reason() -> str | None:
    """Why no jail can be made here (None: it can). The jail needs bwrap, prlimit and, as root, setpriv."""
    if bwrap_path() is None:
        return (
            f"the local sandbox needs bubblewrap to isolate tool code and it is not installed: {INSTALL_HINT}"
        )
    if shutil.which("prlimit", path="/usr/bin:/bin") is None:
        return "the local sandbox needs prlimit (util-linux) and it is not installed"
    if os.geteuid() == 0 and shutil.which("setpriv", path="/usr/bin:/bin") is None:
        return "the local sandbox needs setpriv (util-linux) to drop root and it is not installed"
    return None


_uid_lock = threading.Lock()
_uid_counter = itertools.count(random.randrange(HOST_UID_SLOTS))


def next_host_uid() -> int:
    """A host uid for one jail. Random start per process, then sequential: concurrent jails of one
    process never share one, and two processes collide only by chance (then they share a process limit)."""
    with _uid_lock:
        return HOST_UID_BASE + next(_uid_counter) % HOST_UID_SLOTS


def jail_command(
    command: Sequence[str],
    *,
    limits: JailLimits,
    read_only: Iterable[str] = (),
    hidden: Iterable[str] = (),
    host_uid: int | None = None,
    info_fd: int | None = None,
    binds: Iterable[tuple[str, str]] = (),
) -> list[str]:
    """The argv that runs `command` jailed. `read_only`: extra host paths bound read-only at the same
    place (an interpreter's prefix, an MCP server's install); `binds`: (host path, path in the jail)
    bound read-only elsewhere than /usr, so that the jail sees those files and not where they live
    (the local sandbox's pydantic); `hidden`: folders covered by an empty tmpfs wherever they would
    otherwise show (DATA_DIR, the checkout, home); `info_fd`: bwrap writes `{"child-pid": N}` there, the
    host pid of the jail's first process (see kill_jail)."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise RuntimeError(INSTALL_HINT)
    argv: list[str] = []
    if os.geteuid() == 0:
        uid = host_uid if host_uid is not None else next_host_uid()
        argv += ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    argv += [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    argv += ["--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID)]
    argv += ["--ro-bind", "/usr", "/usr"]
    for link in MERGED_USR_LINKS:
        path = Path(link)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), link]
        elif path.is_dir():
            argv += ["--ro-bind", link, link]
    bound = ["/usr", *MERGED_USR_LINKS]
    for extra in dict.fromkeys(str(Path(p)) for p in read_only):
        if Path(extra).exists() and not _under(extra, bound):
            argv += ["--ro-bind", extra, extra]
            bound.append(extra)
    for source, target in binds:
        if _under(target, ["/usr", *MERGED_USR_LINKS, "/proc", "/dev", "/tmp"]):
            raise ValueError(f"cannot bind {source} at {target}: that place is the jail's own")
        argv += ["--ro-bind", source, target]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(limits.tmpfs_mb * 1024 * 1024), "--perms", "1777", "--tmpfs", "/tmp"]
    for folder in dict.fromkeys(str(Path(p)) for p in hidden):
        if _under(folder, bound) and Path(folder).is_dir():
            argv += ["--tmpfs", folder]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--"]
    argv += [
        "/usr/bin/prlimit",
        f"--nproc={limits.max_processes}",
        f"--as={limits.memory_mb * 1024 * 1024}",
        f"--cpu={limits.cpu_seconds}",
        f"--fsize={limits.file_size_mb * 1024 * 1024}",
        f"--nofile={limits.open_files}",
        "--core=0",
        "--",
    ]
    return argv + list(command)


def _under(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


@dataclass
class JailOutput:
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    overflow: bool = False
    returncode: int | None = None  # bwrap's exit status: the jailed command's, or 1 when bwrap failed


def pump(
    process: subprocess.Popen[bytes], info_fd: int, payload: bytes, deadline: float, max_bytes: int
) -> JailOutput:
    """Feed a jailed process (started with `jail_command(..., info_fd=...)`) its stdin and read its
    stdout/stderr until both close, the deadline (time.monotonic) passes or the output exceeds
    `max_bytes`; then kill the jail if need be and reap bwrap. `info_fd` gives the jail's first pid."""
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    result = JailOutput()
    out_fd, err_fd = process.stdout.fileno(), process.stderr.fileno()
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: [], info_fd: []}
    reading = {out_fd, err_fd}
    total = 0
    pending = memoryview(payload)
    selector = selectors.DefaultSelector()
    os.set_blocking(process.stdin.fileno(), False)
    selector.register(process.stdin, selectors.EVENT_WRITE)
    selector.register(out_fd, selectors.EVENT_READ)
    selector.register(err_fd, selectors.EVENT_READ)
    selector.register(info_fd, selectors.EVENT_READ)
    try:
        while reading and not result.overflow:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                result.timed_out = True
                break
            for key, _events in selector.select(remaining):
                if key.fileobj is process.stdin:
                    try:
                        pending = pending[os.write(key.fd, pending[:65536]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # it stopped reading: its output says why
                        pending = pending[len(pending) :]
                    if not pending:
                        selector.unregister(process.stdin)
                        process.stdin.close()
                    continue
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fd)
                    reading.discard(key.fd)
                    continue
                chunks[key.fd].append(data)
                if key.fd == info_fd:
                    continue
                total += len(data)
                if total > max_bytes:
                    result.overflow = True
                    break
    finally:
        selector.close()
        if reading:  # stopped early (timeout, overflow): nothing of the jail may outlive the call
            kill_jail(_child_pid(b"".join(chunks[info_fd])), process.pid)
        for pipe in (process.stdin, process.stdout, process.stderr):
            with contextlib.suppress(OSError):
                pipe.close()
        os.close(info_fd)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kill_jail(None, process.pid)
            process.wait()
    result.stdout, result.stderr = b"".join(chunks[out_fd]), b"".join(chunks[err_fd])
    result.returncode = process.returncode
    return result


def run(
    command: Sequence[str],
    *,
    limits: JailLimits,
    read_only: Iterable[str],
    hidden: Iterable[str],
    env: dict[str, str],
    stdin: bytes,
    timeout: float,
    max_bytes: int,
    binds: Iterable[tuple[str, str]] = (),
) -> JailOutput:
    """Run `command` jailed with `env` (never the caller's environment), feed it `stdin`, and collect its
    output as `pump` does: killed as a whole at `timeout` seconds or past `max_bytes` of output."""
    info_read, info_write = os.pipe()
    argv = jail_command(
        command, limits=limits, read_only=read_only, hidden=hidden, info_fd=info_write, binds=binds
    )
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd="/",
            start_new_session=True,
            pass_fds=(info_write,),
        )
    except BaseException:
        os.close(info_read)
        raise
    finally:
        os.close(info_write)
    return pump(process, info_read, stdin, time.monotonic() + timeout, max_bytes)


def _child_pid(info: bytes) -> int | None:
    """bwrap's --info-fd JSON: {"child-pid": N, ...}; None when it has not been written (yet)."""
    try:
        pid = json.loads(info or b"{}").get("child-pid")
    except ValueError:
        return None
    return pid if isinstance(pid, int) and pid > 1 else None
