"""Fixtures of the cluster tests: one cluster per module (built once: its start takes most of the time),
repaired before every test, always torn down; the measured fault times in the terminal summary."""

from __future__ import annotations

import os
import shutil
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.cluster.clients import SHARED_BLOCK, Api
from tests.cluster.harness import ROOT, Cluster, Timing, unsupported_reason
from tests.support.scripted_llm import ScriptedLLMServer

TIMINGS: list[Timing] = []
NOTES: list[tuple[str, str]] = []
KEPT: list[Path] = []


def _base_dir() -> Path:
    # DATA_DIR, not pytest's tmp (mode 0700): PostgreSQL runs as its own user and must reach its folder.
    return Path(os.environ.get("DATA_DIR") or ROOT / "var").resolve()


def _in_ci() -> bool:
    """CI is set (any value but empty, 0 or false), as tests/sandbox and the browser tests read it."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The cluster (harness.py), with the scripted LLM on the root namespace's address. Skipped where this
    machine cannot build it, failed instead under CI. Its folder (logs/ has every process's log and the
    harness's events.log) is removed when every test passed, unless CLUSTER_KEEP_LOGS is set."""
    reason = unsupported_reason()
    if reason is not None:
        if _in_ci():
            pytest.fail(f"CI is set, and the cluster tests cannot run here: {reason}")
        pytest.skip(reason)
    failures_before = request.session.testsfailed
    built = Cluster.create(_base_dir())
    keep = True  # the logs, for the report, unless every test passed
    try:
        with ScriptedLLMServer(built.gateway, 0, default_turn={"content": "OK", "latency": 0.2}) as llm:
            built.llm = llm
            built.start(llm.url)
            yield built
            keep = request.session.testsfailed != failures_before or bool(os.environ.get("CLUSTER_KEEP_LOGS"))
    finally:
        TIMINGS.extend(built.timings)
        NOTES.extend(built.notes)
        built.write_timings(_base_dir() / "cluster-timings.json")
        built.destroy()
        if keep:
            KEPT.append(built.log_dir)
        else:
            shutil.rmtree(built.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Api:
    return Api(cluster)


@pytest.fixture(scope="module")
def shared_block(api: Api) -> str:
    """A block every agent of the cluster tests has, so memory turns on both workers edit one row."""
    return api.create_block(SHARED_BLOCK)


@pytest.fixture(scope="module")
def background_agents(api: Api, shared_block: str) -> list[str]:
    return [api.create_agent(f"background-{i}", block_ids=[shared_block]) for i in range(3)]


@pytest.fixture
def healthy(cluster: Cluster) -> Cluster:
    """The cluster as it should be, whatever the previous test left broken."""
    cluster.ensure_healthy()
    return cluster


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing cluster test's report ends with the tail of every process log."""
    report = yield
    built = item.funcargs.get("cluster") if isinstance(item, pytest.Function) else None
    if report.failed and isinstance(built, Cluster):
        report.sections.append(("cluster logs", built.logs()))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for kept in KEPT:
        terminalreporter.write_line(f"cluster logs kept in {kept}")
    if not TIMINGS:
        return
    terminalreporter.section("cluster: how long each fault took to resolve")
    for timing in TIMINGS:
        bound = f" (bound {timing.bound:.0f} s)" if timing.bound is not None else ""
        terminalreporter.write_line(f"{timing.scenario:<28} {timing.what:<58} {timing.seconds:6.2f} s{bound}")
    for scenario, text in NOTES:
        terminalreporter.write_line(f"{scenario:<28} {text}")
