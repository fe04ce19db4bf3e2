"""Backup and restore through the real commands: `manage.py backup_database` dumps the platform's database
while it is in use, `manage.py restore_database` fills a fresh database from the dump, and a web process on
that database serves the same agents, with the same API key, and runs their next turn."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from rest_framework.test import APIClient

from apps.accounts.services import api_key_provision
from apps.agents.models import Message
from apps.agents.services import agent_passage_insert
from tests.support import workers
from tests.support.scripted_llm import text, tool_call, tool_calls
from tests.support.web import WebProcess, database_url
from tests.support.workers import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def manage(*args: str, database: str) -> subprocess.CompletedProcess[str]:
    env = {**workers.worker_env(""), "DATABASE_URL": database}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """A new, empty database on the test server (what a new machine's platform starts on); its URL."""
    name = f"restored_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(database_url("postgres"), autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    yield database_url(name)
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


def test_a_platform_restored_from_a_backup_serves_the_same_agents(
    make_agent, send, actor, org, user, llm, scripted_server, fresh_database, tmp_path
):
    agent = make_agent()
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        text("Hello Sam!"),
    )
    send(agent, "I'm Sam")
    agent_passage_insert(actor=actor, agent_id=agent.id, text="Sam keeps bees on the roof.")
    key = api_key_provision(organization=org, user=user, name="backup").raw_key
    original = APIClient()
    original.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    paths = [
        f"/v1/agents/{agent.id}",
        f"/v1/agents/{agent.id}/messages",
        f"/v1/agents/{agent.id}/core-memory/blocks",
        f"/v1/agents/{agent.id}/archival-memory",
    ]
    # Both reads as one pre-1.0 client (httpx's User-Agent): an agent with every relationship, field for field.
    user_agent = f"python-httpx/{httpx.__version__}"
    before = {path: original.get(path, HTTP_USER_AGENT=user_agent).json() for path in paths}
    dump = tmp_path / "platform.dump"

    backed_up = manage("backup_database", str(dump), database=workers.test_database_url())
    restored = manage("restore_database", str(dump), database=fresh_database)
    env = {
        **workers.worker_env(scripted_server.url),
        "DATABASE_URL": fresh_database,
        "RUN_EXECUTOR": "in_process",
    }
    web = WebProcess(env, tmp_path, "restored").wait_ready()
    try:
        headers = {"Authorization": f"Bearer {key}", "User-Agent": user_agent}
        after = {path: httpx.get(f"{web.url}{path}", headers=headers, timeout=30).json() for path in paths}
        llm.push(text("Still here, Sam."))
        turn = httpx.post(
            f"{web.url}/v1/agents/{agent.id}/messages",
            headers=headers,
            json={"messages": [{"role": "user", "content": "Are you there?"}]},
            timeout=60,
        )
    finally:
        web.stop()

    assert backed_up.returncode == 0, backed_up.stderr
    assert backed_up.stdout.startswith(f"Backup written to {dump}")
    assert dump.stat().st_mode & 0o777 == 0o600
    assert restored.returncode == 0, restored.stderr
    assert after == before  # the same agent, messages, blocks and passages, field for field
    assert len(before[f"/v1/agents/{agent.id}/messages"]) == 5  # system, user, tool call, tool return, reply
    assert [p["text"] for p in before[f"/v1/agents/{agent.id}/archival-memory"]] == [
        "Sam keeps bees on the roof."
    ]
    assert turn.status_code == 200, turn.text
    assert [m["content"] for m in turn.json()["messages"] if m["message_type"] == "assistant_message"] == [
        "Still here, Sam."
    ]
    assert "Name: Sam" in llm.last_chat_request()["messages"][0]["content"]  # the restored memory
    assert not Message.all_objects.filter(text="Are you there?").exists()  # the original was not touched


def test_a_restore_refuses_a_database_that_is_not_empty_and_changes_nothing(make_agent, tmp_path):
    agent = make_agent(embedding="")
    dump = tmp_path / "platform.dump"
    manage("backup_database", str(dump), database=workers.test_database_url())

    refused = manage("restore_database", str(dump), database=workers.test_database_url())

    assert refused.returncode == 1
    assert "restore into an empty database" in refused.stderr
    assert agent.__class__.all_objects.filter(id=agent.id).count() == 1
