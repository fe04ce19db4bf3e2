from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, QuerySet
from pgvector.django import CosineDistance

from apps.core.actor import Actor
from apps.core.errors import NotFound
from apps.memory.archival import (  # noqa: F401 - archival memory's reads, for the other apps and adapters
    DEFAULT_TOP_K,
    PassageHit,
    agent_archives,
    archival_count,
    archival_tags,
    archive_get,
    archive_list,
    archive_search,
    passage_list,
)
from apps.memory.errors import BlockNotFound
from apps.memory.models import Archive, Block, BlockHistory, Passage, vector_index_expression


def block_list(*, actor: Actor, label: str | None = None, templates_only: bool = False) -> QuerySet[Block]:
    qs = Block.objects.for_actor(actor)
    if label is not None:
        qs = qs.filter(label=label)
    if templates_only:
        qs = qs.filter(is_template=True)
    return qs


def block_filter(
    qs: QuerySet[Block],
    *,
    name: str | None = None,
    tags: list[str] | None = None,
    match_all_tags: bool = False,
    label_search: str | None = None,
    description_search: str | None = None,
    value_search: str | None = None,
    connected_to_agents_count_gt: int | None = None,
    connected_to_agents_count_lt: int | None = None,
    connected_to_agents_count_eq: list[int] | None = None,
    show_hidden_blocks: bool | None = None,
) -> QuerySet[Block]:
    """Letta's list_blocks filters: `name` is the template name; the *_search ones match a part, in any
    case; hidden blocks are left out unless `show_hidden_blocks`."""
    if name:
        qs = qs.filter(template_name=name)
    if tags:
        qs = qs.filter(tags__contains=tags) if match_all_tags else qs.filter(tags__overlap=tags)
    for field, text in (
        ("label", label_search),
        ("description", description_search),
        ("value", value_search),
    ):
        if text:
            qs = qs.filter(**{f"{field}__icontains": text})
    if not show_hidden_blocks:
        qs = qs.exclude(hidden=True)
    counts = (connected_to_agents_count_gt, connected_to_agents_count_lt, connected_to_agents_count_eq)
    if any(value is not None for value in counts):
        qs = qs.annotate(agent_count=Count("agent_attachments", distinct=True))
        if connected_to_agents_count_gt is not None:
            qs = qs.filter(agent_count__gt=connected_to_agents_count_gt)
        if connected_to_agents_count_lt is not None:
            qs = qs.filter(agent_count__lt=connected_to_agents_count_lt)
        if connected_to_agents_count_eq:
            qs = qs.filter(agent_count__in=connected_to_agents_count_eq)
    return qs


def block_get(*, actor: Actor, block_id: str) -> Block:
    """Raises BlockNotFound, also for another organisation's block (existence is not leaked)."""
    block = Block.objects.for_actor(actor).filter(id=block_id).first()
    if block is None:
        raise BlockNotFound(f"Block with id '{block_id}' not found")
    return block


def block_history(*, actor: Actor, block_id: str) -> QuerySet[BlockHistory]:
    return BlockHistory.objects.for_actor(actor).filter(block_id=block_id).order_by("-version")


def block_history_get(*, actor: Actor, block_id: str, history_id: str) -> BlockHistory:
    """One entry of this block's history. Raises NotFound, also for an entry of another block."""
    entry = block_history(actor=actor, block_id=block_id).filter(id=history_id).first()
    if entry is None:
        raise NotFound("No such version of this block")
    return entry


def passage_nearest(
    *, actor: Actor, archive_ids: list[str], embedding: list[float], top_k: int = 10
) -> QuerySet[Passage]:
    """Passages nearest to `embedding` by cosine distance, annotated with `distance`.

    Uses the cast expression and dimension filter of the matching partial HNSW index (see models).
    """
    dimension = len(embedding)
    return (
        Passage.objects.for_actor(actor)
        .filter(archive_id__in=archive_ids, embedding_dim=dimension)
        .annotate(distance=CosineDistance(vector_index_expression(dimension), embedding))
        .order_by("distance")[:top_k]
    )


# --- an agent's archival memory, as a person browses it (the ADE's memory column) ---------------------------


@dataclass(frozen=True)
class AgentArchival:
    """An agent's archives in attachment order, their distinct tags (sorted) and how many passages they
    hold; what agent_archival_search and agent_archival_passages look in."""

    archives: list[Archive]
    tags: list[str]
    total: int

    @property
    def archive_ids(self) -> list[str]:
        return [archive.id for archive in self.archives]


def agent_archival(*, actor: Actor, agent_id: str) -> AgentArchival:
    """The agent's archival memory (no archive yet: an empty one)."""
    archives = list(agent_archives(actor=actor, agent_id=agent_id))
    if not archives:
        return AgentArchival(archives=[], tags=[], total=0)
    ids = [archive.id for archive in archives]
    return AgentArchival(
        archives=archives,
        tags=archival_tags(actor=actor, archive_ids=ids),
        total=archival_count(actor=actor, archive_ids=ids),
    )


def agent_archival_search(
    *, actor: Actor, archival: AgentArchival, query: str, tag: str | None = None, top_k: int = DEFAULT_TOP_K
) -> list[PassageHit]:
    """The agent's passages best matching `query` (by meaning, or by text where an archive has no embedding
    model), optionally only those tagged `tag`. Raises what archive_search raises (InvalidInput,
    EmbeddingModelMissing, LLMError)."""
    if not archival.archives:
        return []
    return archive_search(
        actor=actor, archives=archival.archives, query=query, tags=[tag] if tag else None, top_k=top_k
    )


def agent_archival_passages(
    *, actor: Actor, archival: AgentArchival, tag: str | None = None
) -> QuerySet[Passage]:
    """The agent's passages, newest first, optionally only those tagged `tag` (paginate them)."""
    return passage_list(actor=actor, archive_ids=archival.archive_ids, tags=[tag] if tag else None)


def archive_list_with_usage(*, actor: Actor) -> QuerySet[Archive]:
    """The organisation's archives by name, each with `passage_count` and `agent_count` (the ADE's list)."""
    return (
        archive_list(actor=actor)
        .annotate(
            passage_count=Count("passages", distinct=True),
            agent_count=Count("agents", distinct=True),
        )
        .order_by("name", "id")
    )
