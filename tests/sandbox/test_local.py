"""The local sandbox runs tool code in a bubblewrap jail that sees only what it is given."""

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from apps.sandbox import jail
from apps.sandbox.local import Limits, run_tool_locally
from tests.sandbox.test_isolation import processes_with

SOURCE = '''
import os, time

def peek(name: str) -> str:
    """Args:
        name (str): variable
    """
    return os.environ.get(name, "<unset>")

def sleepy(seconds: float) -> str:
    """Args:
        seconds (float): how long
    """
    time.sleep(seconds)
    return "woke"

def hog(megabytes: int) -> int:
    """Args:
        megabytes (int): how much
    """
    return len(bytearray(megabytes * 1024 * 1024))

def talk() -> dict:
    """Prints and returns."""
    print("to stdout")
    import sys
    print("to stderr", file=sys.stderr)
    return {"ok": True}
'''


def test_the_tool_sees_only_the_environment_it_is_given(monkeypatch):
    monkeypatch.setenv("SERVER_SECRET", "do-not-leak")

    leaked = run_tool_locally(source_code=SOURCE, name="peek", arguments={"name": "SERVER_SECRET"}, env={})
    given = run_tool_locally(
        source_code=SOURCE, name="peek", arguments={"name": "API_TOKEN"}, env={"API_TOKEN": "t-123"}
    )

    assert leaked.return_value == "<unset>"
    assert given.return_value == "t-123"
    assert os.environ["SERVER_SECRET"] == "do-not-leak"


def test_a_tool_past_its_time_limit_is_stopped():
    outcome = run_tool_locally(
        source_code=SOURCE,
        name="sleepy",
        arguments={"seconds": 5},
        env={},
        limits=Limits(timeout_seconds=0.5),
    )

    assert outcome.ok is False
    assert "timed out after 0.5 s" in outcome.error


def test_a_tool_over_its_memory_limit_fails_instead_of_hurting_the_server():
    outcome = run_tool_locally(
        source_code=SOURCE, name="hog", arguments={"megabytes": 400}, env={}, limits=Limits(memory_mb=128)
    )

    assert outcome.ok is False
    assert "MemoryError" in (outcome.error or "")


def test_stdout_stderr_and_a_json_return_come_back():
    outcome = run_tool_locally(source_code=SOURCE, name="talk", arguments={}, env={})

    assert (outcome.ok, outcome.return_value) == (True, {"ok": True})
    assert outcome.stdout == "to stdout\n"
    assert outcome.stderr == "to stderr\n"


def test_without_bubblewrap_nothing_runs_and_the_error_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(jail, "SEARCH_PATH", str(tmp_path))  # a machine without bwrap
    marker = tmp_path / "ran"

    outcome = run_tool_locally(
        source_code=f"def touch() -> str:\n    open({str(marker)!r}, 'w')\n    return 'ran'\n",
        name="touch",
        arguments={},
        env={},
    )

    assert outcome.ok is False
    assert outcome.error == (
        "Tool 'touch' cannot run in the local sandbox: the local sandbox needs bubblewrap to isolate tool "
        "code and it is not installed: install bubblewrap (Debian: apt-get install bubblewrap)."
    )
    assert not marker.exists()


SPAWN = SOURCE + (
    "\ndef spawn(marker: str, wait: bool) -> str:\n"
    "    import subprocess, sys\n"
    "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(100)', marker], start_new_session=True)\n"
    "    if wait:\n"
    "        time.sleep(3)\n"
    "    return 'spawned'\n"
)


def test_the_jailed_process_is_not_root_on_the_host_either():
    marker = f"letta-probe-{uuid.uuid4().hex}"
    with ThreadPoolExecutor(1) as executor:
        call = executor.submit(
            run_tool_locally,
            source_code=SPAWN,
            name="spawn",
            arguments={"marker": marker, "wait": True},
            env={},
        )
        host_uids = set()
        deadline = time.monotonic() + 3
        while not host_uids and time.monotonic() < deadline:
            host_uids = {uid for pid in processes_with(marker) if (uid := _host_uid(pid)) is not None}
            time.sleep(0.05)
        outcome = call.result()

    assert outcome.return_value == "spawned"
    assert host_uids
    assert 0 not in host_uids


def test_a_jail_leaves_nothing_behind_on_the_host():
    marker = f"letta-probe-{uuid.uuid4().hex}"

    outcome = run_tool_locally(
        source_code=SPAWN, name="spawn", arguments={"marker": marker, "wait": False}, env={}
    )

    assert outcome.return_value == "spawned"
    assert processes_with(marker) == []  # gone when the call returns: the PID namespace ended with it


def _host_uid(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))


def test_tenant_variables_never_reach_the_host_processes_that_build_the_jail(tmp_path):
    # As root, setpriv and bwrap run as root on the host: a loader variable there would write this file.
    trace = tmp_path / "loader-trace"

    outcome = run_tool_locally(
        source_code=SOURCE,
        name="peek",
        arguments={"name": "LD_DEBUG_OUTPUT"},
        env={"LD_DEBUG": "all", "LD_DEBUG_OUTPUT": str(trace)},
    )

    assert outcome.return_value == str(trace)  # the tool has its variables
    assert list(tmp_path.iterdir()) == []
