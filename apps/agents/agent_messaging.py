"""Agent-to-agent messaging: Letta's `letta_multi_agent_core` tools, run for the sending agent in its step.

Delivery. A message to another agent is a system message (as in Letta) of that agent's default thread, stored with a Run
by `run_create` (the service behind the API's sends) as the sender's organisation, so another
organisation's agent is "not found" exactly as a missing id is. Its text names the sender (Letta's
"[Incoming message from agent with ID '...' - ...]" prefix); `sender_id` holds the sender's id and
`name` its name.

Waiting never deadlocks the worker pool. The waiting step does not park its worker thread on a reply that
needs another worker: it executes the other agent's run itself, inline, in the same thread (it can take
that agent's conversation lock on its own database session, as a worker would). Only when another
executor holds that lock (the other agent is busy elsewhere) does it wait, polling, until that executor
is done, then executes the run itself, unless someone else claimed it meanwhile (then it follows that run
to its end). Runs of the other agent that come before the message and wait for a worker are executed
inline first (a conversation's runs execute in order), so even with every worker slot waiting, each
waiting step makes progress. A wait ends at the earliest of AGENT_REPLY_TIMEOUT, the sender's run
deadline (RUN_DEADLINE, less a reserve for the sender's own answer) and the deadline of every wait it is
nested in; then the request is cancelled (an inline run stops at its next check, within about a second of
an LLM call) and the model gets an error saying so.

Cycles are errors, never hangs. Each thread keeps the stack of agents whose step waits in it (a
contextvar); waiting on one of them, or on oneself, is refused. Across workers, each wait is registered in
Redis (waiter -> awaited, expiring with the wait); before waiting, the chain of waits from the awaited
agent is followed, and reaching the waiter (or an agent waiting in this thread) is refused. The wait is
registered before the chain is read, so of two waits that close a cycle at the same moment, at least one
sees it. Refusing by agent, not by conversation, is deliberate: inline execution of a second run of an
agent whose run this thread is executing would share that run's database session, whose advisory locks
are re-entrant, and so would not be kept out.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.agents.errors import AgentNotFound
from apps.agents.locks import conversation_is_locked
from apps.agents.loop.convert import to_letta_messages
from apps.agents.loop.runner import RunDeferred, TurnResult, execute_run_streamed
from apps.agents.models import Agent, AgentType, Run
from apps.agents.selectors import TERMINAL_RUN_STATUSES, run_produced_messages
from apps.core.actor import Actor
from apps.core.errors import DomainError
from apps.llm.retry import Deadline, earliest
from apps.streams.events import cancel_requested
from apps.streams.redis_client import get_redis
from apps.tools.execution import ToolContext, ToolResult

logger = logging.getLogger(__name__)

ASYNC_PREFIX = (
    "[Incoming message from agent with ID '{sender}' - to reply to this message, make sure to use the "
    "'send_message_to_agent_async' tool, or the agent will not receive your message] {message}"
)
"""Letta's wording for a message that expects no reply in return."""
REPLY_PREFIX = "[Incoming message from agent with ID '{sender}' - your response will be delivered to the sender] {message}"
"""For the waiting tools: the receiving agent's reply (its assistant text or send_message) goes back."""
SENT = "Successfully sent message to agent '{agent_id}' (run '{run_id}')."
NO_RESPONSE = "<no response>"
MAX_RECIPIENTS = 50
"""The most agents send_message_to_agents_matching_tags reaches (Letta's limit); more is an error."""
POLL_SECONDS = 0.2
WATCH_SECONDS = 0.25
DEADLINE_RESERVE_SECONDS = 10.0
"""What a wait leaves of the sender's run deadline for the sender's own answer (at most 10% of it)."""
WAIT_KEY = "agent-waits:{agent_id}"
WAIT_KEY_MARGIN_SECONDS = 5
CHAIN_LIMIT = 200
"""Agents a cycle check visits at most (a chain of waits is short; this bounds a pathological graph)."""
BACKGROUND_TIMEOUT_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class _Waiting:
    agent_id: str
    deadline: Deadline


_WAITING: ContextVar[tuple[_Waiting, ...]] = ContextVar("agent_messaging_waiting", default=())
"""The agents whose step waits for a reply in this thread, outermost first (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class Reply:
    """What one asked agent answered: its messages to the sender, or why there are none."""

    agent_id: str
    response: tuple[str, ...] = ()
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        if self.error is not None:
            return {"agent_id": self.agent_id, "error": self.error}
        return {"agent_id": self.agent_id, "response": list(self.response) or [NO_RESPONSE]}


class CycleRefused(DomainError):
    """Waiting for this agent would wait, directly or through other agents, for the waiter itself."""

    code = "agent_wait_cycle"


# --- the tools ------------------------------------------------------------------------------------------


def send_message_to_agent_async(
    *, ctx: ToolContext, sender: Agent, message: str, other_agent_id: str
) -> ToolResult:
    """Queue a run of the other agent with the message; the receipt comes back at once."""
    recipient = _recipient(ctx, other_agent_id)
    run = _deliver(
        ctx,
        sender,
        recipient,
        ASYNC_PREFIX.format(sender=sender.id, message=message),
        "send_message_to_agent_async",
    )
    _submit(run)
    return ToolResult.ok(SENT.format(agent_id=recipient.id, run_id=run.id))


def send_message_to_agent_and_wait_for_reply(
    *, ctx: ToolContext, sender: Agent, message: str, other_agent_id: str
) -> ToolResult:
    """Send the message and return the other agent's reply; a failure, a timeout or a cycle is an error."""
    recipient = _recipient(ctx, other_agent_id)
    deadline = _wait_deadline(ctx)
    inline = _may_execute_inline(ctx)
    try:
        with _waiting_on(sender.id, [recipient.id], deadline):
            run = _deliver(
                ctx,
                sender,
                recipient,
                REPLY_PREFIX.format(sender=sender.id, message=message),
                "send_message_to_agent_and_wait_for_reply",
            )
            if not inline:
                _submit(run)
            reply = _await_reply(ctx, run, deadline, inline=inline)
    except CycleRefused as exc:
        return ToolResult.error(exc.message)
    if reply.error is not None:
        return ToolResult.error(reply.error)
    return ToolResult.ok(json.dumps(reply.as_dict(), ensure_ascii=False))


def send_message_to_agents_matching_tags(
    *, ctx: ToolContext, sender: Agent, message: str, match_all: list[str], match_some: list[str]
) -> ToolResult:
    """Send the message to every matching agent of the organisation but the sender and gather the replies,
    in the agents' order (an error entry for one that could not reply). Every message is delivered and
    submitted first, so free workers answer in parallel; what none has taken is executed here, one after
    the other, each wait bounded as send_message_to_agent_and_wait_for_reply's. Raises DomainError past
    MAX_RECIPIENTS matching agents (nothing is sent)."""
    recipients = _matching_agents(ctx, sender, match_all, match_some)
    if not recipients:
        return ToolResult.ok("[]")
    overall = _wait_deadline(ctx, own=False)
    text = REPLY_PREFIX.format(sender=sender.id, message=message)
    inline = _may_execute_inline(ctx)
    replies: dict[str, Reply] = {}
    with _waiting_on(sender.id, [r.id for r in recipients], overall, refuse=False) as refused:
        runs: list[Run] = []
        for recipient in recipients:
            if recipient.id in refused:
                replies[recipient.id] = Reply(recipient.id, error=refused[recipient.id])
                continue
            try:
                runs.append(_deliver(ctx, sender, recipient, text, "send_message_to_agents_matching_tags"))
            except DomainError as exc:
                replies[recipient.id] = Reply(recipient.id, error=exc.message)
        for run in runs:
            _submit(run)
        for run in runs:
            deadline = earliest(_reply_timeout(), overall)
            replies[run.agent_id] = _await_reply(ctx, run, deadline, inline=inline)
    return ToolResult.ok(json.dumps([replies[r.id].as_dict() for r in recipients], ensure_ascii=False))


# --- recipients and delivery ----------------------------------------------------------------------------


def _recipient(ctx: ToolContext, agent_id: str) -> Agent:
    """The agent `agent_id` of the sender's organisation; another organisation's is not found, in the same
    words as one that does not exist. Raises AgentNotFound."""
    agent = Agent.objects.for_actor(ctx.actor).filter(id=agent_id).only("id", "name").first()
    if agent is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    return agent


def _matching_agents(
    ctx: ToolContext, sender: Agent, match_all: list[str], match_some: list[str]
) -> list[Agent]:
    """Letta's tag match: all of `match_all` and at least one of `match_some`, an empty list matching
    every agent; ordered by id. Sleeptime agents (which carry their primary's tags) are the primary's
    background memory, not agents to talk to, and are left out, as is the sender."""
    agents = (
        Agent.objects.for_actor(ctx.actor)
        .exclude(id=sender.id)
        .exclude(agent_type=AgentType.SLEEPTIME)
        .only("id", "name")
    )
    if match_all:
        agents = agents.filter(tags__contains=sorted(set(match_all)))
    if match_some:
        agents = agents.filter(tags__overlap=sorted(set(match_some)))
    found = list(agents.order_by("id")[: MAX_RECIPIENTS + 1])
    if len(found) > MAX_RECIPIENTS:
        raise DomainError(
            f"More than {MAX_RECIPIENTS} agents match these tags; a message reaches at most "
            f"{MAX_RECIPIENTS}. Narrow match_all or match_some. Nothing was sent."
        )
    return found


def _deliver(ctx: ToolContext, sender: Agent, recipient: Agent, text: str, run_type: str) -> Run:
    """Store the message as a user message of the recipient's default thread, with the run that will
    answer it (not submitted: see _submit). The run's metadata says where it came from (Letta's
    `run_type`, the tool's name, with the sending agent and its run). Raises DomainError when the recipient
    cannot take it (a tool call awaiting approval), its text naming the recipient."""
    from apps.agents.services import MessageIn, run_create  # services sits above this module

    try:
        with transaction.atomic():
            run = run_create(
                actor=ctx.actor,
                agent_id=recipient.id,
                # A system message, as Letta sends it: the receiving agent's user did not write it.
                messages=[MessageIn(content=text, role="system", name=sender.name, sender_id=sender.id)],
            )
            run.metadata = {
                **run.metadata,
                "run_type": run_type,
                "sender_agent_id": sender.id,
                "sender_run_id": ctx.run_id,
            }
            Run.objects.unscoped().filter(id=run.id).update(metadata=run.metadata)
            return run
    except AgentNotFound:
        raise
    except DomainError as exc:
        raise DomainError(f"Agent '{recipient.id}' cannot take messages now: {exc.message}") from exc


def _submit(run: Run) -> None:
    """Have a worker execute the run, as an API send does. Executed in this process (RUN_EXECUTOR
    in_process), it runs in a thread of its own: this thread executes the sender's run, whose conversation
    lock it holds, and would otherwise run the recipient's run before its own step is over."""
    if settings.RUN_EXECUTOR != "in_process":
        from apps.agents.services import run_submit  # services sits above this module

        run_submit(run)
        return
    thread = threading.Thread(
        target=_execute_in_background,
        args=(run.id, run.agent_id),
        name=f"agent-message-{run.id}",
        daemon=True,
    )
    transaction.on_commit(thread.start)


def _execute_in_background(run_id: str, agent_id: str) -> None:
    give_up = time.monotonic() + BACKGROUND_TIMEOUT_SECONDS
    try:
        while True:
            try:
                execute_run_streamed(run_id, agent_id=agent_id, conversation_id=None)
                return
            except RunDeferred:
                if time.monotonic() > give_up:
                    logger.warning("agents.agent_message_not_executed", extra={"run_id": run_id})
                    return
                time.sleep(POLL_SECONDS)
    finally:
        connection.close()


# --- waiting for a reply --------------------------------------------------------------------------------


def _may_execute_inline(ctx: ToolContext) -> bool:
    """Inside a run (a worker, or this process when RUN_EXECUTOR is in_process) the recipient's run is
    executed here; a tool run outside any run (POST /v1/agents/{id}/tools/{name}/run, the web process,
    which never calls an LLM) has a worker execute it and waits for its end."""
    return ctx.run_id is not None or settings.RUN_EXECUTOR == "in_process"


def _reply_timeout() -> Deadline:
    seconds = float(settings.AGENT_REPLY_TIMEOUT)
    return Deadline.after(seconds, f"no reply came within {seconds:g} s (AGENT_REPLY_TIMEOUT)")


def _wait_deadline(ctx: ToolContext, *, own: bool = True) -> Deadline:
    """When a wait must end: AGENT_REPLY_TIMEOUT (`own`), the sender's run deadline less a reserve, and the
    deadline of every wait this one is nested in, whichever comes first."""
    bounds: list[Deadline] = [w.deadline for w in _WAITING.get()]
    run_bound = _run_deadline(ctx)
    if run_bound is not None:
        bounds.append(run_bound)
    longest = float(settings.RUN_DEADLINE)
    first = _reply_timeout() if own else Deadline.after(longest, f"no reply came within {longest:g} s")
    return earliest(first, *bounds)


def _run_deadline(ctx: ToolContext) -> Deadline | None:
    if ctx.run_id is None:
        return None
    started = (
        Run.objects.for_actor(ctx.actor).filter(id=ctx.run_id).values_list("started_at", flat=True).first()
    )
    if started is None:
        return None
    seconds = float(settings.RUN_DEADLINE)
    reserve = min(DEADLINE_RESERVE_SECONDS, seconds / 10)
    left = (started + timedelta(seconds=seconds) - timezone.now()).total_seconds() - reserve
    return Deadline.after(left, "your run's own deadline (RUN_DEADLINE) is near")


def _await_reply(ctx: ToolContext, run: Run, deadline: Deadline, *, inline: bool) -> Reply:
    """The reply of the run's agent, once its run has ended. At the deadline, or when the sender's own run
    is cancelled, the run is cancelled and the reply is an error.

    With `inline`, the run is executed in this thread whenever it can be (see the module docstring),
    watched meanwhile (_Watch); otherwise the caller has submitted it."""
    watch = _Watch(ctx, run, deadline) if inline else None
    if watch is not None:
        watch.start()
    try:
        while True:
            status = _status(ctx, run)
            if status is None:
                return Reply(run.agent_id, error=f"Agent '{run.agent_id}' did not reply: it was deleted.")
            if status in TERMINAL_RUN_STATUSES:
                return _ours_cancelled(ctx, run, status, deadline) or _reply_from_database(ctx, run, status)
            if deadline.remaining() <= 0 or _sender_cancelled(ctx):
                return _give_up(ctx, run, deadline)
            if inline and status == Run.Status.CREATED:
                try:
                    result = execute_run_streamed(run.id, agent_id=run.agent_id, conversation_id=None)
                except RunDeferred:
                    if _execute_earlier_run(ctx, run):
                        continue
                else:
                    if result is not None:
                        return _reply_from_turn(ctx, result, deadline)
                    continue  # claimed or cancelled elsewhere meanwhile: its status says which
            time.sleep(min(POLL_SECONDS, max(deadline.remaining(), 0.0)))
    finally:
        if watch is not None:
            watch.done.set()


def _sender_cancelled(ctx: ToolContext) -> bool:
    return ctx.run_id is not None and cancel_requested(ctx.run_id)


class _Watch(threading.Thread):
    """While a wait may execute its run inline: cancel the run at the deadline, or as soon as the sender's
    run is cancelled (so cancelling a turn cancels the chain of runs it waits for). An inline run stops at
    its next check (within about a second of an LLM call), so the waiting step does too."""

    def __init__(self, ctx: ToolContext, run: Run, deadline: Deadline) -> None:
        super().__init__(name=f"agent-reply-watch-{run.id}", daemon=True)
        self.ctx, self.run_to_watch, self.deadline = ctx, run, deadline
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(min(WATCH_SECONDS, max(self.deadline.remaining(), 0.0))):
            if self.deadline.remaining() <= 0 or _sender_cancelled(self.ctx):
                _cancel_in_thread(self.run_to_watch)
                return


def _cancel_in_thread(run: Run) -> None:
    from apps.agents.services import run_cancel  # services sits above this module

    try:
        run_cancel(actor=Actor.system(run.organization_id), run_id=run.id)
    except Exception:
        logger.exception("agents.agent_message_cancel_failed", extra={"run_id": run.id})
    finally:
        connection.close()


def _execute_earlier_run(ctx: ToolContext, run: Run) -> bool:
    """When the run's conversation is free but an earlier run of it has not started (its task waits for
    a worker slot, perhaps this one's), execute that run here, so the queue moves. Returns whether it did.

    Such a run is someone else's and is bounded by its own RUN_DEADLINE, not by this wait's deadline."""
    if conversation_is_locked(run.agent_id, None):
        return False
    earlier = (
        Run.objects.for_actor(ctx.actor)
        .filter(
            agent_id=run.agent_id,
            conversation__isnull=True,
            status=Run.Status.CREATED,
            created_at__lt=run.created_at,
        )
        .order_by("created_at")
        .values_list("id", flat=True)
        .first()
    )
    if earlier is None:
        return False
    try:
        execute_run_streamed(earlier, agent_id=run.agent_id, conversation_id=None)
    except RunDeferred:
        return False
    return True


def _status(ctx: ToolContext, run: Run) -> str | None:
    return Run.objects.for_actor(ctx.actor).filter(id=run.id).values_list("status", flat=True).first()


def _give_up(ctx: ToolContext, run: Run, deadline: Deadline) -> Reply:
    """The wait ends before the run did: cancel it (what it did so far is kept)."""
    from apps.agents.services import run_cancel  # services sits above this module

    run_cancel(actor=ctx.actor, run_id=run.id)
    if deadline.remaining() > 0:
        return Reply(run.agent_id, error=_stopped_message(run.agent_id))
    return Reply(run.agent_id, error=_timeout_message(run.agent_id, deadline))


def _stopped_message(agent_id: str) -> str:
    return f"Stopped waiting for agent '{agent_id}': your run was cancelled; your message to it was too."


def _timeout_message(agent_id: str, deadline: Deadline) -> str:
    return (
        f"Agent '{agent_id}' did not reply in time ({deadline.reason}); your message to it was cancelled. "
        "Try again later, or use send_message_to_agent_async if you need no reply."
    )


def _reply_from_turn(ctx: ToolContext, result: TurnResult, deadline: Deadline) -> Reply:
    run = result.run
    letta = [item for message in result.messages for item in to_letta_messages(message)]
    return _ours_cancelled(ctx, run, run.status, deadline) or _reply(run, run.status, letta)


def _ours_cancelled(ctx: ToolContext, run: Run, status: str, deadline: Deadline) -> Reply | None:
    """The reply of a run this wait cancelled (its deadline passed, or the sender's run was cancelled)."""
    if status != Run.Status.CANCELLED:
        return None
    if deadline.remaining() <= 0:
        return Reply(run.agent_id, error=_timeout_message(run.agent_id, deadline))
    if _sender_cancelled(ctx):
        return Reply(run.agent_id, error=_stopped_message(run.agent_id))
    return None


def _reply_from_database(ctx: ToolContext, run: Run, status: str) -> Reply:
    run.refresh_from_db(fields=["status", "stop_reason", "error"])
    produced = run_produced_messages(actor=ctx.actor, run_id=run.id)
    return _reply(run, status, [item for message in produced for item in to_letta_messages(message)])


def _reply(run: Run, status: str | None, letta_messages: list[dict[str, Any]]) -> Reply:
    texts = tuple(
        str(m["content"])
        for m in letta_messages
        if m.get("message_type") == "assistant_message" and m.get("content")
    )
    if status == Run.Status.COMPLETED:
        return Reply(run.agent_id, response=texts)
    if status == Run.Status.CANCELLED:
        return Reply(run.agent_id, error=f"Agent '{run.agent_id}' did not reply: its run was cancelled.")
    reason = (run.error or {}).get("message") or run.stop_reason or "unknown error"
    return Reply(run.agent_id, error=f"Agent '{run.agent_id}' could not reply: its run failed ({reason}).")


# --- who waits for whom ---------------------------------------------------------------------------------


@contextmanager
def _waiting_on(
    waiter: str, targets: list[str], deadline: Deadline, *, refuse: bool = True
) -> Iterator[dict[str, str]]:
    """While the block runs, `waiter` waits in this thread for `targets` (see the module docstring).
    Yields {target: why} for the targets that would close a cycle; with `refuse`, raises CycleRefused for
    the first instead."""
    token = uuid.uuid4().hex
    entries = [f"{target}|{token}" for target in targets]
    ttl = max(1, int(deadline.remaining()) + WAIT_KEY_MARGIN_SECONDS)
    redis = get_redis()
    key = WAIT_KEY.format(agent_id=waiter)
    expires = time.time() + ttl
    pipe = redis.pipeline(transaction=False)
    pipe.zremrangebyscore(key, "-inf", time.time())  # waits of a process that died
    pipe.zadd(key, dict.fromkeys(entries, expires))
    pipe.expire(key, ttl, gt=True)  # the key lives as long as its longest wait
    pipe.expire(key, ttl, nx=True)
    pipe.execute()
    stack = _WAITING.get()
    pushed = _WAITING.set((*stack, _Waiting(waiter, deadline)))
    try:
        blocked = {a.agent_id for a in stack} | {waiter}
        refused = {t: why for t in targets if (why := _cycle(waiter, t, blocked)) is not None}
        if refuse and refused:
            raise CycleRefused(next(iter(refused.values())))
        yield refused
    finally:
        _WAITING.reset(pushed)
        redis.zrem(key, *entries)


def _cycle(waiter: str, target: str, blocked: set[str]) -> str | None:
    """Why waiting for `target` would never end, or None: `target` is an agent blocked in this thread, or
    the chain of registered waits from it reaches one."""
    if target == waiter:
        return "You cannot wait for a reply from yourself."
    if target in blocked:
        return _cycle_message(target)
    seen = {target}
    frontier = [target]
    redis = get_redis()
    now = time.time()
    while frontier and len(seen) < CHAIN_LIMIT:
        pipe = redis.pipeline(transaction=False)
        for agent_id in frontier:
            pipe.zrangebyscore(WAIT_KEY.format(agent_id=agent_id), now, "+inf")
        awaited = {entry.split("|", 1)[0] for entry in itertools.chain.from_iterable(pipe.execute())}
        if awaited & blocked:
            return _cycle_message(target)
        frontier = sorted(awaited - seen)
        seen.update(frontier)
    return None


def _cycle_message(target: str) -> str:
    return (
        f"Cannot wait for a reply from agent '{target}': it is itself waiting for a reply from you "
        "(directly or through other agents), so neither would ever answer. Nothing was sent to it. "
        "Answer without its reply, or use send_message_to_agent_async."
    )
