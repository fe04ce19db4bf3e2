"""/v1/groups over raw HTTP (the official SDK has no groups resource): CRUD, tenancy, the agent's groups,
and a blocking, a streamed and an async send driven by a real Celery worker."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from apps.agents.models import Agent
from apps.core.actor import Actor
from tests.api.test_messages_api import new_agent
from tests.support.scripted_llm import ScriptedLLM, text


def create(client: Any, agent_ids: list[str], **body: Any) -> Any:
    return client.post("/v1/groups/", {"agent_ids": agent_ids, "description": "d", **body}, format="json")


def test_group_crud(api_client_for: Any, actor: Actor) -> None:
    client = api_client_for(actor)
    alice, bob = new_agent(actor, name="Alice"), new_agent(actor, name="Bob")

    created = create(
        client, [alice.id, bob.id], manager_config={"manager_type": "round_robin", "max_turns": 4}
    )
    group_id = created.json()["id"]
    patched = client.patch(f"/v1/groups/{group_id}", {"agent_ids": [bob.id, alice.id]}, format="json")
    listed = client.get("/v1/groups/")
    of_agent = client.get(f"/v1/agents/{alice.id}/groups?manager_type=round_robin")
    counted = client.get("/v1/groups/count")
    deleted = client.delete(f"/v1/groups/{group_id}")

    assert created.status_code == 200
    assert group_id.startswith("group-")
    body = created.json()
    assert {k: body[k] for k in ("manager_type", "agent_ids", "max_turns", "description")} == {
        "manager_type": "round_robin",
        "agent_ids": [alice.id, bob.id],
        "max_turns": 4,
        "description": "d",
    }
    assert patched.json()["agent_ids"] == [bob.id, alice.id]
    assert [g["id"] for g in listed.json()] == [group_id]
    assert [g["id"] for g in of_agent.json()] == [group_id]
    assert counted.json() == 1
    assert deleted.json() == {"message": f"Group id={group_id} successfully deleted"}
    assert client.get(f"/v1/groups/{group_id}").status_code == 404


def test_other_organisations_groups_and_agents_are_not_found(
    api_client_for: Any, actor: Actor, other_org_actor: Actor
) -> None:
    mine = new_agent(actor, name="Mine")
    theirs = new_agent(other_org_actor, name="Theirs")
    group_id = create(api_client_for(actor), [mine.id]).json()["id"]
    other = api_client_for(other_org_actor)

    refused = create(other, [mine.id])
    assert refused.status_code == 404
    assert refused.json()["detail"] == f"Agent with id '{mine.id}' not found"
    assert create(api_client_for(actor), [mine.id, theirs.id]).status_code == 404
    for response in (
        other.get(f"/v1/groups/{group_id}"),
        other.patch(f"/v1/groups/{group_id}", {"description": "x"}, format="json"),
        other.get(f"/v1/groups/{group_id}/messages"),
        other.post(
            f"/v1/groups/{group_id}/messages",
            {"messages": [{"role": "user", "content": "hi"}]},
            format="json",
        ),
        other.patch(f"/v1/groups/{group_id}/reset-messages"),
        other.get(f"/v1/agents/{mine.id}/groups"),
    ):
        assert response.status_code == 404, response.content
    assert api_client_for(actor).get("/v1/groups/").json()[0]["id"] == group_id


def test_supervisor_needs_its_manager(api_client_for: Any, actor: Actor) -> None:
    alice = new_agent(actor, name="Alice")

    response = create(api_client_for(actor), [alice.id], manager_config={"manager_type": "supervisor"})

    assert response.status_code == 400
    assert "manager_agent_id" in response.json()["detail"]


@pytest.mark.django_db(transaction=True)
def test_send_blocking_stream_and_async_through_a_worker(
    api_client_for: Any, actor: Actor, llm: ScriptedLLM, celery_worker: Any
) -> None:
    client = api_client_for(actor)
    alice: Agent = new_agent(actor, name="Alice")
    bob: Agent = new_agent(actor, name="Bob")
    group_id = create(client, [alice.id, bob.id]).json()["id"]
    llm.push(
        text("Alice one"), text("Bob one"), text("Alice two"), text("Bob two"), text("Alice 3"), text("Bob 3")
    )
    body = {"messages": [{"role": "user", "content": "hello group"}]}

    blocking = client.post(f"/v1/groups/{group_id}/messages", body, format="json")
    streamed = client.post(f"/v1/groups/{group_id}/messages/stream", body, format="json")
    chunks = [
        json.loads(line[len("data: ") :])
        for line in b"".join(streamed.streaming_content).decode().splitlines()
        if line.startswith("data: {")
    ]
    queued = client.post(f"/v1/groups/{group_id}/messages/async", body, format="json").json()
    for _ in range(200):
        turn = client.get(f"/v1/groups/{group_id}/turns/{queued['id']}").json()
        if turn["status"] == "completed":
            break
        time.sleep(0.1)
    timeline = client.get(f"/v1/groups/{group_id}/messages?order=asc&limit=100").json()

    assert blocking.status_code == 200, blocking.content
    answer = blocking.json()
    assert [
        (m["agent_id"], m["content"]) for m in answer["messages"] if m["message_type"] == "assistant_message"
    ] == [
        (alice.id, "Alice one"),
        (bob.id, "Bob one"),
    ]
    assert answer["stop_reason"] == {"message_type": "stop_reason", "stop_reason": "end_turn"}
    assert answer["usage"]["step_count"] == 2
    assert [(c["agent_id"], c["content"]) for c in chunks if c["message_type"] == "assistant_message"] == [
        (alice.id, "Alice two"),
        (bob.id, "Bob two"),
    ]
    assert chunks[-2]["message_type"] == "stop_reason"
    assert queued["id"].startswith("group-turn-")
    assert turn["status"] == "completed"
    assert [(m["agent_id"], m["message_type"]) for m in timeline][:3] == [
        (alice.id, "user_message"),
        (alice.id, "assistant_message"),
        (bob.id, "assistant_message"),
    ]
    assert len(timeline) == 9
