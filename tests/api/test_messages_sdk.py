"""The official Letta SDK (letta-client 1.12.1, unpatched) against a live server.

The server is pytest-django's threaded WSGI live server in this process; runs execute in a real Celery
worker process calling the scripted LLM. Nothing leaves the loopback interface.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from letta_client import ConflictError, Letta

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.models import Message, Run
from apps.api import sse
from apps.core.actor import Actor
from apps.memory.models import Block
from tests.api.test_messages_api import NEEDS_APPROVAL, insert_call, new_agent
from tests.support.scripted_llm import text, tool_call, tool_calls

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


@pytest.fixture
def sdk(live_server: Any, actor: Actor, monkeypatch: pytest.MonkeyPatch) -> Letta:
    monkeypatch.setattr(sse, "FOLLOW_TIMEOUT_S", 30.0)
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk")
    return Letta(base_url=live_server.url, api_key=key.raw_key, timeout=30)


def user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def message_types(items: Any) -> list[str]:
    return [item.message_type for item in items]


def test_the_agent_remembers_the_user_through_its_memory_tools(sdk, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "Loves hiking"})),
        text("Nice to meet you, Sam! Hiking is great."),
    )

    response = sdk.agents.messages.create(agent.id, messages=user("My name is Sam and I love hiking"))

    assert message_types(response.messages) == [
        "tool_call_message",
        "tool_return_message",
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
    ]
    assert response.messages[0].tool_call.name == "memory_replace"
    assert response.messages[1].status == "success"
    assert response.messages[-1].content == "Nice to meet you, Sam! Hiking is great."
    assert response.stop_reason.stop_reason == "end_turn"
    assert response.usage.step_count == 3
    human = Block.objects.for_actor(actor).get(label="human").value
    assert "Name: Sam" in human
    assert "Loves hiking" in human


def test_a_streamed_reply_arrives_in_order_and_ends_with_a_stop_reason(sdk, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "Loves hiking"})),
        text("Noted!"),
    )

    stream = sdk.agents.messages.create(agent.id, messages=user("I love hiking"), streaming=True)
    items = list(stream)

    assert message_types(items) == [
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
        "stop_reason",
        "usage_statistics",
    ]
    assert items[2].content == "Noted!"
    assert items[3].stop_reason == "end_turn"
    assert items[4].step_count == 2
    assert [i.seq_id for i in items[:3]] == sorted(i.seq_id for i in items[:3])


def test_token_streaming_through_the_deprecated_stream_method(sdk, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("Hello there, Sam!"))

    with pytest.deprecated_call():
        stream = sdk.agents.messages.stream(agent.id, messages=user("hi"), stream_tokens=True)
    items = list(stream)

    pieces = [i for i in items if i.message_type == "assistant_message"]
    assert len(pieces) > 1
    assert len({p.id for p in pieces}) == 1
    assert "".join(p.content for p in pieces) == "Hello there, Sam!"
    assert items[-2].message_type == "stop_reason"


def test_a_tool_call_is_approved_then_another_denied(sdk, actor, llm, celery_worker):
    agent = new_agent(actor, tool_rules=NEEDS_APPROVAL)
    llm.push(
        tool_calls(insert_call("call_1")),
        text("Saved."),
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "Secret"}, id="call_2")),
        text("I will not save it."),
    )

    asked = sdk.agents.messages.create(agent.id, messages=user("remember I like tea"))
    with pytest.raises(ConflictError) as blocked:
        sdk.agents.messages.create(agent.id, messages=user("are you there?"))
    approved = sdk.agents.messages.create(
        agent.id,
        messages=[
            {
                "type": "approval",
                "approvals": [{"type": "approval", "tool_call_id": "call_1", "approve": True}],
            }
        ],
    )
    asked_again = sdk.agents.messages.create(agent.id, messages=user("and remember my secret"))
    denied = sdk.agents.messages.create(
        agent.id,
        messages=[
            {
                "type": "approval",
                "approvals": [
                    {"type": "approval", "tool_call_id": "call_2", "approve": False, "reason": "no"}
                ],
            }
        ],
    )

    assert message_types(asked.messages) == ["approval_request_message"]
    assert asked.messages[0].tool_call.tool_call_id == "call_1"
    assert asked.stop_reason.stop_reason == "requires_approval"
    assert blocked.value.status_code == 409
    assert blocked.value.body["detail"]["code"] == "PENDING_APPROVAL"
    assert blocked.value.response.headers["x-should-retry"] == "false"
    assert message_types(approved.messages) == ["tool_return_message", "assistant_message"]
    assert asked_again.stop_reason.stop_reason == "requires_approval"
    assert denied.messages[0].status == "error"
    assert denied.messages[0].tool_return == "Error: request to call tool denied. User reason: no"
    human = Block.objects.for_actor(actor).get(label="human").value
    assert "Likes tea" in human
    assert "Secret" not in human
    assert Message.objects.for_actor(actor).filter(role="user").count() == 2


def test_history_pages_through_everything_in_ascending_order(sdk, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("one"), text("two"), text("three"))
    for word in ("first", "second", "third"):
        sdk.agents.messages.create(agent.id, messages=user(word))

    everything = list(sdk.agents.messages.list(agent.id, order="asc", limit=2))
    newest = list(sdk.agents.messages.list(agent.id, limit=2))

    assert everything[0].message_type == "system_message"
    assert [(m.message_type, m.content) for m in everything[1:]] == [
        ("user_message", "first"),
        ("assistant_message", "one"),
        ("user_message", "second"),
        ("assistant_message", "two"),
        ("user_message", "third"),
        ("assistant_message", "three"),
    ]
    assert [m.content for m in newest] == ["third", "three"]


def test_an_async_send_is_polled_then_read(sdk, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("worked in the background", usage={"prompt_tokens": 20, "completion_tokens": 4}))

    run = sdk.agents.messages.create_async(agent.id, messages=user("do it later"))
    deadline = time.monotonic() + 30
    while (current := sdk.runs.retrieve(run.id)).status not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    messages = list(sdk.runs.messages.list(run.id))
    usage = sdk.runs.usage.retrieve(run.id)
    steps = list(sdk.runs.steps.list(run.id))

    assert run.id.startswith("run-")
    assert current.status == "completed"
    assert current.stop_reason == "end_turn"
    assert message_types(messages) == ["user_message", "assistant_message"]
    assert messages[1].content == "worked in the background"
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (20, 4, 24)
    assert [s.run_id for s in steps] == [run.id]
    assert sdk.steps.retrieve(steps[0].id).id == steps[0].id
    assert [r.id for r in sdk.runs.list(agent_id=agent.id)] == [run.id]


def test_a_client_reattaches_to_a_run_and_gets_only_what_it_missed(sdk, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "Hikes"})),
        text("Done."),
    )
    first = list(sdk.agents.messages.create(agent.id, messages=user("note it"), streaming=True))
    run_id = first[0].run_id

    resumed = list(sdk.runs.messages.stream(run_id, starting_after=first[0].seq_id))

    assert message_types(resumed) == [
        "tool_return_message",
        "assistant_message",
        "stop_reason",
        "usage_statistics",
    ]
    assert [m.id for m in resumed[:2]] == [m.id for m in first[1:3]]
    assert Run.objects.for_actor(actor).count() == 1
