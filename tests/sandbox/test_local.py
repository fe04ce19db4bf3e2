"""The local sandbox runs tool code in a separate, limited process that sees only what it is given."""

import os

from apps.sandbox.local import Limits, run_tool_locally

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
