"""POST/GET /v1/agents/{agent_id}/messages and friends, through DRF's APIClient.

Sends run for real: the view persists the input and a Run, a Celery worker process executes it against
the scripted LLM, and the view answers from the run's event stream.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from apps.agents.models import Agent, Message, Run
from apps.agents.services import BlockSpec, agent_create
from apps.agents.system_messages import THREAD_SYSTEM_MESSAGE, thread_system_message_id
from apps.api import sse
from apps.core.actor import Actor
from apps.memory.models import Block
from tests.factories import MessageFactory
from tests.support.scripted_llm import error, text, tool_call, tool_calls

worker = pytest.mark.django_db(transaction=True)
AUTH_QUERIES = 1
"""Queries the API-key authentication of a request costs: the key with its user and membership (once the
key's last use is stamped)."""


# --- helpers (imported by the other API test modules) -----------------------------------------------------


def new_agent(actor: Actor, **kwargs: Any) -> Agent:
    kwargs.setdefault("name", "Assistant")
    kwargs.setdefault("model", "openai/gpt-4o-mini")
    kwargs.setdefault(
        "memory_blocks",
        [
            BlockSpec(label="human", value="Name: unknown", limit=2000),
            BlockSpec(label="persona", value="I am a helpful assistant.", limit=2000),
        ],
    )
    return agent_create(actor=actor, **kwargs)


def sse_events(response: Any) -> list[tuple[str | None, Any]]:
    """(event name, data) pairs of an SSE response; data is parsed JSON, or the raw text ([DONE])."""
    body = b"".join(response.streaming_content).decode()
    events = []
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.splitlines():
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        raw = "\n".join(data)
        events.append((name, raw if raw == "[DONE]" else json.loads(raw)))
    return events


def types(messages: list[dict[str, Any]]) -> list[str]:
    return [m["message_type"] for m in messages]


def send(client: APIClient, agent_id: str, body: dict[str, Any], **headers: Any) -> Any:
    return client.post(f"/v1/agents/{agent_id}/messages", body, format="json", **headers)


def user(content: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content, **extra}]}


NEEDS_APPROVAL = [{"type": "requires_approval", "tool_name": "memory_insert"}]


def insert_call(call_id: str = "call_ins") -> dict[str, str]:
    return tool_call("memory_insert", {"label": "human", "new_string": "Likes tea"}, id=call_id)


@pytest.fixture
def client(actor: Actor, api_client_for: Any) -> APIClient:
    return api_client_for(actor)


@pytest.fixture
def short_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken stream fails the test in seconds instead of hanging it."""
    monkeypatch.setattr(sse, "FOLLOW_TIMEOUT_S", 30.0)


# --- blocking send ----------------------------------------------------------------------------------------


@worker
def test_a_blocking_send_answers_with_what_the_agent_did(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        text("Nice to meet you, Sam!"),
    )

    response = send(client, agent.id, user("My name is Sam"))

    body = response.json()
    assert response.status_code == 200
    assert types(body["messages"]) == ["tool_call_message", "tool_return_message", "assistant_message"]
    assert body["messages"][0]["tool_call"]["name"] == "memory_replace"
    assert body["messages"][2]["content"] == "Nice to meet you, Sam!"
    assert body["stop_reason"] == {"message_type": "stop_reason", "stop_reason": "end_turn"}
    assert body["usage"]["step_count"] == 2
    run = Run.objects.for_actor(actor).get()
    assert (run.status, body["usage"]["run_ids"]) == ("completed", [run.id])
    assert Block.objects.for_actor(actor).get(label="human").value == "Name: Sam"


@worker
def test_input_is_sugar_for_one_user_message(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("Hello"))

    response = send(client, agent.id, {"input": "hi via input"})

    assert types(response.json()["messages"]) == ["assistant_message"]
    assert Message.objects.for_actor(actor).get(role="user").text == "hi via input"


@worker
def test_include_return_message_types_filters_the_response(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("Hello", reasoning="Greet back."))

    response = send(client, agent.id, {**user("hi"), "include_return_message_types": ["assistant_message"]})

    assert types(response.json()["messages"]) == ["assistant_message"]


@worker
def test_a_resent_message_with_the_same_otid_is_answered_from_the_first_run(
    client, actor, llm, celery_worker
):
    agent = new_agent(actor)
    llm.push(text("Only once"))
    body = user("hello", otid="otid-123")

    first = send(client, agent.id, body)
    again = send(client, agent.id, body)

    assert first.json()["messages"] == again.json()["messages"]
    assert Run.objects.for_actor(actor).count() == 1
    assert Message.objects.for_actor(actor).filter(role="user").count() == 1
    assert len(llm.chat_requests()) == 1


@worker
def test_a_send_still_running_at_the_client_deadline_is_504_and_not_retried(
    client, actor, llm, celery_worker
):
    agent = new_agent(actor)
    llm.push(text("slow answer", latency=4))

    response = send(client, agent.id, user("take your time"), HTTP_X_STAINLESS_READ_TIMEOUT="6")

    run = Run.objects.for_actor(actor).get()
    assert response.status_code == 504
    assert response["x-should-retry"] == "false"
    assert response.json()["run_id"] == run.id
    assert response.json()["code"] == "RUN_STILL_RUNNING"
    collected = client.post(f"/v1/runs/{run.id}/stream", {}, format="json")
    assert [
        d["stop_reason"] for _, d in sse_events(collected) if isinstance(d, dict) and "stop_reason" in d
    ] == ["end_turn"]
    assert Run.objects.for_actor(actor).count() == 1


@worker
def test_an_llm_failure_is_a_502_the_sdk_does_not_retry(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(error(500, "provider down", times=3))

    response = send(client, agent.id, user("hi"))

    assert response.status_code == 502
    assert response["x-should-retry"] == "false"
    assert response.json()["stop_reason"] == "llm_api_error"
    assert Run.objects.for_actor(actor).get().status == "failed"


# --- streaming --------------------------------------------------------------------------------------------


@worker
def test_streaming_answers_sse_even_when_json_is_accepted(client, actor, llm, celery_worker, short_streams):
    agent = new_agent(actor)
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "Hikes"})),
        text("Noted!"),
    )

    response = send(client, agent.id, {**user("I hike"), "streaming": True}, HTTP_ACCEPT="application/json")

    events = sse_events(response)
    data = [d for _, d in events]
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    assert response["X-Accel-Buffering"] == "no"
    assert [d["message_type"] if isinstance(d, dict) else d for d in data] == [
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
        "stop_reason",
        "usage_statistics",
        "[DONE]",
    ]
    assert [d["seq_id"] for d in data[:3]] == sorted(d["seq_id"] for d in data[:3])
    assert data[3]["stop_reason"] == "end_turn"
    assert all(name is None for name, _ in events)


@worker
def test_token_streaming_sends_pieces_that_share_one_id(client, actor, llm, celery_worker, short_streams):
    agent = new_agent(actor)
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "Hikes"}, id="call_t")),
        text("Noted that you like hiking!", reasoning="Save it then answer."),
    )

    response = send(client, agent.id, {**user("I hike"), "streaming": True, "stream_tokens": True})

    items = [d for _, d in sse_events(response) if isinstance(d, dict)]
    calls = [i for i in items if i["message_type"] == "tool_call_message"]
    answers = [i for i in items if i["message_type"] == "assistant_message"]
    reasoning = [i for i in items if i["message_type"] == "reasoning_message"]
    assert len(calls) > 1
    assert {c["id"] for c in calls} != {None}
    assert len({c["id"] for c in calls}) == 1
    assert "".join(c["tool_call"]["arguments"] for c in calls) == json.dumps(
        {"label": "human", "new_string": "Hikes"}
    )
    assert len(answers) > 1
    assert len({a["id"] for a in answers}) == 1
    assert "".join(a["content"] for a in answers) == "Noted that you like hiking!"
    assert "".join(r["reasoning"] for r in reasoning) == "Save it then answer."
    assert [i["message_type"] for i in items][-2:] == ["stop_reason", "usage_statistics"]
    assert sum(1 for i in items if i["message_type"] == "tool_return_message") == 1


@worker
def test_the_deprecated_stream_endpoint_always_streams(client, actor, llm, celery_worker, short_streams):
    agent = new_agent(actor)
    llm.push(text("streamed"))

    response = client.post(f"/v1/agents/{agent.id}/messages/stream", user("hi"), format="json")

    data = [d for _, d in sse_events(response)]
    assert data[0]["content"] == "streamed"
    assert data[-1] == "[DONE]"


@worker
def test_a_failed_run_ends_its_stream_with_an_error_event(client, actor, llm, celery_worker, short_streams):
    agent = new_agent(actor)
    llm.push(error(500, "provider down", times=3))

    response = send(client, agent.id, {**user("hi"), "streaming": True})

    events = sse_events(response)
    assert events[0][1]["stop_reason"] == "llm_api_error"
    assert events[-2][0] == "error"
    assert events[-2][1]["message_type"] == "error_message"
    assert events[-2][1]["error_type"] == "llm_api_error"
    assert events[-1] == (None, "[DONE]")


@worker
def test_pings_keep_an_idle_stream_alive(client, actor, llm, celery_worker, short_streams, monkeypatch):
    monkeypatch.setattr(sse, "PING_INTERVAL_S", 0.5)
    agent = new_agent(actor)
    llm.push(text("after a pause", latency=3))

    response = send(client, agent.id, {**user("hi"), "streaming": True})

    data = [d for _, d in sse_events(response) if isinstance(d, dict)]
    pings = [d for d in data if d["message_type"] == "ping"]
    assert len(pings) >= 2
    assert all(p["id"].startswith("ping-") and p["date"] for p in pings)
    assert data[-3]["content"] == "after a pause"


@worker
def test_no_pings_when_the_request_says_so(client, actor, llm, celery_worker, short_streams, monkeypatch):
    monkeypatch.setattr(sse, "PING_INTERVAL_S", 0.5)
    agent = new_agent(actor)
    llm.push(text("after a pause", latency=2))

    response = send(client, agent.id, {**user("hi"), "streaming": True, "include_pings": False})

    assert "ping" not in [d.get("message_type") for _, d in sse_events(response) if isinstance(d, dict)]


# --- async, cancel ----------------------------------------------------------------------------------------


@worker
def test_async_send_returns_a_run_to_poll(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("done in the background"))

    response = client.post(f"/v1/agents/{agent.id}/messages/async", user("work"), format="json")

    run = response.json()
    assert response.status_code == 200
    assert run["id"].startswith("run-")
    assert run["agent_id"] == agent.id
    assert run["status"] in ("created", "running", "completed")
    assert run["background"] is True
    collected = client.post(f"/v1/runs/{run['id']}/stream", {}, format="json")
    assert [d for _, d in sse_events(collected)][-1] == "[DONE]"
    assert client.get(f"/v1/runs/{run['id']}").json()["status"] == "completed"
    messages = client.get(f"/v1/runs/{run['id']}/messages").json()
    assert types(messages) == ["user_message", "assistant_message"]


@worker
def test_cancel_stops_the_agents_active_run(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("never shown", latency=3))
    run_id = client.post(f"/v1/agents/{agent.id}/messages/async", user("work"), format="json").json()["id"]

    response = client.post(f"/v1/agents/{agent.id}/messages/cancel", {}, format="json")

    assert response.status_code == 200
    assert response.json() == {run_id: "cancelled"}
    assert Run.objects.for_actor(actor).get(id=run_id).status == "cancelled"


@pytest.mark.django_db
def test_cancel_with_nothing_active_is_a_409_not_retried(client, actor):
    agent = new_agent(actor)

    response = client.post(f"/v1/agents/{agent.id}/messages/cancel", {}, format="json")

    assert response.status_code == 409
    assert response["x-should-retry"] == "false"


@pytest.mark.django_db
def test_cancel_of_another_agents_run_is_404(client, actor):
    agent, other = new_agent(actor), new_agent(actor, name="Other")
    run = Run.objects.for_actor(actor).create(agent=other)

    response = client.post(f"/v1/agents/{agent.id}/messages/cancel", {"run_ids": [run.id]}, format="json")

    assert response.status_code == 404
    run.refresh_from_db()
    assert run.status == "created"


@pytest.mark.django_db
def test_cancel_given_run_ids(client, actor):
    agent = new_agent(actor)
    run = Run.objects.for_actor(actor).create(agent=agent)

    response = client.post(f"/v1/agents/{agent.id}/messages/cancel", {"run_ids": [run.id]}, format="json")

    assert response.json() == {run.id: "cancelled"}


# --- approvals --------------------------------------------------------------------------------------------


@worker
def test_a_call_needing_approval_stops_and_blocks_new_messages_with_409(client, actor, llm, celery_worker):
    agent = new_agent(actor, tool_rules=NEEDS_APPROVAL)
    llm.push(tool_calls(insert_call()))

    first = send(client, agent.id, user("remember I like tea"))
    blocked = send(client, agent.id, user("hello?"))
    blocked_stream = send(client, agent.id, {**user("hello?"), "streaming": True})

    body = first.json()
    assert types(body["messages"]) == ["approval_request_message"]
    assert body["stop_reason"]["stop_reason"] == "requires_approval"
    request_id = body["messages"][0]["id"]
    assert blocked.status_code == 409
    assert blocked["x-should-retry"] == "false"
    assert blocked.json()["detail"]["code"] == "PENDING_APPROVAL"
    assert blocked.json()["detail"]["pending_request_id"] == request_id
    assert blocked_stream.status_code == 409
    assert blocked_stream["x-should-retry"] == "false"
    assert blocked_stream.json()["detail"].startswith("Cannot send a new message")
    assert Message.objects.for_actor(actor).filter(role="user").count() == 1


@worker
def test_the_agent_shows_its_pending_approval_when_asked(client, actor, llm, celery_worker):
    agent = new_agent(actor, tool_rules=NEEDS_APPROVAL)
    llm.push(tool_calls(insert_call()))
    request_id = send(client, agent.id, user("remember I like tea")).json()["messages"][0]["id"]

    asked = client.get(f"/v1/agents/{agent.id}", {"include": "agent.pending_approval"}).json()
    [listed] = client.get("/v1/agents/", {"include": "agent.pending_approval"}).json()
    plain = client.get(f"/v1/agents/{agent.id}").json()
    updated = client.patch(f"/v1/agents/{agent.id}", {"description": "Waits"}, format="json").json()

    pending = asked["pending_approval"]
    assert (pending["id"], pending["message_type"]) == (request_id, "approval_request_message")
    assert pending["tool_call"]["name"] == "memory_insert"
    assert listed["pending_approval"] == pending
    assert plain["pending_approval"] is None
    assert (updated["description"], updated["pending_approval"]) == ("Waits", None)  # only when asked for
    assert updated["blocks"]  # every other relationship, as on Letta


@worker
def test_approving_runs_the_tool_and_the_loop_goes_on(client, actor, llm, celery_worker):
    agent = new_agent(actor, tool_rules=NEEDS_APPROVAL)
    llm.push(tool_calls(insert_call()), text("Saved."))
    send(client, agent.id, user("remember I like tea"))

    approval = {
        "type": "approval",
        "approvals": [{"type": "approval", "tool_call_id": "call_ins", "approve": True}],
    }
    response = send(client, agent.id, {"messages": [approval]})

    body = response.json()
    assert types(body["messages"]) == ["tool_return_message", "assistant_message"]
    assert body["messages"][0]["status"] == "success"
    assert "Likes tea" in Block.objects.for_actor(actor).get(label="human").value


@worker
def test_denying_with_the_legacy_form_returns_an_error_to_the_model(client, actor, llm, celery_worker):
    agent = new_agent(actor, tool_rules=NEEDS_APPROVAL)
    llm.push(tool_calls(insert_call()), text("Understood, I will not."))
    send(client, agent.id, user("remember I like tea"))

    response = send(
        client,
        agent.id,
        {"messages": [{"approve": False, "approval_request_id": "call_ins", "reason": "private"}]},
    )

    tool_return = response.json()["messages"][0]
    assert tool_return["status"] == "error"
    assert tool_return["tool_return"] == "Error: request to call tool denied. User reason: private"
    assert "Likes tea" not in Block.objects.for_actor(actor).get(label="human").value
    history = types(client.get(f"/v1/agents/{agent.id}/messages", {"order": "asc"}).json())
    assert history[-3:] == ["approval_response_message", "tool_return_message", "assistant_message"]


@worker
def test_an_approval_for_the_wrong_call_is_a_400(client, actor, llm, celery_worker):
    agent = new_agent(actor, tool_rules=NEEDS_APPROVAL)
    llm.push(tool_calls(insert_call()))
    send(client, agent.id, user("remember I like tea"))

    response = send(
        client,
        agent.id,
        {"messages": [{"type": "approval", "approvals": [{"tool_call_id": "call_nope", "approve": True}]}]},
    )

    assert response.status_code == 400
    assert response.json()["detail"] == (
        "Invalid tool call IDs. Expected '['call_ins']', but received '['call_nope']'."
    )
    assert Run.objects.for_actor(actor).count() == 1


@pytest.mark.django_db
def test_an_approval_with_nothing_pending_is_a_400(client, actor):
    agent = new_agent(actor)

    response = send(
        client,
        agent.id,
        {"messages": [{"type": "approval", "approvals": [{"tool_call_id": "x", "approve": True}]}]},
    )

    assert response.status_code == 400
    assert response.json()["detail"] == (
        "Cannot process approval response: No tool call is currently awaiting approval. "
        "Please send a regular message to interact with the agent."
    )
    assert not Run.objects.for_actor(actor).exists()


# --- malformed bodies -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": []},
        {"messages": [{"role": "user", "content": "a"}], "input": "b"},
        {"messages": [{"role": "robot", "content": "a"}]},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
        {"messages": [{"type": "approval", "approvals": [{"tool_call_id": "c"}]}]},
        {"input": "x", "max_steps": 0},
        {"input": "x", "include_return_message_types": ["nonsense"]},
    ],
)
@pytest.mark.django_db
def test_a_malformed_body_is_a_422_and_creates_nothing(client, actor, body):
    agent = new_agent(actor)

    response = send(client, agent.id, body)

    assert response.status_code == 422
    assert isinstance(response.json()["detail"], str)
    assert not Run.objects.for_actor(actor).exists()


# --- history ----------------------------------------------------------------------------------------------


def _history(actor: Actor, agent: Agent, count: int) -> list[Message]:
    return [
        MessageFactory(organization_id=actor.organization_id, agent=agent, text=f"m{i}") for i in range(count)
    ]


@pytest.mark.django_db
def test_history_desc_gives_the_newest_page_in_chronological_order(client, actor):
    agent = new_agent(actor)
    messages = _history(actor, agent, 5)

    page = client.get(f"/v1/agents/{agent.id}/messages", {"limit": 2}).json()
    after_newest = client.get(f"/v1/agents/{agent.id}/messages", {"limit": 2, "after": page[-1]["id"]}).json()
    older = client.get(f"/v1/agents/{agent.id}/messages", {"limit": 2, "before": page[0]["id"]}).json()

    assert [m["id"] for m in page] == [messages[3].id, messages[4].id]
    assert after_newest == []
    assert [m["id"] for m in older] == [messages[1].id, messages[2].id]


@pytest.mark.django_db
def test_history_asc_walks_everything_with_after(client, actor):
    agent = new_agent(actor)
    messages = _history(actor, agent, 5)

    seen, after = [], None
    for _ in range(10):
        query = {"limit": 2, "order": "asc"} | ({"after": after} if after else {})
        page = client.get(f"/v1/agents/{agent.id}/messages", query).json()
        if not page:
            break
        seen += [m["id"] for m in page]
        after = page[-1]["id"]

    assert seen == [thread_system_message_id(agent.id, None), *(m.id for m in messages)]


@pytest.mark.django_db
def test_history_hides_system_alerts_unless_asked(client, actor):
    agent = new_agent(actor)
    MessageFactory(organization_id=actor.organization_id, agent=agent, role="system", text="alert")
    MessageFactory(organization_id=actor.organization_id, agent=agent, text="hi")

    default = client.get(f"/v1/agents/{agent.id}/messages").json()
    everything = client.get(f"/v1/agents/{agent.id}/messages", {"include_system": "true"}).json()

    # The thread's own system message is always listed first; other system messages only when asked.
    assert [m["id"] for m in default][:1] == [thread_system_message_id(agent.id, None)]
    assert types(default) == ["system_message", "user_message"]
    assert types(everything) == ["system_message", "system_message", "user_message"]
    assert everything[1]["content"] == "alert"


@pytest.mark.django_db
def test_history_filters_by_type_and_conversation(client, actor):
    agent = new_agent(actor)
    conversation = agent.conversations.create(organization_id=actor.organization_id)
    MessageFactory(organization_id=actor.organization_id, agent=agent, text="main")
    in_conv = MessageFactory(organization_id=actor.organization_id, agent=agent, conversation=conversation)

    main = client.get(f"/v1/agents/{agent.id}/messages").json()
    conv = client.get(f"/v1/agents/{agent.id}/messages", {"conversation_id": conversation.id}).json()
    none = client.get(
        f"/v1/agents/{agent.id}/messages", {"include_return_message_types": "assistant_message"}
    ).json()

    assert [m["content"] for m in main][1:] == ["main"]
    assert [m["id"] for m in conv] == [in_conv.id]  # made without the API: it has no system message
    assert none == []


@pytest.mark.django_db
def test_history_costs_the_same_queries_however_long(client, actor):
    agent = new_agent(actor)
    first = _history(actor, agent, 2)[0]
    query = {"after": first.id, "include_return_message_types": "user_message"}
    client.get(f"/v1/agents/{agent.id}/messages")  # the key's first use is stamped: one more query

    with CaptureQueriesContext(connection) as short:
        client.get(f"/v1/agents/{agent.id}/messages", query)
    _history(actor, agent, 20)
    with CaptureQueriesContext(connection) as long:
        response = client.get(f"/v1/agents/{agent.id}/messages", query)

    assert len(response.json()) == 21
    assert len(long.captured_queries) == len(short.captured_queries) == AUTH_QUERIES + 2


@pytest.mark.django_db
def test_global_message_list_and_retrieve(client, actor, other_org_actor):
    agent = new_agent(actor)
    mine = MessageFactory(organization_id=actor.organization_id, agent=agent, text="mine")
    new_agent_other = new_agent(other_org_actor)
    MessageFactory(organization_id=other_org_actor.organization_id, agent=new_agent_other, text="theirs")

    listed = client.get("/v1/messages/").json()
    retrieved = client.get(f"/v1/messages/{mine.id}").json()

    assert [m["content"] for m in listed][1:] == ["mine"]  # after its agent's system message
    assert listed[0]["message_type"] == "system_message"
    assert retrieved == [listed[1]]


# --- reset ------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_reset_empties_the_context_window_and_keeps_history(client, actor):
    agent = new_agent(actor)
    messages = _history(actor, agent, 2)
    Agent.objects.for_actor(actor).filter(id=agent.id).update(message_ids=[m.id for m in messages])

    response = client.patch(f"/v1/agents/{agent.id}/reset-messages", {}, format="json")

    assert response.status_code == 200
    assert response.json()["id"] == agent.id
    agent.refresh_from_db()
    assert agent.message_ids == []
    assert types(client.get(f"/v1/agents/{agent.id}/messages").json()) == [
        "system_message",
        "user_message",
        "user_message",
    ]


# --- tenancy and authentication for every endpoint ----------------------------------------------------------

AGENT_ENDPOINTS = [
    ("get", "/v1/agents/{agent}/messages", None),
    ("post", "/v1/agents/{agent}/messages", {"input": "hi"}),
    ("post", "/v1/agents/{agent}/messages", {"input": "hi", "streaming": True}),
    ("post", "/v1/agents/{agent}/messages/stream", {"input": "hi"}),
    ("post", "/v1/agents/{agent}/messages/async", {"input": "hi"}),
    ("post", "/v1/agents/{agent}/messages/cancel", {}),
    ("patch", "/v1/agents/{agent}/reset-messages", {}),
    ("get", "/v1/messages/{message}", None),
]


@pytest.mark.parametrize(("method", "path", "body"), AGENT_ENDPOINTS)
@pytest.mark.django_db
def test_another_organisation_gets_404_and_changes_nothing(
    api_client_for, actor, other_org_actor, method, path, body
):
    agent = new_agent(actor)
    message = MessageFactory(organization_id=actor.organization_id, agent=agent)
    Agent.objects.for_actor(actor).filter(id=agent.id).update(message_ids=[message.id])

    response = getattr(api_client_for(other_org_actor), method)(
        path.format(agent=agent.id, message=message.id), body, format="json"
    )

    assert response.status_code == 404
    assert "not found" in response.json()["detail"]
    assert not Run.objects.for_actor(actor).exists()
    assert Message.objects.for_actor(actor).exclude(THREAD_SYSTEM_MESSAGE).count() == 1
    agent.refresh_from_db()
    assert agent.message_ids == [message.id]


@pytest.mark.parametrize(("method", "path", "body"), [*AGENT_ENDPOINTS, ("get", "/v1/messages/", None)])
@pytest.mark.django_db
def test_no_key_is_401(actor, method, path, body):
    agent = new_agent(actor)
    message = MessageFactory(organization_id=actor.organization_id, agent=agent)

    response = getattr(APIClient(), method)(
        path.format(agent=agent.id, message=message.id), body, format="json"
    )

    assert response.status_code == 401
    assert not Run.objects.for_actor(actor).exists()


@pytest.mark.django_db
def test_another_organisations_list_sees_nothing(api_client_for, actor, other_org_actor):
    agent = new_agent(actor)
    MessageFactory(organization_id=actor.organization_id, agent=agent)

    response = api_client_for(other_org_actor).get("/v1/messages/")

    assert response.json() == []


# --- conversations ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_conversations_are_created_listed_and_retrieved(client, actor):
    agent = new_agent(actor)

    created = client.post(f"/v1/conversations/?agent_id={agent.id}", {"summary": "trip"}, format="json")
    listed = client.get("/v1/conversations/", {"agent_id": agent.id}).json()
    retrieved = client.get(f"/v1/conversations/{created.json()['id']}").json()

    assert created.status_code == 200
    assert created.json()["id"].startswith("conv-")
    assert created.json()["agent_id"] == agent.id
    assert [c["summary"] for c in listed] == ["trip"]
    assert retrieved["id"] == created.json()["id"]


@pytest.mark.django_db
def test_creating_a_conversation_needs_an_agent_id(client, actor):
    response = client.post("/v1/conversations/", {}, format="json")

    assert response.status_code == 422


@worker
def test_a_conversation_has_its_own_thread(client, actor, llm, celery_worker, short_streams):
    agent = new_agent(actor)
    conversation = client.post(f"/v1/conversations/?agent_id={agent.id}", {}, format="json").json()
    llm.push(text("in the conversation"), text("in the default thread"))

    streamed = client.post(
        f"/v1/conversations/{conversation['id']}/messages", user("hi there"), format="json"
    )
    default = client.post(
        "/v1/conversations/default/messages", {**user("hello"), "agent_id": agent.id}, format="json"
    )

    streamed_types = [d["message_type"] if isinstance(d, dict) else d for _, d in sse_events(streamed)]
    assert streamed_types == ["assistant_message", "stop_reason", "usage_statistics", "[DONE]"]
    assert [d for _, d in sse_events(default)][-1] == "[DONE]"
    in_conversation = client.get(f"/v1/conversations/{conversation['id']}/messages", {"order": "asc"}).json()
    in_default = client.get(f"/v1/agents/{agent.id}/messages", {"order": "asc"}).json()
    assert [m.get("content") for m in in_conversation][1:] == ["hi there", "in the conversation"]
    assert [m.get("content") for m in in_default][1:] == ["hello", "in the default thread"]
    assert in_conversation[0]["id"] == thread_system_message_id(agent.id, conversation["id"])
    assert in_default[0]["id"] == thread_system_message_id(agent.id, None)


@pytest.mark.django_db
def test_a_conversation_with_no_active_run_cannot_be_cancelled(client, actor):
    agent = new_agent(actor)
    conversation = agent.conversations.create(organization_id=actor.organization_id)

    response = client.post(f"/v1/conversations/{conversation.id}/cancel", {}, format="json")

    assert response.status_code == 409


CONVERSATION_ENDPOINTS = [
    ("get", "/v1/conversations/{conversation}", None),
    ("get", "/v1/conversations/{conversation}/messages", None),
    ("post", "/v1/conversations/{conversation}/messages", {"input": "hi"}),
    ("post", "/v1/conversations/{conversation}/stream", {}),
    ("post", "/v1/conversations/{conversation}/cancel", {}),
]


@pytest.mark.parametrize(("method", "path", "body"), CONVERSATION_ENDPOINTS)
@pytest.mark.django_db
def test_another_organisation_gets_404_for_a_conversation(
    api_client_for, actor, other_org_actor, method, path, body
):
    agent = new_agent(actor)
    conversation = agent.conversations.create(organization_id=actor.organization_id)

    response = getattr(api_client_for(other_org_actor), method)(
        path.format(conversation=conversation.id), body, format="json"
    )

    assert response.status_code == 404
    assert not Run.objects.for_actor(actor).exists()
    assert not Message.objects.for_actor(actor).exclude(THREAD_SYSTEM_MESSAGE).exists()


@pytest.mark.django_db
def test_another_organisation_cannot_open_a_conversation_on_an_agent(api_client_for, actor, other_org_actor):
    agent = new_agent(actor)

    response = api_client_for(other_org_actor).post(
        f"/v1/conversations/?agent_id={agent.id}", {}, format="json"
    )

    assert response.status_code == 404
    assert not agent.conversations.exists()


@pytest.mark.parametrize(
    ("method", "path", "body"), [*CONVERSATION_ENDPOINTS, ("get", "/v1/conversations/", None)]
)
@pytest.mark.django_db
def test_no_key_is_401_for_conversations(actor, method, path, body):
    agent = new_agent(actor)
    conversation = agent.conversations.create(organization_id=actor.organization_id)

    response = getattr(APIClient(), method)(path.format(conversation=conversation.id), body, format="json")

    assert response.status_code == 401


# --- max_steps is bounded (issue 16) ------------------------------------------------------------------------


def send_async(client: APIClient, agent_id: str, **fields: Any) -> Any:
    """An async send: the run is stored, and (outside a transactional test) never submitted."""
    return client.post(f"/v1/agents/{agent_id}/messages/async", {**user("work"), **fields}, format="json")


def stored_max_steps(actor: Actor) -> list[int]:
    return [run.request_config["max_steps"] for run in Run.objects.for_actor(actor).order_by("created_at")]


@pytest.mark.django_db
def test_the_default_send_and_max_steps_up_to_the_limit_pass(client, actor):
    agent = new_agent(actor)

    default = send_async(client, agent.id)
    lettas_default = send_async(client, agent.id, max_steps=50)
    at_the_limit = send_async(client, agent.id, max_steps=100)

    assert [default.status_code, lettas_default.status_code, at_the_limit.status_code] == [200, 200, 200]
    assert stored_max_steps(actor) == [50, 50, 100]


@pytest.mark.django_db
def test_max_steps_over_the_limit_is_a_422_naming_the_field_and_the_limit(client, actor, settings):
    agent = new_agent(actor)

    over = send_async(client, agent.id, max_steps=101)
    settings.MAX_STEPS_LIMIT = 20
    over_a_lower_limit = client.post(
        f"/v1/agents/{agent.id}/messages", {**user("work"), "max_steps": 21}, format="json"
    )

    assert over.status_code == 422
    assert over.json() == {
        "detail": "max_steps must be at most 100 (this organisation's step limit), got 101",
        "code": "max_steps_exceeded",
    }
    assert over_a_lower_limit.status_code == 422
    assert "at most 20" in over_a_lower_limit.json()["detail"]
    assert stored_max_steps(actor) == []


@pytest.mark.django_db
def test_an_organisations_own_step_limit_replaces_the_deployments(client, actor, org):
    agent = new_agent(actor)
    org.max_steps_limit = 10
    org.save(update_fields=["max_steps_limit"])

    over = send_async(client, agent.id, max_steps=11)
    default = send_async(client, agent.id)  # Letta's 50 would be over it: the run gets the limit instead
    org.max_steps_limit = 500
    org.save(update_fields=["max_steps_limit"])
    above_the_deployments = send_async(client, agent.id, max_steps=300)

    assert over.status_code == 422
    assert over.json()["detail"] == "max_steps must be at most 10 (this organisation's step limit), got 11"
    assert (default.status_code, above_the_deployments.status_code) == (200, 200)
    assert stored_max_steps(actor) == [10, 300]


@pytest.mark.django_db
def test_an_organisations_step_limit_is_edited_in_the_admin(admin_client, org):
    page = admin_client.get(f"/admin/accounts/organization/{org.id}/change/")
    listing = admin_client.get("/admin/accounts/organization/")

    assert 'name="max_steps_limit"' in page.content.decode()
    assert "column-max_steps_limit" in listing.content.decode()


def test_two_messages_with_one_otid_are_refused(client, actor):
    agent = new_agent(actor)
    body = {"messages": [user("a", otid="same")["messages"][0], user("b", otid="same")["messages"][0]]}

    response = client.post(f"/v1/agents/{agent.id}/messages", body, format="json")

    assert response.status_code in (400, 422)
    assert "same otid" in json.dumps(response.json())
    assert not Run.objects.for_actor(actor).exists()


@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_a_second_run_for_one_otid(actor):
    # What keeps two concurrent resends (both past run_find_by_otids) from creating two runs: the
    # agent lock orders their inserts and the unique constraint refuses the second.
    from django.db import IntegrityError

    from apps.agents.services import MessageIn, run_create

    agent = new_agent(actor)
    run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi", otid="otid-race")])

    with pytest.raises(IntegrityError):
        run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi", otid="otid-race")])

    assert Run.objects.for_actor(actor).count() == 1


@pytest.mark.django_db
def test_modifying_a_message_is_refused_as_letta_refuses_it_and_changes_nothing(client, actor):
    agent = new_agent(actor)
    message = MessageFactory(organization_id=actor.organization_id, agent=agent, text="as sent")

    response = client.patch(
        f"/v1/agents/{agent.id}/messages/{message.id}",
        {"message_type": "user_message", "content": "rewritten"},
        format="json",
    )

    assert response.status_code == 405
    assert response.json()["detail"].startswith("Message editing is no longer supported.")
    assert Message.objects.for_actor(actor).get(id=message.id).text == "as sent"
