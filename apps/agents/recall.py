"""Recall memory: every message an agent exchanged, searchable by keywords and by meaning.

Ranking is hybrid. Keywords: PostgreSQL full text (english config, `websearch_to_tsquery`, `ts_rank`)
over the `message_text_fts` GIN index. Meaning: cosine distance between the query's embedding and the
messages' embeddings, through the per-dimension partial HNSW indexes (as for passages), when the agent
has an embedding model. The two rankings are merged with reciprocal rank fusion (RRF, k=60): a message's
score is the sum of 1/(60 + rank) over the lists it appears in, so agreeing lists reinforce each other
and neither list's raw scores (ts_rank, distances) need calibrating against the other.

Dates: `start_date`/`end_date` given as ISO dates (2025-01-31) mean whole days in the *agent's*
timezone, both inclusive, because that is the calendar the model sees in its system message and in
these results' timestamps; an ISO date-time is an inclusive instant (naive ones are read in the agent's
timezone too).

Messages are embedded after the fact (`embed_messages`); a message without an embedding (no embedding
model, provider down, different model size) is still found by keywords.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.contrib.postgres.search import SearchQuery, SearchRank, SearchVector
from django.db.models import BooleanField, ExpressionWrapper, Q, QuerySet
from pgvector.django import CosineDistance

from apps.agents.errors import AgentNotFound
from apps.agents.models import Agent, Message
from apps.core.actor import Actor
from apps.core.errors import DomainError, InvalidInput
from apps.llm.embeddings import embed
from apps.llm.handles import resolve_embedding
from apps.memory.archival import filtered_vector_scan
from apps.memory.models import vector_index_expression

logger = logging.getLogger(__name__)

RRF_K = 60
"""The usual RRF constant: damps the head of each list so one list's first place cannot dominate."""
DEFAULT_LIMIT = 10
MAX_LIMIT = 100
CANDIDATES_PER_LIST = 50
"""Each ranking contributes at least this many candidates (or 3x the limit) before fusion."""
EMBED_TEXT_MAX_CHARS = 8_000
"""Only a message's first 8,000 characters are embedded (about 2,000 tokens, well under embedding models'
input limits), so one huge tool return cannot fail the whole batch; full text search sees everything."""
SEARCHABLE_ROLES = ("user", "assistant", "tool")
SEARCH_TOOL_NAME = "conversation_search"
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S %Z"  # Letta's conversation_search format, in the agent's timezone


def embed_messages(*, actor: Actor, messages: Iterable[Message], embedding_handle: str) -> int:
    """Store the embeddings of the searchable messages in one batch (the given objects are left as they
    are); returns how many.

    Skips system messages, empty texts, already embedded messages, conversation_search's own returns
    and other organisations' messages. Never fails the caller because of the embedding provider: no
    handle means nothing to do, and an unusable handle or a failed call is logged and leaves them NULL.
    Call it outside a transaction holding locks: it waits for the provider.
    """
    todo = [
        message
        for message in messages
        if message.organization_id == actor.organization_id
        # __dict__, not the attribute: a message loaded with .defer("embedding") counts as not embedded
        # (touching the attribute would load it, one query per message)
        and message.__dict__.get("embedding") is None
        and _embeddable(message)
    ]
    if not todo or not (embedding_handle or "").strip():
        return 0
    try:
        target = resolve_embedding(embedding_handle.strip(), organization_id=actor.organization_id)
        vectors = embed(target, [message.text[:EMBED_TEXT_MAX_CHARS] for message in todo])
    except DomainError as exc:
        logger.warning(
            "recall.embedding_failed",
            extra={
                "organization_id": actor.organization_id,
                "embedding_handle": embedding_handle,
                "message_count": len(todo),
                "error_code": exc.code,
                "error": exc.message,
            },
        )
        return 0
    # New instances: the given ones may be kept by the loop's message store (stored_messages), which must
    # not hold vectors.
    embedded = [
        Message(id=message.id, embedding=vector, embedding_dim=len(vector))
        for message, vector in zip(todo, vectors, strict=True)
    ]
    Message.objects.for_actor(actor).bulk_update(embedded, ["embedding", "embedding_dim"])
    return len(todo)


def conversation_search(
    *,
    actor: Actor,
    agent_id: str,
    conversation_id: str | None = None,
    query: str | None = None,
    roles: Sequence[str] | None = None,
    limit: int | None = None,
    start_date: str | date | None = None,
    end_date: str | date | None = None,
) -> list[dict[str, Any]]:
    """Search the agent's messages in one conversation (None = the default conversation).

    With a query: hybrid ranking (see module doc), each result with `relevance`; without: the newest
    messages. System messages are never returned. Results are Letta-shaped dicts:
    `{"timestamp", "role", "content"}` (+ `"relevance"`). Raises AgentNotFound and InvalidInput (bad
    roles, limit or dates).
    """
    agent = Agent.objects.for_actor(actor).filter(id=agent_id).only("id", "embedding", "timezone").first()
    if agent is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    zone = agent_zone(agent.timezone)
    count = _limit(limit)
    start = parse_time_bound(start_date, zone=zone, end=False, name="start_date")
    end = parse_time_bound(end_date, zone=zone, end=True, name="end_date")
    if start is not None and end is not None and start > end:
        raise InvalidInput(f"start_date ({start_date}) is after end_date ({end_date}).")
    base = recall_queryset(
        actor=actor,
        agent_id=agent_id,
        conversation_id=conversation_id,
        roles=_roles(roles),
        start=start,
        end=end,
    )
    text = (query or "").strip()
    if not text:
        # One thread: its conversation first, for its index (apps.agents.selectors.THREAD_ORDER).
        newest = list(base.defer("embedding").order_by("-conversation_id", "-sequence_id")[:count])
        return [_result(message, zone) for message in newest]

    pool = max(CANDIDATES_PER_LIST, 3 * count)
    lists = {"fts_rank": list(_keyword_ranking(base, text)[:pool])}
    vector = _query_embedding(actor=actor, handle=agent.embedding, text=text)
    if vector is not None:
        with filtered_vector_scan(limit=pool):
            lists["vector_rank"] = list(
                message_nearest(base, embedding=vector).values_list("id", flat=True)[:pool]
            )
    fused = reciprocal_rank_fusion(lists)
    # Without their vectors: parsing 100 of them cost more than the query (36 ms at 384 dimensions).
    messages = Message.objects.for_actor(actor).defer("embedding").in_bulk(list(fused))
    mode = "hybrid" if vector is not None else "fts"
    ranked = sorted(
        ((message_id, relevance) for message_id, relevance in fused.items() if message_id in messages),
        key=lambda item: (-item[1]["rrf_score"], -messages[item[0]].sequence_id),
    )
    return [
        {**_result(messages[message_id], zone), "relevance": {**relevance, "search_mode": mode}}
        for message_id, relevance in ranked[:count]
    ]


def recall_queryset(
    *,
    actor: Actor,
    agent_id: str,
    conversation_id: str | None,
    roles: Sequence[str] | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> QuerySet[Message]:
    """The searchable messages: this organisation, agent and conversation only; no system messages,
    no empty texts, no earlier conversation_search returns (they would nest results in results)."""
    queryset = Message.objects.for_actor(actor).filter(agent_id=agent_id)
    if conversation_id is None:
        queryset = queryset.filter(conversation__isnull=True)
    else:
        queryset = queryset.filter(conversation_id=conversation_id)
    if roles:
        queryset = queryset.filter(role__in=list(roles))
    queryset = (
        queryset.exclude(role=Message.Role.SYSTEM)
        .exclude(text="")
        .exclude(role=Message.Role.TOOL, name=SEARCH_TOOL_NAME)
    )
    if start is not None:
        queryset = queryset.filter(created_at__gte=start)
    if end is not None:
        queryset = queryset.filter(created_at__lte=end)
    return queryset


def message_nearest(queryset: QuerySet[Message], *, embedding: list[float]) -> QuerySet[Message]:
    """Order by cosine distance to `embedding` (annotated as `distance`), through the index expression
    and dimension filter of the matching partial HNSW index. Slice it: the index serves ORDER BY+LIMIT."""
    dimension = len(embedding)
    return (
        queryset.filter(embedding_dim=dimension)
        .annotate(distance=CosineDistance(vector_index_expression(dimension), embedding))
        .order_by("distance")
    )


def reciprocal_rank_fusion(lists: dict[str, Sequence[str]], *, k: int = RRF_K) -> dict[str, dict[str, Any]]:
    """Merge rankings of ids: id -> {"rrf_score", <list name>: 1-based rank, ...}, in no particular order."""
    fused: dict[str, dict[str, Any]] = {}
    for name, ids in lists.items():
        for rank, item in enumerate(ids, start=1):
            entry = fused.setdefault(item, {"rrf_score": 0.0})
            entry["rrf_score"] += 1.0 / (k + rank)
            entry[name] = rank
    for entry in fused.values():
        entry["rrf_score"] = round(entry["rrf_score"], 6)
    return fused


def parse_time_bound(value: str | date | None, *, zone: ZoneInfo, end: bool, name: str) -> datetime | None:
    """An inclusive bound: a date is the start (or, for `end`, the last microsecond) of that day in `zone`;
    a date-time is taken as is, in `zone` when naive. Raises InvalidInput for anything else."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        return _day_bound(value, zone=zone, end=end)
    elif isinstance(value, str):
        text = value.strip()
        try:
            return _day_bound(date.fromisoformat(text), zone=zone, end=end)
        except ValueError:
            pass
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidInput(
                f"Invalid {name} {value!r}: use an ISO 8601 date (2025-01-31) or date-time (2025-01-31T14:30)."
            ) from None
    else:
        raise InvalidInput(f"{name} must be an ISO 8601 date string, got {type(value).__name__}.")
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=zone)


def agent_zone(name: str) -> ZoneInfo:
    """The agent's timezone; an unknown name falls back to UTC rather than failing the tool."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def _day_bound(day: date, *, zone: ZoneInfo, end: bool) -> datetime:
    if end:
        return datetime.combine(day + timedelta(days=1), time.min, tzinfo=zone) - timedelta(microseconds=1)
    return datetime.combine(day, time.min, tzinfo=zone)


def _keyword_ranking(queryset: QuerySet[Message], text: str) -> QuerySet[Message]:
    """Message ids by keyword relevance. Plain word lists match ANY word (so one absent word hides
    nothing), with messages containing ALL words first, then by ts_rank; quoted phrases, `-exclusions`
    and explicit `or` keep websearch semantics."""
    vector = SearchVector("text", config="english")
    strict = SearchQuery(text, search_type="websearch", config="english")
    loose = SearchQuery(_any_word(text), search_type="websearch", config="english")
    return (
        queryset.annotate(search=vector)
        .filter(search=loose)
        .annotate(
            rank=SearchRank(vector, loose),
            has_all=ExpressionWrapper(Q(search=strict), output_field=BooleanField()),
        )
        .order_by("-has_all", "-rank", "-sequence_id")
        .values_list("id", flat=True)
    )


def _any_word(text: str) -> str:
    words = text.split()
    has_syntax = '"' in text or any(w.startswith("-") or w.lower() == "or" for w in words)
    return text if has_syntax or len(words) < 2 else " or ".join(words)


def _query_embedding(*, actor: Actor, handle: str, text: str) -> list[float] | None:
    """The query's vector, or None (keywords only) when the agent has no usable embedding model."""
    if not (handle or "").strip():
        return None
    try:
        target = resolve_embedding(handle.strip(), organization_id=actor.organization_id)
        return embed(target, [text[:EMBED_TEXT_MAX_CHARS]])[0]
    except DomainError as exc:
        logger.warning(
            "recall.query_embedding_failed",
            extra={
                "organization_id": actor.organization_id,
                "embedding_handle": handle,
                "error": exc.message,
            },
        )
        return None


def _embeddable(message: Message) -> bool:
    if message.role == Message.Role.SYSTEM or not message.text.strip():
        return False
    return not (message.role == Message.Role.TOOL and message.name == SEARCH_TOOL_NAME)


def _roles(roles: Sequence[str] | None) -> list[str] | None:
    if roles is None:
        return None
    if isinstance(roles, str) or not all(isinstance(role, str) for role in roles):
        raise InvalidInput(f"roles must be a list drawn from {', '.join(SEARCHABLE_ROLES)}.")
    unknown = sorted(set(roles) - set(SEARCHABLE_ROLES))
    if unknown:
        raise InvalidInput(
            f"Unknown role(s) {', '.join(unknown)}: roles may be {', '.join(SEARCHABLE_ROLES)}."
        )
    return list(roles) or None


def _limit(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInput(f"limit must be a positive integer, got {limit!r}.")
    return min(limit, MAX_LIMIT)


def _result(message: Message, zone: ZoneInfo) -> dict[str, Any]:
    return {
        "timestamp": message.created_at.astimezone(zone).strftime(TIMESTAMP_FORMAT),
        "role": message.role,
        "content": message.text,
    }


# --- across the organisation (POST /v1/messages/search) -----------------------------------------------

SEARCH_MODES = ("vector", "fts", "hybrid")
MAX_EMBEDDING_MODELS = 5
"""An organisation-wide vector search embeds the query once per embedding model its agents use; past this
many models, the rest are searched by keywords only (a bounded cost per request)."""


def organization_search(
    *,
    actor: Actor,
    query: str,
    search_mode: str = "hybrid",
    agent_id: str | None = None,
    conversation_id: str | None = None,
    limit: int = 50,
    start: datetime | None = None,
    end: datetime | None = None,
) -> list[tuple[Message, dict[str, Any]]]:
    """Messages of the whole organisation (or one agent, or one conversation) ranked for `query`:
    keywords (`fts`), meaning (`vector`, per embedding model its agents use) or both fused with RRF
    (`hybrid`). Each hit comes with `fts_rank`, `vector_rank` and `rrf_score`. Raises InvalidInput,
    AgentNotFound."""
    if search_mode not in SEARCH_MODES:
        raise InvalidInput(f"search_mode must be one of {', '.join(SEARCH_MODES)}, got {search_mode!r}")
    text = (query or "").strip()
    if not text:
        raise InvalidInput("query must not be empty")
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    agents = Agent.objects.for_actor(actor)
    if agent_id is not None:
        agents = agents.filter(id=agent_id)
        if not agents.exists():
            raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    base = (
        Message.objects.for_actor(actor)
        .exclude(role=Message.Role.SYSTEM)
        .exclude(text="")
        .exclude(role=Message.Role.TOOL, name=SEARCH_TOOL_NAME)
    )
    if agent_id is not None:
        base = base.filter(agent_id=agent_id)
    if conversation_id is not None:
        base = base.filter(conversation_id=conversation_id)
    if start is not None:
        base = base.filter(created_at__gte=start)
    if end is not None:
        base = base.filter(created_at__lte=end)
    pool = max(CANDIDATES_PER_LIST, 3 * limit)
    lists: dict[str, list[str]] = {}
    if search_mode in ("fts", "hybrid"):
        lists["fts_rank"] = list(_keyword_ranking(base, text)[:pool])
    if search_mode in ("vector", "hybrid"):
        handles = (
            agents.exclude(embedding="").values_list("embedding", flat=True).distinct().order_by("embedding")
        )
        for index, handle in enumerate(handles[:MAX_EMBEDDING_MODELS]):
            vector = _query_embedding(actor=actor, handle=handle, text=text)
            if vector is None:
                continue
            of_model = base.filter(agent__embedding=handle)
            with filtered_vector_scan(limit=pool):
                ids = list(message_nearest(of_model, embedding=vector).values_list("id", flat=True)[:pool])
            lists[f"vector_rank:{index}"] = ids
    fused = reciprocal_rank_fusion(lists)
    messages = Message.objects.for_actor(actor).in_bulk(list(fused))
    ranked = sorted(
        ((message_id, scores) for message_id, scores in fused.items() if message_id in messages),
        key=lambda item: (-item[1]["rrf_score"], -messages[item[0]].sequence_id),
    )
    return [(messages[message_id], _search_ranks(scores)) for message_id, scores in ranked[:limit]]


def _search_ranks(scores: dict[str, Any]) -> dict[str, Any]:
    """Letta's rank fields: one vector rank (the best over the embedding models), the FTS rank, RRF."""
    vector_ranks = [rank for key, rank in scores.items() if key.startswith("vector_rank:")]
    return {
        "fts_rank": scores.get("fts_rank"),
        "vector_rank": min(vector_ranks) if vector_ranks else None,
        "rrf_score": scores["rrf_score"],
    }
