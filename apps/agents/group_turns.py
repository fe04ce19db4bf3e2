"""A group turn, driven one speaker at a time: who speaks next, what they are told, when the turn ends.

Every agent that speaks does so in an ordinary Run of its default thread (created by `run_create`, as an
API send's), so it is executed, streamed and traced like any run. The turn (GroupTurn) is the parent:
its `current_run` is the run in progress, GroupTurnRun lists them all in order.

Never deadlocks the worker pool: `advance` executes the current speaker's run itself, inline, in the
calling thread (as apps.agents.agent_messaging does for a reply), so a group turn needs one worker thread,
never two. When that agent's conversation is busy elsewhere (RunDeferred, or its run was claimed by
another executor) `advance` returns DEFER and the caller tries again later without holding the thread
(the Celery task retries with a countdown). One `advance` is one speaker: the task enqueues itself again
for the next, so a long group turn shares the pool with other work.

Moving on (take in what the speaker said, plan the next, start it) is one compare-and-set on the turn's
current_run under its row lock (`_move_on`): Celery delivers a task at least once, and of two advances
after the same finished run only one starts the next speaker. Cancelling (apps.agents.groups.
group_turn_cancel) marks the turn cancelled under the same lock and cancels its current run, so once a
turn is cancelled no run starts for it. A turn whose advance task was lost (its worker died between the
speaker's run ending and the turn moving on) is advanced again by the periodic recovery
(`recover_stalled_turns`).

What each speaker is told (Letta's round robin): the messages of the group it has not seen yet, from
the other agents as system messages "<name>: <text>" naming the sender (`name`, `sender_id`), the sent
messages as they were. What an agent did not see before the turn ended is kept (GroupMember.unseen) and
given to it when it next speaks.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.agents.loop.convert import to_letta_messages
from apps.agents.loop.runner import RunDeferred, execute_run_streamed
from apps.agents.models import (
    Agent,
    Group,
    GroupMember,
    GroupTurn,
    GroupTurnRun,
    ManagerType,
    Run,
    StopReason,
)
from apps.agents.selectors import TERMINAL_RUN_STATUSES, run_produced_messages
from apps.core.actor import Actor, Role
from apps.core.errors import DomainError

logger = logging.getLogger(__name__)

ACTIVE_TURN_STATUSES = (Run.Status.CREATED, Run.Status.RUNNING)
DEFAULT_TERMINATION_TOKEN = "DONE!"
GROUP_RUN_TYPE = "group_send_message"
"""Run metadata `run_type` of a group speaker's run (Letta keeps a run's origin there)."""
DRIVE_POLL_SECONDS = 0.1


class Progress(Enum):
    CONTINUE = "continue"  # a run was started: call advance again
    DEFER = "defer"  # the speaker's conversation is busy elsewhere: try again later
    DONE = "done"  # the turn is over


@dataclass(frozen=True)
class NextRun:
    agent_id: str
    messages: list[dict[str, Any]]
    kind: str = "speaker"
    carries_input: bool = False
    state: dict[str, Any] | None = None


class GroupTurnFailed(DomainError):
    code = "group_turn_failed"


def turn_actor(turn: GroupTurn) -> Actor:
    """Runs of a group turn are created as the system, for the user who sent the message (their send was
    checked against the role matrix)."""
    return Actor(organization_id=turn.organization_id, user_id=turn.created_by_id, role=Role.SYSTEM)


def advance(turn_id: str) -> Progress:
    """Move the turn on by at most one speaker: execute its current run (inline), take in what it said,
    start the next one or end the turn. Idempotent: a turn that is over is left alone, and of two calls
    after the same finished run (a task delivered twice, recovery racing a late task) one moves the turn
    on and the other returns DONE (`_move_on`)."""
    turn = GroupTurn.all_objects.select_related("current_run").filter(id=turn_id).first()
    if turn is None or turn.status not in ACTIVE_TURN_STATUSES:
        return Progress.DONE
    if turn.status == Run.Status.CREATED:
        GroupTurn.all_objects.filter(id=turn.id, status=Run.Status.CREATED).update(
            status=Run.Status.RUNNING, started_at=timezone.now()
        )
    run = turn.current_run
    if run is not None and run.status not in TERMINAL_RUN_STATUSES:
        if run.status == Run.Status.CREATED:
            try:
                execute_run_streamed(run.id, agent_id=run.agent_id, conversation_id=run.conversation_id)
            except RunDeferred:
                return Progress.DEFER
        run.refresh_from_db(fields=["status", "stop_reason", "error"])
        if run.status not in TERMINAL_RUN_STATUSES:
            return Progress.DEFER  # another executor has it: follow it
    return _move_on(turn.id, run.id if run is not None else None)


@transaction.atomic
def _move_on(turn_id: str, finished_run_id: str | None) -> Progress:
    """Take in the finished speaker, plan the next and start it (or end the turn), as one compare-and-set
    on the turn's current_run under its row lock: a caller whose finished run is no longer the current
    one lost the race to another advance (which carries the turn on) and changes nothing, and
    group_turn_cancel, taking the same lock, comes wholly before (nothing starts) or after (it cancels
    the run started here)."""
    turn = GroupTurn.all_objects.select_for_update().filter(id=turn_id).first()
    if turn is None or turn.status not in ACTIVE_TURN_STATUSES:
        return Progress.DONE
    if turn.current_run_id != finished_run_id:
        return Progress.DONE  # moved on already by another advance
    run = None
    if finished_run_id is not None:
        run = (
            Run.objects.unscoped()
            .only("id", "agent_id", "status", "stop_reason", "error")
            .get(id=finished_run_id)
        )
        if run.status == Run.Status.CANCELLED:
            _finish(turn, Run.Status.CANCELLED, StopReason.CANCELLED)
            return Progress.DONE
        if run.status == Run.Status.FAILED:
            reason = (run.error or {}).get("message") or run.stop_reason or "error"
            _finish(
                turn,
                Run.Status.FAILED,
                run.stop_reason or StopReason.ERROR,
                error={"message": f"Agent '{run.agent_id}' failed: {reason}", "run_id": run.id},
            )
            return Progress.DONE
        _absorb(turn, run)
    try:
        following = _plan(turn, run)
    except GroupTurnFailed as exc:
        _finish(turn, Run.Status.FAILED, StopReason.ERROR, error={"message": exc.message})
        return Progress.DONE
    if following is None:
        _finish(turn, Run.Status.COMPLETED, StopReason.END_TURN)
        return Progress.DONE
    return Progress.CONTINUE if _start(turn, following) else Progress.DONE


def drive(turn_id: str, *, timeout_s: float = 900.0) -> None:
    """Advance the turn until it is over, in this thread (RUN_EXECUTOR=in_process, tests)."""
    give_up = time.monotonic() + timeout_s
    while True:
        progress = advance(turn_id)
        if progress is Progress.DONE:
            return
        if progress is Progress.DEFER:
            if time.monotonic() > give_up:
                logger.warning("agents.group_turn_not_driven", extra={"turn_id": turn_id})
                return
            time.sleep(DRIVE_POLL_SECONDS)


# --- recovery ---------------------------------------------------------------------------------------


STALLED_TURN_GRACE = timedelta(seconds=30)
"""How long a turn may stand still (its current run over, or no run yet) before recovery advances it:
the advance that executed a run moves the turn on at once, so longer means its task was lost."""
RESENT_MARKER_TTL = 120
"""Seconds during which a turn whose advance recovery sent again is not sent again."""


def stalled_turns() -> list[str]:
    """Ids of active turns standing still for longer than STALLED_TURN_GRACE: their current run ended (or
    they have none) and nothing moved them on."""
    cutoff = timezone.now() - STALLED_TURN_GRACE
    active = GroupTurn.all_objects.filter(status__in=ACTIVE_TURN_STATUSES)
    ended = active.filter(
        current_run__status__in=TERMINAL_RUN_STATUSES, current_run__completed_at__lt=cutoff
    ) | active.filter(current_run__isnull=True, created_at__lt=cutoff)
    return list(ended.values_list("id", flat=True))


def recover_stalled_turns() -> list[str]:
    """Periodic (apps.agents.tasks.recover_runs_task): send the advance task again for every stalled turn
    (a worker died between a speaker's run ending and the turn moving on). Safe against a late original
    task: `_move_on` lets one of them move the turn on. A turn sent again is left for RESENT_MARKER_TTL, so
    a busy queue is not flooded. A speaker's run whose task was lost before it ran is executed by
    apps.agents.recovery.requeue_lost_tasks; once it ends, the turn is stalled and comes here."""
    from celery import current_app

    from apps.streams.redis_client import get_redis

    redis = get_redis()
    sent = []
    for turn_id in stalled_turns():
        if not redis.set(f"group-turn-resent:{turn_id}", 1, nx=True, ex=RESENT_MARKER_TTL):
            continue
        current_app.send_task("agents.group_turn_advance", args=[turn_id])
        logger.warning("agents.group_turn_recovered", extra={"turn_id": turn_id})
        sent.append(turn_id)
    return sent


# --- what was said -------------------------------------------------------------------------------------


def said(run: Run) -> list[str]:
    """What the run's agent said to the group: its assistant messages (or send_message contents)."""
    actor = Actor.system(run.organization_id)
    return [
        str(letta["content"])
        for message in run_produced_messages(actor=actor, run_id=run.id)
        for letta in to_letta_messages(message)
        if letta.get("message_type") == "assistant_message" and letta.get("content")
    ]


def _absorb(turn: GroupTurn, run: Run) -> None:
    """Add what a speaker said to the turn's transcript (a manager's choice is not said to the group)."""
    if turn.state.get("absorbed") == run.id:
        return  # taken in already (a task redelivered after a crash)
    link = GroupTurnRun.objects.filter(run_id=run.id).only("kind").first()
    texts = said(run)
    state = dict(turn.state)
    state["last_said"] = texts
    state["absorbed"] = run.id
    turn.state = state
    if link is not None and link.kind == "speaker":
        name = Agent.all_objects.filter(id=run.agent_id).values_list("name", flat=True).first() or ""
        turn.transcript = [
            *turn.transcript,
            *({"agent_id": run.agent_id, "name": name, "text": text} for text in texts),
        ]
        if run.agent_id in state.get("seen", {}):  # a speaker has seen what it said itself
            state["seen"] = {**state["seen"], run.agent_id: _history_length(turn)}
    GroupTurn.all_objects.filter(id=turn.id).update(transcript=turn.transcript, state=turn.state)


def _forwarded(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Transcript entries as input messages: the sent ones as they were, the agents' as system messages
    naming the sender."""
    out = []
    for entry in entries:
        if entry.get("agent_id") is None:
            out.append(dict(entry["message"]))
        else:
            out.append(
                {
                    "role": "system",
                    "content": f"{entry['name'] or entry['agent_id']}: {entry['text']}",
                    "name": entry["name"],
                    "sender_id": entry["agent_id"],
                }
            )
    return out


def _inputs_as_entries(turn: GroupTurn) -> list[dict[str, Any]]:
    return [{"agent_id": None, "message": message} for message in turn.input]


def _unseen_for(turn: GroupTurn, agent_id: str) -> list[dict[str, Any]]:
    """What `agent_id` has not seen: its backlog from earlier turns, then this turn's messages (the sent
    ones and what others said) since it last spoke in this turn."""
    seen = turn.state.get("seen", {})
    history = [*_inputs_as_entries(turn), *turn.transcript]
    backlog: list[dict[str, Any]] = []
    if agent_id not in seen:
        backlog = list(
            GroupMember.objects.filter(group_id=turn.group_id, agent_id=agent_id)
            .values_list("unseen", flat=True)
            .first()
            or []
        )
    return [*backlog, *history[seen.get(agent_id, 0) :]]


def _history_length(turn: GroupTurn) -> int:
    return len(turn.input) + len(turn.transcript)


# --- who speaks next -----------------------------------------------------------------------------------


def _participants(group: Group) -> list[tuple[str, str]]:
    """(agent id, name) of the group's participants, in speaking order."""
    return list(
        GroupMember.objects.filter(group=group).order_by("position").values_list("agent_id", "agent__name")
    )


def _plan(turn: GroupTurn, previous: Run | None) -> NextRun | None:
    group = turn.group
    match group.manager_type:
        case ManagerType.ROUND_ROBIN:
            return _plan_round_robin(turn)
        case ManagerType.SUPERVISOR:
            return _plan_supervisor(turn)
        case ManagerType.DYNAMIC:
            return _plan_dynamic(turn, previous)
        case ManagerType.SLEEPTIME:
            return _plan_sleeptime(turn)
    raise GroupTurnFailed(f"Groups of type '{group.manager_type}' cannot be sent messages here.")


def _speaker(turn: GroupTurn, agent_id: str, **extra: Any) -> NextRun:
    entries = _unseen_for(turn, agent_id)
    seen = {**turn.state.get("seen", {}), agent_id: _history_length(turn)}
    return NextRun(
        agent_id=agent_id,
        messages=_forwarded(entries),
        carries_input=not turn.state.get("input_shown"),
        state={"seen": seen, "input_shown": True, **extra},
    )


def _plan_round_robin(turn: GroupTurn) -> NextRun | None:
    """Letta's round robin: the participants in order, max_turns speakers (default: each once)."""
    participants = _participants(turn.group)
    if not participants:
        raise GroupTurnFailed("Empty group: a group must have at least one agent.")
    spoken = turn.state.get("spoken", 0)
    if spoken >= (turn.group.max_turns or len(participants)):
        return None
    agent_id = participants[spoken % len(participants)][0]
    return _speaker(turn, agent_id, spoken=spoken + 1)


def _plan_supervisor(turn: GroupTurn) -> NextRun | None:
    """The supervisor answers the message; what it said goes to every worker; their replies, gathered in
    one message, go back to the supervisor, whose answer ends the turn."""
    group = turn.group
    supervisor = group.manager_agent_id
    if supervisor is None:
        raise GroupTurnFailed("This supervisor group has no manager agent.")
    workers = [agent_id for agent_id, _ in _participants(group) if agent_id != supervisor]
    phase = turn.state.get("phase")
    if phase is None:
        return NextRun(
            agent_id=supervisor,
            messages=list(turn.input),
            kind="supervisor",
            carries_input=True,
            state={"phase": "workers", "worker": 0, "instruction": None, "replies": []},
        )
    state = turn.state
    if phase == "workers":
        instruction = state.get("instruction")
        replies = list(state.get("replies", []))
        index = state.get("worker", 0)
        if instruction is None:
            instruction = "\n".join(state.get("last_said", []))
        elif index > 0:
            replies.append({"agent_id": workers[index - 1], "response": state.get("last_said", [])})
        if index < len(workers):
            name = Agent.all_objects.filter(id=supervisor).values_list("name", flat=True).first() or ""
            return NextRun(
                agent_id=workers[index],
                messages=[
                    {
                        "role": "system",
                        "content": f"{name or supervisor}: {instruction}",
                        "name": name,
                        "sender_id": supervisor,
                    }
                ],
                state={
                    "phase": "workers",
                    "worker": index + 1,
                    "instruction": instruction,
                    "replies": replies,
                },
            )
        return NextRun(
            agent_id=supervisor,
            messages=[
                {
                    "role": "system",
                    "content": "Replies of the agents in your group: "
                    + json.dumps(replies, ensure_ascii=False),
                }
            ],
            kind="supervisor",
            state={"phase": "final", "replies": replies},
        )
    return None


def _plan_dynamic(turn: GroupTurn, previous: Run | None) -> NextRun | None:
    """Letta's dynamic group: the manager names the next speaker (by name or id) each round, up to
    max_turns speakers (default: the number of participants); a speaker saying the termination token
    (default "DONE!") ends the turn."""
    group = turn.group
    manager = group.manager_agent_id
    if manager is None:
        raise GroupTurnFailed("This dynamic group has no manager agent.")
    participants = [(a, n) for a, n in _participants(group) if a != manager]
    if not participants:
        raise GroupTurnFailed("Empty group: a group must have at least one agent besides its manager.")
    state = turn.state
    token = group.termination_token or DEFAULT_TERMINATION_TOKEN
    if state.get("phase") == "manager":
        options = state.get("options", [])
        choice = _named(" ".join(state.get("last_said", [])), [p for p in participants if p[0] in options])
        if choice is None:
            raise GroupTurnFailed(
                f"The manager agent '{manager}' named none of the agents it could choose ({options})."
            )
        return _speaker(turn, choice, phase="speaker", spoken=state.get("spoken", 0) + 1, last=choice)
    if state.get("phase") == "speaker" and any(token in text for text in state.get("last_said", [])):
        return None
    if state.get("spoken", 0) >= (group.max_turns or len(participants)):
        return None
    last = state.get("last")
    options = [agent_id for agent_id, _ in participants if agent_id != last] or [participants[0][0]]
    history = "\n".join(
        f"{(e['message'].get('name') or 'user') if e.get('agent_id') is None else (e['name'] or e['agent_id'])}: "
        f"{_text(e['message']['content']) if e.get('agent_id') is None else e['text']}"
        for e in [*_inputs_as_entries(turn), *turn.transcript]
    )
    prompt = (
        "Choose the most suitable agent to reply to the latest message in the group chat from the "
        f"following options: {options}. Do not respond to the messages yourself, your task is only to "
        f"decide the next speaker, not to participate. \nChat history:\n{history}"
    )
    return NextRun(
        agent_id=manager,
        messages=[{"role": "user", "content": prompt, "sender_id": manager}],
        kind="manager",
        state={"phase": "manager", "options": options},
    )


def _plan_sleeptime(turn: GroupTurn) -> NextRun | None:
    """A sleeptime group's message goes to its primary (the manager); the sleeptime agent is run every
    sleeptime_agent_frequency turns by the primary's own runs (apps.agents.sleeptime)."""
    if turn.state.get("phase") == "done":
        return None
    manager = turn.group.manager_agent_id
    if manager is None:
        raise GroupTurnFailed("This sleeptime group has no primary agent.")
    return NextRun(agent_id=manager, messages=list(turn.input), carries_input=True, state={"phase": "done"})


def _named(text: str, candidates: list[tuple[str, str]]) -> str | None:
    """The candidate the manager's text names: by id, else by name (Letta: the last name found)."""
    lowered = text.lower()
    for agent_id, _ in candidates:
        if agent_id.lower() in lowered:
            return agent_id
    found = None
    for agent_id, name in candidates:
        if name and name.lower() in lowered:
            found = agent_id
    return found


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


# --- starting and ending -------------------------------------------------------------------------------


def _start(turn: GroupTurn, following: NextRun) -> bool:
    """Create the next speaker's run and make it the turn's current one; the caller (`_move_on`) holds
    the turn's row lock. Returns whether it was created; a refusal of the agent ends the turn."""
    from apps.agents.services import MessageIn, run_create  # services sits above this module

    inputs = [
        MessageIn(
            content=m["content"],
            role=m.get("role", "user"),
            name=m.get("name") or "",
            sender_id=m.get("sender_id") or "",
            otid="",
        )
        for m in following.messages
    ]
    if not inputs:
        inputs = [MessageIn(content="(nothing new was said in the group)", role="system")]
    try:
        with transaction.atomic():
            run = run_create(
                actor=turn_actor(turn),
                agent_id=following.agent_id,
                messages=inputs,
                max_steps=turn.max_steps,
                stream_tokens=bool(turn.state.get("stream_tokens")),
            )
    except DomainError as exc:
        _finish(
            turn,
            Run.Status.FAILED,
            StopReason.ERROR,
            error={"message": f"Agent '{following.agent_id}' cannot take the group's message: {exc.message}"},
        )
        return False
    # Letta marks a run's origin in its metadata (run_type); these name the group turn too.
    Run.objects.unscoped().filter(id=run.id).update(
        metadata={
            **run.metadata,
            "run_type": GROUP_RUN_TYPE,
            "group_id": turn.group_id,
            "group_turn_id": turn.id,
            "group_role": following.kind,
        }
    )
    position = GroupTurnRun.objects.filter(turn=turn).count()
    GroupTurnRun.objects.create(
        turn=turn, run=run, position=position, kind=following.kind, carries_input=following.carries_input
    )
    state = {**turn.state, **(following.state or {})}
    GroupTurn.all_objects.filter(id=turn.id).update(current_run=run, state=state)
    return True


def _finish(turn: GroupTurn, status: str, stop_reason: str, *, error: dict[str, Any] | None = None) -> None:
    """End the turn (if it is still going) and keep, for each participant, what it did not see."""
    with transaction.atomic():
        ended = GroupTurn.all_objects.filter(id=turn.id, status__in=ACTIVE_TURN_STATUSES).update(
            status=status, stop_reason=stop_reason, error=error, completed_at=timezone.now()
        )
        if not ended:
            return
        _keep_unseen(turn)


def _keep_unseen(turn: GroupTurn) -> None:
    turn.refresh_from_db(fields=["state", "transcript", "input"])
    seen = turn.state.get("seen", {})
    history = [*_inputs_as_entries(turn), *turn.transcript]
    if not seen:
        return  # nobody took part in the group's conversation (supervisor, sleeptime)
    for member in GroupMember.objects.filter(group_id=turn.group_id):
        if member.agent_id in seen:
            member.unseen = history[seen[member.agent_id] :]
        else:
            member.unseen = [*member.unseen, *history]
        member.save(update_fields=["unseen"])
