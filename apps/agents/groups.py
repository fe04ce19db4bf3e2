"""Multi-agent groups (Letta's /v1/groups): services and selectors.

A group's agents are its organisation's: another organisation's agent id is "not found", in the words a
missing one gets. Sending to a group creates a GroupTurn and has it driven (apps.agents.group_turns) by a
Celery task (`agents.group_turn_advance`), one speaker per task, or in this process with
RUN_EXECUTOR=in_process. A group's messages are those of its turns' runs: what each agent produced, and
the messages the group was sent (once); each says which agent's thread holds it (`agent_id`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from apps.agents.errors import AgentNotFound
from apps.agents.group_turns import ACTIVE_TURN_STATUSES, DEFAULT_TERMINATION_TOKEN, drive
from apps.agents.models import (
    Agent,
    AgentType,
    Group,
    GroupMember,
    GroupTurn,
    GroupTurnRun,
    ManagerType,
    Message,
    Run,
    Step,
    StopReason,
)
from apps.core import permissions
from apps.core.actor import Actor
from apps.core.errors import Conflict, InvalidInput, NotFound
from apps.core.pagination import PageParams, paginate
from apps.core.permissions import Action

SUPPORTED_TYPES = (
    ManagerType.ROUND_ROBIN,
    ManagerType.SUPERVISOR,
    ManagerType.DYNAMIC,
    ManagerType.SLEEPTIME,
)
NEEDS_MANAGER = (ManagerType.SUPERVISOR, ManagerType.DYNAMIC, ManagerType.SLEEPTIME)


# --- selectors ------------------------------------------------------------------------------------------


def group_queryset(*, actor: Actor) -> QuerySet[Group]:
    """The organisation's groups, with their members prefetched (agent_ids)."""
    return Group.objects.for_actor(actor).prefetch_related("members")


def group_get(*, actor: Actor, group_id: str) -> Group:
    """Raises NotFound, also for another organisation's group."""
    group = group_queryset(actor=actor).filter(id=group_id).first()
    if group is None:
        raise NotFound(f"Group with id '{group_id}' not found")
    return group


def group_agent_ids(group: Group) -> list[str]:
    """The participants in speaking order (from the prefetched members)."""
    return [m.agent_id for m in sorted(group.members.all(), key=lambda m: m.position)]


def group_list(
    *,
    actor: Actor,
    page: PageParams,
    manager_type: str | None = None,
    project_id: str | None = None,
    show_hidden: bool = False,
) -> list[Group]:
    qs = group_queryset(actor=actor)
    if manager_type:
        qs = qs.filter(manager_type=manager_type)
    if project_id:
        qs = qs.filter(project_id=project_id)
    if not show_hidden:
        qs = qs.filter(Q(hidden__isnull=True) | Q(hidden=False))
    return paginate(qs, page)


def group_count(*, actor: Actor) -> int:
    return Group.objects.for_actor(actor).count()


def group_list_for_agent(
    *, actor: Actor, agent_id: str, page: PageParams, manager_type: str | None = None
) -> list[Group]:
    """The groups the agent takes part in or manages. Raises AgentNotFound."""
    if not Agent.objects.for_actor(actor).filter(id=agent_id).exists():
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    ids = GroupMember.objects.filter(agent_id=agent_id).values("group_id")
    qs = group_queryset(actor=actor).filter(Q(id__in=ids) | Q(manager_agent_id=agent_id))
    if manager_type:
        qs = qs.filter(manager_type=manager_type)
    return paginate(qs, page)


def group_message_list(*, actor: Actor, group_id: str) -> QuerySet[Message]:
    """The group's timeline: what its agents produced in its turns, and the messages it was sent (shown
    once, in the thread of the agent that took them first). Raises NotFound."""
    group_get(actor=actor, group_id=group_id)
    return (
        Message.objects.for_actor(actor)
        .filter(run__group_link__turn__group_id=group_id)
        .filter(
            Q(step__isnull=False)
            | Q(run__group_link__carries_input=True, role=Message.Role.USER, sender_id="")
        )
        .defer("embedding")
    )


def group_turn_get(*, actor: Actor, turn_id: str, group_id: str | None = None) -> GroupTurn:
    """Raises NotFound, also for another organisation's (or another group's) turn."""
    qs = GroupTurn.objects.for_actor(actor).select_related("group").filter(id=turn_id)
    if group_id is not None:
        qs = qs.filter(group_id=group_id)
    turn = qs.first()
    if turn is None:
        raise NotFound(f"Group turn with id '{turn_id}' not found")
    return turn


def group_turn_runs(*, actor: Actor, turn: GroupTurn) -> list[Run]:
    """The runs of the turn, in speaking order."""
    return [
        link.run
        for link in GroupTurnRun.objects.filter(turn=turn, run__organization_id=actor.organization_id)
        .select_related("run")
        .order_by("position")
    ]


def group_turn_messages(*, actor: Actor, turn: GroupTurn) -> list[Message]:
    """What the agents of the turn produced, in order."""
    return list(
        Message.objects.for_actor(actor)
        .filter(run__group_link__turn=turn)
        .exclude(role__in=[Message.Role.USER, Message.Role.SYSTEM])
        .exclude(step__isnull=True, role=Message.Role.APPROVAL)
        .defer("embedding")
        .order_by("sequence_id")
    )


def group_turn_usage(*, actor: Actor, turn: GroupTurn) -> dict[str, Any]:
    """Letta's usage_statistics over every run of the turn."""
    run_ids = [run.id for run in group_turn_runs(actor=actor, turn=turn)]
    totals = (
        Step.objects.for_actor(actor)
        .filter(run_id__in=run_ids)
        .aggregate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"), steps=Count("id"))
    )
    prompt, completion = int(totals["prompt"] or 0), int(totals["completion"] or 0)
    return {
        "message_type": "usage_statistics",
        "completion_tokens": completion,
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "step_count": int(totals["steps"] or 0),
        "run_ids": run_ids,
    }


def group_active_turns(*, actor: Actor, group_id: str) -> list[GroupTurn]:
    return list(GroupTurn.objects.for_actor(actor).filter(group_id=group_id, status__in=ACTIVE_TURN_STATUSES))


# --- services -------------------------------------------------------------------------------------------


def _org_agents(*, actor: Actor, agent_ids: Iterable[str]) -> dict[str, Agent]:
    """The agents, by id; raises AgentNotFound for the first that is not the organisation's."""
    wanted = list(agent_ids)
    found = {a.id: a for a in Agent.objects.for_actor(actor).filter(id__in=wanted).only("id", "name")}
    for agent_id in wanted:
        if agent_id not in found:
            raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    return found


def _set_members(group: Group, agent_ids: list[str]) -> None:
    GroupMember.objects.filter(group=group).delete()
    GroupMember.objects.bulk_create(
        [GroupMember(group=group, agent_id=agent_id, position=i) for i, agent_id in enumerate(agent_ids)]
    )


def _validate_agents(*, actor: Actor, agent_ids: list[str], manager_agent_id: str | None) -> None:
    if len(set(agent_ids)) != len(agent_ids):
        raise InvalidInput("Duplicate agent ids found in list")
    agents = _org_agents(
        actor=actor, agent_ids=[*agent_ids, *([manager_agent_id] if manager_agent_id else [])]
    )
    names = [agents[a].name for a in agent_ids]
    if len(set(names)) != len(names):
        raise InvalidInput("Duplicate agent names found in the provided agent IDs.")


def _validate_config(manager_type: str, config: dict[str, Any]) -> None:
    if manager_type not in SUPPORTED_TYPES:
        raise InvalidInput(f"Unsupported manager type: {manager_type}")
    if manager_type in NEEDS_MANAGER and not config.get("manager_agent_id"):
        raise InvalidInput(f"A {manager_type} group needs manager_config.manager_agent_id")
    max_turns = config.get("max_turns")
    if max_turns is not None and max_turns < 1:
        raise InvalidInput("max_turns must be at least 1")


@transaction.atomic
def group_create(
    *,
    actor: Actor,
    agent_ids: list[str],
    description: str,
    manager_type: str = ManagerType.ROUND_ROBIN,
    manager_config: dict[str, Any] | None = None,
    shared_block_ids: list[str] | None = None,
    hidden: bool | None = None,
    project_id: str | None = None,
) -> Group:
    """Create a group of the organisation's agents. Raises AgentNotFound (another organisation's agent
    too), InvalidInput (duplicates, an unsupported type, a missing manager), PermissionDenied."""
    permissions.require(actor, Action.GROUP_CREATE)
    config = dict(manager_config or {})
    _validate_config(manager_type, config)
    manager_agent_id = config.get("manager_agent_id")
    _validate_agents(actor=actor, agent_ids=agent_ids, manager_agent_id=manager_agent_id)
    frequency = config.get("sleeptime_agent_frequency")
    group = Group.objects.for_actor(actor).create(
        organization_id=actor.organization_id,
        manager_type=manager_type,
        description=description,
        manager_agent_id=manager_agent_id if manager_type in NEEDS_MANAGER else None,
        max_turns=config.get("max_turns")
        if manager_type in (ManagerType.ROUND_ROBIN, ManagerType.DYNAMIC)
        else None,
        termination_token=(config.get("termination_token") or DEFAULT_TERMINATION_TOKEN)
        if manager_type == ManagerType.DYNAMIC
        else "",
        sleeptime_agent_frequency=frequency if manager_type == ManagerType.SLEEPTIME else None,
        turns_counter=-1 if manager_type == ManagerType.SLEEPTIME and frequency else None,
        shared_block_ids=list(shared_block_ids or []),
        hidden=hidden,
        project_id=project_id or "",
        created_by_id=actor.user_id,
    )
    _set_members(group, agent_ids)
    return group_get(actor=actor, group_id=group.id)


def _writable(*, actor: Actor, group_id: str) -> Group:
    group = group_get(actor=actor, group_id=group_id)
    permissions.require(
        actor, Action.GROUP_WRITE, creator_id=group.created_by_id, subject=f"group '{group.id}'"
    )
    return group


@transaction.atomic
def group_update(
    *,
    actor: Actor,
    group_id: str,
    agent_ids: list[str] | None = None,
    description: str | None = None,
    manager_config: dict[str, Any] | None = None,
    shared_block_ids: list[str] | None = None,
    project_id: str | None = None,
) -> Group:
    """Letta's modify_group: what is given replaces what was (the pattern cannot change). Raises NotFound,
    AgentNotFound, InvalidInput, PermissionDenied."""
    group = _writable(actor=actor, group_id=group_id)
    changed: list[str] = []
    if manager_config:
        kind = manager_config.get("manager_type", group.manager_type)
        if kind != group.manager_type:
            raise InvalidInput("Cannot change group pattern after creation")
        _validate_config(group.manager_type, {"manager_agent_id": "kept", **manager_config})
        manager = manager_config.get("manager_agent_id")
        if manager and group.manager_type in NEEDS_MANAGER:
            _org_agents(actor=actor, agent_ids=[manager])
            group.manager_agent_id = manager
            changed.append("manager_agent")
        for field in ("max_turns", "termination_token", "sleeptime_agent_frequency"):
            if manager_config.get(field):
                setattr(group, field, manager_config[field])
                changed.append(field)
    if description:
        group.description = description
        changed.append("description")
    if shared_block_ids is not None:
        group.shared_block_ids = list(shared_block_ids)
        changed.append("shared_block_ids")
    if project_id is not None:
        group.project_id = project_id
        changed.append("project_id")
    if changed:
        group.save(update_fields=[*changed, "updated_at"])
    if agent_ids:
        _validate_agents(actor=actor, agent_ids=agent_ids, manager_agent_id=None)
        _set_members(group, agent_ids)
    return group_get(actor=actor, group_id=group.id)


def group_delete(*, actor: Actor, group_id: str) -> None:
    """Delete the group (its agents and their messages stay); a turn in progress is cancelled first.
    Raises NotFound, PermissionDenied."""
    group = _writable(actor=actor, group_id=group_id)
    for turn in group_active_turns(actor=actor, group_id=group.id):
        group_turn_cancel(actor=actor, turn_id=turn.id, check=False)
    group.delete()


@transaction.atomic
def group_reset_messages(*, actor: Actor, group_id: str) -> None:
    """Empty the group's timeline: its turns are forgotten, as is what each agent had not seen yet. The
    messages stay in each agent's own history (as an agent's reset keeps them in recall). Raises NotFound,
    PermissionDenied, Conflict while a turn is in progress."""
    group = _writable(actor=actor, group_id=group_id)
    if group_active_turns(actor=actor, group_id=group.id):
        raise Conflict(f"Group '{group.id}' is answering a message; cancel it or wait before resetting.")
    GroupTurn.objects.for_actor(actor).filter(group=group).delete()
    GroupMember.objects.filter(group=group).update(unseen=[])


# --- sending to a group ---------------------------------------------------------------------------------


@transaction.atomic
def group_turn_create(
    *,
    actor: Actor,
    group_id: str,
    messages: list[dict[str, Any]],
    max_steps: int | None = None,
    background: bool = False,
    stream_tokens: bool = False,
) -> GroupTurn:
    """Store a message to the group and have the group answer it (a worker drives the turn, see the module
    docstring). `messages`: [{role, content, name?, otid?}]; `stream_tokens`: every speaker's run streams
    its tokens (token deltas in its run stream). Raises NotFound, InvalidInput (no messages, an empty group,
    an unsupported type), PermissionDenied."""
    group = group_get(actor=actor, group_id=group_id)
    permissions.require(actor, Action.AGENT_USE)
    if not messages:
        raise InvalidInput("Send at least one message")
    if group.manager_type not in SUPPORTED_TYPES:
        raise InvalidInput(f"Groups of type '{group.manager_type}' cannot be sent messages here.")
    if not group_agent_ids(group) and group.manager_type != ManagerType.SLEEPTIME:
        raise InvalidInput("Empty group: group must have at least one agent")
    turn = GroupTurn.objects.for_actor(actor).create(
        organization_id=actor.organization_id,
        group=group,
        input=[
            {
                "role": m.get("role", "user"),
                "content": m["content"],
                **({"name": m["name"]} if m.get("name") else {}),
            }
            for m in messages
        ],
        max_steps=max_steps,
        background=background,
        state={"stream_tokens": True} if stream_tokens else {},
        created_by_id=actor.user_id,
    )
    _submit(turn.id)
    return turn


def _submit(turn_id: str) -> None:
    """Once committed: a worker drives the turn, or (RUN_EXECUTOR=in_process) a thread of this process."""
    if settings.RUN_EXECUTOR == "in_process":
        thread = threading.Thread(
            target=_drive_in_thread, args=(turn_id,), name=f"group-{turn_id}", daemon=True
        )
        transaction.on_commit(thread.start)
        return
    from apps.agents.group_tasks import group_turn_advance_task  # the task module imports the work module

    transaction.on_commit(lambda: group_turn_advance_task.apply_async(args=[turn_id]))


def _drive_in_thread(turn_id: str) -> None:
    try:
        drive(turn_id)
    finally:
        connection.close()


def group_turn_cancel(
    *, actor: Actor, turn_id: str, group_id: str | None = None, check: bool = True
) -> GroupTurn:
    """Cancel a group turn as a whole: no further agent speaks, and the one speaking is stopped at its
    next safe point (apps.agents.services.run_cancel); what was said so far is kept. Idempotent. Raises
    NotFound, PermissionDenied."""
    from apps.agents.services import run_cancel  # services sits beside this module and imports more

    turn = group_turn_get(actor=actor, turn_id=turn_id, group_id=group_id)
    if check:
        permissions.require(actor, Action.RUN_CANCEL)
    with transaction.atomic():
        locked = GroupTurn.objects.for_actor(actor).select_for_update().filter(id=turn.id).first()
        if locked is None or locked.status not in ACTIVE_TURN_STATUSES:
            return locked or turn
        GroupTurn.objects.for_actor(actor).filter(id=turn.id).update(
            status=Run.Status.CANCELLED, stop_reason=StopReason.CANCELLED, completed_at=timezone.now()
        )
        if locked.current_run_id is not None:
            run_cancel(actor=Actor.system(actor.organization_id), run_id=locked.current_run_id)
    turn.refresh_from_db()
    return turn


def group_turn_as_run(turn: GroupTurn) -> dict[str, Any]:
    """The turn in Letta's Run shape (the answer of an async send): its agent is the manager, else the
    first participant."""
    group = turn.group
    agent_id = group.manager_agent_id or next(iter(group_agent_ids(group)), None)
    return {
        "id": turn.id,
        "agent_id": agent_id,
        "status": turn.status,
        "stop_reason": turn.stop_reason or None,
        "background": turn.background,
        "conversation_id": None,
        "callback_url": None,
        "callback_sent_at": None,
        "callback_status_code": None,
        "callback_error": None,
        "created_at": turn.created_at,
        "completed_at": turn.completed_at,
        "metadata": {"group_id": group.id, **({"error": turn.error} if turn.error else {})},
        "request_config": {"max_steps": turn.max_steps},
        "total_duration_ns": None,
        "ttft_ns": None,
        "base_template_id": None,
    }


def sleeptime_group_sync(*, primary: Agent) -> Group | None:
    """Keep the record of a primary's sleeptime pairing as a sleeptime group (Letta creates one when an
    agent is made with enable_sleeptime): manager = the primary, participant = its sleeptime agent.
    Removed when the pairing is gone. Returns the group."""
    existing = Group.all_objects.filter(
        organization_id=primary.organization_id,
        manager_type=ManagerType.SLEEPTIME,
        manager_agent_id=primary.id,
    ).first()
    sleeptime_id = primary.sleeptime_agent_id
    if not primary.enable_sleeptime or sleeptime_id is None or primary.agent_type == AgentType.SLEEPTIME:
        if existing is not None:
            existing.delete()
        return None
    if existing is None:
        existing = Group.all_objects.create(
            organization_id=primary.organization_id,
            manager_type=ManagerType.SLEEPTIME,
            description=f"Sleeptime pairing of agent {primary.id}",
            manager_agent_id=primary.id,
            sleeptime_agent_frequency=primary.sleeptime_agent_frequency,
            turns_counter=-1,
            created_by_id=primary.created_by_id,
        )
    elif existing.sleeptime_agent_frequency != primary.sleeptime_agent_frequency:
        existing.sleeptime_agent_frequency = primary.sleeptime_agent_frequency
        existing.save(update_fields=["sleeptime_agent_frequency", "updated_at"])
    if list(existing.members.values_list("agent_id", flat=True)) != [sleeptime_id]:
        _set_members(existing, [sleeptime_id])
    return existing
