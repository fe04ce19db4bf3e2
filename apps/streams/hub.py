"""One reader per process for the runs' event streams, fanning entries out to every client that follows one.

A web process serves many streams at once (SSE, the ADE's WebSockets, blocking sends waiting for their run).
Instead of one blocked XREAD, one Redis connection and one thread each, every client here is a
Subscription of the event loop's StreamHub: one asyncio task does XREAD BLOCK over all the runs that have
subscribers, on one Redis connection, and hands each entry (parsed once) to their bounded queues.

A subscriber starts from a cursor: it is registered first (from then on the reader queues what it reads
for it), then reads what the stream already holds from its cursor itself (non-blocking XREADs on the hub's
small command pool), and skips what the queue repeats; entry ids are ordered, so nothing is missed or sent
twice. A run new to the hub is read from where its first subscriber's catch-up stopped.

Bounds: a subscriber's queue holds at most STREAM_HUB_QUEUE_EVENTS entries; one that falls behind (a slow
client) has its queue dropped and reads its backlog from Redis again by cursor, so memory stays bounded
and the client still gets every event. A Redis error pauses the reader (backoff) and it reads on from the
runs' positions when Redis is back. The writers' side (append_events, fencing) is untouched.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager, suppress
from typing import Any, TypeVar

import redis.asyncio
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from apps.streams.events import START, StreamEvent, stream_key

logger = logging.getLogger(__name__)

T = TypeVar("T")

BLOCK_MS = 5000
"""The reader's XREAD BLOCK: it is woken early (the wake stream) when a run joins."""
READ_COUNT = 500
"""Entries per stream per read (the reader's and a catch-up's)."""
WAKE_TTL_S = 3600
RECONNECT_ATTEMPTS = 3
_KEY_PREFIX = stream_key("")


def entry_id(value: str) -> tuple[int, int]:
    """A stream entry id ("<ms>-<seq>") as a comparable pair."""
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


def _events(entries: list[Any]) -> list[StreamEvent]:
    return [StreamEvent(cursor=str(entry), data=json.loads(fields["data"])) for entry, fields in entries]


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class Subscription:
    """One client following one run from a cursor. `get` returns the next events in order, each once."""

    def __init__(self, hub: StreamHub, run_id: str, after: str) -> None:
        self.hub, self.run_id = hub, run_id
        self.cursor = after
        self.pending: deque[StreamEvent] = deque()
        self.waiter: asyncio.Future[None] | None = None  # set while get() waits
        self.catching_up = True  # reading its backlog from Redis (at first, and after an overflow)
        self.overflows = 0

    def push(self, events: list[StreamEvent]) -> None:
        """The reader's hand-off (synchronous: no event is read between two pushes of a batch)."""
        if self.catching_up and not self.pending and entry_id(events[-1].cursor) <= entry_id(self.cursor):
            return
        if len(self.pending) + len(events) > self.hub.queue_events:
            # Fallen behind: drop the queue (memory stays bounded); the backlog is read again from Redis.
            self.pending.clear()
            self.catching_up = True
            self.overflows += 1
        else:
            self.pending.extend(events)
        _wake(self.waiter)

    async def get(self, wait_s: float) -> list[StreamEvent]:
        """The events after the cursor, or [] after `wait_s` seconds with none."""
        deadline = time.monotonic() + wait_s
        while True:
            if self.catching_up:
                overflows, known = self.overflows, self.run_id in self.hub.positions
                batch = await self.hub.read_after(self.run_id, self.cursor)
                fresh = self._fresh(batch)
                if self.overflows == overflows:  # else its queue was dropped meanwhile: read on
                    self.catching_up = not self.hub.caught_up(self, read=len(batch), known=known)
                if fresh:
                    return fresh
                continue
            if self.pending:
                fresh = self._fresh(list(self.pending))
                self.pending.clear()
                if fresh:
                    return fresh
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            # A bare future and a timer (not asyncio.wait_for, a task per wait): this runs for every
            # event and every client.
            loop = asyncio.get_running_loop()
            self.waiter = waiter = loop.create_future()
            timer = loop.call_later(left, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self.waiter = None

    def _fresh(self, events: list[StreamEvent]) -> list[StreamEvent]:
        after = entry_id(self.cursor)
        fresh = [event for event in events if entry_id(event.cursor) > after]
        if fresh:
            self.cursor = fresh[-1].cursor
        return fresh


def _reconnecting() -> Retry:
    """A command that meets a closed connection is sent again on a fresh one (redis-py's pools keep
    theirs, so after a Redis restart each pooled socket fails once): a few times, quickly. The hub's
    commands are reads, wake-ups and slot refreshes, all safe to repeat."""
    return Retry(ExponentialBackoff(cap=0.5, base=0.02), RECONNECT_ATTEMPTS)


class StreamHub:
    """The event loop's reader and its subscribers (use get_hub())."""

    def __init__(self, url: str | None = None, *, queue_events: int | None = None) -> None:
        url = url or settings.REDIS_URL
        self.id = uuid.uuid4().hex[:12]
        self.queue_events = queue_events or settings.STREAM_HUB_QUEUE_EVENTS
        # The reader's own connection (named, so CLIENT LIST shows it), and a small pool for everything
        # else: catch-up reads, wake-ups, stream slots.
        self.reader = redis.asyncio.Redis.from_url(
            url,
            decode_responses=True,
            single_connection_client=True,
            client_name=f"stream-hub-reader-{self.id}",
            socket_timeout=BLOCK_MS / 1000 + 5,  # redis-py's default (5 s) would cut the BLOCK short
            retry=_reconnecting(),
        )
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url,
            decode_responses=True,
            max_connections=settings.STREAM_HUB_CONNECTIONS,
            timeout=None,
            client_name=f"stream-hub-{self.id}",
            retry=_reconnecting(),
        )
        self.commands = redis.asyncio.Redis(connection_pool=pool)
        self.subscribers: dict[str, set[Subscription]] = {}
        self.positions: dict[str, str] = {}  # run -> the last entry the reader has handed out (or from)
        self.ended: set[str] = set()
        self.wake_key = f"stream-hub-wake:{self.id}"
        self.wake_cursor = START
        self.changed = asyncio.Event()
        self.reading = False  # blocked in XREAD (a wake-up must go through Redis)
        self.task: asyncio.Task[None] | None = None
        self.reads = 0
        self.shared_calls: dict[Hashable, tuple[float, asyncio.Future[Any]]] = {}

    # --- subscribers ---------------------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(self, run_id: str, after: str = START) -> AsyncIterator[Subscription]:
        subscription = self.open(run_id, after)
        try:
            yield subscription
        finally:
            self.close(subscription)

    def open(self, run_id: str, after: str = START) -> Subscription:
        """subscribe() without the context manager: pair it with close() (on the hub's loop)."""
        subscription = Subscription(self, run_id, after)
        self.subscribers.setdefault(run_id, set()).add(subscription)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._read_forever(), name="stream-hub")
        return subscription

    def close(self, subscription: Subscription) -> None:
        run_id = subscription.run_id
        followers = self.subscribers.get(run_id)
        if followers is None:
            return
        followers.discard(subscription)
        if not followers:
            del self.subscribers[run_id]
            self.positions.pop(run_id, None)
            self.ended.discard(run_id)
            self.shared_calls.pop(("status", run_id), None)

    def subscriber_count(self) -> int:
        return sum(len(followers) for followers in self.subscribers.values())

    def caught_up(self, subscription: Subscription, *, read: int, known: bool) -> bool:
        """After a catch-up read of `read` entries: whether the subscriber has everything up to where the
        reader is, so that its queue alone brings the rest. `known`: the hub was reading the run before
        the catch-up read began (what the reader had read then was in Redis for that read to see). A run
        new to the hub is read from where its first subscriber's catch-up stopped."""
        if read >= READ_COUNT:
            return False  # more backlog to read
        run_id = subscription.run_id
        position = self.positions.get(run_id)
        if position is None:
            self.positions[run_id] = subscription.cursor
            self._wake()
            return True
        return (known and not read) or entry_id(subscription.cursor) >= entry_id(position)

    async def read_after(self, run_id: str, after: str, *, count: int = READ_COUNT) -> list[StreamEvent]:
        """What the run's stream holds after the cursor (non-blocking)."""
        reply: Any = await self.commands.xread({stream_key(run_id): after}, count=count)
        return _events(reply[0][1]) if reply else []

    async def shared(self, key: Hashable, call: Callable[[], Awaitable[T]], *, max_age_s: float) -> T:
        """`call`'s result, shared by every caller with this key within max_age_s (one in flight): e.g. one
        database check of a run's status for all of its idle subscribers."""
        result: T = await asyncio.shield(self.shared_future(key, call, max_age_s=max_age_s))
        return result

    def shared_future(
        self, key: Hashable, call: Callable[[], Awaitable[T]], *, max_age_s: float
    ) -> asyncio.Future[T]:
        """shared() as the shared future itself, for a caller that polls it (no task of its own; never
        cancel it: others wait on it too)."""
        now = time.monotonic()
        cached = self.shared_calls.get(key)
        if cached is None or now - cached[0] > max_age_s:
            cached = (now, asyncio.ensure_future(call()))
            self.shared_calls[key] = cached
        return cached[1]

    # --- the reader ----------------------------------------------------------------------------------

    def _wake(self) -> None:
        self.changed.set()
        if self.reading:
            asyncio.get_running_loop().create_task(self._wake_reader())

    async def _wake_reader(self) -> None:
        try:
            pipe = self.commands.pipeline(transaction=False)
            pipe.xadd(self.wake_key, {"w": "1"}, maxlen=16, approximate=False)
            pipe.expire(self.wake_key, WAKE_TTL_S)
            await pipe.execute()
        except Exception:  # the reader reads the new run after its BLOCK_MS anyway
            logger.warning("streams.hub_wake_failed", exc_info=True)

    def _followed(self) -> dict[str, str]:
        return {
            stream_key(run_id): position
            for run_id, position in self.positions.items()
            if run_id not in self.ended and run_id in self.subscribers
        }

    async def _read_forever(self) -> None:
        backoff = 0.05
        while self.subscribers:
            streams = self._followed()
            if not streams:
                self.changed.clear()
                with suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), BLOCK_MS / 1000)
                continue
            streams[self.wake_key] = self.wake_cursor
            self.reading = True
            try:
                reply: Any = await self.reader.xread(streams, count=READ_COUNT, block=BLOCK_MS)  # type: ignore[arg-type]
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("streams.hub_read_failed", exc_info=True)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            finally:
                self.reading = False
            self.reads += 1
            self._hand_out(reply or [], streams)

    def _hand_out(self, reply: list[Any], asked: dict[str, str]) -> None:
        for key, entries in reply:
            if key == self.wake_key:
                self.wake_cursor = str(entries[-1][0])
                continue
            run_id = key[len(_KEY_PREFIX) :]
            if self.positions.get(run_id) != asked.get(key):
                continue  # every subscriber left while the read was on its way (maybe new ones came)
            try:
                events = _events(entries)
            except (KeyError, ValueError):
                logger.exception("streams.hub_bad_entry", extra={"run_id": run_id})
                self.positions[run_id] = str(entries[-1][0])
                continue
            self.positions[run_id] = events[-1].cursor
            if events[-1].is_end:
                self.ended.add(run_id)
            for subscription in self.subscribers.get(run_id, ()):
                subscription.push(events)

    async def aclose(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.reader.aclose()
        await self.commands.aclose(close_connection_pool=True)


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StreamHub] = weakref.WeakKeyDictionary()


def get_hub() -> StreamHub:
    """The running event loop's hub (asyncio clients and tasks belong to one loop)."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = StreamHub()
    return hub
