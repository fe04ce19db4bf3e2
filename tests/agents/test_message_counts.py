"""Stored messages per agent and per conversation, kept by database triggers (migration agents 0005):
the recall count in every system message is read from them, not counted at each run."""

import pytest

from apps.agents.models import Agent, Conversation, Message
from apps.agents.services import MessageIn, conversation_create, run_create
from apps.agents.system_messages import THREAD_SYSTEM_MESSAGE
from tests.support.migrations import migrated_from
from tests.support.scripted_llm import text

pytestmark = pytest.mark.django_db


def stored(agent: Agent, conversation: Conversation | None = None) -> int:
    """Messages between agent and user: the thread's stored system message is not one (migration 0010)."""
    messages = Message.all_objects.filter(agent=agent, conversation=conversation)
    return messages.exclude(THREAD_SYSTEM_MESSAGE).count()


def test_counts_follow_every_insert_and_delete(make_agent, actor, llm, send):
    agent = make_agent(embedding="")
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    llm.push(text("one"), text("two"))
    send(agent, "hello")
    run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="a"), MessageIn(content="b")])
    send(agent, "in a thread", conversation_id=conversation.id)

    agent.refresh_from_db()
    conversation.refresh_from_db()
    assert agent.message_count == stored(agent) > 0
    assert conversation.message_count == stored(agent, conversation) == 2

    Message.all_objects.filter(agent=agent, conversation=None, role="user").delete()
    agent.refresh_from_db()
    assert agent.message_count == stored(agent)
    assert Message.all_objects.filter(THREAD_SYSTEM_MESSAGE, agent=agent).count() == 2  # one per thread


def test_the_system_message_reports_the_messages_out_of_context(make_agent, actor, llm, send):
    agent = make_agent(embedding="")
    llm.configure(strict=False, default_turn={"content": "ok"})
    for i in range(3):
        send(agent, f"message {i}")
    agent.refresh_from_db()
    Agent.all_objects.filter(id=agent.id).update(message_ids=agent.message_ids[:1] + agent.message_ids[-2:])
    out_of_context = stored(agent) - 3

    send(agent, "how much do you remember?")

    system = llm.chat_requests()[-1]["messages"][0]["content"]
    # The new input and its reply joined the context and the stored messages alike.
    assert f"- {out_of_context} earlier messages between you and the user are no longer in context" in system


@pytest.mark.django_db(transaction=True)
def test_the_migration_counts_the_messages_already_stored(make_agent, actor):
    agent = make_agent(embedding="")
    with migrated_from([("agents", "0004_step_trace_compressed")]) as (old_apps, forward):
        OldMessage = old_apps.get_model("agents", "Message")
        for i in range(4):
            OldMessage._default_manager.create(
                organization_id=agent.organization_id,
                agent_id=agent.id,
                role="user",
                text=f"m{i}",
                content=[],
            )
        forward([("agents", "0005_message_counts")])

        agent.refresh_from_db()
        assert agent.message_count == stored(agent) >= 4


def test_saving_a_loaded_agent_or_conversation_keeps_the_messages_stored_since(make_agent, actor, llm, send):
    agent = make_agent(embedding="")
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    loaded_agent = Agent.all_objects.get(id=agent.id)
    loaded_conversation = Conversation.all_objects.get(id=conversation.id)
    llm.push(text("stored meanwhile"), text("also in the thread"))
    send(agent, "hello")
    send(agent, "thread", conversation_id=conversation.id)

    loaded_agent.name = "Renamed"
    loaded_agent.save()  # a full save, as the admin's change form does
    loaded_conversation.summary = "renamed too"
    loaded_conversation.save()

    agent.refresh_from_db()
    conversation.refresh_from_db()
    assert agent.name == "Renamed"
    assert agent.message_count == stored(agent)
    assert conversation.message_count == stored(agent, conversation) == 2
