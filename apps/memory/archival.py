"""Archival memory: an agent's archives of passages, embedded with one embedding model per archive and
searched by cosine distance through the per-dimension partial HNSW indexes (see apps.memory.models).

This module must not import apps.agents: agents are referred to by id, through the `Agent.archives`
many-to-many table (`Archive.agents.through`) and the `agents` reverse lookup.

Invariant: every passage of an archive is embedded by `archive.embedding` (set on the first insert with
its dimension), so distances inside an archive compare like with like. The provider is always called
outside a transaction: no lock is held while waiting for it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Literal

from django.apps import apps as django_apps
from django.db import connection, transaction
from django.db.models import QuerySet, Sum
from pgvector.django import CosineDistance

from apps.core.actor import Actor
from apps.core.errors import InvalidInput, NotFound
from apps.llm.embeddings import embed
from apps.llm.errors import UnknownModelHandle
from apps.llm.handles import EmbeddingTarget, resolve_embedding
from apps.memory.models import Archive, ArchiveStats, ArchiveTag, Passage, vector_index_expression

logger = logging.getLogger(__name__)

TagMatchMode = Literal["any", "all"]

ARCHIVAL_NEEDS_EMBEDDING = "archival memory needs an embedding model: set the agent's embedding handle"
DEFAULT_TOP_K = 10
MAX_TOP_K = 100
"""Searches return at most this many passages: more would not fit a tool return anyway."""
MAX_TAG_LENGTH = 100  # Passage.tags items are varchar(100)


class EmbeddingModelMissing(InvalidInput):
    """Archival memory was used without a usable embedding handle (empty, unknown or unconfigured)."""

    code = "embedding_model_missing"


class PassageNotFound(NotFound):
    code = "passage_not_found"


def embedding_target(*, actor: Actor, embedding_handle: str) -> EmbeddingTarget:
    """Resolve the handle for the actor's organisation; never falls back to a default model.

    Raises EmbeddingModelMissing for an empty, unknown or unconfigured handle.
    """
    handle = (embedding_handle or "").strip()
    if not handle:
        raise EmbeddingModelMissing(ARCHIVAL_NEEDS_EMBEDDING)
    try:
        return resolve_embedding(handle, organization_id=actor.organization_id)
    except UnknownModelHandle as exc:
        raise EmbeddingModelMissing(f"{ARCHIVAL_NEEDS_EMBEDDING} ({exc.message})") from exc


def agent_archives(*, actor: Actor, agent_id: str) -> QuerySet[Archive]:
    """The archives attached to the agent, oldest first; the first is where the agent's inserts go."""
    return Archive.objects.for_actor(actor).filter(agents__id=agent_id).order_by("created_at", "id")


def agent_archive(
    *, actor: Actor, agent_id: str, embedding_handle: str, embedding_dim: int | None = None
) -> Archive:
    """The agent's default archive, created (with this embedding model) and attached on first use.

    Raises EmbeddingModelMissing without an embedding handle, NotFound for an agent outside the actor's
    organisation. An existing archive keeps its own embedding model even if the agent's has changed.
    """
    if not (embedding_handle or "").strip():
        raise EmbeddingModelMissing(ARCHIVAL_NEEDS_EMBEDDING)
    existing = agent_archives(actor=actor, agent_id=agent_id).first()
    if existing is not None:
        return existing
    agent_model = django_apps.get_model("agents", "Agent")
    with transaction.atomic():
        # The agent's row lock makes two concurrent first inserts agree on one archive.
        names = list(
            agent_model.objects.for_actor(actor)
            .select_for_update()
            .filter(id=agent_id)
            .values_list("name", flat=True)
        )
        if not names:
            raise NotFound(f"Agent with id '{agent_id}' not found")
        existing = agent_archives(actor=actor, agent_id=agent_id).first()
        if existing is not None:
            return existing
        archive = Archive.objects.for_actor(actor).create(
            name=f"{names[0]}'s archive",
            embedding=embedding_handle.strip(),
            embedding_dim=embedding_dim,
        )
        Archive.agents.through.objects.create(agent_id=agent_id, archive_id=archive.id)
    return archive


def passage_insert(
    *,
    actor: Actor,
    archive: Archive,
    texts: Sequence[str],
    tags: Sequence[str] | None = None,
    embedding_handle: str,
    created_by_id: str | None = None,
) -> list[Passage]:
    """Embed `texts` in one batch with `embedding_handle` and store one passage per text, all tagged `tags`.

    Raises EmbeddingModelMissing (no usable handle), InvalidInput (empty text, bad tags, a handle or vector
    size other than the archive's), NotFound for another organisation's archive, and LLMError when the
    provider fails. Nothing is written when it raises.
    """
    if archive.organization_id != actor.organization_id:
        raise NotFound(f"Archive with id '{archive.id}' not found")
    clean_texts = _clean_texts(texts)
    clean_tags = normalize_tags(tags)
    handle = (embedding_handle or "").strip()
    if archive.embedding and handle and handle != archive.embedding:
        raise InvalidInput(
            f"Archive '{archive.name}' is embedded with '{archive.embedding}', not '{handle}': "
            "passages of one archive must share one embedding model."
        )
    vectors = embed(embedding_target(actor=actor, embedding_handle=handle), clean_texts)
    dimension = len(vectors[0])
    with transaction.atomic():
        locked = Archive.objects.for_actor(actor).select_for_update().filter(id=archive.id).first()
        if locked is None:
            raise NotFound(f"Archive with id '{archive.id}' not found")
        if locked.embedding_dim is not None and locked.embedding_dim != dimension:
            raise InvalidInput(
                f"Archive '{locked.name}' holds {locked.embedding_dim}-dimensional embeddings; "
                f"'{handle}' produced {dimension}-dimensional ones."
            )
        if locked.embedding_dim is None or not locked.embedding:
            Archive.objects.for_actor(actor).filter(id=locked.id).update(
                embedding=locked.embedding or handle, embedding_dim=dimension
            )
            archive.embedding, archive.embedding_dim = locked.embedding or handle, dimension
        return Passage.objects.for_actor(actor).bulk_create(
            [
                Passage(
                    organization_id=actor.organization_id,
                    archive_id=archive.id,
                    text=text,
                    embedding=vector,
                    embedding_dim=dimension,
                    tags=list(clean_tags),
                    created_by_id=created_by_id,
                )
                for text, vector in zip(clean_texts, vectors, strict=True)
            ]
        )


def passage_search(
    *,
    actor: Actor,
    archive_ids: Sequence[str],
    query: str,
    embedding_handle: str,
    tags: Sequence[str] | None = None,
    tag_match_mode: TagMatchMode = "any",
    top_k: int = DEFAULT_TOP_K,
    start: datetime | None = None,
    end: datetime | None = None,
) -> list[tuple[Passage, float]]:
    """Passages of the archives nearest in meaning to `query`, with their cosine distance, nearest first.

    `tags` filter with "any" (at least one) or "all"; `start`/`end` are inclusive bounds on creation
    time; `top_k` is capped at MAX_TOP_K. Raises InvalidInput / EmbeddingModelMissing / LLMError.
    """
    if not isinstance(query, str) or not query.strip():
        raise InvalidInput("query must be a non-empty string: describe what to look for.")
    if top_k < 1:
        raise InvalidInput(f"top_k must be at least 1, got {top_k}.")
    if not archive_ids:
        return []
    [vector] = embed(embedding_target(actor=actor, embedding_handle=embedding_handle), [query])
    queryset = passage_search_queryset(
        actor=actor,
        archive_ids=archive_ids,
        embedding=vector,
        tags=tags,
        tag_match_mode=tag_match_mode,
        top_k=top_k,
        start=start,
        end=end,
    )
    with filtered_vector_scan():
        return [(passage, float(passage.distance)) for passage in queryset]


def passage_search_queryset(
    *,
    actor: Actor,
    archive_ids: Sequence[str],
    embedding: list[float],
    tags: Sequence[str] | None = None,
    tag_match_mode: TagMatchMode = "any",
    top_k: int = DEFAULT_TOP_K,
    start: datetime | None = None,
    end: datetime | None = None,
) -> QuerySet[Passage]:
    """The query behind passage_search, annotated with `distance`: it uses the cast expression and the
    dimension filter of the matching partial HNSW index, so the planner can serve it from the index."""
    dimension = len(embedding)
    queryset = _filtered(
        Passage.objects.for_actor(actor).filter(archive_id__in=list(archive_ids), embedding_dim=dimension),
        tags=tags,
        tag_match_mode=tag_match_mode,
        start=start,
        end=end,
    )
    return queryset.annotate(distance=CosineDistance(vector_index_expression(dimension), embedding)).order_by(
        "distance"
    )[: min(top_k, MAX_TOP_K)]


def passage_list(
    *,
    actor: Actor,
    archive_ids: Sequence[str],
    tags: Sequence[str] | None = None,
    tag_match_mode: TagMatchMode = "any",
    start: datetime | None = None,
    end: datetime | None = None,
    ascending: bool = False,
) -> QuerySet[Passage]:
    """Passages of the archives by creation time (newest first unless `ascending`); no embedding needed."""
    queryset = _filtered(
        Passage.objects.for_actor(actor).filter(archive_id__in=list(archive_ids)),
        tags=tags,
        tag_match_mode=tag_match_mode,
        start=start,
        end=end,
    )
    return queryset.order_by(*(("created_at", "id") if ascending else ("-created_at", "-id")))


@transaction.atomic
def passage_delete(*, actor: Actor, passage_id: str, archive_ids: Sequence[str] | None = None) -> None:
    """Delete one passage; with `archive_ids`, only if it belongs to one of them.

    Raises PassageNotFound, also for another organisation's passage (existence is not leaked).
    """
    queryset = Passage.objects.for_actor(actor).filter(id=passage_id)
    if archive_ids is not None:
        queryset = queryset.filter(archive_id__in=list(archive_ids))
    deleted, _ = queryset.delete()
    if not deleted:
        raise PassageNotFound(f"Passage with id '{passage_id}' not found")


def archival_tags(*, actor: Actor, archive_ids: Sequence[str]) -> list[str]:
    """Every distinct tag used in the archives, sorted (for the system message's memory metadata)."""
    return list(
        ArchiveTag.objects.filter(
            archive_id__in=list(archive_ids), archive__organization_id=actor.organization_id
        )
        .values_list("tag", flat=True)
        .distinct()
        .order_by("tag")
    )


def archival_count(*, actor: Actor, archive_ids: Sequence[str]) -> int:
    """How many passages the archives hold."""
    total = ArchiveStats.objects.filter(
        archive_id__in=list(archive_ids), archive__organization_id=actor.organization_id
    ).aggregate(total=Sum("passage_count"))["total"]
    return int(total or 0)


def agent_archival_stats(*, actor: Actor, agent_id: str) -> tuple[int, list[str]]:
    """How many passages the agent's archives hold and their distinct tags (unsorted): read from the counts
    the passage triggers keep, however many passages there are, in one statement (every run reads them
    for its memory metadata)."""
    links = Archive.agents.through._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH archives AS (
                SELECT link.archive_id FROM {links} AS link
                JOIN {Archive._meta.db_table} AS archive ON archive.id = link.archive_id
                WHERE link.agent_id = %s AND archive.organization_id = %s
            )
            SELECT (SELECT coalesce(sum(passage_count), 0) FROM {ArchiveStats._meta.db_table}
                    WHERE archive_id IN (SELECT archive_id FROM archives)),
                   ARRAY(SELECT DISTINCT tag FROM {ArchiveTag._meta.db_table}
                         WHERE archive_id IN (SELECT archive_id FROM archives))
            """,
            [agent_id, actor.organization_id],
        )
        total, tags = cursor.fetchone()
    return int(total), list(tags) if total else []


def normalize_tags(tags: Sequence[str] | None) -> list[str]:
    """Stripped, de-duplicated (first occurrence wins) tags; raises InvalidInput for non-strings or long tags."""
    if tags is None:
        return []
    if isinstance(tags, str) or not isinstance(tags, Sequence):
        raise InvalidInput('tags must be a list of strings, e.g. ["project", "preference"].')
    clean: list[str] = []
    for tag in tags:
        if not isinstance(tag, str):
            raise InvalidInput(f"tags must be strings, got {type(tag).__name__}.")
        tag = tag.strip()
        if len(tag) > MAX_TAG_LENGTH:
            raise InvalidInput(f"A tag may be at most {MAX_TAG_LENGTH} characters: '{tag[:40]}...'.")
        if tag and tag not in clean:
            clean.append(tag)
    return clean


@contextmanager
def filtered_vector_scan() -> Iterator[None]:
    """Run filtered nearest-neighbour queries with pgvector's iterative index scan (pgvector >= 0.8).

    Why: an HNSW scan yields `hnsw.ef_search` (40) candidates and only then applies the WHERE clause,
    so with other agents' or organisations' rows in the same index a filtered search can come back short
    or empty. `strict_order` keeps reading the index until the LIMIT is met, in exact distance order.
    The setting is transaction-local and put back afterwards (a failure rolls the savepoint back, which
    restores it too); an older pgvector without the setting just skips it.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('hnsw.iterative_scan', true)")
        previous = cursor.fetchone()[0]
        change = previous is not None and previous != "strict_order"
        if change:
            cursor.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', true)")
        yield
        if change:
            cursor.execute("SELECT set_config('hnsw.iterative_scan', %s, true)", [previous])


def _clean_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str) or not texts:
        raise InvalidInput("Give at least one text to store in archival memory.")
    clean: list[str] = []
    for text in texts:
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput("Archival memory content must be non-empty text.")
        clean.append(text.replace("\x00", ""))  # PostgreSQL text cannot hold NUL
    return clean


def _filtered(
    queryset: QuerySet[Passage],
    *,
    tags: Sequence[str] | None,
    tag_match_mode: TagMatchMode,
    start: datetime | None,
    end: datetime | None,
) -> QuerySet[Passage]:
    if tag_match_mode not in ("any", "all"):
        raise InvalidInput(f"tag_match_mode must be 'any' or 'all', got {tag_match_mode!r}.")
    wanted = normalize_tags(tags)
    if wanted:
        lookup = "tags__overlap" if tag_match_mode == "any" else "tags__contains"
        queryset = queryset.filter(**{lookup: wanted})
    if start is not None:
        queryset = queryset.filter(created_at__gte=start)
    if end is not None:
        queryset = queryset.filter(created_at__lte=end)
    return queryset
