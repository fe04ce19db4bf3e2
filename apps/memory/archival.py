"""Archival memory: archives of passages (an agent's own, or shared by several agents), embedded with one
embedding model per archive and searched by cosine distance through the per-dimension partial HNSW indexes
(see apps.memory.models); the archives themselves (create, modify, delete, attach to agents).

This module must not import apps.agents: agents are referred to by id, through the `Agent.archives`
many-to-many table (`Archive.agents.through`) and the `agents` reverse lookup.

Invariant: every embedded passage of an archive is embedded by `archive.embedding` (chosen when the archive
is created, or adopted by its first insert while it holds no passage), so distances inside an archive
compare like with like. The embedding model is optional, as in Letta: an archive without one stores its
passages without vectors (embedding and embedding_dim null), and a search finds those by a text match
instead of by similarity. The provider is always called outside a transaction: no lock is held while
waiting for it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from django.apps import apps as django_apps
from django.db import connection, transaction
from django.db.models import Case, DateTimeField, OuterRef, QuerySet, Subquery, Sum, Value, When
from pgvector.django import CosineDistance

from apps.core import permissions
from apps.core.actor import Actor
from apps.core.errors import InvalidInput, NotFound
from apps.core.permissions import Action
from apps.llm.embeddings import embed
from apps.llm.errors import UnknownModelHandle
from apps.llm.handles import EmbeddingTarget, resolve_embedding
from apps.memory.errors import ArchiveNotFound, EmbeddingModelMissing, PassageNotFound
from apps.memory.models import (
    MAX_ARCHIVE_NAME_LENGTH,
    Archive,
    ArchiveStats,
    ArchiveTag,
    Passage,
    vector_index_expression,
)

logger = logging.getLogger(__name__)

TagMatchMode = Literal["any", "all"]
MatchKind = Literal["vector", "text", "filter"]

ARCHIVAL_NEEDS_EMBEDDING = "archival memory needs an embedding model: set the agent's embedding handle"
DEFAULT_TOP_K = 10
MAX_TOP_K = 100
"""Searches return at most this many passages: more would not fit a tool return anyway."""
MAX_TAG_LENGTH = 100  # Passage.tags items are varchar(100)
TEXT_MATCH_SCORE = 1.0
"""Score of a passage found by text match: it contains every word of the query, which ranks it ahead of
passages that are only near in meaning (cosine similarity is at most 1)."""


@dataclass(frozen=True, slots=True)
class PassageSpec:
    """One passage to store: its text, and optionally its tags, metadata and creation time (Letta lets
    callers backdate passages they import)."""

    text: str
    tags: Sequence[str] | None = None
    metadata: dict[str, Any] | None = None
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class PassageHit:
    """A passage a search found: `score` is the cosine similarity to the query ("vector"), TEXT_MATCH_SCORE
    ("text": a passage without a vector containing every word of the query), or 0.0 ("filter": no query,
    only the filters)."""

    passage: Passage
    score: float
    match: MatchKind


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
    """The archives attached to the agent, in the order they were attached; the first is where the agent's
    inserts go (its own archive, unless an archive was attached before its first insert, as in Letta)."""
    links = Archive.agents.through.objects.filter(agent_id=agent_id, archive_id=OuterRef("pk")).values("id")
    return (
        Archive.objects.for_actor(actor)
        .filter(agents__id=agent_id)
        .annotate(link_id=Subquery(links[:1]))
        .order_by("link_id")
    )


def agent_archive(
    *, actor: Actor, agent_id: str, embedding_handle: str, embedding_dim: int | None = None
) -> Archive:
    """The agent's default archive, created (with this embedding model, possibly none) and attached on first
    use; it is the agent's creator's (ARCHIVE_WRITE), whoever caused it.

    Raises NotFound for an agent outside the actor's organisation. An existing archive keeps its own
    embedding model even if the agent's has changed. Without an embedding handle the archive stores
    passages without vectors (text search only), as Letta allows.
    """
    existing = agent_archives(actor=actor, agent_id=agent_id).first()
    if existing is not None:
        return existing
    handle = (embedding_handle or "").strip()
    agent_model = django_apps.get_model("agents", "Agent")
    with transaction.atomic():
        # The agent's row lock makes two concurrent first inserts agree on one archive.
        rows = list(
            agent_model.objects.for_actor(actor)
            .select_for_update()
            .filter(id=agent_id)
            .values_list("name", "created_by_id")
        )
        if not rows:
            raise NotFound(f"Agent with id '{agent_id}' not found")
        existing = agent_archives(actor=actor, agent_id=agent_id).first()
        if existing is not None:
            return existing
        [(name, creator_id)] = rows
        archive = Archive.objects.for_actor(actor).create(
            name=f"{name}'s archive",
            embedding=handle,
            embedding_dim=embedding_dim if handle else None,
            created_by_id=creator_id,
        )
        Archive.agents.through.objects.create(agent_id=agent_id, archive_id=archive.id)
    return archive


def passage_insert(
    *,
    actor: Actor,
    archive: Archive,
    texts: Sequence[str],
    tags: Sequence[str] | None = None,
    embedding_handle: str = "",
    created_by_id: str | None = None,
) -> list[Passage]:
    """Store one passage per text, all tagged `tags`: see passages_insert."""
    if isinstance(texts, str) or not texts:
        raise InvalidInput("Give at least one text to store in archival memory.")
    return passages_insert(
        actor=actor,
        archive=archive,
        passages=[PassageSpec(text=text, tags=tags) for text in texts],
        embedding_handle=embedding_handle,
        created_by_id=created_by_id,
    )


def passages_insert(
    *,
    actor: Actor,
    archive: Archive,
    passages: Sequence[PassageSpec],
    embedding_handle: str = "",
    created_by_id: str | None = None,
) -> list[Passage]:
    """Store the passages in the archive, embedded in one batch with the archive's model.

    An archive without a model adopts `embedding_handle` on its first insert (while it holds no passage);
    without either, the passages are stored without vectors and found by text match. Raises
    EmbeddingModelMissing (a handle that does not resolve), InvalidInput (empty text, bad tags or
    metadata, a handle or vector size other than the archive's), NotFound for another organisation's
    archive, and LLMError when the provider fails. Nothing is written when it raises.
    """
    if archive.organization_id != actor.organization_id:
        raise ArchiveNotFound(f"Archive with id '{archive.id}' not found")
    if not passages:
        raise InvalidInput("Give at least one text to store in archival memory.")
    clean_texts = _clean_texts([spec.text for spec in passages])
    clean_tags = [normalize_tags(spec.tags) for spec in passages]
    for spec in passages:
        if spec.metadata is not None and not isinstance(spec.metadata, dict):
            raise InvalidInput('metadata must be a JSON object, e.g. {"source": "notes"}.')
    handle = (embedding_handle or "").strip()
    if archive.embedding and handle and handle != archive.embedding:
        raise InvalidInput(
            f"Archive '{archive.name}' is embedded with '{archive.embedding}', not '{handle}': "
            "passages of one archive must share one embedding model."
        )
    model = archive.embedding or (handle if handle and not _holds_passages(actor, archive) else "")
    vectors: list[list[float] | None] = []
    dimension: int | None = None
    if model:
        embedded = embed(embedding_target(actor=actor, embedding_handle=model), clean_texts)
        vectors, dimension = list(embedded), len(embedded[0])
    else:
        vectors = [None] * len(clean_texts)
    with transaction.atomic():
        locked = Archive.objects.for_actor(actor).select_for_update().filter(id=archive.id).first()
        if locked is None:
            raise ArchiveNotFound(f"Archive with id '{archive.id}' not found")
        if model:
            _adopt_model(actor, archive, locked, model=model, dimension=dimension)
        created = Passage.objects.for_actor(actor).bulk_create(
            [
                Passage(
                    organization_id=actor.organization_id,
                    archive_id=archive.id,
                    text=text,
                    embedding=vector,
                    embedding_dim=dimension if vector is not None else None,
                    tags=list(tags),
                    metadata=dict(spec.metadata or {}),
                    created_by_id=created_by_id,
                )
                for text, vector, tags, spec in zip(clean_texts, vectors, clean_tags, passages, strict=True)
            ]
        )
        _backdate(actor, created, [spec.created_at for spec in passages])
    return created


def _holds_passages(actor: Actor, archive: Archive) -> bool:
    return Passage.objects.for_actor(actor).filter(archive_id=archive.id).exists()


def _adopt_model(
    actor: Actor, archive: Archive, locked: Archive, *, model: str, dimension: int | None
) -> None:
    """Check the vectors fit the (locked) archive, and record its model and dimension on first use."""
    if locked.embedding and locked.embedding != model:
        raise InvalidInput(
            f"Archive '{locked.name}' is embedded with '{locked.embedding}', not '{model}': "
            "passages of one archive must share one embedding model."
        )
    if locked.embedding_dim is not None and locked.embedding_dim != dimension:
        raise InvalidInput(
            f"Archive '{locked.name}' holds {locked.embedding_dim}-dimensional embeddings; "
            f"'{model}' produced {dimension}-dimensional ones."
        )
    if locked.embedding_dim is None or not locked.embedding:
        Archive.objects.for_actor(actor).filter(id=locked.id).update(embedding=model, embedding_dim=dimension)
        archive.embedding, archive.embedding_dim = model, dimension


def _backdate(actor: Actor, passages: Sequence[Passage], moments: Sequence[datetime | None]) -> None:
    """Give passages the creation times their callers chose, in one statement (created_at is auto_now_add,
    which bulk_create always fills with now)."""
    chosen = [(p, moment) for p, moment in zip(passages, moments, strict=True) if moment is not None]
    if not chosen:
        return
    Passage.objects.for_actor(actor).filter(id__in=[p.id for p, _ in chosen]).update(
        created_at=Case(
            *[When(id=p.id, then=Value(moment)) for p, moment in chosen], output_field=DateTimeField()
        )
    )
    for passage, moment in chosen:
        passage.created_at = moment


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
    with filtered_vector_scan(limit=min(top_k, MAX_TOP_K)):
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
    sql, params = archival_stats_query(actor=actor, agent_id=agent_id)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return archival_stats_from_row(cursor.fetchone())


def archival_stats_query(*, actor: Actor, agent_id: str) -> tuple[str, list[Any]]:
    """agent_archival_stats' statement, for a caller that sends it with other reads (a run's load)."""
    links = Archive.agents.through._meta.db_table
    sql = f"""
        WITH archives AS (
            SELECT link.archive_id FROM {links} AS link
            JOIN {Archive._meta.db_table} AS archive ON archive.id = link.archive_id
            WHERE link.agent_id = %s AND archive.organization_id = %s
        )
        SELECT (SELECT coalesce(sum(passage_count), 0) FROM {ArchiveStats._meta.db_table}
                WHERE archive_id IN (SELECT archive_id FROM archives)),
               ARRAY(SELECT DISTINCT tag FROM {ArchiveTag._meta.db_table}
                     WHERE archive_id IN (SELECT archive_id FROM archives))
        """
    return sql, [agent_id, actor.organization_id]


def archival_stats_from_row(row: Sequence[Any]) -> tuple[int, list[str]]:
    total, tags = row
    return int(total), list(tags) if total else []


# --- Archives (the /v1/archives resource) ------------------------------------------------------------------


def archive_get(*, actor: Actor, archive_id: str) -> Archive:
    """Raises ArchiveNotFound, also for another organisation's archive (existence is not leaked)."""
    archive = Archive.objects.for_actor(actor).filter(id=archive_id).first()
    if archive is None:
        raise ArchiveNotFound(f"Archive with id '{archive_id}' not found")
    return archive


def archive_list(*, actor: Actor, name: str | None = None, agent_id: str | None = None) -> QuerySet[Archive]:
    """The organisation's archives, optionally only those with exactly this name or attached to this agent
    (the caller checks the agent is visible: an unknown one simply has no archives here)."""
    queryset = Archive.objects.for_actor(actor)
    if name is not None:
        queryset = queryset.filter(name=name)
    if agent_id is not None:
        queryset = queryset.filter(agents__id=agent_id)
    return queryset


def archive_create(
    *, actor: Actor, name: str, description: str = "", embedding_handle: str | None = None
) -> Archive:
    """Create an archive owned by the actor (ARCHIVE_CREATE). With an embedding handle, its passages are
    embedded with that model; without one they are stored without vectors and searched by text match (an
    archive may still adopt a model with its first insert, see passages_insert).

    Raises PermissionDenied, InvalidInput (a blank or long name), EmbeddingModelMissing (an unknown handle).
    """
    permissions.require(actor, Action.ARCHIVE_CREATE)
    clean_name = _clean_archive_name(name)
    handle = (embedding_handle or "").strip()
    dimension = embedding_target(actor=actor, embedding_handle=handle).dimension if handle else None
    return Archive.objects.for_actor(actor).create(
        name=clean_name,
        description=description or "",
        embedding=handle,
        embedding_dim=dimension,
        created_by_id=actor.user_id,
    )


@transaction.atomic
def archive_update(
    *, actor: Actor, archive_id: str, name: str | None = None, description: str | None = None
) -> Archive:
    """Rename or redescribe an archive (None leaves a field as it is). Raises ArchiveNotFound,
    PermissionDenied (ARCHIVE_WRITE), InvalidInput."""
    archive = _lock_archive(actor=actor, archive_id=archive_id)
    require_archive_writer(actor, archive)
    if name is not None:
        archive.name = _clean_archive_name(name)
    if description is not None:
        archive.description = description
    archive.save(update_fields=["name", "description", "updated_at"])
    return archive


@transaction.atomic
def archive_delete(*, actor: Actor, archive_id: str) -> None:
    """Delete an archive with its passages; the agents it was attached to keep working without it.
    Raises ArchiveNotFound, PermissionDenied (ARCHIVE_WRITE)."""
    archive = _lock_archive(actor=actor, archive_id=archive_id)
    require_archive_writer(actor, archive)
    archive.delete()


def archive_passages_create(
    *, actor: Actor, archive_id: str, passages: Sequence[PassageSpec]
) -> tuple[Archive, list[Passage]]:
    """Add passages to an archive as the actor, embedded with the archive's model if it has one.
    An empty list stores nothing (as Letta). Raises ArchiveNotFound, PermissionDenied (ARCHIVE_WRITE),
    and what passages_insert raises."""
    archive = archive_get(actor=actor, archive_id=archive_id)
    require_archive_writer(actor, archive)
    if not passages:
        return archive, []
    created = passages_insert(
        actor=actor, archive=archive, passages=passages, embedding_handle="", created_by_id=actor.user_id
    )
    return archive, created


@transaction.atomic
def archive_passage_delete(*, actor: Actor, archive_id: str, passage_id: str) -> None:
    """Delete one passage of the archive. Raises ArchiveNotFound, PermissionDenied (ARCHIVE_WRITE),
    PassageNotFound, InvalidInput for a passage of another archive (Letta's 400)."""
    archive = archive_get(actor=actor, archive_id=archive_id)
    require_archive_writer(actor, archive)
    passage = Passage.objects.for_actor(actor).filter(id=passage_id).only("id", "archive_id").first()
    if passage is None:
        raise PassageNotFound(f"Passage with id '{passage_id}' not found")
    if passage.archive_id != archive.id:
        raise InvalidInput(f"Passage {passage_id} does not belong to archive {archive_id}")
    Passage.objects.for_actor(actor).filter(id=passage.id).delete()


def archive_attach_agent(*, actor: Actor, archive_id: str, agent_id: str) -> Archive:
    """Attach the archive to an agent the caller has already checked (visible, and theirs to configure):
    its searches then cover the archive. Attaching twice is a no-op. Raises ArchiveNotFound,
    PermissionDenied (ARCHIVE_WRITE)."""
    archive = archive_get(actor=actor, archive_id=archive_id)
    require_archive_writer(actor, archive)
    Archive.agents.through.objects.get_or_create(agent_id=agent_id, archive_id=archive.id)
    return archive


def archive_detach_agent(*, actor: Actor, archive_id: str, agent_id: str) -> Archive:
    """Detach the archive from an agent (the archive and its passages stay); detaching an archive that is
    not attached is a no-op, as in Letta. Raises ArchiveNotFound, PermissionDenied (ARCHIVE_WRITE)."""
    archive = archive_get(actor=actor, archive_id=archive_id)
    require_archive_writer(actor, archive)
    Archive.agents.through.objects.filter(agent_id=agent_id, archive_id=archive.id).delete()
    return archive


def require_archive_writer(actor: Actor, archive: Archive) -> None:
    """The role matrix's ARCHIVE_WRITE: the archive's creator, owners and admins. Raises PermissionDenied."""
    permissions.require(
        actor, Action.ARCHIVE_WRITE, creator_id=archive.created_by_id, subject=f"archive '{archive.name}'"
    )


def _lock_archive(*, actor: Actor, archive_id: str) -> Archive:
    archive = Archive.objects.for_actor(actor).select_for_update().filter(id=archive_id).first()
    if archive is None:
        raise ArchiveNotFound(f"Archive with id '{archive_id}' not found")
    return archive


def _clean_archive_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("An archive needs a name.")
    if len(name) > MAX_ARCHIVE_NAME_LENGTH:
        raise InvalidInput(f"An archive name may be at most {MAX_ARCHIVE_NAME_LENGTH} characters.")
    return name


# --- Search across archives, with or without embedding models ---------------------------------------------


def archive_search(
    *,
    actor: Actor,
    archives: Sequence[Archive],
    query: str | None,
    tags: Sequence[str] | None = None,
    tag_match_mode: TagMatchMode = "any",
    top_k: int = DEFAULT_TOP_K,
    start: datetime | None = None,
    end: datetime | None = None,
) -> list[PassageHit]:
    """Passages of `archives` that fit the filters, best first, at most `top_k` (capped at MAX_TOP_K).

    A passage with a vector is ranked by cosine similarity to the query, embedded with its archive's model
    (one provider call per distinct model). A passage without one (its archive has no embedding model) is
    found by a text match instead of by similarity: it must contain every word of the query, ignoring
    case; these come first (TEXT_MATCH_SCORE), oldest first. With `query` None: the passages that fit the
    filters, oldest first, score 0. `tags` filter with "any" or "all"; `start`/`end` are inclusive.

    Raises InvalidInput (an empty query string, bad top_k, tags or tag_match_mode), EmbeddingModelMissing
    (an archive's model no longer resolves), LLMError (the provider failed).
    """
    if query is not None and (not isinstance(query, str) or not query.strip()):
        raise InvalidInput("query must be a non-empty string: describe what to look for.")
    if top_k < 1:
        raise InvalidInput(f"top_k must be at least 1, got {top_k}.")
    limit = min(top_k, MAX_TOP_K)
    base = _filtered(
        Passage.objects.for_actor(actor).filter(archive_id__in=[archive.id for archive in archives]),
        tags=tags,
        tag_match_mode=tag_match_mode,
        start=start,
        end=end,
    )
    if not archives:
        return []
    if query is None:
        return [PassageHit(p, 0.0, "filter") for p in base.order_by("created_at", "id")[:limit]]
    # Only an archive without a model holds passages without vectors (one adopts a model only while empty):
    # the text match is not run over the others, where it read every passage (no index serves
    # `embedding IS NULL AND text ILIKE`: 800 ms at 1,000,000 passages, bench/scale_bench.py).
    hits: list[PassageHit] = []
    if unembedded := [archive.id for archive in archives if not archive.embedding]:
        text_only = base.filter(archive_id__in=unembedded, embedding__isnull=True)
        for word in query.split():
            text_only = text_only.filter(text__icontains=word)
        hits = [
            PassageHit(p, TEXT_MATCH_SCORE, "text") for p in text_only.order_by("created_at", "id")[:limit]
        ]
        if len(hits) >= limit:
            return hits
    by_model: dict[str, list[str]] = {}
    for archive in archives:
        if archive.embedding:
            by_model.setdefault(archive.embedding, []).append(archive.id)
    near: list[PassageHit] = []
    for handle, archive_ids in by_model.items():
        [vector] = embed(embedding_target(actor=actor, embedding_handle=handle), [query])
        queryset = passage_search_queryset(
            actor=actor,
            archive_ids=archive_ids,
            embedding=vector,
            tags=tags,
            tag_match_mode=tag_match_mode,
            top_k=limit,
            start=start,
            end=end,
        )
        with filtered_vector_scan(limit=limit):
            near += [PassageHit(p, 1.0 - float(p.distance), "vector") for p in queryset]
    near.sort(key=lambda hit: hit.score, reverse=True)
    return (hits + near)[:limit]


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
def filtered_vector_scan(*, limit: int | None = None) -> Iterator[None]:
    """Run filtered nearest-neighbour queries with pgvector's iterative index scan (pgvector >= 0.8).

    Why: an HNSW scan yields `hnsw.ef_search` (40) candidates and only then applies the WHERE clause,
    so with other agents' or organisations' rows in the same index a filtered search can come back short
    or empty. `strict_order` keeps reading the index until the LIMIT is met, in exact distance order.
    With `limit` (the query's LIMIT), ef_search is raised to twice it: a first pass narrower than the LIMIT
    must iterate, and strict-order iterations cost more than a wider first pass (recall's 50 candidates
    among 100,000 of the agent's 200,000 vectors: 119 ms at ef_search 40, 37 ms at 100; bench/scale_bench.py).
    The settings are transaction-local: put back afterwards inside an outer transaction (a failure rolls
    the savepoint back, which restores them too), else gone with this block's COMMIT; an older pgvector
    without them just skips them.
    """
    nested = connection.in_atomic_block
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('hnsw.iterative_scan', true), current_setting('hnsw.ef_search', true)"
        )
        scan, ef_search = cursor.fetchone()
        wanted = {"hnsw.iterative_scan": "strict_order"} if scan is not None else {}
        if limit is not None and ef_search is not None and int(ef_search) < 2 * limit:
            wanted["hnsw.ef_search"] = str(min(2 * limit, MAX_EF_SEARCH))
        previous = {"hnsw.iterative_scan": scan, "hnsw.ef_search": ef_search}
        changed = {name: value for name, value in wanted.items() if previous[name] != value}
        _set_local(cursor, changed)
        yield
        if nested:
            _set_local(cursor, {name: str(previous[name]) for name in changed})


MAX_EF_SEARCH = 1000  # pgvector's upper bound


def _set_local(cursor: Any, settings: dict[str, str]) -> None:
    if settings:
        calls = ", ".join("set_config(%s, %s, true)" for _ in settings)
        cursor.execute(f"SELECT {calls}", [v for item in settings.items() for v in item])


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
