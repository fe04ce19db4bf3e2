"""The process's one stream reader (apps.streams.hub): many subscribers on one Redis connection, replay from
a cursor, clean unsubscription, bounded queues for slow subscribers, recovery after a lost connection."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from asgiref.sync import sync_to_async

from apps.streams.events import append_events, end_stream, stream_key
from apps.streams.hub import StreamHub
from apps.streams.redis_client import get_redis

pytestmark = pytest.mark.anyio


def new_run() -> str:
    return f"run-{uuid.uuid4()}"


async def write(run_id: str, *numbers: int) -> list[str]:
    return await sync_to_async(append_events, thread_sensitive=False)(
        run_id, [{"message_type": "assistant_message", "n": n} for n in numbers]
    )


async def collect(hub: StreamHub, run_id: str, after: str = "0-0", *, wait_s: float = 10.0) -> list[int]:
    """Everything the subscriber gets until the run's end event."""
    got: list[int] = []
    async with hub.subscribe(run_id, after) as subscription:
        async with asyncio.timeout(wait_s):
            while True:
                for event in await subscription.get(1.0):
                    if event.is_end:
                        return got
                    got.append(event.data["n"])


def hub_connections(hub: StreamHub) -> list[dict[str, str]]:
    return [c for c in get_redis().client_list() if c.get("name", "").endswith(f"-{hub.id}")]


@pytest.fixture
async def hub():
    hub = StreamHub()
    yield hub
    await hub.aclose()
    get_redis().delete(hub.wake_key)


async def test_one_reader_serves_every_subscriber_of_every_run(hub):
    runs = [new_run() for _ in range(5)]
    readers = [asyncio.create_task(collect(hub, run)) for run in runs for _ in range(20)]
    while hub.subscriber_count() < 100 or len(hub.positions) < 5:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # all 100 waiting: who is blocked in Redis?
    blocked = [c for c in get_redis().client_list() if c.get("cmd") == "xread" and "b" in c.get("flags", "")]
    blocked = [c for c in blocked if c.get("name", "").startswith("stream-hub") or not c.get("name")]
    for n in range(10):
        for run in runs:
            await write(run, n)
    await asyncio.gather(
        *(sync_to_async(end_stream)(run, status="completed", stop_reason="end_turn") for run in runs)
    )
    results = await asyncio.gather(*readers)
    connections = hub_connections(hub)

    assert results == [list(range(10))] * 100  # every event, once, in order, for all 100 subscribers
    assert [c["name"] for c in blocked] == [f"stream-hub-reader-{hub.id}"]  # one XREAD BLOCK, 100 subscribers
    assert [c["name"] for c in connections].count(f"stream-hub-reader-{hub.id}") == 1
    assert len(connections) <= 1 + 8  # the reader and the command pool (STREAM_HUB_CONNECTIONS)


async def test_a_subscriber_replays_from_its_cursor_then_follows_live(hub):
    run = new_run()
    ids = await write(run, 1, 2, 3)
    reader = asyncio.create_task(collect(hub, run, after=ids[0]))
    while run not in hub.positions:  # noqa: ASYNC110  (caught up with what the stream holds)
        await asyncio.sleep(0.01)
    await write(run, 4)
    late = asyncio.create_task(collect(hub, run, after=ids[2]))  # joins a run the hub is reading
    await asyncio.sleep(0.2)
    await write(run, 5)
    await sync_to_async(end_stream)(run, status="completed", stop_reason="end_turn")

    assert await reader == [2, 3, 4, 5]
    assert await late == [4, 5]


async def test_leaving_subscribers_leave_nothing_behind(hub):
    run = new_run()
    await write(run, 1)
    async with hub.subscribe(run) as first, hub.subscribe(run) as second:
        assert [e.data["n"] for e in await first.get(1.0)] == [1]
        assert [e.data["n"] for e in await second.get(1.0)] == [1]
        assert hub.subscriber_count() == 2
    await asyncio.sleep(0)

    assert hub.subscriber_count() == 0
    assert hub.subscribers == {}
    assert hub.positions == {}
    assert hub.ended == set()
    await asyncio.wait_for(hub.task, 10)  # the reader stops with its last subscriber


async def test_a_slow_subscriber_is_bounded_and_still_gets_every_event(hub):
    hub.queue_events = 10
    run = new_run()
    async with hub.subscribe(run) as slow, hub.subscribe(run) as fast:
        assert await slow.get(0.1) == []
        assert await fast.get(0.1) == []
        largest_queue = 0
        fast_got: list[int] = []
        for n in range(100):
            await write(run, n)
            fast_got += [event.data["n"] for event in await fast.get(5.0)]
            largest_queue = max(largest_queue, len(slow.pending))
        while len(fast_got) < 100:
            fast_got += [event.data["n"] for event in await fast.get(5.0)]
        slow_got: list[int] = []
        while len(slow_got) < 100:
            slow_got += [event.data["n"] for event in await slow.get(5.0)]

    assert largest_queue <= 10
    assert slow.overflows >= 1  # it fell behind, its queue was dropped, its backlog read again
    assert slow_got == fast_got == list(range(100))


async def test_the_reader_reads_on_after_its_connection_is_lost(hub):
    run = new_run()
    async with hub.subscribe(run) as subscription:
        await write(run, 1)
        assert [e.data["n"] for e in await subscription.get(5.0)] == [1]
        while not (readers := [c for c in hub_connections(hub) if c["name"].startswith("stream-hub-reader")]):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        [reader] = readers
        get_redis().client_kill_filter(_id=reader["id"])
        await write(run, 2, 3)
        got: list[int] = []
        async with asyncio.timeout(10):
            while len(got) < 2:
                got += [e.data["n"] for e in await subscription.get(1.0)]

    assert got == [2, 3]


async def test_a_run_that_ended_before_anyone_came_is_replayed_whole(hub):
    run = new_run()
    await write(run, 1, 2)
    await sync_to_async(end_stream)(run, status="completed", stop_reason="end_turn")

    assert await collect(hub, run) == [1, 2]
    get_redis().delete(stream_key(run))


async def test_a_new_stream_is_served_after_redis_dropped_every_connection(hub):
    """A Redis restart closes every pooled connection: the next catch-up read and the next follower must
    get through on fresh ones, not fail the stream on the first stale socket (the cluster's restart)."""
    first = new_run()
    await write(first, 1)
    await end_stream_async(first)
    assert await collect(hub, first) == [1]  # the hub's pool and reader hold connections now
    for connection in hub_connections(hub):
        get_redis().client_kill_filter(_id=connection["id"])

    second = new_run()
    await write(second, 2, 3)
    await end_stream_async(second)
    assert [event.data["n"] for event in await hub.read_after(second, "0-0", count=1)] == [2]
    assert await collect(hub, second) == [2, 3]


async def end_stream_async(run_id: str) -> None:
    await sync_to_async(end_stream, thread_sensitive=False)(
        run_id, status="completed", stop_reason="end_turn"
    )
