"""Streams and blocking sends through the ASGI application (config.asgi, as daphne serves it): SSE bodies
are sent by the event loop from the process's StreamHub, with no thread per open stream."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from asgiref.testing import ApplicationCommunicator

from apps.core import asgi
from apps.streams.events import append_event
from apps.streams.hub import get_hub
from config.asgi import application
from tests.api.test_messages_api import new_agent
from tests.api.test_runs_api import finish, make_run, message_event
from tests.core.test_asgi import key_for, scope
from tests.factories import MessageFactory

pytestmark = pytest.mark.django_db(transaction=True)


def request(
    method: str, path: str, key: str, headers: dict[str, str] | None = None
) -> ApplicationCommunicator:
    return ApplicationCommunicator(
        application,
        scope(
            method,
            path,
            {"authorization": f"Bearer {key}", "content-type": "application/json", **(headers or {})},
        ),
    )


async def body_of(app: ApplicationCommunicator, wait_s: float = 30) -> bytes:
    body = b""
    while True:
        message = await app.receive_output(timeout=wait_s)
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def test_open_streams_hold_no_thread_each(actor, fast_streams, settings, monkeypatch):
    settings.MAX_STREAMS_PER_USER = 0
    # Request threads given back are kept for later requests, at most `keep` of them: a few here, so what
    # is counted below is the threads the streams hold, not the ones kept idle.
    monkeypatch.setattr(asgi.REQUEST_THREADS, "keep", 2)
    agent = new_agent(actor)
    run = make_run(actor, agent, status="running")
    first = MessageFactory(organization_id=actor.organization_id, agent=agent, run=run, role="assistant")
    append_event(run.id, message_event(first))
    key = key_for(actor)

    async def attach_many(n: int) -> tuple[int, int, int, list[bytes]]:
        before = threading.active_count()
        apps = [request("GET", f"/v1/runs/{run.id}/stream", key) for _ in range(n)]
        for app in apps:
            await app.send_input({"type": "http.request", "body": b"", "more_body": False})
        for app in apps:
            start = await app.receive_output(timeout=10)
            assert start["status"] == 200
            assert first.id.encode() in (await app.receive_output(timeout=10))["body"]
        await asyncio.sleep(0.3)  # ended threads are gone
        during, followers = threading.active_count(), get_hub().subscriber_count()
        await sync_to_async(finish, thread_sensitive=False)(run)
        rests = [await body_of(app) for app in apps]
        await asyncio.sleep(0.1)
        left = get_hub().subscriber_count()
        await get_hub().aclose()
        return during - before, followers, left, rests

    extra_threads, followers, left, rests = async_to_sync(attach_many)(30)

    assert followers == 30
    assert extra_threads < 10  # 30 open streams: the loop's few shared threads at most, not one each
    assert all(rest.endswith(b"data: [DONE]\n\n") for rest in rests)
    assert left == 0
