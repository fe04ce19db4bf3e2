"""Archival memory (passages) and recall memory (messages) at 10k / 100k rows for one agent.

- Insert throughput goes through the platform's own path, `apps.memory.archival.passage_insert`:
  texts embedded in batches (LLM_EMBEDDING_BATCH_SIZE, 100) by the bench LLM server over HTTP, then one
  bulk insert that maintains the HNSW index.
- The corpora are loaded the way a bulk import would: COPY of pre-computed vectors (the scripted
  server's embedding function, so queries share words with passages) with the 384-dimension HNSW
  index (and for messages the full-text GIN index) dropped and built again afterwards, all in one
  transaction, so an interrupted run leaves the indexes as they were. Inserting 100k rows one HNSW
  insert at a time takes about 3 minutes on 2 cores; building the index takes about 40 s.
- A single insert is one passage through `passage_insert` with the embedding call answered from
  pre-computed vectors (the bar excludes embedding time), at the largest size, after the searches.
- Searches go through `passage_search` (query embedded over HTTP, then the filtered HNSW query) and,
  for the database part alone, `passage_search_queryset` with a pre-computed vector. Recall goes
  through `apps.agents.recall.conversation_search` (full text + vector, fused).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from unittest import mock

from django.db import connection, transaction
from pgvector import Vector
from pgvector.psycopg import register_vector
from psycopg.types.json import Jsonb

from apps.agents.models import Message
from apps.agents.recall import conversation_search
from apps.core.actor import Actor
from apps.memory import archival as archival_module
from apps.memory.archival import (
    agent_archive,
    filtered_vector_scan,
    passage_insert,
    passage_search,
    passage_search_queryset,
)
from apps.memory.models import Passage
from bench.inprocess import load_state_ms
from bench.stats import across, percentile
from tests.support.scripted_llm import embed_text

DIMENSION = 384
EMBEDDING_HANDLE = "openai/text-embedding-small-384"
VOCABULARY = [f"topic{i}" for i in range(20_000)]
WORDS_PER_TEXT = 12


def corpus(count: int, seed: int) -> tuple[list[str], list[list[float]]]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(VOCABULARY) for _ in range(WORDS_PER_TEXT)) for _ in range(count)]
    return texts, [embed_text(text, DIMENSION) for text in texts]


def queries(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(VOCABULARY) for _ in range(3)) for _ in range(count)]


def _index_definitions(cursor: Any, names: Sequence[str]) -> list[str]:
    cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)", [list(names)])
    found = dict(cursor.fetchall())
    missing = [n for n in names if n not in found]
    if missing:
        raise RuntimeError(f"expected indexes are missing: {missing} (run migrate)")
    return [found[n] for n in names]


def bulk_load(
    table: str, columns: Sequence[str], types: Sequence[str], rows: Any, indexes: Sequence[str]
) -> float:
    """COPY rows with `indexes` dropped, then build them again; one transaction. Returns seconds."""
    started = time.perf_counter()
    connection.ensure_connection()
    register_vector(connection.connection)
    with transaction.atomic(), connection.cursor() as cursor:
        definitions = _index_definitions(cursor, indexes)
        for name in indexes:
            cursor.execute(f'DROP INDEX "{name}"')
        with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(list(types))
            for row in rows:
                copy.write_row(row)
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # deferred FK checks now, or CREATE INDEX refuses
        cursor.execute("SET LOCAL maintenance_work_mem = '1GB'")
        cursor.execute("SET LOCAL max_parallel_maintenance_workers = 1")
        for definition in definitions:
            cursor.execute(definition)
        cursor.execute(f"ANALYZE {table}")
    # What autovacuum does within a minute of a bulk insert: sets the visibility map, so counts that
    # the platform runs as index-only scans (a run's recall count) are measured as they run in service.
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM {table}")
    return time.perf_counter() - started


def load_passages(actor: Actor, archive_id: str, texts: list[str], vectors: list[list[float]]) -> float:
    now = datetime.now(UTC)
    rows = (
        (
            f"passage-{uuid.uuid4()}",
            actor.organization_id,
            archive_id,
            text,
            Vector(vector),
            DIMENSION,
            [],
            Jsonb({}),
            now,
            now,
        )
        for text, vector in zip(texts, vectors, strict=True)
    )
    return bulk_load(
        "memory_passage",
        [
            "id",
            "organization_id",
            "archive_id",
            "text",
            "embedding",
            "embedding_dim",
            "tags",
            "metadata",
            "created_at",
            "updated_at",
        ],
        [
            "varchar",
            "varchar",
            "varchar",
            "text",
            "vector",
            "int4",
            "varchar[]",
            "jsonb",
            "timestamptz",
            "timestamptz",
        ],
        rows,
        [f"passage_emb_{DIMENSION}_hnsw"],
    )


def load_messages(actor: Actor, agent_id: str, texts: list[str], vectors: list[list[float]]) -> float:
    now = datetime.now(UTC)
    rows = (
        (
            f"message-{uuid.uuid4()}",
            actor.organization_id,
            agent_id,
            "user" if i % 2 == 0 else "assistant",
            Jsonb([{"type": "text", "text": text}]),
            text,
            "",
            "",
            "",
            "",
            "",
            "",
            "",
            False,
            now,
            now,
            Vector(vector),
            DIMENSION,
        )
        for i, (text, vector) in enumerate(zip(texts, vectors, strict=True))
    )
    return bulk_load(
        "agents_message",
        [
            "id", "organization_id", "agent_id", "role", "content", "text", "name", "tool_call_id",
            "approval_request_id", "denial_reason", "otid", "sender_id", "model", "is_err", "created_at",
            "updated_at", "embedding", "embedding_dim",
        ],
        [
            "varchar", "varchar", "varchar", "varchar", "jsonb", "text", "varchar", "varchar", "varchar",
            "text", "varchar", "varchar", "varchar", "bool", "timestamptz", "timestamptz", "vector", "int4",
        ],
        rows,
        [f"message_emb_{DIMENSION}_hnsw", "message_text_fts"],
    )  # fmt: skip


def _runs(fn: Callable[[int], None], *, runs: int, per_run: int) -> dict[str, Any]:
    """`runs` runs of `per_run` timed calls: median and spread of the runs' p50 and p95."""
    fn(0)  # warm up
    p50s, p95s = [], []
    counter = 0
    for _ in range(runs):
        samples = []
        for _ in range(per_run):
            counter += 1
            started = time.perf_counter()
            fn(counter)
            samples.append((time.perf_counter() - started) * 1000)
        p50s.append(percentile(samples, 50))
        p95s.append(percentile(samples, 95))
    return {"p50_ms": across(p50s), "p95_ms": across(p95s), "n": runs * per_run}


def insert_throughput(
    actor: Actor, archive: Any, *, runs: int, batches: int, batch_size: int = 100
) -> dict[str, Any]:
    """passages/s through passage_insert: `batches` calls of `batch_size` texts per run."""
    rates = []
    for run in range(runs):
        texts = queries(batches * batch_size, seed=1000 + run)
        started = time.perf_counter()
        for b in range(batches):
            passage_insert(
                actor=actor,
                archive=archive,
                texts=texts[b * batch_size : (b + 1) * batch_size],
                embedding_handle=EMBEDDING_HANDLE,
            )
        rates.append(batches * batch_size / (time.perf_counter() - started))
    return {"passages_per_s": across(rates, 1), "passages_per_run": batches * batch_size, "batch": batch_size}


def single_insert(actor: Actor, archive: Any, *, runs: int, per_run: int) -> dict[str, Any]:
    """p50/p95 of passage_insert with one text, embedding time excluded: the embedding call returns a
    vector computed beforehand (the rest of the path runs: provider lookup, archive lock, HNSW insert)."""
    texts = queries(runs * per_run + 1, seed=2000)
    vectors = {text: embed_text(text, DIMENSION) for text in texts}

    def embedded(_target: Any, batch: Sequence[str]) -> list[list[float]]:
        return [vectors.get(text) or embed_text(text, DIMENSION) for text in batch]

    def insert(i: int) -> None:
        passage_insert(actor=actor, archive=archive, texts=[texts[i]], embedding_handle=EMBEDDING_HANDLE)

    with mock.patch.object(archival_module, "embed", embedded):
        return _runs(insert, runs=runs, per_run=per_run)


def search_figures(actor: Actor, archive_id: str, *, runs: int, per_run: int) -> dict[str, Any]:
    texts = queries(runs * per_run + 1, seed=99)
    vectors = [embed_text(t, DIMENSION) for t in texts]

    def end_to_end(i: int) -> None:
        found = passage_search(
            actor=actor,
            archive_ids=[archive_id],
            query=texts[i % len(texts)],
            embedding_handle=EMBEDDING_HANDLE,
        )
        assert len(found) == 10, len(found)

    def database_only(i: int) -> None:
        with filtered_vector_scan():
            rows = list(
                passage_search_queryset(
                    actor=actor, archive_ids=[archive_id], embedding=vectors[i % len(vectors)]
                )
            )
        assert len(rows) == 10, len(rows)

    plan = passage_search_queryset(actor=actor, archive_ids=[archive_id], embedding=vectors[0]).explain()
    count = Passage.objects.for_actor(actor).filter(archive_id=archive_id).count()
    return {
        "passages": count,
        "search": _runs(end_to_end, runs=runs, per_run=per_run),
        "search_db_only": _runs(database_only, runs=runs, per_run=per_run),
        "uses_hnsw": f"passage_emb_{DIMENSION}_hnsw" in plan,
    }


def recall_figures(actor: Actor, agent_id: str, *, runs: int, per_run: int) -> dict[str, Any]:
    texts = queries(runs * per_run + 1, seed=7)

    def search(i: int) -> None:
        results = conversation_search(actor=actor, agent_id=agent_id, query=texts[i % len(texts)], limit=10)
        assert results, "conversation_search found nothing"

    count = Message.objects.for_actor(actor).filter(agent_id=agent_id).count()
    return {"messages": count, "search": _runs(search, runs=runs, per_run=per_run)}


def archival_and_recall(
    actor: Actor,
    make_agent: Callable[[str], str],
    *,
    sizes: Sequence[int],
    runs: int,
    per_run: int,
    insert_batches: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    agent_id = make_agent(EMBEDDING_HANDLE)
    archive = agent_archive(actor=actor, agent_id=agent_id, embedding_handle=EMBEDDING_HANDLE)
    log(f"archival insert throughput: {runs} x {insert_batches * 100} passages through passage_insert")
    results["archival_insert"] = insert_throughput(actor, archive, runs=runs, batches=insert_batches)
    biggest = max(sizes)
    started = time.perf_counter()
    texts, vectors = corpus(biggest, seed=1)
    log(f"corpus of {biggest:,} texts embedded in {time.perf_counter() - started:.1f} s")
    loaded = Passage.objects.for_actor(actor).filter(archive_id=archive.id).count()
    offset = 0
    for size in sorted(sizes):
        need = size - loaded
        if need > 0:
            seconds = load_passages(
                actor, archive.id, texts[offset : offset + need], vectors[offset : offset + need]
            )
            log(f"loaded {need:,} passages (COPY + HNSW build) in {seconds:.1f} s")
            offset += need
            loaded += need
        results[f"archival_{size}"] = search_figures(actor, archive.id, runs=runs, per_run=per_run)
        # Every run of this agent loads its memory statistics (passage count and tags) first.
        results[f"archival_{size}"]["agent_load_state_ms"] = load_state_ms(actor, agent_id)
        log(
            f"archival search at {loaded:,} passages: {results[f'archival_{size}']['search']['p50_ms']['median']} ms p50"
        )
    # After the searches, so their corpus is exactly `size` passages.
    log(f"single archival insert: {runs} x {per_run} passages at {loaded:,}")
    results["archival_single_insert"] = {
        "passages": loaded,
        **single_insert(actor, archive, runs=runs, per_run=per_run),
    }
    recall_agent = make_agent(EMBEDDING_HANDLE)
    seconds = load_messages(actor, recall_agent, texts, vectors)
    log(f"loaded {biggest:,} messages (COPY + HNSW + full-text index build) in {seconds:.1f} s")
    results[f"recall_{biggest}"] = recall_figures(actor, recall_agent, runs=runs, per_run=per_run)
    results[f"recall_{biggest}"]["agent_load_state_ms"] = load_state_ms(actor, recall_agent)
    return results


def cleanup(organization_id: str) -> dict[str, float]:
    """Delete the big tables' rows of the benchmark organisation, then rebuild the two 384-d indexes so
    the next run does not walk 200k dead graph nodes. Returns each statement's seconds."""
    seconds: dict[str, float] = {}
    with connection.cursor() as cursor:
        for statement, params in (
            ("DELETE FROM memory_passage WHERE organization_id = %s", [organization_id]),
            ("DELETE FROM agents_message WHERE organization_id = %s", [organization_id]),
            (f"REINDEX INDEX passage_emb_{DIMENSION}_hnsw", []),
            (f"REINDEX INDEX message_emb_{DIMENSION}_hnsw", []),
        ):
            started = time.monotonic()
            cursor.execute(statement, params)
            seconds[statement.split(" WHERE")[0]] = round(time.monotonic() - started, 1)
    return seconds
