"""Each thread's stored system message (issue 18), as Letta's clients see it: `messages.list` starts with
it, `message_ids[0]` names it, a new conversation or fork gets its own compiled from the memory of the
moment, runs and recompile keep it current, and agent files carry it.

Through the API with DRF's APIClient; sends run for real (a Celery worker against the scripted LLM).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.agents.models import Agent, Message
from apps.agents.system_messages import thread_system_message_id
from apps.core.actor import Actor
from apps.memory.models import Block
from tests.api.test_agent_file import import_file
from tests.api.test_messages_api import new_agent, send, user
from tests.support.migrations import migrated_from
from tests.support.scripted_llm import text, tool_call, tool_calls

worker = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client(actor: Actor, api_client_for: Any) -> APIClient:
    return api_client_for(actor)


def listed(client: APIClient, path: str, **query: Any) -> list[dict[str, Any]]:
    response = client.get(path, {"order": "asc", **query})
    assert response.status_code == 200, response.content
    return response.json()


def set_human(client: APIClient, agent: Agent, value: str) -> None:
    response = client.patch(
        f"/v1/agents/{agent.id}/core-memory/blocks/human", {"value": value}, format="json"
    )
    assert response.status_code == 200, response.content


@pytest.mark.django_db
def test_a_new_agents_history_starts_with_its_compiled_system_message(client, actor, llm):
    agent = new_agent(actor, system="You are Ada, a careful assistant.")

    messages = listed(client, f"/v1/agents/{agent.id}/messages")
    state = client.get(f"/v1/agents/{agent.id}").json()

    assert [m["message_type"] for m in messages] == ["system_message"]
    system = messages[0]
    assert system["content"].startswith("You are Ada, a careful assistant.")
    assert "<human>" in system["content"]
    assert "Name: unknown" in system["content"]
    assert f"- AGENT_ID: {agent.id}" in system["content"]
    assert "- CONVERSATION_ID: default" in system["content"]
    assert state["message_ids"] == [system["id"]]
    assert client.get(f"/v1/messages/{system['id']}").json()[0]["content"] == system["content"]


@worker
def test_the_system_message_stays_first_and_follows_memory_edits_made_in_a_run(
    client, actor, llm, celery_worker
):
    agent = new_agent(actor)
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        text("Nice to meet you, Sam!"),
    )

    assert send(client, agent.id, user("My name is Sam")).status_code == 200

    messages = listed(client, f"/v1/agents/{agent.id}/messages")
    assert [m["message_type"] for m in messages] == [
        "system_message",
        "user_message",
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
    ]
    assert "Name: Sam" in messages[0]["content"]
    assert "Name: unknown" not in messages[0]["content"]
    # What the model got on its last call is what is stored.
    assert llm.last_chat_request()["messages"][0]["content"] == messages[0]["content"]
    state = client.get(f"/v1/agents/{agent.id}").json()
    assert state["message_ids"][0] == messages[0]["id"]
    assert len(state["message_ids"]) > 1
    assert set(state["message_ids"]) <= {m["id"] for m in messages}


@pytest.mark.django_db
def test_each_conversation_gets_its_own_system_message_compiled_when_it_is_created(client, actor, llm):
    agent = new_agent(actor)
    set_human(client, agent, "Name: Robin")

    conversation = client.post(f"/v1/conversations/?agent_id={agent.id}", {}, format="json")
    assert conversation.status_code in (200, 201), conversation.content
    conversation = conversation.json()

    own = listed(client, f"/v1/conversations/{conversation['id']}/messages")
    default = listed(client, f"/v1/agents/{agent.id}/messages")
    assert [m["message_type"] for m in own] == ["system_message"]
    assert own[0]["id"] != default[0]["id"]
    assert f"- CONVERSATION_ID: {conversation['id']}" in own[0]["content"]
    assert "Name: Robin" in own[0]["content"]
    assert conversation["in_context_message_ids"] == [own[0]["id"]]
    # The default thread's was compiled before the edit and stays as it was until recompiled.
    assert "Name: unknown" in default[0]["content"]


@pytest.mark.django_db
def test_recompile_stores_the_system_message_unless_it_is_a_dry_run(client, actor, llm):
    agent = new_agent(actor)
    set_human(client, agent, "Name: Kim")

    dry = client.post(f"/v1/agents/{agent.id}/recompile?dry_run=true")
    assert dry.status_code == 200
    assert "Name: Kim" in dry.json()
    assert "Name: unknown" in listed(client, f"/v1/agents/{agent.id}/messages")[0]["content"]

    stored = client.post(f"/v1/agents/{agent.id}/recompile")
    assert stored.status_code == 200
    assert listed(client, f"/v1/agents/{agent.id}/messages")[0]["content"] == stored.json()


@pytest.mark.django_db
def test_a_fork_gets_its_own_system_message_and_shares_the_rest(client, actor, llm):
    agent = new_agent(actor)
    first = client.post(
        f"/v1/agents/{agent.id}/messages/async", user("remember this"), format="json"
    )  # a stored input, never run here (no worker)
    assert first.status_code in (200, 202), first.content
    source = Agent.objects.for_actor(actor).get(id=agent.id)
    source.message_ids = list(
        Message.objects.for_actor(actor).filter(agent=agent, role="user").values_list("id", flat=True)
    )
    source.save(update_fields=["message_ids"])

    fork = client.post(f"/v1/conversations/{agent.id}/fork")
    assert fork.status_code in (200, 201), fork.content
    fork = fork.json()

    forked = listed(client, f"/v1/conversations/{fork['id']}/messages")
    assert [m["message_type"] for m in forked] == ["system_message", "user_message"]
    assert f"- CONVERSATION_ID: {fork['id']}" in forked[0]["content"]
    assert fork["in_context_message_ids"] == [forked[0]["id"], *source.message_ids]


@pytest.mark.django_db
def test_message_ids_sent_back_as_listed_keep_the_stored_context(client, actor, llm):
    agent = new_agent(actor)
    listed_ids = client.get(f"/v1/agents/{agent.id}").json()["message_ids"]

    response = client.patch(f"/v1/agents/{agent.id}", {"message_ids": listed_ids}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["message_ids"] == listed_ids
    assert Agent.objects.for_actor(actor).get(id=agent.id).message_ids == []


@pytest.mark.django_db
def test_reset_keeps_the_system_message_first(client, actor, llm):
    agent = new_agent(actor)
    system_id = listed(client, f"/v1/agents/{agent.id}/messages")[0]["id"]

    response = client.patch(f"/v1/agents/{agent.id}/reset-messages")

    assert response.status_code == 200
    assert response.json()["message_ids"] == [system_id]
    assert [m["id"] for m in listed(client, f"/v1/agents/{agent.id}/messages")] == [system_id]


@pytest.mark.django_db
def test_the_system_message_is_not_counted_as_a_message_between_agent_and_user(client, actor, llm):
    agent = new_agent(actor)

    prompt = client.post(f"/v1/agents/{agent.id}/recompile?dry_run=true").json()

    assert Agent.objects.for_actor(actor).get(id=agent.id).message_count == 0
    assert "- 0 earlier messages between you and the user" in prompt


@pytest.mark.django_db
def test_an_exported_agent_file_starts_its_context_with_the_system_message_and_imports_back(
    client, actor, llm
):
    agent = new_agent(actor)
    set_human(client, agent, "Name: Lee")
    client.post(f"/v1/agents/{agent.id}/recompile")
    system = listed(client, f"/v1/agents/{agent.id}/messages")[0]

    exported = client.get(f"/v1/agents/{agent.id}/export").json()

    file_agent = exported["agents"][0]
    first = next(m for m in file_agent["messages"] if m["id"] == file_agent["in_context_message_ids"][0])
    assert first["role"] == "system"
    assert first["content"][0]["text"] == system["content"]
    imported = import_file(client, json.dumps(exported))
    assert imported.status_code == 200, imported.content
    new_id = imported.json()["agent_ids"][0]
    again = listed(client, f"/v1/agents/{new_id}/messages")
    assert [m["message_type"] for m in again] == ["system_message"]
    assert f"- AGENT_ID: {new_id}" in again[0]["content"]
    assert "Name: Lee" in again[0]["content"]
    assert Block.objects.for_actor(actor).filter(label="human", value="Name: Lee").count() == 2


@pytest.mark.django_db
def test_another_organisation_never_sees_the_system_message(actor, other_org_actor, api_client_for, llm):
    agent = new_agent(actor)
    system_id = api_client_for(actor).get(f"/v1/agents/{agent.id}").json()["message_ids"][0]

    other = api_client_for(other_org_actor)

    assert other.get(f"/v1/messages/{system_id}").status_code == 404
    assert system_id not in [m["id"] for m in other.get("/v1/messages/").json()]


@pytest.mark.django_db
def test_changing_the_system_prompt_rewrites_the_stored_system_message(client, actor, llm):
    agent = new_agent(actor, system="You are terse.")

    response = client.patch(f"/v1/agents/{agent.id}", {"system": "You are verbose."}, format="json")

    assert response.status_code == 200
    system = listed(client, f"/v1/agents/{agent.id}/messages")[0]
    assert system["content"].startswith("You are verbose.")
    assert system["id"] == response.json()["message_ids"][0]


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_existing_threads_a_system_message_that_the_next_run_compiles(
    client, actor, llm, celery_worker
):
    agent = new_agent(actor, system="You are an old agent.")
    with migrated_from([("agents", "0009_links_same_organization")]) as (old_apps, forward):
        # As before 0010: no stored system messages at all.
        old_apps.get_model("agents", "Message")._default_manager.filter(sequence_id__lt=0).delete()
        conversation = old_apps.get_model("agents", "Conversation")._default_manager.create(
            organization_id=actor.organization_id, agent_id=agent.id
        )
        forward()

    default = listed(client, f"/v1/agents/{agent.id}/messages")
    threaded = listed(client, f"/v1/conversations/{conversation.id}/messages")
    assert [m["content"] for m in default] == ["You are an old agent."]  # the prompt as written, for now
    assert [m["id"] for m in threaded] == [thread_system_message_id(agent.id, conversation.id)]
    assert Agent.objects.for_actor(actor).get(id=agent.id).message_count == 0

    llm.push(text("Hello again."))
    assert send(client, agent.id, user("hi")).status_code == 200

    compiled = listed(client, f"/v1/agents/{agent.id}/messages")[0]["content"]
    assert compiled.startswith("You are an old agent.")
    assert f"- AGENT_ID: {agent.id}" in compiled
