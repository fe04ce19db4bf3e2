"""Throttling of /v1: wrong API keys per client address, request rates per key and per organisation, and
the cap on concurrent streams per user (SSE, blocking waits), through DRF's APIClient."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.core.signals import request_finished
from django.db import close_old_connections, connection
from rest_framework.test import APIClient

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents import services as agent_services
from apps.agents.models import Run
from apps.api import sse, throttles
from apps.core.actor import Actor
from apps.streams.events import append_event
from apps.streams.redis_client import get_redis
from tests.api.test_messages_api import new_agent, send, sse_events, user


def an_address() -> str:
    """A client address of its own (the counters live in Redis, across tests and runs)."""
    return f"198.18.{random.randrange(256)}.{random.randrange(1, 255)}"


def key_client(actor: Actor, **defaults: Any) -> APIClient:
    created = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="t")
    client = APIClient(**defaults)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created.raw_key}")
    return client


def retry_after(response: Any) -> int:
    return int(response["Retry-After"])


def close(response: Any) -> None:
    """Close a streaming response as a departing client does; the test keeps its database connection
    (what Django's test client does around a request)."""
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)


# --- wrong API keys --------------------------------------------------------------------------------------


@pytest.fixture
def three_failures(settings):
    settings.API_KEY_FAILURE_LIMIT = 3
    settings.API_KEY_FAILURE_WINDOW = 60


@pytest.mark.django_db
def test_wrong_api_keys_from_one_address_are_throttled_with_retry_after(three_failures):
    guesser = APIClient(REMOTE_ADDR=an_address())
    guesser.credentials(HTTP_AUTHORIZATION="Bearer sk-let-not-a-real-key-000000")

    statuses = [guesser.get("/v1/blocks/").status_code for _ in range(3)]
    throttled = guesser.get("/v1/blocks/")

    assert statuses == [401, 401, 401]
    assert throttled.status_code == 429
    assert 0 < retry_after(throttled) <= 60
    assert "detail" in throttled.json()


@pytest.mark.django_db
def test_a_throttled_address_is_refused_even_with_a_right_key_and_others_are_not(three_failures, actor):
    address = an_address()
    guesser = APIClient(REMOTE_ADDR=address)
    guesser.credentials(HTTP_AUTHORIZATION="Bearer sk-let-not-a-real-key-000000")
    for _ in range(3):
        guesser.get("/v1/blocks/")

    same_address = key_client(actor, REMOTE_ADDR=address).get("/v1/blocks/")
    elsewhere = key_client(actor, REMOTE_ADDR=an_address()).get("/v1/blocks/")

    assert same_address.status_code == 429  # no oracle: a guess that happens to be right looks the same
    assert elsewhere.status_code == 200


@pytest.mark.django_db
def test_a_malformed_authorization_header_counts_as_a_failure(three_failures):
    client = APIClient(REMOTE_ADDR=an_address())
    client.credentials(HTTP_AUTHORIZATION="Basic abc")

    assert [client.get("/v1/blocks/").status_code for _ in range(4)] == [401, 401, 401, 429]


@pytest.mark.django_db
def test_forwarded_for_headers_do_not_move_a_client_to_another_address(three_failures):
    address = an_address()
    guesser = APIClient(REMOTE_ADDR=address)
    guesser.credentials(HTTP_AUTHORIZATION="Bearer sk-let-not-a-real-key-000000")

    statuses = [guesser.get("/v1/blocks/", HTTP_X_FORWARDED_FOR=an_address()).status_code for _ in range(4)]

    assert statuses == [401, 401, 401, 429]


# --- request rates per key and per organisation -----------------------------------------------------------


def test_djangos_cache_is_redis_shared_by_every_process_not_local_memory():
    assert isinstance(caches["default"], RedisCache)


@pytest.mark.django_db
def test_one_key_is_held_to_its_rate_and_other_keys_are_not(settings, actor):
    settings.API_RATE_PER_KEY = "3/min"
    busy, other = key_client(actor), key_client(actor)

    statuses = [busy.get("/v1/blocks/").status_code for _ in range(3)]
    throttled = busy.get("/v1/blocks/")

    assert statuses == [200, 200, 200]
    assert throttled.status_code == 429
    assert 0 < retry_after(throttled) <= 60
    assert throttled.json()["detail"].startswith("Request was throttled")
    assert other.get("/v1/blocks/").status_code == 200
    keys = get_redis().keys("*throttle_api_key_*")
    assert keys  # in Redis, where every web process sees the same count


@pytest.mark.django_db
def test_an_organisation_is_held_to_its_rate_across_its_keys(settings, actor, other_org_actor):
    settings.API_RATE_PER_ORG = "4/min"
    first, second = key_client(actor), key_client(actor)

    statuses = [c.get("/v1/blocks/").status_code for c in (first, second, first, second, first)]

    assert statuses == [200, 200, 200, 200, 429]
    assert key_client(other_org_actor).get("/v1/blocks/").status_code == 200


@pytest.mark.django_db
def test_a_session_user_is_held_to_the_per_key_rate(settings, user):
    settings.API_RATE_PER_KEY = "2/min"
    client = APIClient()
    client.force_login(user)

    assert [client.get("/v1/blocks/").status_code for _ in range(3)] == [200, 200, 429]


@pytest.mark.django_db
def test_unauthenticated_endpoints_are_not_throttled_per_key(settings):
    settings.API_RATE_PER_KEY = settings.API_RATE_PER_ORG = "1/min"

    assert {APIClient().get("/v1/health/").status_code for _ in range(3)} == {200}


# --- concurrent streams per user --------------------------------------------------------------------------


@pytest.fixture
def two_streams(settings):
    settings.MAX_STREAMS_PER_USER = 2


def running_run(actor: Actor) -> Run:
    agent = new_agent(actor)
    run = Run.objects.for_actor(actor).create(agent=agent, status="running")
    append_event(run.id, {"message_type": "assistant_message", "content": "so far", "id": "message-x"})
    return run


@pytest.mark.django_db
def test_streams_past_the_cap_are_429_and_a_closed_stream_frees_its_slot(two_streams, actor, other_org_actor):
    run = running_run(actor)
    client = key_client(actor)
    opened = [client.post(f"/v1/runs/{run.id}/stream", {}, format="json") for _ in range(2)]

    refused = client.post(f"/v1/runs/{run.id}/stream", {}, format="json")
    elsewhere = running_run(other_org_actor)
    someone_else = key_client(other_org_actor).post(f"/v1/runs/{elsewhere.id}/stream", {}, format="json")
    close(opened[0])
    after_close = client.post(f"/v1/runs/{run.id}/stream", {}, format="json")

    assert [r.status_code for r in opened] == [200, 200]
    assert refused.status_code == 429
    assert "MAX_STREAMS_PER_USER" in refused.json()["detail"]
    assert someone_else.status_code == 200
    assert after_close.status_code == 200
    assert throttles.open_streams(actor.user_id) == 2
    for response in (opened[1], after_close, someone_else):
        close(response)
    assert throttles.open_streams(actor.user_id) == 0


@pytest.mark.django_db
def test_a_stream_that_ends_frees_its_slot(two_streams, actor, fast_streams):
    from tests.api.test_runs_api import finished_run_with_stream

    run, _ = finished_run_with_stream(actor)
    client = key_client(actor)

    for _ in range(3):
        events = sse_events(client.post(f"/v1/runs/{run.id}/stream", {}, format="json"))
        assert events[-1] == (None, "[DONE]")

    assert throttles.open_streams(actor.user_id) == 0


@pytest.mark.django_db
def test_a_streaming_send_past_the_cap_is_429_and_starts_no_run(two_streams, actor):
    run = running_run(actor)
    client = key_client(actor)
    held = [client.post(f"/v1/runs/{run.id}/stream", {}, format="json") for _ in range(2)]
    agent = new_agent(actor)

    refused = send(client, agent.id, {**user("hello"), "streaming": True})

    assert refused.status_code == 429
    assert not Run.objects.for_actor(actor).filter(agent=agent).exists()
    for response in held:
        close(response)


@pytest.mark.django_db
def test_a_blocking_send_counts_while_it_waits(two_streams, actor, monkeypatch):
    run = running_run(actor)
    client = key_client(actor)
    held = [client.post(f"/v1/runs/{run.id}/stream", {}, format="json") for _ in range(2)]
    agent = new_agent(actor)

    refused = send(client, agent.id, user("hello"))

    assert refused.status_code == 429
    assert not Run.objects.for_actor(actor).filter(agent=agent).exists()
    for response in held:
        close(response)


@pytest.mark.django_db
def test_a_blocking_send_waits_at_most_blocking_wait_seconds_and_answers_with_what_it_has(
    settings, actor, monkeypatch
):
    settings.BLOCKING_WAIT_SECONDS = 1
    client = key_client(actor)
    agent = new_agent(actor)

    def started_but_slow(run: Run) -> None:  # the worker has produced one message, then takes its time
        append_event(run.id, {"message_type": "assistant_message", "content": "thinking...", "id": "m-1"})

    monkeypatch.setattr(agent_services, "run_submit", started_but_slow)
    started = time.monotonic()
    response = send(client, agent.id, user("hello"), HTTP_X_STAINLESS_READ_TIMEOUT="600")
    waited = time.monotonic() - started

    assert waited < 5
    assert response.status_code == 504
    body = response.json()
    assert body["code"] == "RUN_STILL_RUNNING"
    assert [m.get("content") for m in body["messages"]] == ["thinking..."]
    assert Run.objects.for_actor(actor).get(id=body["run_id"]).status not in ("cancelled", "failed")
    assert throttles.open_streams(actor.user_id) == 0


def test_a_slot_of_a_crashed_process_expires(settings):
    settings.MAX_STREAMS_PER_USER = 1
    user_id = f"user-test-{random.getrandbits(64):x}"

    crashed = throttles.stream_slot(user_id, ttl_s=1)  # never released: its process died
    refused = throttles.stream_slot(user_id)
    time.sleep(1.2)
    later = throttles.stream_slot(user_id)

    assert crashed is not None
    assert refused is None
    assert later is not None
    later.release()
    assert throttles.open_streams(user_id) == 0


def test_a_refreshed_slot_outlives_its_first_ttl(settings, monkeypatch):
    settings.MAX_STREAMS_PER_USER = 1
    monkeypatch.setattr(throttles, "STREAM_SLOT_REFRESH_S", 0.0)
    user_id = f"user-test-{random.getrandbits(64):x}"

    slot = throttles.stream_slot(user_id, ttl_s=1)
    assert slot is not None
    for _ in range(3):
        time.sleep(0.5)
        slot.refresh()

    assert throttles.stream_slot(user_id) is None
    slot.release()
    assert throttles.stream_slot(user_id) is not None


@pytest.mark.django_db(transaction=True)
def test_an_open_stream_refreshes_its_slot_while_it_waits(two_streams, actor, monkeypatch):
    monkeypatch.setattr(throttles, "STREAM_SLOT_TTL_S", 1.0)
    monkeypatch.setattr(throttles, "STREAM_SLOT_REFRESH_S", 0.1)
    monkeypatch.setattr(sse, "POLL_MS", 100)
    monkeypatch.setattr(sse, "FOLLOW_TIMEOUT_S", 2.0)
    run = running_run(actor)
    response = key_client(actor).post(f"/v1/runs/{run.id}/stream", {"include_pings": False}, format="json")

    def read() -> None:
        try:
            b"".join(response.streaming_content)
        finally:
            connection.close()  # this thread's own

    reader = threading.Thread(target=read)
    reader.start()  # the message so far, then the stream idles past its slot's first TTL
    time.sleep(1.6)
    counted = throttles.open_streams(actor.user_id)
    reader.join(timeout=10)

    assert counted == 1
    assert throttles.open_streams(actor.user_id) == 0


# --- the ADE's WebSocket relay ------------------------------------------------------------------------------


def hub_subscribers() -> int:
    """Clients following a run through this event loop's StreamHub (the relays hold no Redis client of
    their own)."""
    from apps.streams.hub import get_hub

    return get_hub().subscriber_count()


async def ws_connect(user: Any, run: Run) -> Any:
    from asgiref.sync import sync_to_async
    from channels.testing import WebsocketCommunicator

    from config.asgi import application
    from tests.ade.test_run_stream_consumer import session_headers

    headers = await sync_to_async(session_headers)(user)
    communicator = WebsocketCommunicator(application, f"/ws/runs/{run.id}/", headers=headers)
    connected, _ = await communicator.connect()
    return communicator, connected


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_a_websocket_past_the_cap_is_closed_with_a_code_and_a_reason(two_streams, user, actor):
    from asgiref.sync import sync_to_async

    run = await sync_to_async(running_run)(actor)
    first, first_ok = await ws_connect(user, run)
    second, second_ok = await ws_connect(user, run)
    third, third_ok = await ws_connect(user, run)

    closed = await third.receive_output(timeout=5)
    while closed["type"] != "websocket.close":
        closed = await third.receive_output(timeout=5)

    assert (first_ok, second_ok, third_ok) == (True, True, True)
    assert closed["code"] == 4429
    assert "MAX_STREAMS_PER_USER" in closed["reason"]
    await first.disconnect()
    await second.disconnect()
    assert await sync_to_async(throttles.open_streams)(actor.user_id) == 0


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_the_relay_unsubscribes_and_frees_its_slot_on_disconnect(two_streams, user, actor):
    from asgiref.sync import sync_to_async

    run = await sync_to_async(running_run)(actor)
    communicator, connected = await ws_connect(user, run)
    first = await communicator.receive_json_from(timeout=5)
    counted = await sync_to_async(throttles.open_streams)(actor.user_id)

    await communicator.disconnect()

    assert connected
    assert first["event"]["content"] == "so far"
    assert counted == 1
    assert hub_subscribers() == 0
    assert await sync_to_async(throttles.open_streams)(actor.user_id) == 0


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_a_relay_that_reaches_the_end_unsubscribes_too(user, org):
    from asgiref.sync import sync_to_async

    from tests.ade.test_run_stream_consumer import make_run, receive_all

    run = await sync_to_async(make_run)(org)
    communicator, _ = await ws_connect(user, run)
    await receive_all(communicator)
    await communicator.disconnect()

    assert hub_subscribers() == 0
