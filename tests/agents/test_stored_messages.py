"""The in-context messages a process keeps once loaded (apps.agents.loop.stored_messages)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.agents.loop import stored_messages
from apps.agents.models import Agent
from tests.support.scripted_llm import text

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def empty_store():
    stored_messages.forget_all()
    yield
    stored_messages.forget_all()


def in_context_ids(agent) -> list[str]:
    return Agent.all_objects.get(id=agent.id).message_ids


def test_a_run_fetches_only_the_messages_this_process_has_not_seen(make_agent, actor, llm, send):
    agent = make_agent(embedding="")
    llm.push(text("Hi!"), text("Still here."))
    send(agent, "hello")
    stored_messages.in_context_messages(actor, in_context_ids(agent))  # what the next run loads first
    send(agent, "are you there?")
    ids = in_context_ids(agent)

    with CaptureQueriesContext(connection) as captured:
        messages = stored_messages.in_context_messages(actor, ids)

    assert [m.id for m in messages] == ids
    assert [m.text for m in messages[-2:]] == ["are you there?", "Still here."]
    fetched = [q["sql"] for q in captured.captured_queries]
    assert len(fetched) == 1
    # The second run loaded its own input with the rest; only its reply is new to this process.
    assert ids[-1] in fetched[0]
    assert not any(message_id in fetched[0] for message_id in ids[:-1])


def test_kept_messages_cost_no_query(make_agent, actor, llm, send):
    agent = make_agent(embedding="")
    llm.push(text("Hi!"))
    send(agent, "hello")
    ids = in_context_ids(agent)
    first = stored_messages.in_context_messages(actor, ids)

    with CaptureQueriesContext(connection) as captured:
        again = stored_messages.in_context_messages(actor, ids)

    assert captured.captured_queries == []
    assert [m.id for m in again] == [m.id for m in first]


def test_another_organisation_never_gets_kept_messages(make_agent, actor, other_org_actor, llm, send):
    agent = make_agent(embedding="")
    llm.push(text("A secret reply."))
    send(agent, "my secret")
    ids = in_context_ids(agent)
    stored_messages.in_context_messages(actor, ids)

    assert stored_messages.in_context_messages(other_org_actor, ids) == []


def test_the_store_keeps_at_most_its_size(settings, make_agent, actor, llm, send):
    settings.MESSAGE_CACHE_SIZE = 1
    agent = make_agent(embedding="")
    llm.push(text("Hi!"))
    send(agent, "hello")
    ids = in_context_ids(agent)
    stored_messages.in_context_messages(actor, ids)

    with CaptureQueriesContext(connection) as captured:
        messages = stored_messages.in_context_messages(actor, ids)

    assert [m.id for m in messages] == ids
    assert len(ids) > 1
    assert len(captured.captured_queries) == 1  # the ones that no longer fit
