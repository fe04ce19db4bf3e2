"""The run event log: a Redis Stream per run, appended by the loop and read from a cursor by SSE and the ADE.

Each event is one JSON document. Entry ids ("<ms>-<seq>") are the sequence numbers clients resume
from: a reader that connects late or reconnects passes the last id it saw and gets everything after
it, then the live tail, with no gap and no duplicate. A final `run_end` event closes the stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from apps.streams.redis_client import get_redis

STREAM_TTL_SECONDS = 24 * 3600
STREAM_MAX_EVENTS = 100_000  # a bound, far above any real run, so a runaway loop cannot fill Redis
END_EVENT = "run_end"
START = "0-0"


def stream_key(run_id: str) -> str:
    return f"run-events:{run_id}"


@dataclass(frozen=True)
class StreamEvent:
    cursor: str
    data: dict[str, Any]

    @property
    def is_end(self) -> bool:
        return self.data.get("message_type") == END_EVENT


def append_event(run_id: str, event: dict[str, Any]) -> str:
    return append_events(run_id, [event])[-1]


def append_events(run_id: str, events: list[dict[str, Any]]) -> list[str]:
    """Append events in order, in one round trip (one pipeline: the XADDs, then the TTL refresh)."""
    if not events:
        return []
    key = stream_key(run_id)
    pipe = get_redis().pipeline(transaction=False)
    for event in events:
        pipe.xadd(key, {"data": json.dumps(event, default=str)}, maxlen=STREAM_MAX_EVENTS, approximate=True)
    pipe.expire(key, STREAM_TTL_SECONDS)
    return [str(entry_id) for entry_id in pipe.execute()[:-1]]


def owner_key(run_id: str) -> str:
    return f"run-events-owner:{run_id}"


class StreamFenced(Exception):
    """The run's stream has a newer writer (another executor claimed the run, or recovery ended it) since
    this one took it: nothing this writer appends is stored any more."""


# Fenced appends: the stream's owner (a hash: lease, generation) is the writer with the newest generation
# (the time its claim was made, ms). A writer under the owner's lease appends; a writer with a newer
# generation takes the stream over and appends; any other writer (an executor cut off while the run was
# failed or claimed again, coming back) is refused with nothing appended. One round trip, atomic.
_FENCED_APPEND = """
local owner = redis.call('HMGET', KEYS[2], 'lease', 'generation')
if owner[1] ~= ARGV[1] then
  if owner[2] and tonumber(owner[2]) >= tonumber(ARGV[2]) then
    return false
  end
  redis.call('HSET', KEYS[2], 'lease', ARGV[1], 'generation', ARGV[2])
end
redis.call('EXPIRE', KEYS[2], ARGV[3])
local ids = {}
for i = 5, #ARGV do
  ids[#ids + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], '*', 'data', ARGV[i])
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return ids
"""
_fenced_append_script: Any = None


def append_events_fenced(
    run_id: str, events: list[dict[str, Any]], *, lease: str, generation: int
) -> list[str]:
    """append_events for a writer holding the run under `lease`, taken at `generation` (ms); raises
    StreamFenced (nothing appended) when a writer with a newer generation has taken the stream since.

    Generations are the writers' clocks: hosts' clocks must agree to well within the time recovery takes
    to end a lost run (seconds), which NTP gives. A Redis that lost its data (no persistence) forgets the
    owner; the next writer takes the stream, and the newest writer still wins from then on."""
    global _fenced_append_script
    if not events:
        return []
    if _fenced_append_script is None:
        _fenced_append_script = get_redis().register_script(_FENCED_APPEND)
    ids = _fenced_append_script(
        keys=[stream_key(run_id), owner_key(run_id)],
        args=[
            lease,
            generation,
            STREAM_TTL_SECONDS,
            STREAM_MAX_EVENTS,
            *(json.dumps(event, default=str) for event in events),
        ],
    )
    if ids is None:
        raise StreamFenced(run_id)
    return [str(entry_id) for entry_id in ids]


def end_event(run_id: str, *, status: str, stop_reason: str) -> dict[str, Any]:
    return {"message_type": END_EVENT, "run_id": run_id, "status": status, "stop_reason": stop_reason}


def end_stream(run_id: str, *, status: str, stop_reason: str, fence: bool = False) -> str:
    """Close the run's stream. fence (crash recovery ending a run it failed): as the stream's newest
    writer, so the run's old executor, coming back, appends nothing after the end."""
    event = end_event(run_id, status=status, stop_reason=stop_reason)
    if fence:
        return append_events_fenced(run_id, [event], lease="ended", generation=time.time_ns() // 1_000_000)[
            -1
        ]
    return append_event(run_id, event)


def cancel_key(run_id: str) -> str:
    return f"run-cancel:{run_id}"


def request_cancel(run_id: str) -> None:
    """Tell the run's executor, wherever it is, that the run was cancelled: an LLM call it has in flight
    checks this (apps.llm.retry.CallBounds) and ends within about a second. Between steps the loop reads
    the run's status from the database instead."""
    get_redis().set(cancel_key(run_id), "1", ex=STREAM_TTL_SECONDS)


def cancel_requested(run_id: str) -> bool:
    """Whether the run was cancelled (one Redis read, no SQL: an LLM call's watchdog asks twice a second)."""
    return bool(get_redis().exists(cancel_key(run_id)))


def read_events(
    run_id: str, *, after: str = START, block_ms: int | None = None, count: int = 500
) -> list[StreamEvent]:
    """Events after the cursor; with block_ms, waits up to that long for the first new one."""
    reply = get_redis().xread({stream_key(run_id): after}, count=count, block=block_ms)
    if not reply:
        return []
    _, entries = reply[0]
    return [StreamEvent(cursor=entry_id, data=json.loads(fields["data"])) for entry_id, fields in entries]


def follow_events(
    run_id: str,
    *,
    after: str = START,
    timeout_s: float = 3600.0,
    poll_ms: int = 1000,
    on_idle: Callable[[], bool] | None = None,
) -> Iterator[StreamEvent | None]:
    """Yield events from the cursor until the run's end event (included) or the timeout.

    Yields None after each idle `poll_ms` so callers can send keep-alive pings; `on_idle` returning
    True ends the stream early (e.g. the run is terminal in the database but has no end event,
    because its worker died before writing it).
    """
    deadline = time.monotonic() + timeout_s
    cursor = after
    while time.monotonic() < deadline:
        events = read_events(run_id, after=cursor, block_ms=poll_ms)
        if not events:
            if on_idle is not None and on_idle():
                return
            yield None
            continue
        for event in events:
            cursor = event.cursor
            yield event
            if event.is_end:
                return


class RedisStreamSink:
    """The loop's EventSink for runs executed by workers: events go to the run's stream as they come;
    `finish` appends the run's last events and the end event together."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.ended = False
        self.lease = ""
        self.generation = 0

    def hold(self, lease: str, generation: int) -> None:
        """The executor claimed the run under `lease` at `generation` (ms): from now on its events are
        fenced (append_events_fenced) and StreamFenced says it lost the run."""
        self.lease, self.generation = lease, generation

    def _append(self, events: list[dict[str, Any]]) -> None:
        if self.lease:
            append_events_fenced(self.run_id, events, lease=self.lease, generation=self.generation)
        else:
            append_events(self.run_id, events)

    def emit(self, event: dict[str, Any]) -> None:
        self._append([event])

    def emit_many(self, events: list[dict[str, Any]]) -> None:
        self._append(events)

    def finish(self, events: list[dict[str, Any]], *, status: str, stop_reason: str) -> None:
        self._append([*events, end_event(self.run_id, status=status, stop_reason=stop_reason)])
        self.ended = True
