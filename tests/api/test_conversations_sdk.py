"""The official Letta SDK (letta-client 1.12.1, unpatched) driving the conversation and agent operations of
issue 18 against pytest-django's live server: one test per SDK method. Runs execute in a real Celery
worker process; compaction calls the scripted LLM from the request. Only loopback is contacted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from letta_client import BadRequestError, Letta, PermissionDeniedError

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.models import Agent, Conversation, Message
from apps.agents.services import conversation_create
from apps.agents.system_messages import THREAD_SYSTEM_MESSAGE, thread_system_message_id
from apps.api import sse
from apps.core.actor import Actor, Role
from apps.memory.models import Block
from tests.api.test_conversations_api import seed
from tests.api.test_messages_api import new_agent
from tests.support.scripted_llm import text

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_persistent_connections_in_server_threads() -> Iterator[None]:
    """The live server answers each request in a new thread; with persistent connections (CONN_MAX_AGE)
    each would leave a database session open and the test database could not be dropped."""
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


def sdk_for(live_server: Any, actor: Actor) -> Letta:
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk")
    return Letta(base_url=live_server.url, api_key=key.raw_key, max_retries=0, timeout=30)


@pytest.fixture
def sdk(live_server: Any, actor: Actor, monkeypatch: pytest.MonkeyPatch) -> Letta:
    monkeypatch.setattr(sse, "FOLLOW_TIMEOUT_S", 30.0)
    return sdk_for(live_server, actor)


def test_conversations_update(sdk, actor):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id, summary="trip")

    updated = sdk.conversations.update(conversation.id, summary="Trip to Rome")

    assert (updated.id, updated.summary) == (conversation.id, "Trip to Rome")
    assert sdk.conversations.retrieve(conversation.id).summary == "Trip to Rome"


def test_conversations_delete(sdk, actor):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)

    result = sdk.conversations.delete(conversation.id)

    assert result is None
    assert [c.id for c in sdk.conversations.list(agent_id=agent.id)] == []


def test_conversations_update_refused_to_another_member(live_server, org, make_user, actor):
    member = make_user(org, role=Role.MEMBER, username="member")
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id, summary="trip")
    client = sdk_for(live_server, Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER))

    with pytest.raises(PermissionDeniedError) as refused:
        client.conversations.update(conversation.id, summary="mine now")

    assert refused.value.body["detail"].startswith("Not allowed (conversation ")
    assert Conversation.objects.for_actor(actor).get().summary == "trip"


def test_conversations_fork(sdk, actor):
    agent = new_agent(actor)
    source = conversation_create(actor=actor, agent_id=agent.id)
    rows = seed(actor, agent, source, "hi", "hello")

    fork = sdk.conversations.fork(source.id)
    from_default = sdk.conversations.fork("default", agent_id=agent.id)

    assert fork.id != source.id
    # Each thread's system message first (a fork's is its own), then the shared messages.
    assert fork.in_context_message_ids == [
        thread_system_message_id(agent.id, fork.id),
        *(row.id for row in rows),
    ]
    assert from_default.in_context_message_ids == [thread_system_message_id(agent.id, from_default.id)]
    assert Message.objects.for_actor(actor).exclude(THREAD_SYSTEM_MESSAGE).count() == 2


def test_conversations_recompile(sdk, actor, llm):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    Block.objects.for_actor(actor).filter(label="human").update(value="Name: Ada")

    compiled = sdk.conversations.recompile(conversation.id, dry_run=True)

    assert "Name: Ada" in json.loads(
        compiled
    )  # cast_to=str: the SDK hands back the JSON text as Letta's does


def test_conversations_messages_compact(sdk, actor, llm):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    seed(actor, agent, conversation, "I am Sam", "Hi Sam", "I like tea", "Noted")
    llm.push(text("Sam likes tea."))

    result = sdk.conversations.messages.compact(conversation.id)

    assert (result.summary, result.num_messages_before, result.num_messages_after) == ("Sam likes tea.", 4, 2)
    assert len(Conversation.objects.for_actor(actor).get().message_ids) == 2


def test_conversations_messages_compact_with_too_little(sdk, actor, llm):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    seed(actor, agent, conversation, "hi")

    with pytest.raises(BadRequestError):
        sdk.conversations.messages.compact(conversation.id)


def test_conversations_messages_list_in_both_orders(sdk, actor, llm, celery_worker):
    agent = new_agent(actor)
    conversation = sdk.conversations.create(agent_id=agent.id)
    llm.push(text("first answer"), text("second answer"))
    for question in ("first question", "second question"):
        list(
            sdk.conversations.messages.create(
                conversation.id, messages=[{"role": "user", "content": question}]
            )
        )

    newest_first = sdk.conversations.messages.list(conversation.id, order="desc").items
    oldest_first = sdk.conversations.messages.list(conversation.id, order="asc").items

    assert [m.content for m in newest_first[:4]] == [
        "second answer",
        "second question",
        "first answer",
        "first question",
    ]
    assert [m.message_type for m in newest_first[4:]] == ["system_message"]  # the conversation's own, first
    assert f"- CONVERSATION_ID: {conversation.id}" in newest_first[4].content
    assert [m.id for m in oldest_first] == list(reversed([m.id for m in newest_first]))


def test_conversations_messages_stream(sdk, actor, llm, celery_worker):
    agent = new_agent(actor)
    conversation = sdk.conversations.create(agent_id=agent.id)
    llm.push(text("Done."))
    items = list(
        sdk.conversations.messages.create(
            conversation.id, messages=[{"role": "user", "content": "go"}], background=True
        )
    )
    run_id = items[0].run_id

    with pytest.raises(BadRequestError) as no_active:
        list(sdk.conversations.messages.stream(conversation.id))
    replayed = list(sdk.conversations.messages.stream(conversation.id, run_id=run_id))

    assert "No active runs found" in str(no_active.value)
    assert [item.message_type for item in replayed] == [item.message_type for item in items]
    assert replayed[0].content == "Done."


def test_agents_recompile(sdk, actor, llm):
    agent = new_agent(actor, system="You help Ada.")

    compiled = json.loads(sdk.agents.recompile(agent.id, dry_run=True))

    assert compiled.startswith("You help Ada.")
    assert "I am a helpful assistant." in compiled


def test_agents_messages_compact(sdk, actor, llm):
    agent = new_agent(actor)
    seed(actor, agent, None, "I am Sam", "Hi Sam", "I like tea", "Noted")
    llm.push(text("Sam likes tea."))

    result = sdk.agents.messages.compact(agent.id, compaction_settings={"mode": "all"})

    assert (result.summary, result.num_messages_before, result.num_messages_after) == ("Sam likes tea.", 4, 1)
    assert len(Agent.objects.for_actor(actor).get().message_ids) == 1
