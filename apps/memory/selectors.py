from __future__ import annotations

from django.db.models import QuerySet
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
