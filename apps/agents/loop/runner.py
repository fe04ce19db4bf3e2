"""The agent loop (Letta v3 semantics, no heartbeats), readable top to bottom.

A run is driven by `execute_run(run_id)`:
  1. claim the run (created -> running) so no two executors drive it;
  2. load the agent once: blocks, tools, rules, in-context messages, memory statistics;
  3. if the run resumes a pending approval, settle those tool calls first;
  4. step: compile the context, keep it inside the window (warn, compact), call the LLM once,
     execute the tool calls it returned, persist the step in one statement, and continue while
     the model keeps calling tools; stop on a reply without tool calls, a terminal rule, an
     approval request, max_steps, cancellation, the run's deadline (RUN_DEADLINE) or an error;
  5. finish the run with its stop reason and usage.
Decisions (rules, budget, compaction choice, rendering) are pure code in this package; what a run
works on and how it is loaded is in `state`, every read and write of the run's storage in `store`; this
module drives the steps and makes the calls. No database lock is held across an LLM call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import current_app
from django.conf import settings
from django.utils import timezone

from apps.agents import context_sections
from apps.agents.custom_tools import run_custom_tool
from apps.agents.locks import conversation_lock
from apps.agents.loop import budget as budgeting
from apps.agents.loop import store
from apps.agents.loop.context import build_llm_messages, render_available_skills, with_available_skills
from apps.agents.loop.convert import send_message_text, to_letta_messages
from apps.agents.loop.events import CompactionStarted, EventSink, NullSink, StopReasonEvent, TokenDelta
from apps.agents.loop.messages import memory_pressure_warning, summary_message_text
from apps.agents.loop.state import (
    LoopState,
    StopRun,
    Usage,
    available_tool_names,
    in_context_tokens,
    llm_form,
    load_state,
    memory_stats,
    messages_json,
    system_sections,
    tool_schemas,
)
from apps.agents.models import Message, Run, Step, StopReason
from apps.agents.prompts import SUMMARIZER_PROMPT
from apps.agents.recall import embed_messages
from apps.agents.recovery import enqueue_run, fail_orphaned_runs
from apps.agents.sleeptime import count_primary_turn, create_sleeptime_run
from apps.agents.system_messages import thread_system_message_upsert
from apps.core import fencing
from apps.core.actor import Actor
from apps.core.errors import Conflict, InvalidInput
from apps.core.ids import new_message_id
from apps.llm import client as llm
from apps.llm import records as llm_records
from apps.llm.errors import (
    ContextWindowExceeded,
    InvalidLLMResponse,
    LLMApiError,
    LLMCallCancelled,
    LLMDeadlineExceeded,
    LLMError,
)
from apps.llm.retry import CallBounds
from apps.llm.tokens import count_tokens
from apps.memory.models import Block
from apps.observability import tracing
from apps.streams.events import RedisStreamSink, StreamFenced, cancel_requested
from apps.tools.execution import ToolContext, ToolResult, cut_to_limit, package_for_model
from apps.tools.mcp import run_mcp_tool
from apps.tools.models import Tool

__all__ = [  # what the rest of the project uses; the loop's state and storage have modules of their own
    "Compaction",
    "LoopState",
    "RunDeferred",
    "StopRun",
    "TurnResult",
    "after_run",
    "compact_thread",
    "execute_run",
    "execute_run_streamed",
    "prepare_request",
    "system_sections",
]

logger = logging.getLogger(__name__)

MEMORY_TOOL_NAMES = (
    "memory_replace",
    "memory_insert",
    "memory_rethink",
    "core_memory_append",
    "core_memory_replace",
    "memory_apply_patch",
    "archival_memory_insert",
)
ARCHIVAL_WRITE_TOOLS = frozenset({"archival_memory_insert"})
"""Memory tools that change the archival count and tags shown in the system message."""
PRESSURE_ALERT = "memory_pressure"
REQUIRED_TOOLS_ALERT = "required_tools"
COMPLETED_STOPS = {
    StopReason.END_TURN,
    StopReason.MAX_STEPS,
    StopReason.TOOL_RULE,
    StopReason.REQUIRES_APPROVAL,
}


@dataclass
class TurnResult:
    run: Run
    messages: list[Message]  # what the agent produced in this run, in order
    stop_reason: str
    usage: Usage
    # For recall's embeddings, after the run (embed_for_recall): the input and what was produced.
    to_embed: list[Message] = field(default_factory=list)
    embedding_handle: str = ""
    # Provider traces of its steps, stored after the answer (store_traces): (step id, request, response).
    traces: list[tuple[str, Any, Any]] = field(default_factory=list)
    # The conversation's next run, still waiting when this one finished (its task is enqueued at once).
    next_run_id: str | None = None
    # Every LLM call the run made (apps.llm.records), stored with the traces.
    llm_calls: list[llm_records.NotedCall] = field(default_factory=list)
    # The run's spans (apps.observability.tracing), stored with the traces too.
    spans: tracing.RunSpans | None = None


class RunDeferred(Exception):
    """Not this run's turn yet: another run of the same conversation is executing or comes first."""


def execute_run(
    run_id: str,
    *,
    sink: EventSink | None = None,
    defer_after_run: bool = False,
    agent_id: str | None = None,
    conversation_id: str | None = None,
) -> TurnResult | None:
    """Drive one run to a terminal state, holding its conversation's lock (apps.agents.locks).

    Idempotent: a run that is not `created` is left alone (returns None). Raises RunDeferred while an
    earlier run of the same agent conversation is unfinished, so runs execute one at a time, in order.
    At the end the run's steps get their provider traces and its messages their recall embeddings, in
    one batch each (after_run); with defer_after_run the caller does it, e.g. after closing the run's
    stream so no reader waits for it.
    """
    result = _execute_run(run_id, sink=sink, agent_id=agent_id, conversation_id=conversation_id)
    if result is not None and not defer_after_run:
        after_run(result)
    return result


def after_run(result: TurnResult) -> None:
    """What no reader of the run waits for: its steps' provider traces, then recall embeddings."""
    store_traces(result)
    embed_for_recall(result)


def store_traces(result: TurnResult) -> None:
    """The exact request and response of each step, compressed, in one statement for the run
    (GET /v1/steps/{id}/trace has them once the run has answered). A worker that dies before this leaves
    the steps without traces (and the run without its spans)."""
    # With them, in the same statement: each LLM call as sent and received (apps.llm.records), and the
    # run's spans (GET /v1/runs/{id}/trace).
    records = llm_records.rows(
        result.llm_calls,
        organization_id=result.run.organization_id,
        agent_id=result.run.agent_id,
        run_id=result.run.id,
        traces=result.traces,
    )
    store.store_traces(result.traces, records=records, also=tracing.store_statements(result.spans))


def embed_for_recall(result: TurnResult) -> None:
    """Embeddings for semantic recall search of a finished run's messages (the provider call holds no lock).

    A failing embedding provider is logged by embed_messages and never fails the turn."""
    if result.embedding_handle and result.to_embed:
        embed_messages(
            actor=Actor.system(result.run.organization_id),
            messages=result.to_embed,
            embedding_handle=result.embedding_handle,
        )


def _execute_run(
    run_id: str, *, sink: EventSink | None, agent_id: str | None = None, conversation_id: str | None = None
) -> TurnResult | None:
    """agent_id (with conversation_id): the run's, when the caller knows them (the task that the send
    enqueued carries them), so the lock is taken without reading the run first."""
    if agent_id is None:
        thread = store.run_thread(run_id)
        if thread is None:
            return None
        agent_id, conversation_id = thread
    with store.claim_locked(run_id, agent_id, conversation_id) as claim:
        if claim is None:  # another executor holds the conversation
            raise RunDeferred(run_id)
        if claim.others_running:  # other RUNNING runs of the agent: we hold the lock, so they are orphaned
            fail_orphaned_runs(agent_id=agent_id, exclude_run_id=run_id)
        if claim.run is None:
            if claim.earlier_waiting:  # an earlier run of this conversation goes first
                raise RunDeferred(run_id)
            return None  # not `created` (any more): executed or cancelled already
        hold = getattr(sink, "hold", None)  # a run stream's sink fences its writes by the lease too
        if hold is not None and claim.run.started_at is not None:
            hold(claim.run.lease, int(claim.run.started_at.timestamp() * 1000))
        try:
            with (
                fencing.holding(run_id, claim.run.lease),
                tracing.run_trace(claim.run) as spans,
                llm_records.collecting() as llm_calls,
            ):
                result = _drive(claim.run, sink or NullSink())
                if spans is not None:  # stored by after_run's statement, not one of their own
                    spans.handed_over = True
            result.llm_calls, result.spans = llm_calls, spans
            return result
        except (store.LeaseLost, StreamFenced):
            # Failed by recovery or claimed by another executor meanwhile (this worker was cut off): what
            # it did since is not stored, and the run, its stream and its result are the other's.
            logger.warning("agents.run_lease_lost", extra={"run_id": run_id})
            return None


def _drive(run: Run, sink: EventSink) -> TurnResult:
    run_id = run.id
    state: LoopState | None = None
    try:
        with tracing.span("agent.load"):
            state = load_state(run, sink)
        state.inputs = [m for m in state.in_context if m.run_id == run.id and m.role == Message.Role.USER]
        _resume_pending_approval(state)
        stop = _loop(state)
        return _finish(state, stop.reason, stop.error)
    except (store.LeaseLost, StreamFenced):
        raise
    except StopRun as stop:
        if state is None:
            return _fail_before_start(run, stop.reason, stop.error)
        return _finish(state, stop.reason, stop.error)
    except Exception:
        error_id = uuid.uuid4().hex  # the tenant sees this id, never the exception (hosts, paths, SQL)
        logger.exception("agents.run_crashed error_id=%s", error_id, extra={"run_id": run_id})
        error = f"The run failed with an internal error (error_id: {error_id})."
        if state is None:
            return _fail_before_start(run, StopReason.ERROR, error)
        return _finish(state, StopReason.ERROR, error)


def _loop(state: LoopState) -> StopRun:
    """Steps until one says stop, or the step budget is spent."""
    max_steps = int(state.run.request_config.get("max_steps") or 50)
    if state.produced and _ends_turn(state, state.produced):  # a resumed call was terminal
        return StopRun(StopReason.TOOL_RULE)
    while state.usage.step_count < max_steps:
        if state.usage.step_count:  # the first step follows the claim, which found the run not cancelled
            status, state.status_at_persist = state.status_at_persist, None
            _raise_if_cancelled(state, status=status)
        if state.deadline.remaining() <= 0:
            return StopRun(StopReason.ERROR, _deadline_error(state))
        with tracing.span("agent.step", **{"letta.step": state.usage.step_count + 1}):
            stop = _step(state)
        if stop is not None:
            return stop
    return StopRun(StopReason.MAX_STEPS)


def _call_llm_compacting_once(state: LoopState, *, step_id: str, message_id: str) -> llm.ChatResponse:
    """The step's call on the compiled context; when the provider says it overflows, compact once and
    call again. A second overflow is the provider's refusal (LLMApiError). Raises LLM errors, StopRun."""
    try:
        return _call_llm(state, prepare_request(state), step_id=step_id, message_id=message_id)
    except ContextWindowExceeded:
        pass  # compact outside the handler: the summariser's own failure must not chain to this overflow
    _compact(state, trigger="provider_overflow")
    try:
        return _call_llm(state, prepare_request(state), step_id=step_id, message_id=message_id)
    except ContextWindowExceeded as exc:
        raise LLMApiError(
            f"The context still exceeds the model's window after compaction: {exc.message}",
            status=400,
            provider_message=exc.provider_message,
            attempts=1,
        ) from exc


def _deadline_error(state: LoopState) -> str:
    """What a run past its deadline says (stop reason `error`, as Letta has no reason of its own for it)."""
    return f"Stopped after {state.usage.step_count} step(s): {state.deadline.reason}."


def _step(state: LoopState) -> StopRun | None:
    """One LLM call and the tool calls it asked for. Returns why to stop, or None to go on."""
    step = Step(
        organization_id=state.actor.organization_id,
        agent=state.agent,
        run=state.run,
        model=state.target.litellm_model.split("/", 1)[-1],
        model_handle=state.target.handle,
        model_endpoint=state.target.api_base or "",
        provider_name=state.target.provider_name,
        context_window_limit=state.context_window,
    )
    assistant_id = new_message_id()  # known before the call, so streamed chunks carry the stored id
    try:  # compacting calls the model too (the summariser): its failures end the step the same way
        response = _call_llm_compacting_once(state, step_id=step.id, message_id=assistant_id)
    except (LLMApiError, InvalidLLMResponse) as exc:
        _save_failed_step(state, step, exc)
        if isinstance(exc, LLMDeadlineExceeded) and exc.deadline is state.deadline:
            raise StopRun(StopReason.ERROR, _deadline_error(state)) from exc  # the run's time is up
        reason = (
            StopReason.INVALID_LLM_RESPONSE
            if isinstance(exc, InvalidLLMResponse)
            else StopReason.LLM_API_ERROR
        )
        raise StopRun(reason, exc.message) from exc
    state.usage.step_count += 1
    state.usage.prompt_tokens += response.prompt_tokens
    state.usage.completion_tokens += response.completion_tokens
    step.prompt_tokens, step.completion_tokens = response.prompt_tokens, response.completion_tokens
    step.total_tokens = response.prompt_tokens + response.completion_tokens
    step.reasoning_tokens = response.reasoning_tokens or None
    step.latency_ms = response.latency_ms
    step.logprobs = response.logprobs
    state.traces.append((step.id, response.raw.get("request"), response.raw.get("response")))
    step.status = Step.Status.SUCCESS

    calls = response.tool_calls
    needs_approval = [c for c in calls if _requires_approval(state, c.name)]
    run_now = [c for c in calls if c not in needs_approval]
    new_messages: list[Message] = []
    assistant = _assistant_message(state, step, response, run_now, message_id=assistant_id)
    if assistant is not None:
        new_messages.append(assistant)
        _emit_message(state, assistant)

    if not calls:
        _persist_step(state, step, new_messages)
        if response.finish_reason == "length":
            return StopRun(StopReason.MAX_TOKENS_EXCEEDED)
        missing = state.solver.uncalled_required_tools(list(available_tool_names(state)))
        if missing:
            _add_alert(
                state,
                REQUIRED_TOOLS_ALERT,
                f"[Automated system message] Before finishing you must call: {', '.join(missing)}.",
            )
            return None
        return StopRun(StopReason.END_TURN)

    _raise_if_cancelled(state, pending=(step, new_messages))
    for call in run_now:
        result = _run_tool_call(state, call.name, call.arguments, step_id=step.id)
        tool_message = _tool_message(state, step, call.id, call.name, result)
        new_messages.append(tool_message)
        _emit_message(state, tool_message)
    if needs_approval:
        request_message = _new_message(
            state,
            Message.Role.APPROVAL,
            step=step,
            tool_calls=[_openai_call(c.id, c.name, c.arguments) for c in needs_approval],
        )
        new_messages.append(request_message)
        _emit_message(state, request_message)
        _persist_step(state, step, new_messages, stop_reason=StopReason.REQUIRES_APPROVAL)
        return StopRun(StopReason.REQUIRES_APPROVAL)
    _persist_step(state, step, new_messages)
    if _ends_turn(state, new_messages):
        return StopRun(StopReason.END_TURN if _sent_message(new_messages) else StopReason.TOOL_RULE)
    return None


# --- context ----------------------------------------------------------------------------------------


def prepare_request(state: LoopState) -> llm.ChatRequest:
    """Compile the context and keep it inside the window: warn past the threshold, compact on overflow."""
    for _ in range(3):
        system_message = _system_message(state)
        _store_system_message(state, system_message)
        available = list(available_tool_names(state))
        allowed = state.solver.allowed_tools(available)
        schemas = tool_schemas(state, allowed)
        stored = llm_form(state.in_context)
        messages = build_llm_messages(system_message, stored)
        budget = budgeting.ContextBudget(state.context_window)
        model = state.target.litellm_model
        system_tokens = count_tokens(model, messages[:1])
        schema_tokens = count_tokens(model, [], schemas) if schemas else 0
        message_tokens = in_context_tokens(state)
        verdict = budget.assess(system_tokens, message_tokens, schema_tokens)
        if verdict.state == "system_overflow":
            raise StopRun(
                StopReason.CONTEXT_WINDOW_OVERFLOW_IN_SYSTEM_PROMPT,
                f"The system prompt, memory blocks and tool schemas take {system_tokens + schema_tokens} tokens, "
                f"more than the {state.context_window}-token context window. Shorten memory blocks or the "
                "system prompt, detach tools, or raise the context window.",
            )
        if verdict.state == "overflow":
            _compact(state, trigger="context_window", message_tokens=message_tokens)
            continue
        if verdict.state == "warning" and not state.warned and not _has_pressure_alert(state):
            state.warned = True
            memory_tools = [n for n in MEMORY_TOOL_NAMES if n in state.tools]
            _add_alert(
                state,
                PRESSURE_ALERT,
                memory_pressure_warning(verdict.total, state.context_window, tool_names=memory_tools),
            )
            continue
        forced = state.solver.forced_tool(available)
        if forced and forced in allowed:
            tool_choice: Any = {"type": "function", "function": {"name": forced}}
        elif schemas and state.solver.requires_tool_call():
            tool_choice = "required"
        else:
            tool_choice = "auto" if schemas else None
        return llm.ChatRequest(
            messages=messages,
            tools=schemas or None,
            tool_choice=tool_choice,
            temperature=state.agent.temperature,
            max_tokens=state.agent.max_tokens,
            parallel_tool_calls=state.agent.parallel_tool_calls if schemas else None,
            logprobs=bool(state.run.request_config.get("return_logprobs")) or None,
            top_logprobs=state.run.request_config.get("top_logprobs"),
            return_token_ids=bool(state.run.request_config.get("return_token_ids")) or None,
            messages_json=messages_json(state, messages, dropped=len(stored) + 1 - len(messages))
            if llm.takes_messages_json(state.target)
            else None,
        )
    raise StopRun(StopReason.ERROR, "The context could not be brought under the context window.")


def _system_message(state: LoopState) -> str:
    """What the model gets as its system message: the request's `override_system` verbatim (Letta adds
    nothing to it), else the compiled one with the request's client skills and the agent's skill blocks."""
    options = state.run.request_config
    if options.get("override_system") is not None:
        return str(options["override_system"])
    skills = [
        (s["name"], s.get("description", ""), s.get("location", ""))
        for s in options.get("client_skills") or []
    ]
    section = render_available_skills(skills, [(b.label, b.description) for b in state.blocks])
    return with_available_skills(system_sections(state).render(), section)


def _store_system_message(state: LoopState, system_message: str) -> None:
    """Note what the thread's stored system message (what `messages.list` starts with) should hold: the
    compiled one, written with the step (`_persist_step`), so at the run's first step and then only when
    memory edits change it. A request's `override_system` is for that request alone and is not stored,
    as in Letta."""
    if state.run.request_config.get("override_system") is None:
        state.compiled_system_message = system_message


def _system_message_write(state: LoopState) -> list[tuple[str, list[Any]]]:
    """The statement that brings the stored system message up to date, if it is behind."""
    text = state.compiled_system_message
    if text is None or text == state.stored_system_message:
        return []
    state.stored_system_message = text
    return [
        thread_system_message_upsert(
            organization_id=state.agent.organization_id,
            agent_id=state.agent.id,
            conversation_id=state.conversation.id if state.conversation else None,
            text=text,
            model=state.target.handle,
        )
    ]


def _has_pressure_alert(state: LoopState) -> bool:
    return any(m.role == Message.Role.SYSTEM and m.name == PRESSURE_ALERT for m in state.in_context)


def _add_alert(state: LoopState, name: str, text: str) -> None:
    alert = _new_message(state, Message.Role.SYSTEM, text=text, name=name)
    state.in_context.append(alert)
    _add_in_context(state, [alert])
    state.produced.append(alert)
    _emit_message(state, alert)


# --- compaction -------------------------------------------------------------------------------------


def _compact(state: LoopState, *, trigger: str, message_tokens: list[int] | None = None) -> None:
    """Summarise the oldest in-context messages into one summary message; they stay in recall."""
    evict = _messages_to_compact(state, message_tokens)
    if not evict:
        raise StopRun(StopReason.ERROR, "Context window is full and nothing can be summarised.")
    total = len(state.in_context)
    structured = bool(state.run.request_config.get("include_compaction_messages"))
    if structured:  # Letta announces the compaction before it starts
        estimate = sum(message_tokens) if message_tokens else None
        state.sink.emit(CompactionStarted(trigger, state.context_window, estimate, state.run.id).event())
    summary = _summarize(state, evict)
    summary_message = _new_message(
        state, Message.Role.SUMMARY, text=summary_message_text(summary, len(evict), total)
    )
    _replace_with_summary(state, evict, summary_message)
    letta_form = to_letta_messages(summary_message)[0]
    if structured:
        state.sink.emit(
            {
                **letta_form,
                "compaction_stats": {
                    "trigger": trigger,
                    "context_window": state.context_window,
                    "messages_count_before": total,
                    "messages_count_after": len(state.in_context),
                },
            }
        )
    else:  # Letta's default: the summary as the user message the model reads (its packed JSON text)
        state.sink.emit(
            {
                **{k: v for k, v in letta_form.items() if k not in ("summary", "message_type")},
                "message_type": "user_message",
                "content": summary_message.text,
            }
        )


def _message_infos(state: LoopState, message_tokens: list[int] | None = None) -> list[budgeting.MessageInfo]:
    """The in-context messages as the budget sees them (their tokens counted unless given)."""
    if message_tokens is None or len(message_tokens) != len(state.in_context):
        message_tokens = in_context_tokens(state)
    return [
        budgeting.MessageInfo(
            id=m.id,
            role=_budget_role(m),
            tokens=tokens,
            tool_call_ids=tuple(c["id"] for c in (m.tool_calls or [])),
            tool_call_id=m.tool_call_id or None,
        )
        for m, tokens in zip(state.in_context, message_tokens, strict=True)
    ]


def _messages_to_compact(state: LoopState, message_tokens: list[int] | None = None) -> list[Message]:
    """The oldest in-context messages: all but the recent tail the budget's sliding window keeps (which
    never splits a tool call from its results, nor drops a pending approval request)."""
    infos = [
        budgeting.MessageInfo(id="system", role="system", tokens=0),
        *_message_infos(state, message_tokens),
    ]
    plan = budgeting.ContextBudget(state.context_window).choose_messages_to_compact(infos)
    evicted = set(plan.summarize_ids)
    return [m for m in state.in_context if m.id in evicted]


def _summarize(state: LoopState, evict: list[Message], *, prompt: str = SUMMARIZER_PROMPT) -> str:
    """The model's summary of `evict`, asked for in pieces that fit half the window (each piece's summary
    carried into the next). Raises LLM errors; StopRun when the run is cancelled meanwhile."""
    wanted = {m.id for m in evict}
    by_id = {m.id: m for m in evict}
    chunks = budgeting.chunk_for_summary(
        [i for i in _message_infos(state) if i.id in wanted], max(512, state.context_window // 2)
    )
    summary = ""
    for chunk in chunks:
        transcript = _transcript([by_id[i.id] for i in chunk])
        if summary:
            transcript = f"Earlier summary:\n{summary}\n\nConversation:\n{transcript}"
        response = _call_llm(
            state,
            llm.ChatRequest(
                messages=[{"role": "system", "content": prompt}, {"role": "user", "content": transcript}]
            ),
            step_id=None,
            stream=False,
        )
        state.usage.prompt_tokens += response.prompt_tokens
        state.usage.completion_tokens += response.completion_tokens
        summary = (response.content or "").strip()
    return summary


def _replace_with_summary(state: LoopState, evict: list[Message], summary_message: Message) -> None:
    """Store the summary and put it in place of the evicted messages at the head of the context."""
    evicted = {m.id for m in evict}
    state.in_context = [summary_message, *(m for m in state.in_context if m.id not in evicted)]
    _add_in_context(state, [summary_message])
    state.warned = False
    state.stats = memory_stats(
        state.agent, state.actor, state.conversation, len(state.in_context), state.blocks, fresh=False
    )


COMPACT_ALL_MODES = frozenset({"all", "self_compact_all"})
"""Letta's compaction modes that summarise the whole context; the others (`sliding_window`,
`self_compact_sliding_window`) keep the recent tail, as compaction within a run does."""
NOT_REDUCED = (
    "Summarization failed to reduce the number of messages. You may not have enough messages to compact "
    "or need to use a different CompactionSettings (e.g. using `all` mode)."
)
NO_IN_CONTEXT_MESSAGES = "No in-context messages found for this conversation."


@dataclass(frozen=True, slots=True)
class Compaction:
    """What a compaction outside a run did: the model's summary, and the in-context messages before and after."""

    summary: str
    messages_before: int
    messages_after: int


def compact_thread(
    *,
    organization_id: str,
    agent_id: str,
    conversation_id: str | None,
    mode: str = "sliding_window",
    prompt: str | None = None,
) -> Compaction:
    """Summarise an agent thread's in-context messages now, outside any run (Letta's POST .../summarize and
    .../compact): `all` modes summarise every message but a pending approval request, the others the
    oldest ones, as compaction within a run does. The summary replaces them; they stay in recall.

    Holds the thread's lock (apps.agents.locks) throughout, so no run of it executes meanwhile (a worker
    defers the run until the lock is free); no database lock is held across the LLM call. The caller
    checks permissions. Raises Conflict (code CONVERSATION_BUSY) while a run executes, InvalidInput when
    there is nothing to summarise or it would not reduce the count, or the agent's model cannot be used,
    and LLM errors of the summariser.
    """
    with conversation_lock(agent_id, conversation_id) as acquired:
        if not acquired:
            raise Conflict(
                "Cannot compact: another request is currently being processed for this conversation. "
                "Please wait for the current request to complete.",
                code="CONVERSATION_BUSY",
            )
        probe = Run(
            organization_id=organization_id,
            agent_id=agent_id,
            conversation_id=conversation_id,
            request_config={},
        )
        try:
            state = load_state(probe, NullSink(), keep_messages=False)
        except StopRun as exc:
            raise InvalidInput(exc.error or exc.reason) from exc
        before = len(state.in_context)
        if not before:
            raise InvalidInput(NO_IN_CONTEXT_MESSAGES)
        if mode in COMPACT_ALL_MODES:
            last = state.in_context[-1]
            pending = last.is_approval_request
            evict = state.in_context[:-1] if pending else list(state.in_context)
        else:
            evict = _messages_to_compact(state)
        if len(evict) < 2:  # the summary takes a place of its own: one message would not reduce the count
            raise InvalidInput(NOT_REDUCED)
        summary = _summarize(state, evict, prompt=prompt or SUMMARIZER_PROMPT)
        summary_message = _new_message(
            state, Message.Role.SUMMARY, text=summary_message_text(summary, len(evict), before)
        )
        summary_message.run = None  # made by no run (the probe is not stored)
        _replace_with_summary(state, evict, summary_message)
        return Compaction(summary=summary, messages_before=before, messages_after=len(state.in_context))


def _budget_role(message: Message) -> str:
    if message.is_approval_request:
        return "assistant"
    return {"summary": "user", "system": "user", "approval": "user"}.get(message.role, message.role)


def _transcript(messages: list[Message]) -> str:
    lines = []
    for m in messages:
        text = m.text
        if m.tool_calls:
            text += " " + " ".join(
                f"[calls {c['function']['name']}({c['function']['arguments']})]" for c in m.tool_calls
            )
        lines.append(f"{m.role}: {text.strip()}")
    return "\n".join(lines)


# --- LLM --------------------------------------------------------------------------------------------


def _call_llm(
    state: LoopState,
    request: llm.ChatRequest,
    *,
    step_id: str | None,
    stream: bool | None = None,
    message_id: str | None = None,
) -> llm.ChatResponse:
    """One LLM call, bounded by LLM_CALL_DEADLINE and the run's deadline, and ended within about a second
    when the run is cancelled (a Redis key run_cancel sets: no SQL while the call waits)."""
    run_id = state.run.id
    bounds = CallBounds.from_settings(within=state.deadline, cancelled=lambda: cancel_requested(run_id))
    streamed = stream if stream is not None else state.stream_tokens
    with tracing.span(
        "llm.call", **{"gen_ai.request.model": state.target.handle, "letta.streamed": streamed}
    ) as span:
        try:
            if streamed:
                response = llm.stream(
                    state.target, request, _relay(state, step_id, message_id), bounds=bounds
                )
            else:
                response = llm.complete(state.target, request, bounds=bounds)
        except LLMCallCancelled as exc:  # the user cancelled the run while the model was answering
            raise StopRun(StopReason.CANCELLED) from exc
        tracing.llm_response(span, response)
    return response


def _relay(
    state: LoopState, step_id: str | None, message_id: str | None
) -> Callable[[llm.StreamDelta], None]:
    """A streamed call's deltas into the run's events."""

    def relay(delta: llm.StreamDelta) -> None:
        state.sink.emit(
            TokenDelta(
                delta.kind, delta.text, delta.tool_call_id, delta.tool_name, step_id, state.run.id, message_id
            ).event()
        )

    return relay


def _save_failed_step(state: LoopState, step: Step, exc: LLMError) -> None:
    step.status = Step.Status.FAILED
    step.error_type = type(exc).__name__
    step.error_data = {"message": exc.message}
    store.save_failed_step(step, run_id=state.run.id, lease=state.run.lease)


# --- tools ------------------------------------------------------------------------------------------


def _requires_approval(state: LoopState, name: str) -> bool:
    if name in state.client_tools and name not in state.tools:
        return True
    tool = state.tools.get(name)
    return state.solver.requires_approval(name) or bool(tool and tool.default_requires_approval)


def _run_tool_call(
    state: LoopState, name: str, raw_arguments: str, *, step_id: str | None, check_rules: bool = True
) -> ToolResult:
    """Execute one call. Every failure becomes an error result the model can read; nothing raises."""
    started = time.monotonic()
    if check_rules:
        problem = state.solver.check_call(name, list(available_tool_names(state)))
        if problem:
            state.solver.record_call(name, None)
            return ToolResult.error(problem)
    tool = state.tools.get(name)
    if tool is None:
        return ToolResult.error(
            f"Tool '{name}' does not exist or is not attached. Available tools: {', '.join(state.tools) or 'none'}."
        )
    try:
        arguments = json.loads(raw_arguments or "{}")
    except json.JSONDecodeError as exc:
        state.solver.record_call(name, None)
        return ToolResult.error(
            f"Invalid JSON in the arguments of {name}: {exc}. Received: {raw_arguments[:500]}"
        )
    if not isinstance(arguments, dict):
        return ToolResult.error(f"The arguments of {name} must be a JSON object, got: {raw_arguments[:500]}")
    arguments = {**arguments, **state.solver.prefilled_args(name)}
    ctx = ToolContext(
        actor=state.actor,
        agent_id=state.agent.id,
        conversation_id=state.conversation.id if state.conversation else None,
        run_id=state.run.id,
        step_id=step_id,
        embedding_handle=state.agent.embedding,
        timezone=state.agent.timezone or "UTC",
        blocks=tuple(state.blocks),
    )
    with tracing.tool_spans(name, tool.tool_type, memory=name in MEMORY_TOOL_NAMES) as spans:
        if tool.tool_type.startswith("letta_"):
            from apps.agents.builtin_tools import execute_builtin

            result = execute_builtin(name, arguments, ctx, agent=state.agent)
        elif tool.tool_type == Tool.Type.EXTERNAL_MCP:
            result = run_mcp_tool(tool, arguments, ctx)
        else:
            result = run_custom_tool(tool, arguments, ctx)
        spans.done(result)
    limit = min(tool.return_char_limit, budgeting.tool_return_char_limit(state.context_window))
    edited_block = result.edited_block
    result = ToolResult(
        status=result.status,
        return_value=cut_to_limit(result.return_value, limit),
        stdout=result.stdout,
        stderr=result.stderr,
        sandbox=result.sandbox,
        memory_changed=result.memory_changed,
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    state.solver.record_call(name, result.return_value)
    if context_sections.refreshes_directories(tool.tool_type):  # a file tool may open or close files
        state.directories = context_sections.load_directories(state.actor, state.agent, [tool.tool_type])
    if result.memory_changed:
        state.blocks = _blocks_after_edit(state, edited_block)
        if name in ARCHIVAL_WRITE_TOOLS:
            state.stats = memory_stats(
                state.agent, state.actor, state.conversation, len(state.in_context), state.blocks, fresh=False
            )
        else:  # a block edit: the recall and archival counts are what they were
            state.stats = dataclasses.replace(
                state.stats, last_memory_edit=max((b.updated_at for b in state.blocks), default=None)
            )
    return result


def _blocks_after_edit(state: LoopState, edited: Block | None) -> list[Block]:
    """The agent's blocks after a memory tool wrote: the written block in place of the one read, or (a
    new block, an archival write) all of them read again."""
    if edited is not None and any(block.id == edited.id for block in state.blocks):
        return [edited if block.id == edited.id else block for block in state.blocks]
    return store.load_blocks(state.agent.id, state.actor)


def _ends_turn(state: LoopState, messages: list[Message]) -> bool:
    called = [m.name for m in messages if m.role == Message.Role.TOOL]
    if not any(state.solver.is_terminal(n) or n == "send_message" for n in called):
        return False
    return not state.solver.uncalled_required_tools(list(available_tool_names(state)))


def _sent_message(messages: list[Message]) -> bool:
    return any(m.role == Message.Role.TOOL and m.name == "send_message" for m in messages)


# --- approvals --------------------------------------------------------------------------------------


def _resume_pending_approval(state: LoopState) -> None:
    """Settle the tool calls an approval response decided, before the first step of this run."""
    response_id = state.run.request_config.get("approval_response_id")
    if not response_id:
        return
    response = next((m for m in state.in_context if m.id == response_id), None)
    request = next((m for m in reversed(state.in_context) if m.is_approval_request), None)
    if response is None or request is None:
        raise StopRun(StopReason.ERROR, "The approval request to resume was not found in context.")
    decisions = {d["tool_call_id"]: d for d in response.approvals or []}
    tool_messages = []
    for call in request.tool_calls or []:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        decision = decisions[call["id"]]
        if decision.get("type") == "tool":
            returned = decision.get("tool_return")
            text = returned if isinstance(returned, str) else json.dumps(returned)
            result = ToolResult(
                status=decision.get("status", "success"),
                return_value=text,
                stdout=tuple(decision.get("stdout") or ()),
                stderr=tuple(decision.get("stderr") or ()),
                sandbox="client",
            )
            state.solver.record_call(name, text)
        elif decision.get("approve"):
            result = _run_tool_call(state, name, arguments, step_id=None, check_rules=False)
        else:
            reason = decision.get("reason") or "no reason given"
            result = ToolResult.error(f"Error: request to call tool denied. User reason: {reason}")
            state.solver.record_call(name, None)
        message = _tool_message(state, None, call["id"], name, result)
        tool_messages.append(message)
        _emit_message(state, message)
    state.in_context.extend(tool_messages)
    _add_in_context(state, tool_messages)
    state.produced.extend(tool_messages)


# --- messages and persistence -----------------------------------------------------------------------


def _new_message(
    state: LoopState,
    role: str,
    *,
    step: Step | None = None,
    text: str = "",
    content: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> Message:
    return Message(
        organization_id=state.actor.organization_id,
        agent=state.agent,
        conversation=state.conversation,
        run=state.run,
        step=step,
        role=role,
        content=content if content is not None else ([{"type": "text", "text": text}] if text else []),
        text=text,
        model=state.target.handle,
        created_at=timezone.now(),
        **fields,
    )


def _assistant_message(
    state: LoopState,
    step: Step,
    response: llm.ChatResponse,
    calls: list[llm.ToolCall],
    *,
    message_id: str,
) -> Message | None:
    content: list[dict[str, Any]] = []
    if response.reasoning:
        content.append({"type": "reasoning", "reasoning": response.reasoning})
    if response.content:
        content.append({"type": "text", "text": response.content})
    if not content and not calls:
        return None
    tool_calls = [_openai_call(c.id, c.name, c.arguments) for c in calls]
    return _new_message(
        state,
        Message.Role.ASSISTANT,
        step=step,
        content=content,
        # Recall searches `text`: for agents that speak through send_message, that is what they said.
        text=response.content or send_message_text(tool_calls),
        tool_calls=tool_calls or None,
        id=message_id,
    )


def _openai_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_message(
    state: LoopState, step: Step | None, call_id: str, name: str, result: ToolResult
) -> Message:
    packaged = package_for_model(result, now=timezone.localtime())
    return _new_message(
        state,
        Message.Role.TOOL,
        step=step,
        content=[{"type": "text", "text": packaged}],
        text=result.return_value,
        name=name,
        tool_call_id=call_id,
        is_err=result.status == "error",
        tool_returns=[
            {
                "tool_call_id": call_id,
                "status": result.status,
                "tool_return": result.return_value,
                "stdout": list(result.stdout),
                "stderr": list(result.stderr),
                "sandbox": result.sandbox,
                "duration_ms": result.duration_ms,
            }
        ],
    )


def _persist_step(state: LoopState, step: Step, messages: list[Message], *, stop_reason: str = "") -> None:
    """The step, its messages and the new in-context ids (and the thread's system message when memory
    changed it) in one statement, which also reads the run's status for the next step's cancel check.

    The step's provider trace (the exact request and response) is stored after the run's answer
    (store_traces): at hundreds of in-context messages it is the largest write of a step."""
    step.stop_reason = stop_reason
    with tracing.span("agent.persist", **{"letta.persist": "step"}):
        state.status_at_persist = store.persist_step(
            step,
            messages,
            agent_id=state.agent.id,
            conversation_id=state.conversation_id,
            run_id=state.run.id,
            lease=state.run.lease,
            also=_system_message_write(state),
        )
    state.in_context.extend(messages)
    state.produced.extend(messages)


def _add_in_context(state: LoopState, messages: list[Message]) -> None:
    """Store messages made outside a step, already placed in `state.in_context`, with the new list."""
    store.add_messages_in_context(
        messages,
        state.in_context_ids(),
        agent_id=state.agent.id,
        conversation_id=state.conversation_id,
        # A compaction outside any run (compact_thread) works on an unstored probe run: no lease.
        run_id=state.run.id if state.run.lease else None,
        lease=state.run.lease,
    )


def _emit_message(state: LoopState, message: Message) -> None:
    state.sink.emit_many(to_letta_messages(message))


def _raise_if_cancelled(
    state: LoopState, pending: tuple[Step, list[Message]] | None = None, *, status: str | None = None
) -> None:
    """Stop if the run was cancelled; `status` is the run's status when the caller has just read it."""
    if status is None:
        status = store.run_status(state.run.id)
    if status == Run.Status.CANCELLED:
        if pending is not None:
            _persist_step(state, pending[0], pending[1], stop_reason=StopReason.CANCELLED)
        raise StopRun(StopReason.CANCELLED)


# --- loading and finishing --------------------------------------------------------------------------


def _finish(state: LoopState, reason: str, error: str | None) -> TurnResult:
    run = state.run
    now = timezone.now()
    run.stop_reason = reason
    run.completed_at = now
    run.total_duration_ns = int((now - (run.started_at or now)).total_seconds() * 1e9)
    if reason == StopReason.CANCELLED:
        run.status = Run.Status.CANCELLED
    elif reason in COMPLETED_STOPS:
        run.status = Run.Status.COMPLETED
    else:
        run.status = Run.Status.FAILED
        run.error = {"message": error or reason}
    if error:
        run.metadata = {**run.metadata, "error": error}
    if run.request_config.get("return_token_ids"):  # the answer's `turns` read them: stored before it
        llm_records.store_collected(
            organization_id=run.organization_id, agent_id=state.agent.id, run_id=run.id, traces=state.traces
        )
    with tracing.span("agent.persist", **{"letta.persist": "finish"}):
        saved, next_run_id = store.save_finished(run, state.agent.id)
    if not saved:
        # The user cancelled while the last step ran: the stored run says so, and so must the stream.
        run.status = Run.Status.CANCELLED
        run.stop_reason = reason = StopReason.CANCELLED
    state.sink.finish(
        [StopReasonEvent(reason).event(), state.usage.as_dict(run.id)],
        status=run.status,
        stop_reason=reason,
    )
    if run.status == Run.Status.COMPLETED and count_primary_turn(state.agent):
        _start_sleeptime(state.agent.id)
    return TurnResult(
        run=run,
        messages=state.produced,
        stop_reason=reason,
        usage=state.usage,
        to_embed=[*state.inputs, *state.produced],
        embedding_handle=state.agent.embedding,
        traces=state.traces,
        next_run_id=next_run_id,
    )


def _start_sleeptime(primary_agent_id: str) -> None:
    """Never in the primary's way: a worker task, or (in-process mode) right after this turn."""
    if settings.RUN_EXECUTOR == "in_process":
        run = create_sleeptime_run(primary_agent_id)
        if run is not None:
            execute_run(run.id)
        return
    current_app.send_task("agents.sleeptime", args=[primary_agent_id])


def _fail_before_start(run: Run, reason: str, error: str | None) -> TurnResult:
    store.fail_before_start(run, reason, error)
    return TurnResult(run=run, messages=[], stop_reason=reason, usage=Usage())


def execute_run_streamed(
    run_id: str, *, agent_id: str | None = None, conversation_id: str | None = None
) -> TurnResult | None:
    """execute_run with its events in the run's Redis stream, closed by an end event."""
    with tracing.quiet():  # no instrumentation span per statement and command (apps.observability)
        return _execute_run_streamed(run_id, agent_id=agent_id, conversation_id=conversation_id)


def _execute_run_streamed(
    run_id: str, *, agent_id: str | None, conversation_id: str | None
) -> TurnResult | None:
    sink = RedisStreamSink(run_id)
    result = execute_run(
        run_id, sink=sink, defer_after_run=True, agent_id=agent_id, conversation_id=conversation_id
    )
    if result is not None:
        if not sink.ended:  # a run that failed before it started has no closing events yet
            with contextlib.suppress(StreamFenced):
                sink.finish([], status=result.run.status, stop_reason=result.stop_reason)
        if result.next_run_id and settings.RUN_EXECUTOR == "celery":
            # Its turn now: its own task may be waiting out a deferral's backoff (apps.agents.tasks).
            enqueue_run(result.next_run_id, result.run.agent_id, result.run.conversation_id)
        after_run(result)
    return result
