"""The workspace page's queries with a long history (issue 25, bench/scale_bench.py): counted, not timed.

An idle agent with a long history in a busy organisation: the page's history query must read the agent's
own thread index from its newest message, not walk every newer message of the organisation.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from apps.agents.models import Agent, Message

pytestmark = pytest.mark.django_db


def _message_rows(agent: Agent, count: int, word: str) -> list[Message]:
    return Message.all_objects.bulk_create(
        Message(
            organization_id=agent.organization_id,
            agent=agent,
            role="user",
            text=f"{word} {i}",
            content=[{"type": "text", "text": f"{word} {i}"}],
        )
        for i in range(count)
    )


def _history_statement(captured: CaptureQueriesContext) -> str:
    [sql] = [
        q["sql"]
        for q in captured.captured_queries
        if 'FROM "agents_message"' in q["sql"]
        and 'ORDER BY "agents_message"' in q["sql"]
        and "LIMIT" in q["sql"]
    ]
    return sql


def test_the_workspace_history_reads_the_agents_own_thread_index(
    owner_client: Client, make_agent: Any
) -> None:
    quiet, busy = make_agent(name="quiet"), make_agent(name="busy")
    _message_rows(quiet, 300, "earlier")
    _message_rows(busy, 3000, "busywork")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE agents_message")

    with CaptureQueriesContext(connection) as captured:
        response = owner_client.get(reverse("ade:workspace", kwargs={"agent_id": quiet.id}))
    assert response.status_code == 200
    html = response.content.decode()
    assert "earlier 299" in html  # the newest message of its history is shown
    assert "busywork" not in html

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {_history_statement(captured)}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # An index on the agent (its thread's, or with this few rows its agent_id one and a sort): not the
    # global sequence, read backwards through `busy`'s 3,000.
    assert any("Index Cond" in line and "(agent_id)::text =" in line for line in plan.splitlines()), plan
    assert "sequence_id_key" not in plan, plan


def test_the_workspace_costs_the_same_statements_whatever_the_history(
    owner_client: Client, make_agent: Any
) -> None:
    agent = make_agent(name="growing")
    url = reverse("ade:workspace", kwargs={"agent_id": agent.id})
    owner_client.get(url)
    counts = []
    for _ in range(2):
        _message_rows(agent, 60, "more")
        with CaptureQueriesContext(connection) as captured:
            assert owner_client.get(url).status_code == 200
        counts.append(len(captured.captured_queries))
    assert counts[0] == counts[1]
