"""Upgrading from the previous release: a database it populated migrates to the current schema with its
agents, memory blocks, messages and passages intact, and the platform then works on them through the API
(reading them, an archival search by meaning, an agent turn on a Celery worker against the scripted LLM).

There are no release tags: "the previous release" is the schema of 2026-11-30, the state that
bench/RESULTS.md measured. Upgrading from it runs every migration since: accounts 0002-0004, agents
0008-0011 (one run per otid, the same-organisation triggers, stored system messages, logprobs), memory
0004-0005, sandbox 0002, tools 0003 and the identities and folders apps. The rows are written as that
release wrote them, through its models (the historical models of that state).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from apps.agents.models import Agent
from apps.core.actor import Actor, Role
from apps.memory.models import Passage
from tests.support.migrations import migrated_from
from tests.support.scripted_llm import text

PREVIOUS_RELEASE = [
    ("accounts", "0001_initial"),
    ("agents", "0007_uncompressed_message_embedding"),
    ("memory", "0003_uncompressed_passage_embedding"),
    ("sandbox", "0001_initial"),
    ("tools", "0002_mcpserver"),
    ("identities", None),
    ("folders", None),
]
SYSTEM = "You are Ada's long-standing assistant."
HISTORY = [
    ("user", "Hi, I'm Ada. I climb in the Alps."),
    ("assistant", "Nice to meet you, Ada!"),
    ("user", "Remember that I prefer tea."),
    ("assistant", "Noted: tea, not coffee."),
]
PASSAGES = ["Ada climbed the Matterhorn in the Alps in 2019.", "The office coffee machine is on floor two."]


def embed(scripted_url: str, texts: list[str]) -> list[list[float]]:
    """The scripted LLM's embeddings (deterministic: shared words are closer), as the old release stored."""
    response = httpx.post(
        f"{scripted_url}/embeddings", json={"model": "text-embedding-3-small", "input": texts}, timeout=10
    )
    return [item["embedding"] for item in response.json()["data"]]


def populate_previous_release(old_apps: Any, scripted_url: str) -> dict[str, Any]:
    """An organisation with an owner and an agent as the previous release stored them: blocks, a
    conversation history in context, an archive of embedded passages."""
    model = old_apps.get_model
    org = model("accounts", "Organization")._default_manager.create(name="Upgraded Inc")
    user = model("accounts", "User")._default_manager.create(username="ada-owner", password="!")
    model("accounts", "Membership")._default_manager.create(organization=org, user=user, role="owner")
    agent = model("agents", "Agent")._default_manager.create(
        organization=org,
        name="Old Faithful",
        system=SYSTEM,
        model="openai/gpt-4o-mini",
        embedding="openai/text-embedding-3-small",
        embedding_dim=1536,
        created_by=user,
    )
    blocks = {}
    for label, value in (("human", "Name: Ada. Likes tea."), ("persona", "I remember everything.")):
        block = model("memory", "Block")._default_manager.create(
            organization=org, label=label, value=value, limit=2000, created_by=user
        )
        model("memory", "AgentBlock")._default_manager.create(agent=agent, block=block, block_label=label)
        blocks[label] = block.id
    messages = [
        model("agents", "Message")._default_manager.create(
            organization=org, agent=agent, role=role, text=words, content=[{"type": "text", "text": words}]
        )
        for role, words in HISTORY
    ]
    agent.message_ids = [m.id for m in messages]
    agent.save(update_fields=["message_ids"])
    archive = model("memory", "Archive")._default_manager.create(
        organization=org,
        name="Old Faithful's archive",
        embedding="openai/text-embedding-3-small",
        embedding_dim=1536,
    )
    agent.archives.add(archive)
    passages = [
        model("memory", "Passage")._default_manager.create(
            organization=org,
            archive=archive,
            text=words,
            embedding=vector,
            embedding_dim=1536,
            created_by=user,
        )
        for words, vector in zip(PASSAGES, embed(scripted_url, PASSAGES), strict=True)
    ]
    return {
        "actor": Actor(organization_id=org.id, user_id=user.id, role=Role.OWNER),
        "agent_id": agent.id,
        "blocks": blocks,
        "message_ids": [m.id for m in messages],
        "passage_ids": [p.id for p in passages],
    }


@pytest.mark.django_db(transaction=True)
def test_an_upgrade_keeps_the_previous_releases_agents_and_they_work(
    api_client_for, llm, scripted_server, celery_worker
):
    with migrated_from(PREVIOUS_RELEASE) as (old_apps, forward):
        old = populate_previous_release(old_apps, scripted_server.url)
        forward()  # what `manage.py migrate` does on the upgraded platform

    client = api_client_for(old["actor"])
    agent_id = old["agent_id"]
    state = client.get(f"/v1/agents/{agent_id}", {"include": "agent.blocks"}).json()
    listed = client.get(f"/v1/agents/{agent_id}/messages").json()
    block = client.get(f"/v1/blocks/{old['blocks']['human']}").json()
    found = client.get(
        f"/v1/agents/{agent_id}/archival-memory/search", {"query": "mountains of the Alps"}
    ).json()
    llm.push(text("Welcome back, Ada. Tea?"))
    sent = client.post(
        f"/v1/agents/{agent_id}/messages",
        {"messages": [{"role": "user", "content": "Do you remember me?"}]},
        format="json",
    )

    assert (state["name"], state["system"]) == ("Old Faithful", SYSTEM)
    assert {b["label"]: b["value"] for b in state["memory"]["blocks"]} == {
        "human": "Name: Ada. Likes tea.",
        "persona": "I remember everything.",
    }
    assert block["value"] == "Name: Ada. Likes tea."
    assert [(m["message_type"], m["content"]) for m in listed] == [
        ("system_message", SYSTEM),  # stored by agents 0010 for the existing thread, listed first as on Letta
        ("user_message", "Hi, I'm Ada. I climb in the Alps."),
        ("assistant_message", "Nice to meet you, Ada!"),
        ("user_message", "Remember that I prefer tea."),
        ("assistant_message", "Noted: tea, not coffee."),
    ]
    assert found["results"][0]["content"] == PASSAGES[0]  # by meaning: not every word matches
    assert Passage.all_objects.filter(id__in=old["passage_ids"]).count() == 2

    assert sent.status_code == 200
    assert [m["content"] for m in sent.json()["messages"] if m["message_type"] == "assistant_message"] == [
        "Welcome back, Ada. Tea?"
    ]
    prompt = llm.last_chat_request()["messages"]
    assert prompt[0]["role"] == "system"
    assert SYSTEM in prompt[0]["content"]
    assert "Name: Ada. Likes tea." in prompt[0]["content"]  # the migrated block, rendered
    assert [(m["role"], m["content"]) for m in prompt[1:5]] == HISTORY  # the migrated history, in context
    agent = Agent.all_objects.get(id=agent_id)
    assert agent.message_ids[: len(old["message_ids"])] == old["message_ids"]
