"""Server-sent events in Letta's wire format (letta_api.md section 2), relayed from a run's event stream.

The run's events (apps.streams.events) are read from the beginning, numbered by their position in the
stream, and translated one by one: stored messages pass through; with token streaming, the loop's token
deltas become partial reasoning_message / assistant_message / tool_call_message chunks that share one id
per message, and the complete versions of what was streamed are not sent again. Each message carries
`seq_id` = the position of the event it came from, so a client resuming with `starting_after=<last
seq_id>` gets exactly what it missed. The stream ends with stop_reason, usage_statistics, an
`event: error` for a failed run (the SDK raises it), and `data: [DONE]`.

Views stay thin: they build a StreamOptions and return `run_sse_response(...)`: under ASGI the stream is
relayed by the event loop from the process's StreamHub (arun_sse: no thread and no Redis connection per
stream), under WSGI and Django's test client by the blocking loop (run_sse); the bytes are the same. A
blocking send under ASGI waits the same way (acollect_run). A stream holds one of its user's slots
(apps.api.throttles.require_stream_slot) while open: refreshed while it follows the run, released when it
ends or the client goes away (closing the response).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse

from apps.agents import selectors as agent_selectors
from apps.agents import services as agent_services
from apps.agents.models import Run
from apps.agents.wire import StopReasonEvent, to_letta_messages
from apps.api.errors import log_internal_error
from apps.api.throttles import StreamSlot
from apps.core.actor import Actor
from apps.core.db import release_pooled_connection
from apps.streams.events import END_EVENT, START, StreamEvent, follow_events, read_events
from apps.streams.hub import StreamHub, get_hub

logger = logging.getLogger(__name__)

PING_INTERVAL_S = 20.0
"""Seconds of silence before a keep-alive ping: well under the SDK's 60 s read timeout."""
POLL_MS = 1000
FOLLOW_TIMEOUT_S = 3600.0
TERMINAL_GRACE_POLLS = 3
"""Idle polls to wait once the database says the run ended but its stream has no end event yet (a worker
that died, a run cancelled before it started), before ending the stream from the database."""
DONE = b"data: [DONE]\n\n"
STEP_MESSAGE_TYPES = frozenset({"reasoning_message", "assistant_message", "tool_call_message"})
CONTROL_TYPES = frozenset({"stop_reason", "usage_statistics", "ping", "error_message"})
FAILED_STOP_REASONS = frozenset(
    {
        "error",
        "invalid_tool_call",
        "no_tool_call",
        "invalid_llm_response",
        "llm_api_error",
        "max_tokens_exceeded",
        "context_window_overflow_in_system_prompt",
        "insufficient_credits",
    }
)


def encode(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, separators=(',', ':'), default=str)}\n\n".encode()


def encode_error(event: dict[str, Any]) -> bytes:
    return f"event: error\ndata: {json.dumps(event, separators=(',', ':'), default=str)}\n\n".encode()


def ping(run_id: str | None) -> dict[str, Any]:
    return {"message_type": "ping", "id": f"ping-{uuid.uuid4()}", "date": _now(), "run_id": run_id}


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class StreamOptions:
    stream_tokens: bool = False
    include_types: frozenset[str] | None = None
    include_pings: bool = True
    approval_tools: frozenset[str] = frozenset()
    starting_after: int = 0


@dataclass
class LettaEventTranslator:
    """Run events -> Letta stream items, at most one per event. Stateful: token mode remembers what was
    streamed in pieces, so the complete message that follows is not sent twice."""

    options: StreamOptions
    streamed_parts: set[tuple[str | None, str]] = field(default_factory=set)
    streamed_calls: set[str] = field(default_factory=set)
    held_calls: set[str] = field(default_factory=set)

    def translate(self, seq: int, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("message_type")
        if kind == "delta":
            item = self._chunk(seq, event) if self.options.stream_tokens else None
        elif kind in ("stop_reason", "usage_statistics"):
            return event
        elif kind == "run_end":
            return None
        else:
            item = None if self._already_streamed(event) else {**event, "seq_id": seq}
        if item is None:
            return None
        include = self.options.include_types
        return item if include is None or item.get("message_type") in include else None

    def _chunk(self, seq: int, delta: dict[str, Any]) -> dict[str, Any] | None:
        step_id, run_id = delta.get("step_id"), delta.get("run_id")
        message_id = delta.get("message_id") or _message_id_for(step_id, run_id)
        base = {"id": message_id, "date": _now(), "run_id": run_id, "step_id": step_id, "seq_id": seq}
        kind, text = delta.get("kind"), delta.get("text") or ""
        if kind == "reasoning":
            self.streamed_parts.add((step_id, "reasoning"))
            return {
                **base,
                "message_type": "reasoning_message",
                "otid": _otid(message_id, "reasoning"),
                "reasoning": text,
                "source": "non_reasoner_model",
            }
        if kind == "content":
            self.streamed_parts.add((step_id, "content"))
            return {
                **base,
                "message_type": "assistant_message",
                "otid": _otid(message_id, "content"),
                "content": text,
            }
        call_id, name = delta.get("tool_call_id"), delta.get("tool_name")
        if kind != "tool_call_args" or not call_id:
            return None
        if name in self.options.approval_tools or call_id in self.held_calls:
            self.held_calls.add(call_id)  # comes whole, as an approval request
            return None
        self.streamed_calls.add(call_id)
        call = {"name": name, "arguments": text, "tool_call_id": call_id}
        return {
            **base,
            "message_type": "tool_call_message",
            "otid": _otid(message_id, call_id),
            "tool_call": call,
            "tool_calls": call,
        }

    def _already_streamed(self, event: dict[str, Any]) -> bool:
        if not self.options.stream_tokens or event.get("message_type") not in STEP_MESSAGE_TYPES:
            return False
        kind, step_id = event["message_type"], event.get("step_id")
        if kind == "reasoning_message":
            return (step_id, "reasoning") in self.streamed_parts
        if kind == "assistant_message":
            return (step_id, "content") in self.streamed_parts
        call = event.get("tool_call") or {}
        return call.get("tool_call_id") in self.streamed_calls


def _message_id_for(step_id: str | None, run_id: str | None) -> str:
    """The id the chunks of one step's reply share (stable across replays of the stream)."""
    source = step_id or run_id or ""
    return f"message-{uuid.uuid5(uuid.NAMESPACE_URL, source)}" if source else f"message-{uuid.uuid4()}"


def _otid(message_id: str, part: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{message_id}/{part}"))


class _TerminalWatch:
    """follow_events' on_idle: ends the stream once the run is over in the database but its stream stays
    silent (no end event will come)."""

    def __init__(self, actor: Actor, run_id: str) -> None:
        self.actor, self.run_id = actor, run_id
        self.silent_polls = 0

    def __call__(self) -> bool:
        status = agent_selectors.run_get(actor=self.actor, run_id=self.run_id).status
        release_pooled_connection()
        if status not in agent_selectors.TERMINAL_RUN_STATUSES:
            self.silent_polls = 0
            return False
        self.silent_polls += 1
        return self.silent_polls >= TERMINAL_GRACE_POLLS


class HeldStream:
    """SSE bytes holding a stream slot: released when they end or are closed, even unstarted (a client
    gone before the first byte), which a generator's own `finally` would not see."""

    def __init__(self, chunks: Iterator[bytes], slot: StreamSlot) -> None:
        self.chunks, self.slot = chunks, slot

    def __iter__(self) -> HeldStream:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self.chunks)
        except BaseException:  # the end, or a failure: either way the stream is over
            self.slot.release()
            raise

    def close(self) -> None:
        try:
            close = getattr(self.chunks, "close", None)
            if close is not None:
                close()
        finally:
            self.slot.release()


def run_sse(
    *,
    actor: Actor,
    run_id: str,
    options: StreamOptions,
    timeout_s: float | None = None,
    slot: StreamSlot | None = None,
) -> Iterator[bytes]:
    """The run's events as SSE bytes: replayed from the start (skipping what the client already has),
    then followed live, with pings while idle; always ends with [DONE], also when reading fails midway
    (then after an `event: error`, since the HTTP status is long gone). With a slot, the stream holds it
    while open."""
    chunks = _run_sse_or_error(
        actor=actor,
        run_id=run_id,
        options=options,
        timeout_s=timeout_s,
        keepalive=slot.refresh if slot else None,
    )
    return chunks if slot is None else HeldStream(chunks, slot)


def _run_sse_or_error(
    *,
    actor: Actor,
    run_id: str,
    options: StreamOptions,
    timeout_s: float | None,
    keepalive: Callable[[], None] | None,
) -> Iterator[bytes]:
    try:
        yield from _run_sse(
            actor=actor, run_id=run_id, options=options, timeout_s=timeout_s, keepalive=keepalive
        )
    except Exception as exc:
        yield _failed(exc, run_id)
        yield DONE


def _failed(exc: Exception, run_id: str) -> bytes:
    """The error event of a stream that failed midway (the HTTP status is long gone)."""
    error_id = log_internal_error("api.sse_failed", exc, run_id=run_id)
    return encode_error(
        {
            "message_type": "error_message",
            "run_id": run_id,
            "error_type": "internal_error",
            "message": "The event stream failed; the run itself may still be going.",
            "detail": f"Internal server error (error_id: {error_id})",
            "error_id": error_id,
            "seq_id": None,
        }
    )


@dataclass
class _Relay:
    """The follow loop's state, shared by the blocking loop (WSGI) and the asynchronous one (ASGI): run
    events in, SSE bytes out."""

    options: StreamOptions
    run_id: str = ""
    """Given (the hub's streams), chunks are shared with the run's other streams (_shared_chunk)."""
    translator: LettaEventTranslator = field(init=False)
    sent: set[str] = field(default_factory=set)
    seq: int = 0
    last_output: float = field(default_factory=time.monotonic)
    ended: bool = False

    def __post_init__(self) -> None:
        self.translator = LettaEventTranslator(self.options)

    def take(self, event: StreamEvent) -> bytes | None:
        """The event's SSE chunk, if it makes one; at the end event, sets `ended` instead."""
        self.seq += 1
        if event.is_end:
            self.ended = True
            return None
        if self.run_id and not self.options.stream_tokens:
            kind, chunk = _shared_chunk(self.run_id, event, self.seq, self.options.include_types)
        else:
            kind, chunk = self._chunk(event)
        if chunk is None:
            return None
        if kind in CONTROL_TYPES:
            self.sent.add(kind)
        elif self.seq <= self.options.starting_after:
            return None
        self.last_output = time.monotonic()
        return chunk

    def _chunk(self, event: StreamEvent) -> tuple[str | None, bytes | None]:
        item = self.translator.translate(self.seq, event.data)
        return (None, None) if item is None else (item.get("message_type"), encode(item))

    def idle(self, run_id: str) -> bytes | None:
        """A keep-alive ping when the stream has been silent for PING_INTERVAL_S."""
        if self.options.include_pings and time.monotonic() - self.last_output >= PING_INTERVAL_S:
            self.last_output = time.monotonic()
            return encode(ping(run_id))
        return None


_SHARED_CHUNKS: dict[tuple[str, str, int, frozenset[str] | None], tuple[str | None, bytes | None]] = {}
SHARED_CHUNKS_MAX = 20_000


def _shared_chunk(
    run_id: str, event: StreamEvent, seq: int, include: frozenset[str] | None
) -> tuple[str | None, bytes | None]:
    """An event's translated and encoded chunk, made once for all of the run's streams (ten clients of a
    run: one json.dumps, not ten). Without token streaming the translation is a function of the event, its
    position and the types asked for alone (the translator keeps no state then)."""
    key = (run_id, event.cursor, seq, include)
    made = _SHARED_CHUNKS.get(key)
    if made is None:
        item = LettaEventTranslator(StreamOptions(include_types=include)).translate(seq, event.data)
        made = (None, None) if item is None else (item.get("message_type"), encode(item))
        if len(_SHARED_CHUNKS) >= SHARED_CHUNKS_MAX:
            _SHARED_CHUNKS.clear()  # crude but bounded; a miss only costs a translation
        _SHARED_CHUNKS[key] = made
    return made


def _run_sse(
    *,
    actor: Actor,
    run_id: str,
    options: StreamOptions,
    timeout_s: float | None,
    keepalive: Callable[[], None] | None = None,
) -> Iterator[bytes]:
    if not read_events(run_id, after=START, count=1):
        run = agent_selectors.run_get(actor=actor, run_id=run_id)
        if run.status in agent_selectors.TERMINAL_RUN_STATUSES:
            yield from _replay_from_database(actor=actor, run=run, options=options)
            return
    relay = _Relay(options)
    watch = _TerminalWatch(actor, run_id)
    timeout_s = timeout_s or FOLLOW_TIMEOUT_S
    release_pooled_connection()  # a long stream holds no pooled connection while it waits
    for event in follow_events(run_id, after=START, timeout_s=timeout_s, poll_ms=POLL_MS, on_idle=watch):
        if keepalive is not None:
            keepalive()  # the stream's slot (a Redis call at most every STREAM_SLOT_REFRESH_S)
        if event is None:
            if (chunk := relay.idle(run_id)) is not None:
                yield chunk
            continue
        chunk = relay.take(event)
        if relay.ended:
            break
        if chunk is not None:
            yield chunk
    yield from _ending(actor=actor, run_id=run_id, sent=relay.sent)


# --- the asynchronous relay (ASGI): no thread and no Redis connection per stream ------------------------


def _db(func: Callable[..., Any]) -> Callable[..., Any]:
    """A database call from the event loop, in the loop's shared pool of threads (not one per stream);
    the thread's connection is given back around it, as in a consumer."""
    return database_sync_to_async(func, thread_sensitive=False)


def _run_status(actor: Actor, run_id: str) -> str:
    return agent_selectors.run_get(actor=actor, run_id=run_id).status


async def _aended_in_database(hub: StreamHub, actor: Actor, run_id: str) -> bool:
    """Whether the run is over in the database: one query for all of the run's idle streams at a time."""
    status = await hub.shared(
        ("status", run_id), lambda: _db(_run_status)(actor, run_id), max_age_s=POLL_MS / 1000
    )
    return status in agent_selectors.TERMINAL_RUN_STATUSES


def _replayed(actor: Actor, run_id: str, options: StreamOptions) -> list[bytes] | None:
    """A finished run with an empty stream, replayed from the database; None when the run is not over."""
    run = agent_selectors.run_get(actor=actor, run_id=run_id)
    if run.status not in agent_selectors.TERMINAL_RUN_STATUSES:
        return None
    return list(_replay_from_database(actor=actor, run=run, options=options))


def _ending_chunks(actor: Actor, run_id: str, sent: set[str]) -> list[bytes]:
    return list(_ending(actor=actor, run_id=run_id, sent=sent))


async def arun_sse(
    *,
    actor: Actor,
    run_id: str,
    options: StreamOptions,
    timeout_s: float | None = None,
    slot: StreamSlot | None = None,
) -> AsyncIterator[bytes]:
    """run_sse on the event loop: the same bytes, followed through the process's StreamHub."""
    hub = get_hub()
    try:
        try:
            keepalive = (lambda: slot.arefresh(hub.commands)) if slot is not None else None
            async for chunk in _arun_sse(
                actor=actor, run_id=run_id, options=options, timeout_s=timeout_s, keepalive=keepalive
            ):
                yield chunk
        except Exception as exc:
            yield _failed(exc, run_id)
            yield DONE
    finally:
        if slot is not None:
            await slot.arelease(hub.commands)


async def _arun_sse(
    *,
    actor: Actor,
    run_id: str,
    options: StreamOptions,
    timeout_s: float | None,
    keepalive: Callable[[], Awaitable[None]] | None,
) -> AsyncIterator[bytes]:
    hub = get_hub()
    if not await hub.read_after(run_id, START, count=1):
        replayed = await _db(_replayed)(actor, run_id, options)
        if replayed is not None:
            for chunk in replayed:
                yield chunk
            return
    relay = _Relay(options, run_id=run_id)
    deadline = time.monotonic() + (timeout_s or FOLLOW_TIMEOUT_S)
    silent_polls = 0  # idle polls since the database said the run is over (see _TerminalWatch)
    check: asyncio.Future[str] | None = (
        None  # the run's status, read for an idle poll (shared by the run's streams)
    )
    async with hub.subscribe(run_id, START) as subscription:
        while time.monotonic() < deadline and not relay.ended:
            events = await subscription.get(POLL_MS / 1000)
            if keepalive is not None:
                await keepalive()  # the stream's slot (a Redis call at most every STREAM_SLOT_REFRESH_S)
            if not events:
                # The check runs beside the next wait and is read at the next idle poll: a busy database
                # never holds back an event.
                if check is not None and check.done():
                    ended, check = check.result() in agent_selectors.TERMINAL_RUN_STATUSES, None
                    silent_polls = silent_polls + 1 if ended else 0
                    if silent_polls >= TERMINAL_GRACE_POLLS:
                        break
                if check is None:
                    check = hub.shared_future(
                        ("status", run_id), lambda: _db(_run_status)(actor, run_id), max_age_s=POLL_MS / 1000
                    )
                if (chunk := relay.idle(run_id)) is not None:
                    yield chunk
                continue
            chunks = []
            for event in events:
                if (chunk := relay.take(event)) is not None:
                    chunks.append(chunk)
                if relay.ended:
                    break
            if chunks:
                yield b"".join(chunks)  # one send for what arrived together
    for chunk in await _db(_ending_chunks)(actor, run_id, relay.sent):
        yield chunk


# --- blocking sends (ASGI): agent_services.run_collect on the event loop ------------------------------------


@dataclass
class _Collector:
    """What run_collect gathers from a run's events: its messages, stop reason, usage and end."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    seen_events: bool = False
    cursor: str = START

    def take(self, event: StreamEvent) -> None:
        self.seen_events, self.cursor = True, event.cursor
        kind = event.data.get("message_type")
        if kind == "stop_reason":
            self.stop_reason = event.data
        elif kind == "usage_statistics":
            self.usage = event.data
        elif kind == END_EVENT:
            self.end = event.data
        elif kind != "delta":
            self.messages.append(event.data)


async def acollect_run(*, actor: Actor, run: Run, timeout_s: float) -> agent_services.CollectedRun:
    """agent_services.run_collect(reread=False) for a blocking send under ASGI, with the same answer:
    the run is followed through the process's StreamHub, so the wait holds no thread and no Redis
    connection; the database is read (in the loop's shared threads) only for the idle checks and the end."""
    hub = get_hub()
    if run.status in agent_selectors.TERMINAL_RUN_STATUSES and not await hub.read_after(
        run.id, START, count=1
    ):
        return await _db(_collect_from_database)(actor, run)
    got = _Collector()
    deadline = time.monotonic() + timeout_s
    idle_wait_s = agent_services.COLLECT_POLL_MS * agent_services.COLLECT_DB_CHECK_EVERY / 1000
    terminal_polls = 0
    async with hub.subscribe(run.id, START) as subscription:
        while got.end is None and (left := deadline - time.monotonic()) > 0:
            # Idle: the database is asked whether the run is over every idle_wait_s (a dead worker never
            # writes its end event), then every poll through the grace that follows (see run_collect).
            wait_s = agent_services.COLLECT_POLL_MS / 1000 if terminal_polls else idle_wait_s
            events = await subscription.get(min(wait_s, left))
            for event in events:
                got.take(event)
                if event.is_end:
                    break
            if events or time.monotonic() >= deadline:
                continue
            if not await _aended_in_database(hub, actor, run.id):
                terminal_polls = 0
                continue
            terminal_polls += 1
            if terminal_polls > agent_services.COLLECT_TERMINAL_GRACE_POLLS:
                break
    if got.end is None:  # ended from the database or by the timeout: whatever arrived meanwhile
        for event in await hub.read_after(run.id, got.cursor):
            got.take(event)
    return await _db(_collected)(actor, run, got)


def _collect_from_database(actor: Actor, run: Run) -> agent_services.CollectedRun:
    """A finished run whose stream is empty: run_collect answers it from its stored messages at once."""
    return agent_services.run_collect(actor=actor, run_id=run.id, run=run, reread=False, timeout_s=0)


def _collected(actor: Actor, run: Run, got: _Collector) -> agent_services.CollectedRun:
    """run_collect's ending: the run's last state (from its end event when it completed or was
    cancelled, else read again, e.g. for a failure's error), or the database's account of a run whose
    stream had nothing."""
    end = got.end or {}
    if got.end is not None and end.get("status") in (Run.Status.COMPLETED, Run.Status.CANCELLED):
        run.status, run.stop_reason = end["status"], end.get("stop_reason") or run.stop_reason
    else:
        run.refresh_from_db()
    if not got.seen_events and run.status in agent_selectors.TERMINAL_RUN_STATUSES:
        logger.warning("agents.run_collect_from_database", extra={"run_id": run.id})
        return _collect_from_database(actor, run)
    return agent_services.CollectedRun(
        run=run,
        messages=got.messages,
        stop_reason=got.stop_reason,
        usage=got.usage,
        finished=got.end is not None or run.status in agent_selectors.TERMINAL_RUN_STATUSES,
    )


def _ending(*, actor: Actor, run_id: str, sent: set[str]) -> Iterator[bytes]:
    """What the stream did not carry (its writer died, or it was cancelled before starting), from the
    database; then the error event of a failed run, and [DONE]."""
    run = agent_selectors.run_get(actor=actor, run_id=run_id)
    finished = run.status in agent_selectors.TERMINAL_RUN_STATUSES
    if finished and "stop_reason" not in sent:
        yield encode(StopReasonEvent(agent_selectors.run_stop_reason(run)).event())
    if finished and "usage_statistics" not in sent:
        yield encode(agent_selectors.run_usage_event(actor=actor, run=run))
    if run.status == Run.Status.FAILED:
        yield encode_error(error_message(run))
    yield DONE


def _replay_from_database(*, actor: Actor, run: Run, options: StreamOptions) -> Iterator[bytes]:
    """A finished run whose event stream expired: its stored messages, then the ending."""
    translator = LettaEventTranslator(StreamOptions(include_types=options.include_types))
    seq = 0
    for message in agent_selectors.run_produced_messages(actor=actor, run_id=run.id):
        for letta_message in to_letta_messages(message):
            seq += 1
            item = translator.translate(seq, letta_message)
            if item is not None and seq > options.starting_after:
                yield encode(item)
    yield from _ending(actor=actor, run_id=run.id, sent=set())


def error_message(run: Run) -> dict[str, Any]:
    """Letta's LettaErrorMessage for a failed run."""
    detail = (run.error or {}).get("message") or run.metadata.get("error") or ""
    reason = agent_selectors.run_stop_reason(run)
    return {
        "message_type": "error_message",
        "run_id": run.id,
        "error_type": reason,
        "message": detail or f"The run failed ({reason}).",
        "detail": detail or None,
        "seq_id": None,
    }


def is_asgi(request: HttpRequest) -> bool:
    return isinstance(getattr(request, "_request", request), ASGIRequest)


def _next_chunk(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)


async def _as_async(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Serve a blocking iterator under ASGI without buffering it: each step runs in the request's own
    sync thread (Django gives every ASGI request one), so the event loop never blocks."""
    advance = sync_to_async(_next_chunk)
    try:
        while (chunk := await advance(chunks)) is not None:
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            await sync_to_async(close)()


def run_sse_response(
    request: HttpRequest, *, actor: Actor, run_id: str, options: StreamOptions, slot: StreamSlot | None
) -> StreamingHttpResponse:
    """The run's SSE response: under ASGI relayed by the event loop (arun_sse: the view's thread is let
    go once it returns, see apps.core.asgi), else by the blocking loop (run_sse)."""
    if is_asgi(request):
        return sse_response(request, arun_sse(actor=actor, run_id=run_id, options=options, slot=slot))
    return sse_response(request, run_sse(actor=actor, run_id=run_id, options=options, slot=slot))


def sse_response(
    request: HttpRequest, chunks: Iterator[bytes] | AsyncIterator[bytes]
) -> StreamingHttpResponse:
    """text/event-stream, whatever the Accept header said (the SDK sends application/json)."""
    content = _as_async(chunks) if is_asgi(request) and isinstance(chunks, Iterator) else chunks
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
