from __future__ import annotations

from django.db.models import Count, QuerySet
from pgvector.django import CosineDistance

from apps.core.actor import Actor
from apps.memory.errors import BlockNotFound
from apps.memory.models import Block, BlockHistory, Passage, vector_index_expression


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
