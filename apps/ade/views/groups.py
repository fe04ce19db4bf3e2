"""ADE: groups of agents (Letta's multi-agent groups). The organisation's groups, and a group page: the
shared timeline (every message marked with the agent that said it), a composer that sends a message to the
group, and the turn it starts, which the page streams (static/ade/group.js): it follows the current
speaker's run over the run WebSocket relay (apps.ade.consumers, as the conversation column does) and, when
that run ends, takes the turn's partial again, which names the next speaker's run, until the turn is over.
Cancel stops the turn as a whole (group_turn_cancel)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import F, QuerySet
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from apps.ade.forms.groups import GroupMessageForm
from apps.ade.views.base import AdeRequest, ade_view, error_response, refusal_status
from apps.ade.views.conversation import STOP_REASON_LABELS, STOP_REASON_TONES, timeline_events
from apps.agents.groups import (
    ACTIVE_TURN_STATUSES,
    group_active_turns,
    group_agent_ids,
    group_get,
    group_list,
    group_message_list,
    group_turn_cancel,
    group_turn_create,
    group_turn_get,
)
from apps.agents.models import Group, GroupTurn, Message
from apps.agents.selectors import agent_list
from apps.core.actor import Actor
from apps.core.errors import DomainError
from apps.core.pagination import PageParams

GROUP_LIST_LIMIT = 100
HISTORY_LIMIT = 200


@dataclass
class TurnView:
    """One group turn as its partial shows it: the message sent, what each speaker said, the outcome."""

    turn: GroupTurn
    events: list[dict[str, Any]] = field(default_factory=list)
    speaker: str = ""  # the name of the agent whose run is the turn's current one (the page streams it)
    speaker_id: str = ""

    @property
    def run_id(self) -> str:
        return self.turn.current_run_id or ""

    @property
    def live(self) -> bool:
        return self.turn.status in ACTIVE_TURN_STATUSES

    @property
    def stop_tone(self) -> str:
        return STOP_REASON_TONES.get(self.turn.stop_reason, "err")

    @property
    def stop_label(self) -> str:
        return STOP_REASON_LABELS.get(self.turn.stop_reason, self.turn.stop_reason)

    @property
    def error(self) -> str:
        error = self.turn.error
        return str(error.get("message", "")) if isinstance(error, dict) else str(error or "")


def _names(actor: Actor, agent_ids: set[str]) -> dict[str, str]:
    return dict(agent_list(actor=actor).filter(id__in=agent_ids).values_list("id", "name"))


def _with_speakers(messages: QuerySet[Message]) -> QuerySet[Message]:
    return messages.annotate(speaker=F("agent__name"))


def _events(messages: list[Message]) -> list[dict[str, Any]]:
    """The timeline's events, each marked with its speaker (the agent whose thread holds it; the user's
    message is the user's)."""
    events = []
    for message in messages:
        for event in timeline_events([message]):
            user = event["message_type"] == "user_message"
            event["speaker"] = "" if user else getattr(message, "speaker", "")
            event["speaker_id"] = message.agent_id
            events.append(event)
    return events


def _turn_view(actor: Actor, group: Group, turn: GroupTurn) -> TurnView:
    messages = list(
        _with_speakers(group_message_list(actor=actor, group_id=group.id))
        .filter(run__group_link__turn_id=turn.id)
        .order_by("sequence_id")
    )
    events = _events(messages)
    if not any(event["message_type"] == "user_message" for event in events):
        # No agent has taken the message yet: show it as it was sent.
        sent = [
            {"message_type": "user_message", "content": m.get("content", ""), "speaker": "", "id": ""}
            for m in turn.input
            if m.get("role", "user") == "user"
        ]
        events = sent + events
    speaker_id = turn.current_run.agent_id if turn.current_run_id and turn.current_run else ""
    speaker = _names(actor, {speaker_id}).get(speaker_id, "") if speaker_id else ""
    return TurnView(turn=turn, events=events, speaker=speaker, speaker_id=speaker_id)


def _group_row(group: Group, names: dict[str, str]) -> dict[str, Any]:
    return {
        "group": group,
        "members": [names.get(agent_id, agent_id) for agent_id in group_agent_ids(group)],
        "manager": names.get(manager, manager) if (manager := group.manager_agent_id) else "",
    }


@require_GET
@ade_view
def group_list_page(request: AdeRequest) -> HttpResponse:
    actor = request.actor
    groups = group_list(actor=actor, page=PageParams(limit=GROUP_LIST_LIMIT, order="asc"))
    ids = {agent_id for g in groups for agent_id in group_agent_ids(g)}
    ids |= {g.manager_agent_id for g in groups if g.manager_agent_id}
    names = _names(actor, ids)
    return render(request, "ade/groups/list.html", {"rows": [_group_row(g, names) for g in groups]})


@require_GET
@ade_view
def group_detail(request: AdeRequest, group_id: str) -> HttpResponse:
    actor = request.actor
    group = group_get(actor=actor, group_id=group_id)
    active = sorted(group_active_turns(actor=actor, group_id=group.id), key=lambda t: t.created_at)
    history = list(
        _with_speakers(group_message_list(actor=actor, group_id=group.id))
        .exclude(run__group_link__turn_id__in=[t.id for t in active])
        .order_by("-sequence_id")[:HISTORY_LIMIT]
    )
    history.reverse()
    ids = set(group_agent_ids(group)) | ({group.manager_agent_id} if group.manager_agent_id else set())
    context = {
        "row": _group_row(group, _names(actor, ids)),
        "group": group,
        "events": _events(history),
        "turns": [_turn_view(actor, group, turn) for turn in active],
        "form_values": {"text": ""},
    }
    return render(request, "ade/groups/detail.html", context)


@require_POST
@ade_view
def group_send(request: AdeRequest, group_id: str) -> HttpResponse:
    """Send a message to the group: answers the new turn's partial, which the page then streams."""
    actor = request.actor
    group = group_get(actor=actor, group_id=group_id)
    form = GroupMessageForm(request.POST)
    if not form.is_valid():
        return error_response(request, form.first_error, status=422)
    try:
        turn = group_turn_create(
            actor=actor, group_id=group.id, messages=form.as_messages(), stream_tokens=True
        )
    except DomainError as exc:
        return error_response(request, exc, status=refusal_status(exc))
    return _render_turn(request, group, turn)


@require_GET
@ade_view
def group_turn(request: AdeRequest, group_id: str, turn_id: str) -> HttpResponse:
    """The turn's partial: what it looks like now, and whose run to stream next while it is in progress."""
    group = group_get(actor=request.actor, group_id=group_id)
    turn = group_turn_get(actor=request.actor, turn_id=turn_id, group_id=group.id)
    return _render_turn(request, group, turn)


@require_POST
@ade_view
def group_turn_cancel_view(request: AdeRequest, group_id: str, turn_id: str) -> HttpResponse:
    group = group_get(actor=request.actor, group_id=group_id)
    try:
        turn = group_turn_cancel(actor=request.actor, turn_id=turn_id, group_id=group.id)
    except DomainError as exc:
        return error_response(request, exc, status=refusal_status(exc))
    return _render_turn(request, group, turn)


def _render_turn(request: AdeRequest, group: Group, turn: GroupTurn) -> HttpResponse:
    context = {"group": group, "tv": _turn_view(request.actor, group, turn)}
    return render(request, "ade/groups/_turn.html", context)


urlpatterns = [
    path("groups/", group_list_page, name="group-list"),
    path("groups/<str:group_id>/", group_detail, name="group-detail"),
    path("groups/<str:group_id>/send/", group_send, name="group-send"),
    path("groups/<str:group_id>/turns/<str:turn_id>/", group_turn, name="group-turn"),
    path(
        "groups/<str:group_id>/turns/<str:turn_id>/cancel/", group_turn_cancel_view, name="group-turn-cancel"
    ),
]
