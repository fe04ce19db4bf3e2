"""ADE: the workspace's centre column: the conversation (send, stream over the WebSocket, approvals, cancel,
conversations).

The timeline is a list of *turns*, one per run: the run's input (the user's message, a system event, an
approval decision), what the agent produced (reasoning, tool calls and returns, assistant text, alerts),
and a footer with the stop reason and token usage. Stored messages are shown as the API shows them
(`to_letta_messages`), so the server-rendered history and the live events that conversation.js renders
from the WebSocket have one shape and one look.

A send answers at once with the user's message and a *live* turn carrying the run id; conversation.js
follows the run's event stream (`ws/runs/<run_id>/`) and, when the run ends, replaces the turn by its
server rendering (GET turn), which is authoritative (final status, a pending approval's form).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.http import HttpResponse
from django.shortcuts import render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import push_url, reswap, retarget

from apps.ade.forms.conversation import ApprovalForm, ConversationForm, MessageForm
from apps.ade.views.base import AdeRequest, ade_view, refusal_status
from apps.agents.errors import ApprovalAlreadyDecided, PendingApproval
from apps.agents.models import Agent, Conversation, Message, Run
from apps.agents.selectors import (
    ACTIVE_RUN_STATUSES,
    agent_get,
    agent_message_list,
    conversation_get,
    conversation_list,
    message_get,
    message_page,
    run_awaiting_approval,
    run_get,
    run_list_with_usage,
    run_message_list,
    without_thread_system_messages,
)
from apps.agents.services import (
    MessageIn,
    conversation_create,
    pending_approval,
    pending_approval_for,
    run_cancel,
    run_create,
    run_submit,
)
from apps.agents.wire import to_letta_messages
from apps.core.actor import Actor
from apps.core.errors import DomainError, NotFound

HISTORY_PAGE_SIZE = 40
STOP_REASON_TONES = {
    "end_turn": "ok",
    "tool_rule": "ok",
    "max_steps": "warn",
    "requires_approval": "warn",
    "cancelled": "warn",
}
STOP_REASON_LABELS = {
    "end_turn": "Turn ended",
    "tool_rule": "Ended by a tool rule",
    "max_steps": "Step limit reached",
    "requires_approval": "Waiting for approval",
    "cancelled": "Cancelled",
    "error": "Error",
    "llm_api_error": "LLM provider error",
    "invalid_llm_response": "Invalid LLM response",
    "invalid_tool_call": "Invalid tool call",
    "no_tool_call": "No tool call",
    "max_tokens_exceeded": "Output token limit reached",
    "context_window_overflow_in_system_prompt": "System prompt overflows the context window",
}


# --- presentation helpers (shared with views/runs.py) ---------------------------------------------------


def pretty_json(text: Any) -> str:
    """Arguments and returns as indented JSON when they are JSON, as they are otherwise."""
    if not isinstance(text, str):
        return json.dumps(text, indent=2, ensure_ascii=False, default=str)
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return text
    if isinstance(value, dict | list):
        return json.dumps(value, indent=2, ensure_ascii=False)
    return text


def _call_view(call: dict[str, Any]) -> dict[str, Any]:
    return {**call, "arguments_pretty": pretty_json(call.get("arguments") or "{}")}


def timeline_events(messages: list[Message], *, pending_id: str | None = None) -> list[dict[str, Any]]:
    """Stored messages as the timeline's events (Letta message dicts plus what the templates show)."""
    events: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for message in messages:
        for event in to_letta_messages(message):
            kind = event["message_type"]
            event["created_at"] = message.created_at
            if kind == "tool_call_message":
                event["tool_call"] = _call_view(event["tool_call"])
            elif kind == "approval_request_message":
                event["tool_calls"] = [_call_view(c) for c in event["tool_calls"]]
                event["pending"] = message.id == pending_id
                call_names.update({c["tool_call_id"]: c["name"] for c in event["tool_calls"]})
            elif kind == "tool_return_message":
                first = (message.tool_returns or [{}])[0]
                event["return_pretty"] = pretty_json(event.get("tool_return") or "")
                event["sandbox"] = first.get("sandbox") or ""
                event["duration_ms"] = first.get("duration_ms")
            elif kind == "approval_response_message":
                event["decisions"] = [
                    {**d, "name": call_names.get(d.get("tool_call_id"), "")}
                    for d in event.get("approvals") or []
                ]
            events.append(event)
    return events


@dataclass
class Turn:
    """One run's part of the timeline (or messages that belong to no run)."""

    run_id: str | None
    run: Run | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    live: bool = False
    show_footer: bool = True

    @property
    def stop_tone(self) -> str:
        return STOP_REASON_TONES.get(self.run.stop_reason, "err") if self.run else ""

    @property
    def stop_label(self) -> str:
        if not self.run:
            return ""
        return STOP_REASON_LABELS.get(self.run.stop_reason, self.run.stop_reason or self.run.status)

    @property
    def duration_s(self) -> float | None:
        if not self.run or not self.run.total_duration_ns:
            return None
        return self.run.total_duration_ns / 1e9


def _is_input(message: Message) -> bool:
    """What a run was given (stored when it was created), as opposed to what it produced."""
    if message.step_id is not None:
        return False
    return (
        message.role == Message.Role.USER
        or (message.role == Message.Role.SYSTEM and not message.name)
        or (message.role == Message.Role.APPROVAL and message.approvals is not None)
    )


def build_turns(
    *, actor: Actor, messages: list[Message], pending_id: str | None, open_run_id: str | None = None
) -> list[Turn]:
    """Group messages (oldest first) into turns. A run still going shows only its input: its other events
    come from the stream, which conversation.js reads from the start. `open_run_id` is the run that goes
    on after this page (the first turn of the newer page), whose footer belongs there."""
    runs = run_list_with_usage(actor=actor, run_ids={m.run_id for m in messages if m.run_id})
    groups: list[tuple[Turn, list[Message]]] = []
    for message in messages:
        if not groups or groups[-1][0].run_id != message.run_id:
            run = runs.get(message.run_id) if message.run_id else None
            live = bool(run and run.status in ACTIVE_RUN_STATUSES)
            groups.append((Turn(run_id=message.run_id, run=run, live=live), []))
        groups[-1][1].append(message)
    last_group_of_run = {turn.run_id: i for i, (turn, _) in enumerate(groups)}
    for i, (turn, stored) in enumerate(groups):
        shown = [m for m in stored if _is_input(m)] if turn.live else stored
        turn.events = timeline_events(shown, pending_id=pending_id)
        turn.show_footer = (
            turn.run is not None
            and last_group_of_run[turn.run_id] == i
            and not (i == len(groups) - 1 and turn.run_id == open_run_id)
        )
    return [turn for turn, _ in groups]


def turn_for_run(*, actor: Actor, run: Run, agent: Agent) -> Turn:
    """A run's whole turn (used for a new send, and to re-render a turn when its run ends)."""
    turns = _turns_of_run(actor=actor, run=run, agent=agent)
    if turns and not turns[0].live and run.status in ACTIVE_RUN_STATUSES:
        # `run` (the caller's, read before the messages) was active, and build_turns reads the status
        # after them: a run that ended in between would show as ended without what it produced, and the
        # page would not follow its stream. Read once more: a run's messages are stored before its end.
        turns = _turns_of_run(actor=actor, run=run, agent=agent)
    if turns:
        return turns[0]
    fresh = run_list_with_usage(actor=actor, run_ids=[run.id]).get(run.id, run)
    return Turn(run_id=run.id, run=fresh, live=fresh.status in ACTIVE_RUN_STATUSES)


def _turns_of_run(*, actor: Actor, run: Run, agent: Agent) -> list[Turn]:
    messages = list(run_message_list(actor=actor, run_id=run.id, include_system=True).order_by("sequence_id"))
    conversation = run.conversation if run.conversation_id else None
    pending = pending_approval(agent=agent, conversation=conversation) or run_awaiting_approval(
        actor=actor, run=run, messages=messages
    )
    return build_turns(actor=actor, messages=messages, pending_id=pending.id if pending else None)


# --- the column ------------------------------------------------------------------------------------------


def _conversation(request: AdeRequest, agent: Agent, source: Any) -> Conversation | None:
    conversation_id = (source.get("conversation") or "").strip()
    if not conversation_id:
        return None
    return conversation_get(actor=request.actor, conversation_id=conversation_id, agent_id=agent.id)


def _history(
    request: AdeRequest,
    agent: Agent,
    conversation: Conversation | None,
    *,
    pending: Message | None,
    before: str | None = None,
) -> tuple[list[Turn], bool, str | None]:
    """A page of turns (newest messages, oldest first), whether there are older ones, and the cursor."""
    qs = without_thread_system_messages(
        agent_message_list(
            actor=request.actor,
            agent_id=agent.id,
            conversation_id=conversation.id if conversation else None,
            include_system=True,
        )
    )
    messages = message_page(qs, actor=request.actor, before=before, limit=HISTORY_PAGE_SIZE + 1)
    has_more = len(messages) > HISTORY_PAGE_SIZE
    messages = messages[-HISTORY_PAGE_SIZE:]
    open_run_id = None
    if before:
        open_run_id = message_get(actor=request.actor, message_id=before).run_id
    turns = build_turns(
        actor=request.actor,
        messages=messages,
        pending_id=pending.id if pending else None,
        open_run_id=open_run_id,
    )
    return turns, has_more, messages[0].id if messages else None


def column_context(request: AdeRequest, agent: Agent) -> dict[str, Any]:
    """What ade/workspace/_conversation.html needs when the workspace page first renders."""
    return _column_context(request, agent, _conversation(request, agent, request.GET))


def _column_context(request: AdeRequest, agent: Agent, conversation: Conversation | None) -> dict[str, Any]:
    pending = pending_approval(agent=agent, conversation=conversation)
    turns, has_more, oldest_id = _history(request, agent, conversation, pending=pending)
    return {
        "conversation": conversation,
        "conversations": list(
            conversation_list(actor=request.actor, agent_id=agent.id).order_by("-created_at")[:100]
        ),
        "turns": turns,
        "has_more": has_more,
        "oldest_id": oldest_id,
        "pending_approval": pending,
    }


def _workspace_url(agent: Agent, conversation: Conversation | None) -> str:
    url = reverse("ade:workspace", args=[agent.id])
    return f"{url}?conversation={conversation.id}" if conversation else url


def _column(request: AdeRequest, agent: Agent, conversation: Conversation | None) -> HttpResponse:
    context = {"agent": agent, **_column_context(request, agent, conversation)}
    response = render(request, "ade/workspace/_conversation.html", context)
    push_url(response, _workspace_url(agent, conversation))
    return response


@require_GET
@ade_view
def conversation_column(request: AdeRequest, agent_id: str) -> HttpResponse:
    """The whole column for another conversation (the switcher); the address bar keeps ?conversation=."""
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    return _column(request, agent, _conversation(request, agent, request.GET))


@require_POST
@ade_view
def conversation_new(request: AdeRequest, agent_id: str) -> HttpResponse:
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    form = ConversationForm(request.POST)
    if not form.is_valid():
        return _notice(request, form.first_error, status=422)
    conversation = conversation_create(
        actor=request.actor, agent_id=agent.id, summary=form.cleaned_data["summary"]
    )
    return _column(request, agent, conversation)


@require_GET
@ade_view
def conversation_earlier(request: AdeRequest, agent_id: str) -> HttpResponse:
    """Older messages, prepended above the timeline in place of the "load earlier" button."""
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    conversation = _conversation(request, agent, request.GET)
    before = request.GET.get("before") or ""
    if not before:
        raise NotFound("Which messages? 'before' is missing.")
    pending = pending_approval(agent=agent, conversation=conversation)
    turns, has_more, oldest_id = _history(request, agent, conversation, pending=pending, before=before)
    return render(
        request,
        "ade/workspace/conversation/_earlier.html",
        {
            "agent": agent,
            "conversation": conversation,
            "turns": turns,
            "has_more": has_more,
            "oldest_id": oldest_id,
        },
    )


def _notice(request: AdeRequest, message: str, *, status: int) -> HttpResponse:
    """A refusal shown above the send box (not a toast: it explains what to do next)."""
    response = render(request, "ade/workspace/conversation/_notice.html", {"message": message}, status=status)
    reswap(retarget(response, "#composer-notice"), "innerHTML")
    return response


def _live_turn(
    request: AdeRequest, agent: Agent, run: Run, *, decided: Message | None = None
) -> HttpResponse:
    turn = turn_for_run(actor=request.actor, run=run, agent=agent)
    names = {c["id"]: c["function"]["name"] for c in (decided.tool_calls or [])} if decided else {}
    for event in turn.events:
        for decision in event.get("decisions") or []:
            decision["name"] = decision["name"] or names.get(decision.get("tool_call_id"), "")
    return render(
        request,
        "ade/workspace/conversation/_send_result.html",
        {"agent": agent, "turn": turn, "decided_request": _decided_card(decided)},
    )


@require_POST
@ade_view
def conversation_send(request: AdeRequest, agent_id: str) -> HttpResponse:
    """Send as the user (or as a system event): the run streams tokens and a worker executes it."""
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    conversation = _conversation(request, agent, request.POST)
    form = MessageForm(request.POST)
    if not form.is_valid():
        return _notice(request, form.first_error, status=422)
    try:
        run = run_create(
            actor=request.actor,
            agent_id=agent.id,
            conversation_id=conversation.id if conversation else None,
            messages=[MessageIn(content=form.cleaned_data["text"], role=form.cleaned_data["role"])],
            stream_tokens=True,
        )
    except PendingApproval:
        return _notice(
            request,
            "A tool call is waiting for your approval. Approve or deny it above before sending a new message.",
            status=409,
        )
    except DomainError as exc:
        return _notice(request, exc.message, status=refusal_status(exc))
    run_submit(run)
    return _live_turn(request, agent, run)


@require_POST
@ade_view
def conversation_approve(request: AdeRequest, agent_id: str) -> HttpResponse:
    """Approve or deny the pending tool call(s); a new run carries the decision and continues the turn."""
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    conversation = _conversation(request, agent, request.POST)
    try:
        pending = pending_approval_for(
            agent=agent, conversation=conversation, request_id=request.POST.get("request_id") or ""
        )
    except ApprovalAlreadyDecided as exc:
        return _notice(request, exc.message, status=409)
    form = ApprovalForm(request.POST, calls=pending.tool_calls or [])
    if not form.is_valid():
        return _notice(request, form.first_error, status=422)
    try:
        run = run_create(
            actor=request.actor,
            agent_id=agent.id,
            conversation_id=conversation.id if conversation else None,
            approvals=form.cleaned_data["approvals"],
            stream_tokens=True,
        )
    except DomainError as exc:
        return _notice(request, exc.message, status=refusal_status(exc, 409))
    run_submit(run)
    return _live_turn(request, agent, run, decided=pending)


def _decided_card(request_message: Message | None) -> dict[str, Any] | None:
    """The approval card, now without its form (it replaces the pending one in place)."""
    if request_message is None:
        return None
    events = timeline_events([request_message], pending_id=None)
    return events[0] if events else None


def _agent_run(request: AdeRequest, agent_id: str, run_id: str) -> tuple[Agent, Run]:
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    run = run_get(actor=request.actor, run_id=run_id)
    if run.agent_id != agent.id:
        raise NotFound(f"Run with id '{run_id}' not found")
    return agent, run


@require_GET
@ade_view
def conversation_turn(request: AdeRequest, agent_id: str, run_id: str) -> HttpResponse:
    """One run's turn as it stands: conversation.js swaps it in when the run ends."""
    agent, run = _agent_run(request, agent_id, run_id)
    turn = turn_for_run(actor=request.actor, run=run, agent=agent)
    return render(request, "ade/workspace/conversation/_turn.html", {"agent": agent, "turn": turn})


@require_POST
@ade_view
def conversation_cancel(request: AdeRequest, agent_id: str, run_id: str) -> HttpResponse:
    """Stop the run at its next safe point; what it produced so far is kept."""
    _, run = _agent_run(request, agent_id, run_id)
    run = run_cancel(actor=request.actor, run_id=run.id)
    label = "Cancelling…" if run.status == Run.Status.CANCELLED else f"Already {run.status}"
    return HttpResponse(f'<span class="muted small">{label}</span>')


urlpatterns = [
    path("agents/<str:agent_id>/conversation/", conversation_column, name="conversation-column"),
    path("agents/<str:agent_id>/conversation/new/", conversation_new, name="conversation-new"),
    path("agents/<str:agent_id>/conversation/earlier/", conversation_earlier, name="conversation-earlier"),
    path("agents/<str:agent_id>/conversation/send/", conversation_send, name="conversation-send"),
    path("agents/<str:agent_id>/conversation/approve/", conversation_approve, name="conversation-approve"),
    path(
        "agents/<str:agent_id>/conversation/runs/<str:run_id>/", conversation_turn, name="conversation-turn"
    ),
    path(
        "agents/<str:agent_id>/conversation/runs/<str:run_id>/cancel/",
        conversation_cancel,
        name="conversation-cancel",
    ),
]
