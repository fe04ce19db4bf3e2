"""Query plans and statement counts that keep the API fast with many rows (issue 25, bench/scale_bench.py).

Counted, not timed: which index a deep agent page seeks, and how many statements a page costs.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.agents.models import Agent, Message

pytestmark = pytest.mark.django_db

AGENTS = 120


def _agents(org, other_org) -> list[str]:
    """AGENTS agents of `org` among ten times as many of another organisation, interleaved in time; the
    ids of `org`'s, newest first."""
    now = timezone.now()
    rows = [
        Agent(
            organization=org if i % 11 == 0 else other_org,
            name=f"a{i}",
            created_at=now - timedelta(seconds=i),
        )
        for i in range(AGENTS * 11)
    ]
    Agent.all_objects.bulk_create(rows)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE agents_agent")
    return [
        a.id for a in sorted(rows, key=lambda a: a.created_at, reverse=True) if a.organization_id == org.id
    ]


def _page_statement(client, after: str) -> str:
    with CaptureQueriesContext(connection) as captured:
        response = client.get("/v1/agents/", {"after": after, "limit": 10})
    assert response.status_code == 200
    pages = [
        q["sql"] for q in captured.captured_queries if 'ORDER BY "agents_agent"."created_at" DESC' in q["sql"]
    ]
    assert len(pages) == 1, [q["sql"][:200] for q in captured.captured_queries]
    return pages[0]


def test_a_deep_agent_page_seeks_the_cursor_in_the_index(actor, org, other_org, api_client_for):
    ids = _agents(org, other_org)
    client = api_client_for(actor)
    response = client.get("/v1/agents/", {"after": ids[99], "limit": 10})
    assert [a["id"] for a in response.json()] == ids[100:110]

    sql = _page_statement(client, ids[99])
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a table this small would be read whole
        cursor.execute(f"EXPLAIN {sql}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # The scan starts at the cursor (a bound in the Index Cond), not at the newest agent: without it, a
    # page 5,000 agents deep read and dropped 5,000 rows.
    index_cond = [line for line in plan.splitlines() if "Index Cond" in line]
    assert any("created_at <=" in line for line in index_cond), plan


def test_an_agent_page_costs_the_same_statements_however_deep(actor, org, other_org, api_client_for):
    ids = _agents(org, other_org)
    client = api_client_for(actor)
    client.get("/v1/agents/", {"limit": 1})  # the key's first use is recorded once
    counts = []
    for after in (ids[5], ids[100]):
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/v1/agents/", {"after": after, "limit": 10}).status_code == 200
        counts.append(len(captured.captured_queries))
    with CaptureQueriesContext(connection) as captured:
        assert len(client.get("/v1/agents/", {"limit": 50}).json()) == 50
    assert counts[0] == counts[1]
    assert len(captured.captured_queries) == counts[0] - 1  # no cursor to look up


# --- one agent's messages among many newer ones ---------------------------------------------------------

OLD_MESSAGES, NEWER_OTHERS = 300, 3000


def _history_among_newer_messages(make_agent) -> tuple[Agent, list[str]]:
    """An agent whose OLD_MESSAGES messages are all older than NEWER_OTHERS of another agent (an idle agent
    with a long history, in a busy organisation); its messages' ids, oldest first."""
    quiet, busy = make_agent(name="quiet"), make_agent(name="busy")
    mine = Message.all_objects.bulk_create(
        Message(organization_id=quiet.organization_id, agent=quiet, role="user", text=f"old {i}")
        for i in range(OLD_MESSAGES)
    )
    Message.all_objects.bulk_create(
        Message(organization_id=busy.organization_id, agent=busy, role="user", text=f"new {i}")
        for i in range(NEWER_OTHERS)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE agents_message")
    return quiet, [m.id for m in mine]


def _plan_of(captured: CaptureQueriesContext, marker: str) -> str:
    """EXPLAIN of the one captured statement that reads messages with `marker` in it."""
    [sql] = [
        q["sql"]
        for q in captured.captured_queries
        if 'FROM "agents_message"' in q["sql"] and marker in q["sql"]
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())


def test_a_page_of_an_agents_messages_reads_its_own_index(actor, api_client_for, make_agent):
    agent, ids = _history_among_newer_messages(make_agent)
    client = api_client_for(actor)
    with CaptureQueriesContext(connection) as captured:
        response = client.get(f"/v1/agents/{agent.id}/messages", {"limit": 10})
    assert response.status_code == 200
    assert [m["id"] for m in response.json()] == ids[-10:]

    plan = _plan_of(captured, "LIMIT 10")
    # Its thread's index, from its newest message: not the global sequence index walked backwards through
    # every newer message of the organisation (2 s for 100,000 messages among 1,000,000: issue 25).
    # message_agent_conv_seq_idx, or with this few rows the agent_id index and a sort
    assert any("Index Cond" in line and "(agent_id)::text =" in line for line in plan.splitlines()), plan
    assert "sequence_id_key" not in plan, plan
    assert '"embedding"' not in captured.captured_queries[-1]["sql"]  # the vectors are not fetched


def test_older_pages_of_an_agents_messages_follow_the_cursor(actor, api_client_for, make_agent):
    agent, ids = _history_among_newer_messages(make_agent)
    client = api_client_for(actor)
    older = client.get(f"/v1/agents/{agent.id}/messages", {"limit": 10, "before": ids[-10]}).json()
    assert [m["id"] for m in older] == ids[-20:-10]
    oldest = client.get(f"/v1/agents/{agent.id}/messages", {"limit": 5, "order": "asc"}).json()
    assert oldest[0]["message_type"] == "system_message"  # the thread's stored system message comes first
    assert [m["id"] for m in oldest[1:]] == ids[:4]


# --- filtered vector scans ------------------------------------------------------------------------------


def _hnsw_settings() -> tuple[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('hnsw.iterative_scan'), current_setting('hnsw.ef_search')")
        return cursor.fetchone()


def test_a_filtered_vector_scan_reads_enough_candidates_in_its_first_pass(db):
    from apps.memory.archival import filtered_vector_scan

    before = _hnsw_settings()
    with filtered_vector_scan(limit=50):
        # ef_search below the LIMIT makes the strict-order scan iterate: 3x slower for recall's 50
        # candidates at 100,000 messages (bench/scale_bench.py).
        assert _hnsw_settings() == ("strict_order", "100")
    assert _hnsw_settings() == before
    with filtered_vector_scan(limit=10):
        assert _hnsw_settings() == ("strict_order", before[1])  # never narrower than configured
    assert _hnsw_settings() == before


# --- AgentState lists -----------------------------------------------------------------------------------


def test_an_agent_list_page_costs_the_same_statements_whatever_its_size(actor, api_client_for, make_agent):
    agents = [make_agent(name=f"helper-{i}") for i in range(4)]
    client = api_client_for(actor)
    everything = {"HTTP_USER_AGENT": "python-requests/2.32.3"}  # a pre-1.0 client: every relationship
    client.get("/v1/agents/", {"limit": 1})
    counts = {}
    for limit in (1, 4):
        with CaptureQueriesContext(connection) as captured:
            page = client.get("/v1/agents/", {"limit": limit}, **everything).json()
        assert len(page) == limit
        counts[limit] = len(captured.captured_queries)
    assert counts[1] == counts[4], counts
    # The base tools the agents share are loaded once for the page, and each agent lists its own, by
    # name, as retrieving it does.
    tool_rows = [q for q in captured.captured_queries if 'FROM "tools_tool"' in q["sql"]]
    assert len(tool_rows) == 1, [q["sql"][:200] for q in tool_rows]
    for listed in page:
        alone = client.get(f"/v1/agents/{listed['id']}", **everything).json()
        assert listed["tools"] == alone["tools"]
        names = [t["name"] for t in listed["tools"]]
        assert names
        assert names == sorted(names)
        assert listed["blocks"] == alone["blocks"] == listed["memory"]["blocks"]
    assert {a["id"] for a in page} == {a.id for a in agents}


# --- archival search ------------------------------------------------------------------------------------


def test_an_archival_search_reads_no_passage_by_text_when_every_archive_has_vectors(
    actor, api_client_for, llm
):
    from apps.agents.services import agent_create

    agent = agent_create(actor=actor, name="Archivist", model="openai/gpt-4o-mini", embedding="openai/text-embedding-small-384")  # fmt: skip
    client = api_client_for(actor)
    for text in ("Sam hikes in the Alps", "Sam likes green tea"):
        assert (
            client.post(f"/v1/agents/{agent.id}/archival-memory", {"text": text}, format="json").status_code
            == 200
        )
    with CaptureQueriesContext(connection) as captured:
        response = client.get(f"/v1/agents/{agent.id}/archival-memory/search", {"query": "hiking trips"})
    assert response.status_code == 200
    assert response.json()["results"][0]["content"] == "Sam hikes in the Alps"
    # The text match is for archives without a model: over these it read every passage of the table
    # (no index serves it; 800 ms at 1,000,000 passages, bench/scale_bench.py).
    passages = [q["sql"] for q in captured.captured_queries if 'FROM "memory_passage"' in q["sql"]]
    assert passages
    assert not [sql for sql in passages if "LIKE" in sql.upper()], passages
