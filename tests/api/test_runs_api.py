"""/v1/runs: list, retrieve, messages, steps, usage, and the resumable stream (with its translation rules)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection
from django.test import AsyncClient
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.models import Message, Run, Step
from apps.api import sse
from apps.api.sse import LettaEventTranslator, StreamOptions
from apps.core.actor import Actor
from apps.streams.events import append_event, end_stream
from tests.api.test_messages_api import AUTH_QUERIES, new_agent, sse_events, types
from tests.factories import MessageFactory
from tests.support.scripted_llm import error


@pytest.fixture
def client(actor: Actor, api_client_for: Any) -> APIClient:
    return api_client_for(actor)


def make_run(actor: Actor, agent: Any, **fields: Any) -> Run:
    return Run.objects.for_actor(actor).create(agent=agent, **fields)


def message_event(message: Message) -> dict[str, Any]:
    from apps.agents.loop.convert import to_letta_messages

    return to_letta_messages(message)[0]


def finished_run_with_stream(actor: Actor) -> tuple[Run, list[Message]]:
    """A completed run whose stream holds two assistant messages, its stop reason, usage and end."""
    agent = new_agent(actor)
    run = make_run(actor, agent, status="completed", stop_reason="end_turn")
    replies = [
        MessageFactory(organization_id=actor.organization_id, agent=agent, run=run, role="assistant", text=t)
        for t in ("one", "two")
    ]
    for reply in replies:
        append_event(run.id, message_event(reply))
    append_event(run.id, {"message_type": "stop_reason", "stop_reason": "end_turn"})
    append_event(run.id, {"message_type": "usage_statistics", "step_count": 1, "run_ids": [run.id]})
    end_stream(run.id, status="completed", stop_reason="end_turn")
    return run, replies


# --- list and retrieve -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_runs_list_filters_by_agent_status_and_activity(client, actor):
    agent, other = new_agent(actor), new_agent(actor, name="Other")
    done = make_run(actor, agent, status="completed", stop_reason="end_turn")
    active = make_run(actor, agent, status="running")
    make_run(actor, other, status="failed")

    by_agent = client.get("/v1/runs/", {"agent_id": agent.id}).json()
    by_status = client.get("/v1/runs/", [("statuses", "completed"), ("statuses", "failed")]).json()
    only_active = client.get("/v1/runs/", {"active": "true"}).json()

    assert [r["id"] for r in by_agent] == [active.id, done.id]
    assert sorted(r["status"] for r in by_status) == ["completed", "failed"]
    assert [r["id"] for r in only_active] == [active.id]


@pytest.mark.django_db
def test_runs_list_honours_after_until_an_empty_page(client, actor):
    agent = new_agent(actor)
    runs = [make_run(actor, agent) for _ in range(3)]

    seen, after = [], None
    for _ in range(5):
        query = {"limit": 2, "order": "asc"} | ({"after": after} if after else {})
        page = client.get("/v1/runs/", query).json()
        if not page:
            break
        seen += [r["id"] for r in page]
        after = page[-1]["id"]

    assert seen == [r.id for r in runs]


@pytest.mark.django_db
def test_runs_list_costs_the_same_queries_however_long(client, actor):
    agent = new_agent(actor)
    make_run(actor, agent)
    client.get("/v1/runs/")  # the key's first use is stamped

    with CaptureQueriesContext(connection) as short:
        client.get("/v1/runs/")
    for _ in range(10):
        make_run(actor, agent)
    with CaptureQueriesContext(connection) as long:
        response = client.get("/v1/runs/")

    assert len(response.json()) == 11
    assert len(long.captured_queries) == len(short.captured_queries) == AUTH_QUERIES + 1


@pytest.mark.django_db
def test_a_run_has_lettas_shape(client, actor):
    agent = new_agent(actor)
    run = make_run(actor, agent, status="failed", stop_reason="llm_api_error", error={"message": "down"})

    body = client.get(f"/v1/runs/{run.id}").json()

    assert body["id"] == run.id
    assert body["agent_id"] == agent.id
    assert body["status"] == "failed"
    assert body["stop_reason"] == "llm_api_error"
    assert body["metadata"]["error"] == {"message": "down"}
    assert body["background"] is False
    assert body["conversation_id"] is None
    assert body["request_config"]["include_return_message_types"] is None
    assert body["created_at"]


@pytest.mark.django_db
def test_run_messages_are_oldest_first_and_paginate(client, actor):
    agent = new_agent(actor)
    run = make_run(actor, agent)
    messages = [
        MessageFactory(organization_id=actor.organization_id, agent=agent, run=run, text=f"m{i}")
        for i in range(3)
    ]
    MessageFactory(organization_id=actor.organization_id, agent=agent, text="another run")

    everything = client.get(f"/v1/runs/{run.id}/messages").json()
    after_first = client.get(f"/v1/runs/{run.id}/messages", {"after": messages[0].id}).json()

    assert [m["id"] for m in everything] == [m.id for m in messages]
    assert [m["id"] for m in after_first] == [m.id for m in messages[1:]]
    assert client.get(f"/v1/runs/{run.id}/messages", {"after": messages[-1].id}).json() == []


@pytest.mark.django_db
def test_run_steps_and_usage(client, actor):
    agent = new_agent(actor)
    run = make_run(actor, agent)
    steps = [
        Step.all_objects.create(
            organization_id=actor.organization_id,
            agent=agent,
            run=run,
            prompt_tokens=10 * i,
            completion_tokens=i,
            total_tokens=11 * i,
        )
        for i in (1, 2)
    ]

    listed = client.get(f"/v1/runs/{run.id}/steps", {"order": "asc"}).json()
    usage = client.get(f"/v1/runs/{run.id}/usage").json()

    assert [s["id"] for s in listed] == [s.id for s in steps]
    assert usage["prompt_tokens"] == 30
    assert usage["completion_tokens"] == 3
    assert usage["total_tokens"] == 33
    assert usage["completion_tokens_details"] == {"reasoning_tokens": None}


# --- the stream ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_run_stream_replays_everything_then_done(client, actor, fast_streams):
    run, replies = finished_run_with_stream(actor)

    response = client.post(f"/v1/runs/{run.id}/stream", {}, format="json")

    data = [d for _, d in sse_events(response)]
    assert response["Content-Type"] == "text/event-stream"
    assert [d["id"] for d in data[:2]] == [r.id for r in replies]
    assert [d["seq_id"] for d in data[:2]] == [1, 2]
    assert [d["message_type"] for d in data[2:4]] == ["stop_reason", "usage_statistics"]
    assert data[4] == "[DONE]"


@pytest.mark.django_db
def test_a_reconnecting_client_gets_only_what_it_missed(client, actor, fast_streams):
    run, replies = finished_run_with_stream(actor)

    response = client.post(f"/v1/runs/{run.id}/stream", {"starting_after": 1}, format="json")
    by_get = client.get(f"/v1/runs/{run.id}/stream", {"starting_after": 2})

    data = [d for _, d in sse_events(response)]
    assert [d.get("id") for d in data if isinstance(d, dict) and "seq_id" in d] == [replies[1].id]
    assert data[-1] == "[DONE]"
    assert [d["message_type"] for _, d in sse_events(by_get) if isinstance(d, dict)] == [
        "stop_reason",
        "usage_statistics",
    ]


@pytest.mark.django_db
def test_a_finished_run_whose_stream_expired_is_replayed_from_the_database(client, actor, fast_streams):
    agent = new_agent(actor)
    run = make_run(actor, agent, status="completed", stop_reason="end_turn")
    MessageFactory(organization_id=actor.organization_id, agent=agent, run=run, text="question")
    answer = MessageFactory(
        organization_id=actor.organization_id, agent=agent, run=run, role="assistant", text="hi"
    )

    response = client.post(f"/v1/runs/{run.id}/stream", {}, format="json")

    data = [d for _, d in sse_events(response)]
    assert [d["id"] for d in data[:1]] == [answer.id]
    assert data[1] == {"message_type": "stop_reason", "stop_reason": "end_turn"}
    assert data[2]["message_type"] == "usage_statistics"
    assert data[3] == "[DONE]"


@pytest.mark.django_db
def test_a_stream_whose_writer_died_ends_from_the_database(client, actor, fast_streams):
    agent = new_agent(actor)
    run = make_run(actor, agent, status="failed", stop_reason="error", error={"message": "worker lost"})
    append_event(run.id, {"message_type": "delta", "kind": "content", "text": "hal", "step_id": None})

    events = sse_events(client.post(f"/v1/runs/{run.id}/stream", {}, format="json"))

    assert events[0] == (None, {"message_type": "stop_reason", "stop_reason": "error"})
    assert events[1][1]["message_type"] == "usage_statistics"
    assert events[2][0] == "error"
    assert events[2][1]["message"] == "worker lost"
    assert events[3] == (None, "[DONE]")


@pytest.mark.django_db
def test_a_stream_that_fails_midway_ends_with_an_error_event(client, actor, fast_streams, monkeypatch):
    run, _ = finished_run_with_stream(actor)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("redis went away")

    monkeypatch.setattr(sse, "follow_events", broken)
    events = sse_events(client.post(f"/v1/runs/{run.id}/stream", {}, format="json"))

    assert events[0][0] == "error"
    assert events[0][1]["error_type"] == "internal_error"
    assert events[0][1]["detail"] == f"Internal server error (error_id: {events[0][1]['error_id']})"
    assert events[1] == (None, "[DONE]")


@pytest.mark.django_db(transaction=True)
def test_under_asgi_each_event_is_sent_as_it_comes(actor, fast_streams):
    agent = new_agent(actor)
    run = make_run(actor, agent, status="running")
    first = MessageFactory(organization_id=actor.organization_id, agent=agent, run=run, role="assistant")
    append_event(run.id, message_event(first))
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="asgi")

    async def attach() -> tuple[Any, bytes, list[bytes]]:
        response = await AsyncClient().post(
            f"/v1/runs/{run.id}/stream",
            {},
            content_type="application/json",
            headers={"Authorization": f"Bearer {key.raw_key}"},
        )
        chunks = aiter(response.streaming_content)
        before_the_end = await anext(chunks)  # a buffering server would wait for the run to end here
        await sync_to_async(finish, thread_sensitive=False)(run)
        return response, before_the_end, [chunk async for chunk in chunks]

    response, before_the_end, rest = async_to_sync(attach)()

    assert response.is_async is True
    assert first.id.encode() in before_the_end
    assert rest[-1] == b"data: [DONE]\n\n"


def finish(run: Run) -> None:
    """What the worker does at the end of a run (called from a thread of its own: closes its connection)."""
    try:
        Run.all_objects.filter(id=run.id).update(status="completed", stop_reason="end_turn")
    finally:
        connection.close()
    append_event(run.id, {"message_type": "stop_reason", "stop_reason": "end_turn"})
    end_stream(run.id, status="completed", stop_reason="end_turn")


# --- translation rules ---------------------------------------------------------------------------------------


def delta(kind: str, text: str, **fields: Any) -> dict[str, Any]:
    return {
        "message_type": "delta",
        "kind": kind,
        "text": text,
        "step_id": "step-1",
        "run_id": "run-1",
        **fields,
    }


def test_token_pieces_share_an_id_and_the_whole_message_is_not_sent_again():
    translator = LettaEventTranslator(StreamOptions(stream_tokens=True))

    pieces = [translator.translate(i, delta("content", t)) for i, t in enumerate(["Hel", "lo"], start=1)]
    whole = translator.translate(
        3, {"message_type": "assistant_message", "id": "message-x", "step_id": "step-1", "content": "Hello"}
    )

    assert [p["content"] for p in pieces] == ["Hel", "lo"]
    assert pieces[0]["id"] == pieces[1]["id"]
    assert pieces[0]["otid"] == pieces[1]["otid"]
    assert [p["seq_id"] for p in pieces] == [1, 2]
    assert whole is None


def test_tool_call_pieces_stream_unless_the_tool_needs_approval():
    translator = LettaEventTranslator(StreamOptions(stream_tokens=True, approval_tools=frozenset({"deploy"})))

    streamed = translator.translate(1, delta("tool_call_args", '{"a"', tool_call_id="c1", tool_name="search"))
    held = translator.translate(2, delta("tool_call_args", "{", tool_call_id="c2", tool_name="deploy"))
    held_more = translator.translate(3, delta("tool_call_args", "}", tool_call_id="c2", tool_name=None))
    whole_call = translator.translate(
        4,
        {
            "message_type": "tool_call_message",
            "id": "m",
            "step_id": "step-1",
            "tool_call": {"tool_call_id": "c1"},
        },
    )
    request = translator.translate(
        5,
        {"message_type": "approval_request_message", "id": "m2", "tool_call": {"tool_call_id": "c2"}},
    )

    assert streamed["tool_call"] == {"name": "search", "arguments": '{"a"', "tool_call_id": "c1"}
    assert (held, held_more, whole_call) == (None, None, None)
    assert request["message_type"] == "approval_request_message"


def test_without_token_streaming_deltas_are_dropped_and_messages_pass():
    translator = LettaEventTranslator(StreamOptions(include_types=frozenset({"assistant_message"})))

    assert translator.translate(1, delta("content", "Hel")) is None
    assert translator.translate(2, {"message_type": "reasoning_message", "reasoning": "x"}) is None
    assert translator.translate(3, {"message_type": "assistant_message", "content": "Hello"})["seq_id"] == 3
    assert translator.translate(4, {"message_type": "stop_reason", "stop_reason": "end_turn"}) == {
        "message_type": "stop_reason",
        "stop_reason": "end_turn",
    }


# --- tenancy and authentication -------------------------------------------------------------------------------

RUN_ENDPOINTS = [
    ("get", "/v1/runs/{run}"),
    ("get", "/v1/runs/{run}/messages"),
    ("get", "/v1/runs/{run}/steps"),
    ("get", "/v1/runs/{run}/usage"),
    ("get", "/v1/runs/{run}/stream"),
    ("post", "/v1/runs/{run}/stream"),
]


@pytest.mark.parametrize(("method", "path"), RUN_ENDPOINTS)
@pytest.mark.django_db
def test_another_organisation_gets_404_for_a_run(api_client_for, actor, other_org_actor, method, path):
    run = make_run(actor, new_agent(actor))

    response = getattr(api_client_for(other_org_actor), method)(path.format(run=run.id), format="json")

    assert response.status_code == 404
    assert response.json()["detail"] == f"Run with id '{run.id}' not found"


@pytest.mark.parametrize(("method", "path"), [*RUN_ENDPOINTS, ("get", "/v1/runs/")])
@pytest.mark.django_db
def test_no_key_is_401_for_runs(actor, method, path):
    run = make_run(actor, new_agent(actor))

    response = getattr(APIClient(), method)(path.format(run=run.id), format="json")

    assert response.status_code == 401


@pytest.mark.django_db
def test_another_organisations_run_list_is_empty(api_client_for, actor, other_org_actor):
    make_run(actor, new_agent(actor))

    assert api_client_for(other_org_actor).get("/v1/runs/").json() == []


@pytest.mark.django_db
def test_run_messages_list_types(client, actor):
    agent = new_agent(actor)
    run = make_run(actor, agent)
    MessageFactory(organization_id=actor.organization_id, agent=agent, run=run, text="hi")

    assert types(client.get(f"/v1/runs/{run.id}/messages").json()) == ["user_message"]


# --- every list: a fixed number of queries, and `after` walks to an empty page -------------------------------

LISTS = [
    "/v1/messages/",
    "/v1/runs/{run}/messages",
    "/v1/steps/{step}/messages",
    "/v1/conversations/{conversation}/messages",
    "/v1/agents/{agent}/messages?conversation_id={conversation}",
    "/v1/conversations/",
    "/v1/runs/{run}/steps",
    "/v1/runs/",
    "/v1/steps/",
]


class World:
    """One agent with a conversation, a run and a step; `grow` adds one of every listed thing."""

    def __init__(self, actor: Actor) -> None:
        self.actor = actor
        self.agent = new_agent(actor)
        self.conversation = self.agent.conversations.create(organization_id=actor.organization_id)
        self.run = make_run(actor, self.agent, conversation=self.conversation)
        self.step = Step.all_objects.create(
            organization_id=actor.organization_id, agent=self.agent, run=self.run
        )

    def grow(self) -> None:
        org = self.actor.organization_id
        MessageFactory(
            organization_id=org,
            agent=self.agent,
            conversation=self.conversation,
            run=self.run,
            step=self.step,
        )
        self.agent.conversations.create(organization_id=org)
        make_run(self.actor, self.agent)
        Step.all_objects.create(organization_id=org, agent=self.agent, run=self.run)

    def path(self, template: str) -> str:
        return template.format(
            agent=self.agent.id, conversation=self.conversation.id, run=self.run.id, step=self.step.id
        )


def walk(client: APIClient, path: str) -> list[str]:
    seen: list[str] = []
    joiner = "&" if "?" in path else "?"
    for _ in range(50):
        query = "limit=2&order=asc" + (f"&after={seen[-1]}" if seen else "")
        page = client.get(f"{path}{joiner}{query}").json()
        if not page:
            return seen
        seen += [item["id"] for item in page]
    raise AssertionError(f"{path} never returned an empty page")


@pytest.mark.parametrize("template", LISTS)
@pytest.mark.django_db
def test_a_list_costs_the_same_queries_however_long(client, actor, template):
    world = World(actor)
    world.grow()
    path = world.path(template)
    client.get(path)  # the key's first use is stamped

    with CaptureQueriesContext(connection) as short:
        first = client.get(path).json()
    for _ in range(10):
        world.grow()
    with CaptureQueriesContext(connection) as long:
        second = client.get(path).json()

    assert len(second) > len(first)
    assert len(long.captured_queries) == len(short.captured_queries)


@pytest.mark.parametrize("template", LISTS)
@pytest.mark.django_db
def test_a_list_walked_with_after_ends_on_an_empty_page(client, actor, template):
    world = World(actor)
    for _ in range(5):
        world.grow()
    path = world.path(template)

    seen = walk(client, path)

    everything = client.get(path + ("&" if "?" in path else "?") + "limit=1000").json()
    assert len(seen) == len(set(seen)) == len({item["id"] for item in everything}) >= 5


# --- what a failed run says about the deployment's provider -----------------------------------------------


@pytest.fixture
def failing_provider(llm, settings):
    """The deployment's OpenAI provider (OPENAI_BASE_URL) on loopback, answering every call HTTP 500
    with a body that is not JSON (an internal proxy's page) and carries a marker."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = b"<html>MARKER-5521 upstream gateway internal-lb-7.corp failed</html>"

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(500)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.OPENAI_BASE_URL = f"http://127.0.0.1:{server.server_port}/v1"
    yield server.server_port
    server.shutdown()
    server.server_close()


@pytest.mark.django_db
def test_a_failed_runs_error_names_no_deployment_url_nor_body(client, actor, send, failing_provider):
    agent = new_agent(actor)

    failed = send(agent, "hi")
    body = client.get(f"/v1/runs/{failed.run.id}").json()

    assert failed.stop_reason == "llm_api_error"
    message = str(body["metadata"]["error"])
    assert "HTTP 500" in message
    for leak in ("MARKER-5521", "internal-lb", "127.0.0.1", "<html>"):
        assert leak not in str(body)
    assert f":{failing_provider}" not in message
    assert str(failing_provider) not in message


@pytest.mark.django_db
def test_a_failed_runs_error_keeps_no_scripted_url(client, actor, send, llm, scripted_server):
    agent = new_agent(actor)
    llm.push(error(500, "upstream exploded", times=3))

    failed = send(agent, "hi")
    body = client.get(f"/v1/runs/{failed.run.id}").json()

    assert failed.stop_reason == "llm_api_error"
    message = str(body["metadata"]["error"])
    assert "HTTP 500" in message
    assert "127.0.0.1" not in str(body)
    assert str(scripted_server.port) not in message
