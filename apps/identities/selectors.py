"""Reading identities, and the identity filters the agent and block lists use (Letta's `identity_id` and
`identifier_keys` query parameters)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Prefetch, QuerySet

from apps.agents.models import Agent
from apps.core.actor import Actor
from apps.identities.errors import IdentityNotFound
from apps.identities.models import Identity
from apps.memory.models import Block

AgentLink = Identity.agents.through
BlockLink = Identity.blocks.through


def identity_queryset(*, actor: Actor) -> QuerySet[Identity]:
    """The organisation's identities with their agent and block ids prefetched (a page costs three queries)."""
    return Identity.objects.for_actor(actor).prefetch_related(
        Prefetch("agents", queryset=Agent.all_objects.only("id", "created_at").order_by("created_at", "id")),
        Prefetch("blocks", queryset=Block.all_objects.only("id", "created_at").order_by("created_at", "id")),
    )


def identity_get(*, actor: Actor, identity_id: str) -> Identity:
    """Raises IdentityNotFound, also for another organisation's identity (existence is not leaked)."""
    identity = identity_queryset(actor=actor).filter(id=identity_id).first()
    if identity is None:
        raise IdentityNotFound(f"Identity with id '{identity_id}' not found")
    return identity


def identity_list(
    *,
    actor: Actor,
    name: str | None = None,
    project_id: str | None = None,
    identifier_key: str | None = None,
    identity_type: str | None = None,
) -> QuerySet[Identity]:
    """Letta's filters: `name` matches part of the name, case-insensitively; the others exactly."""
    qs = identity_queryset(actor=actor)
    if name:
        qs = qs.filter(name__icontains=name)
    if project_id:
        qs = qs.filter(project_id=project_id)
    if identifier_key:
        qs = qs.filter(identifier_key=identifier_key)
    if identity_type:
        qs = qs.filter(identity_type=identity_type)
    return qs


def identity_count(*, actor: Actor) -> int:
    return Identity.objects.for_actor(actor).count()


def identity_blocks(*, actor: Actor, identity_id: str) -> QuerySet[Block]:
    """The identity's blocks (GET /v1/identities/{id}/blocks). Raises IdentityNotFound."""
    identity = identity_get(actor=actor, identity_id=identity_id)
    return blocks_for_identity(actor, identity.id)


def blocks_for_identity(actor: Actor, identity_id: str) -> QuerySet[Block]:
    """The organisation's blocks linked to this identity: none for an unknown identity or another
    organisation's (the blocks list's `identity_id` filter, which answers an empty page, not a 404)."""
    return Block.objects.for_actor(actor).filter(
        id__in=BlockLink.objects.filter(
            identity_id=identity_id, identity__organization_id=actor.organization_id
        ).values("block_id")
    )


def filter_blocks_by_identity(
    queryset: QuerySet[Block], *, identity_id: str | None = None, identifier_keys: Iterable[str] | None = None
) -> QuerySet[Block]:
    """Keep the blocks linked to identity `identity_id` and to an identity with one of `identifier_keys`
    (each filter applies only when given). The queryset must already be the actor's: a link never crosses
    organisations (the database refuses it), so an identity seen through one is the same organisation's."""
    if identity_id:
        queryset = queryset.filter(
            id__in=BlockLink.objects.filter(identity_id=identity_id).values("block_id")
        )
    keys = list(identifier_keys or [])
    if keys:
        queryset = queryset.filter(
            id__in=BlockLink.objects.filter(identity__identifier_key__in=keys).values("block_id")
        )
    return queryset


def filter_agents_by_identity(
    queryset: QuerySet[Agent], *, identity_id: str | None = None, identifier_keys: Iterable[str] | None = None
) -> QuerySet[Agent]:
    """Keep the agents linked to identity `identity_id` and to an identity with one of `identifier_keys`
    (each filter applies only when given; each agent once). The queryset must already be the actor's (see
    filter_blocks_by_identity)."""
    if identity_id:
        queryset = queryset.filter(
            id__in=AgentLink.objects.filter(identity_id=identity_id).values("agent_id")
        )
    keys = list(identifier_keys or [])
    if keys:
        queryset = queryset.filter(
            id__in=AgentLink.objects.filter(identity__identifier_key__in=keys).values("agent_id")
        )
    return queryset


def identity_ids_by_agent(agent_ids: Iterable[str]) -> dict[str, list[str]]:
    """The ids of each agent's identities, oldest first, in one query (AgentState's `identity_ids`). The
    agents must be ones the caller may see: their links are in their organisation."""
    ids = list(agent_ids)
    result: dict[str, list[str]] = {agent_id: [] for agent_id in ids}
    if not ids:
        return result
    rows = (
        AgentLink.objects.filter(agent_id__in=ids)
        .order_by("identity__created_at", "identity_id")
        .values_list("agent_id", "identity_id")
    )
    for agent_id, identity_id in rows:
        result[agent_id].append(identity_id)
    return result
