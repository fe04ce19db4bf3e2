"""The ADE's WebSocket relay of run events, through the real ASGI application and Redis."""

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from apps.agents.models import Run
from apps.streams.events import append_event, end_stream
from config.asgi import application
from tests.factories import AgentFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]


def session_headers(user):
    client = Client()
    client.force_login(user)
    return [(b"cookie", f"sessionid={client.session.session_key}".encode()), (b"origin", b"http://127.0.0.1")]


def make_run(org):
    agent = AgentFactory(organization=org)
    run = Run.all_objects.create(organization=org, agent=agent)
    for i in range(3):
        append_event(run.id, {"message_type": "assistant_message", "content": f"part {i}"})
    end_stream(run.id, status="completed", stop_reason="end_turn")
    return run


async def receive_all(communicator):
    events = []
    while True:
        message = await communicator.receive_output(timeout=5)
        if message["type"] == "websocket.close":
            return events
        events.append(message["text"])


async def test_a_member_receives_the_events_in_order_and_the_stream_closes(user, org):
    run = await sync_to_async(make_run)(org)
    headers = await sync_to_async(session_headers)(user)
    communicator = WebsocketCommunicator(application, f"/ws/runs/{run.id}/", headers=headers)

    connected, _ = await communicator.connect()
    texts = await receive_all(communicator)

    assert connected
    assert [t.count("part") for t in texts] == [1, 1, 1, 0]
    assert '"run_end"' in texts[-1]


async def test_a_reconnecting_page_resumes_after_its_cursor_without_duplicates(user, org):
    import json

    run = await sync_to_async(make_run)(org)
    headers = await sync_to_async(session_headers)(user)
    first = WebsocketCommunicator(application, f"/ws/runs/{run.id}/", headers=headers)
    await first.connect()
    seen = [json.loads(await first.receive_from(timeout=5)) for _ in range(2)]
    await first.disconnect()

    second = WebsocketCommunicator(
        application, f"/ws/runs/{run.id}/?after={seen[-1]['cursor']}", headers=headers
    )
    await second.connect()
    rest = [json.loads(t) for t in await receive_all(second)]

    contents = [e["event"].get("content") for e in seen + rest]
    assert contents == ["part 0", "part 1", "part 2", None]


async def test_another_organisations_member_is_refused(other_user, org):
    run = await sync_to_async(make_run)(org)
    headers = await sync_to_async(session_headers)(other_user)
    communicator = WebsocketCommunicator(application, f"/ws/runs/{run.id}/", headers=headers)

    connected, code = await communicator.connect()

    assert (connected, code) == (False, 4404)


async def test_an_anonymous_visitor_is_refused(org):
    run = await sync_to_async(make_run)(org)
    communicator = WebsocketCommunicator(
        application, f"/ws/runs/{run.id}/", headers=[(b"origin", b"http://127.0.0.1")]
    )

    connected, code = await communicator.connect()

    assert (connected, code) == (False, 4401)


@pytest.mark.parametrize("after", ["bogus", "1-2-3", "-1", "1700000000000-0 ", "9" * 30 + "-0"])
async def test_a_cursor_the_stream_never_sent_closes_the_socket_with_a_reason(user, org, after):
    from urllib.parse import quote

    run = await sync_to_async(make_run)(org)
    headers = await sync_to_async(session_headers)(user)
    communicator = WebsocketCommunicator(
        application, f"/ws/runs/{run.id}/?after={quote(after)}", headers=headers
    )

    connected, _ = await communicator.connect()
    closed = await communicator.receive_output(timeout=5)

    assert connected
    assert closed["type"] == "websocket.close"
    assert closed["code"] == 4400
    assert "cursor" in closed["reason"]
