from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from apps.agents.errors import AgentNotFound
from apps.agents.models import Agent
from apps.core.actor import Actor
from apps.memory.models import Block
from apps.tools.models import Tool


def agent_queryset(*, actor: Actor) -> QuerySet[Agent]:
    """Agents with what AgentState needs, prefetched: a list costs a fixed number of queries."""
    return Agent.objects.for_actor(actor).prefetch_related(
        Prefetch("blocks", queryset=Block.all_objects.order_by("created_at")),
        Prefetch("tools", queryset=Tool.all_objects.order_by("name")),
    )


def agent_get(*, actor: Actor, agent_id: str) -> Agent:
    """Raises AgentNotFound, also for another organisation's agent (existence is not leaked)."""
    agent = agent_queryset(actor=actor).filter(id=agent_id).first()
    if agent is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    return agent


def agent_list(
    *, actor: Actor, name: str | None = None, tags: list[str] | None = None, match_all_tags: bool = False
) -> QuerySet[Agent]:
    qs = agent_queryset(actor=actor)
    if name:
        qs = qs.filter(name=name)
    if tags:
        qs = qs.filter(tags__contains=tags) if match_all_tags else qs.filter(tags__overlap=tags)
    return qs
