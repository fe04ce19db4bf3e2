"""Ad hoc figures for git memory's per-request cost (not part of `make bench`): an agent with ~500 history
rows, then the time of each request kind once the repository exists. Run with

    DATA_DIR=var/<you> .venv/bin/python scripts/devenv.py test bench/git_memory_sync.py -q -s -p no:cacheprovider
"""

from __future__ import annotations

import os
import statistics
import time
from typing import cast

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.accounts.models import Membership, Organization, User
from apps.agents.services import BlockSpec, agent_create
from apps.core.actor import Actor, Role
from apps.memory.services import (
    block_update,
    git_commit_log,
    git_info_refs,
    git_memory_enable,
    git_upload_pack,
)
from tests.factories import OrganizationFactory, UserFactory

pytestmark = pytest.mark.django_db

ROWS = 500


def _timed(call, repeat: int = 15) -> tuple[float, int]:
    call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    with CaptureQueriesContext(connection) as queries:
        call()
    return statistics.median(times) * 1000, len(queries)


def test_git_memory_request_cost() -> None:
    org = cast(Organization, OrganizationFactory(name="bench"))
    user = cast(User, UserFactory())
    actor = Actor(organization_id=org.id, user_id=user.id, role=Role.OWNER)
    Membership.objects.create(user=user, organization=org, role=Role.OWNER)
    agent = agent_create(
        actor=actor,
        name="bench",
        memory_blocks=[BlockSpec(label="human", value="x"), BlockSpec(label="persona", value="y")],
        tags=["git-memory-enabled"],
    )
    blocks = list(agent.blocks.all())
    for n in range(ROWS - 2):
        block_update(actor=actor, block_id=blocks[n % 2].id, value=f"value {n}")
    start = time.perf_counter()
    git_memory_enable(actor=actor, agent=agent)
    first = (time.perf_counter() - start) * 1000

    refs = git_info_refs(actor=actor, agent=agent, service="git-upload-pack")
    head = refs.split(b"\n")[1][8:48]  # after the flush and the pkt-line length
    from dulwich.protocol import pkt_line

    want = pkt_line(b"want " + head + b" ofs-delta side-band-64k thin-pack\n") + b"0000" + pkt_line(b"done\n")
    rows = {
        "info/refs (upload-pack)": lambda: git_info_refs(actor=actor, agent=agent, service="git-upload-pack"),
        "info/refs (receive-pack)": lambda: git_info_refs(
            actor=actor, agent=agent, service="git-receive-pack"
        ),
        "git-upload-pack (full clone)": lambda: git_upload_pack(actor=actor, agent=agent, body=want),
        "ADE commit log": lambda: git_commit_log(actor=actor, agent=agent),
    }
    print(f"\nfirst build ({ROWS} history rows): {first:.0f} ms")
    for name, call in rows.items():
        ms, queries = _timed(call)
        print(f"{name}: {ms:.1f} ms median, {queries} queries")
    if os.environ.get("GIT_BENCH_PROFILE"):
        _profile(rows["info/refs (upload-pack)"])
        with CaptureQueriesContext(connection) as captured:
            rows["info/refs (upload-pack)"]()
        for query in sorted(captured.captured_queries, key=lambda q: -float(q["time"]))[:6]:
            print(query["time"], query["sql"][:1200])


def _profile(call) -> None:  # GIT_BENCH_PROFILE=1: where one request's time goes
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(call)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
