"""Seed one organisation with data at scale, kept between runs: 10,000 agents (each with its blocks,
base tools and stored system message), 1,000,000 messages and 1,000,000 archival passages.

    echo "python -m bench.scale_data" | DATA_DIR=var/scale-bench python scripts/devenv.py shell
    (or `make bench-scale`, which seeds when needed, then measures: bench/scale_bench.py)

- The organisation is named `scale-bench`. Its "big" agent (`scale-big`, made by `agent_create`) holds
  100,000 messages (the last 40 in its context) and the one archive, which holds all 1,000,000 passages:
  the archival bar is a top-10 search over 1M passages of the searched archive. The other 9,999 agents
  are copies of the big agent's rows (agent, blocks, block and tool links, system message) made in SQL;
  the other 900,000 messages are spread over them (90 each, all in their context).
- Every message of the big agent has an embedding, and 1 in 9 of the others' (100,000): the 384-d
  message HNSW index holds 200,000 vectors, half of them the big agent's, so its recall search is a
  filtered vector scan. (Embedding all 1M would add a second 1M-vector HNSW build, about 40 minutes on
  the shared 2 cores, for a figure that depends on the filter's selectivity, not on the other rows.)
- Rows are generated inside PostgreSQL (INSERT ... SELECT over generate_series, in batches of 100,000):
  texts of 12 words from a 20,000-word vocabulary (so full-text search finds matches), random unit
  vectors of 384 dimensions (`openai/text-embedding-small-384`, what bench/llm_server.py serves), every
  NOT NULL and tenancy column set. Generating them in SQL is faster than COPY from Python without numpy.
- The 384-d HNSW indexes (and the messages' full-text index) are dropped before a table's rows go in and
  built again after, with maintenance_work_mem high enough for the graph to be built in memory.
- Each stage (agents, passages, messages) runs in one transaction and records itself in the big agent's
  metadata (`scale_seed`): a later run reuses what is there, an interrupted stage is done again from the
  start. `--reseed` deletes the organisation's data first.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script or with -m: set Django up first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()

from django.db import connection, transaction

from apps.accounts.models import Membership, Organization, User
from apps.agents.models import Agent
from apps.agents.services import BlockSpec, agent_create
from apps.agents.system_messages import thread_system_message_id
from apps.core.actor import Actor, Role
from apps.memory.archival import agent_archive

ORG_NAME = "scale-bench"
BIG_AGENT = "scale-big"
MODEL = "openai/gpt-4o-mini"
EMBEDDING_HANDLE = "openai/text-embedding-small-384"
DIMENSION = 384
SEED_VERSION = 1
BATCH = 100_000
VOCABULARY_SIZE = 20_000
WORDS_PER_TEXT = 12
BIG_IN_CONTEXT = 40
PASSAGE_INDEX = f"passage_emb_{DIMENSION}_hnsw"
OTHERS_EMBED_EVERY = 9  # 1 in 9 of the other agents' messages has an embedding: see the module doc
MESSAGE_INDEXES = (f"message_emb_{DIMENSION}_hnsw", "message_text_fts")


@dataclass(frozen=True)
class Sizes:
    agents: int = 10_000
    messages: int = 1_000_000
    big_agent_messages: int = 100_000
    passages: int = 1_000_000

    def scaled(self, factor: float) -> Sizes:
        return Sizes(*(max(2, int(v * factor)) for v in (self.agents, self.messages, self.big_agent_messages, self.passages)))  # fmt: skip


@dataclass
class ScaleData:
    organization_id: str
    user_id: str
    big_agent_id: str
    archive_id: str
    sizes: dict[str, int]
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def actor(self) -> Actor:
        return Actor(organization_id=self.organization_id, user_id=self.user_id, role=Role.OWNER)


# Random text and vector as SQL expressions; `0*i` ties each subquery to its row, or the planner would
# compute it once for the whole statement.
TEXT_SQL = (
    f"(SELECT string_agg('topic' || floor(random() * {VOCABULARY_SIZE})::int, ' ') "
    f"FROM generate_series(1, {WORDS_PER_TEXT} + 0 * i))"
)
VECTOR_SQL = (
    f"l2_normalize((SELECT array_agg(random_normal()) FROM generate_series(1, {DIMENSION} + 0 * i))::vector)"
)


def _session_for_bulk(cursor: Any) -> None:
    cursor.execute("SET LOCAL synchronous_commit = off")
    cursor.execute("SET LOCAL maintenance_work_mem = '6GB'")  # a 1M x 384-d HNSW graph is ~3 GB
    cursor.execute("SET LOCAL max_parallel_maintenance_workers = 1")  # 2 cores


def _index_definitions(cursor: Any, names: tuple[str, ...]) -> dict[str, str]:
    cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)", [list(names)])
    found = dict(cursor.fetchall())
    if missing := [n for n in names if n not in found]:
        raise RuntimeError(f"expected indexes are missing: {missing} (run migrate)")
    return found


def _with_indexes_rebuilt(
    cursor: Any, names: tuple[str, ...], fill: Callable[[], None], log: Callable[[str], None]
) -> float:
    """Drop `names`, run `fill`, build them again; returns the seconds the builds took."""
    definitions = _index_definitions(cursor, names)
    for name in names:
        cursor.execute(f'DROP INDEX "{name}"')
    fill()
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # deferred FK checks now, or CREATE INDEX refuses
    started = time.monotonic()
    for name, definition in definitions.items():
        t = time.monotonic()
        cursor.execute(definition)
        log(f"  built {name} in {time.monotonic() - t:.0f} s")
    return time.monotonic() - started


def _columns(cursor: Any, table: str) -> list[str]:
    cursor.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s AND table_schema = "
        "current_schema() AND is_generated = 'NEVER' AND identity_generation IS NULL ORDER BY ordinal_position",
        [table],
    )
    return [row[0] for row in cursor.fetchall()]


def _copy_rows(cursor: Any, table: str, source_where: str, overrides: dict[str, str], from_extra: str, params: list[Any]) -> int:  # fmt: skip
    """INSERT INTO table SELECT the template rows (`t`, matching source_where) joined with from_extra,
    with some columns replaced by SQL expressions."""
    cols = _columns(cursor, table)
    select = ", ".join(overrides.get(c, f't."{c}"') for c in cols)
    cursor.execute(
        f"INSERT INTO {table} ({', '.join(f'{chr(34)}{c}{chr(34)}' for c in cols)}) "
        f"SELECT {select} FROM {table} t, {from_extra} WHERE {source_where}",
        params,
    )
    return int(cursor.rowcount)


# --- stages ------------------------------------------------------------------------------------------


def _seed_agents(data: ScaleData, sizes: Sizes, log: Callable[[str], None]) -> None:
    """9,999 copies of the big agent, each with its own blocks, links and system message."""
    big = data.big_agent_id
    count = sizes.agents - 1
    agent_ids = [f"agent-{uuid.uuid4()}" for _ in range(count)]
    system_ids = [thread_system_message_id(a, None) for a in agent_ids]
    with connection.cursor() as cursor:
        cursor.execute("SELECT block_label, block_id FROM memory_agentblock WHERE agent_id = %s", [big])
        blocks = cursor.fetchall()
        cursor.execute(
            "CREATE TEMP TABLE scale_clone ON COMMIT DROP AS SELECT * FROM "
            "unnest(%s::text[], %s::text[]) WITH ORDINALITY AS m(agent_id, system_id, n)",
            [agent_ids, system_ids],
        )
        _copy_rows(
            cursor,
            "agents_agent",
            "t.id = %s",
            {
                "id": "m.agent_id",
                "name": "'scale-agent-' || lpad(m.n::text, 5, '0')",
                "created_at": "t.created_at - m.n * interval '1 second'",
                "updated_at": "t.created_at - m.n * interval '1 second'",
                "message_ids": "'{}'",
                "message_count": "0",
                "metadata": "'{}'::jsonb",
            },
            "scale_clone m",
            [big],
        )
        for label, block_id in blocks:
            cursor.execute("ALTER TABLE scale_clone ADD COLUMN block_id text")
            cursor.execute("UPDATE scale_clone SET block_id = 'block-' || gen_random_uuid()")
            _copy_rows(cursor, "memory_block", "t.id = %s", {"id": "m.block_id"}, "scale_clone m", [block_id])
            cursor.execute(
                "INSERT INTO memory_agentblock (block_label, agent_id, block_id) "
                "SELECT %s, agent_id, block_id FROM scale_clone",
                [label],
            )
            cursor.execute("ALTER TABLE scale_clone DROP COLUMN block_id")
        cursor.execute(
            "INSERT INTO agents_agenttool (agent_id, tool_id) SELECT m.agent_id, t.tool_id "
            "FROM agents_agenttool t, scale_clone m WHERE t.agent_id = %s",
            [big],
        )
        _copy_rows(
            cursor,
            "agents_message",
            "t.id = %s",
            {
                "id": "m.system_id",
                "agent_id": "m.agent_id",
                "sequence_id": "-nextval('agents_message_sequence')",
            },
            "scale_clone m",
            [thread_system_message_id(big, None)],
        )
    log(f"  {count:,} agents copied")


def _seed_passages(data: ScaleData, sizes: Sizes, log: Callable[[str], None]) -> None:
    with connection.cursor() as cursor:
        _session_for_bulk(cursor)

        def fill() -> None:
            for start in range(0, sizes.passages, BATCH):
                t = time.monotonic()
                cursor.execute(
                    f"""INSERT INTO memory_passage (id, organization_id, archive_id, text, embedding,
                        embedding_dim, tags, metadata, created_at, updated_at, created_by_id)
                    SELECT 'passage-' || gen_random_uuid(), %s, %s, {TEXT_SQL}, {VECTOR_SQL}, {DIMENSION},
                        CASE WHEN i %% 10 = 0 THEN ARRAY['tag' || (i %% 20)] ELSE '{{}}' END, '{{}}'::jsonb,
                        now() - (%s - i) * interval '1 second', now() - (%s - i) * interval '1 second', %s
                    FROM generate_series(%s, %s) AS i""",
                    [
                        data.organization_id,
                        data.archive_id,
                        sizes.passages,
                        sizes.passages,
                        data.user_id,
                        start + 1,
                        min(start + BATCH, sizes.passages),
                    ],
                )
                log(f"  passages {min(start + BATCH, sizes.passages):,} ({time.monotonic() - t:.0f} s)")

        data.seconds["passage_index_build"] = round(
            _with_indexes_rebuilt(cursor, (PASSAGE_INDEX,), fill, log), 1
        )


def _seed_messages(data: ScaleData, sizes: Sizes, log: Callable[[str], None]) -> None:
    big, others = data.big_agent_id, sizes.messages - sizes.big_agent_messages
    with connection.cursor() as cursor:
        _session_for_bulk(cursor)
        cursor.execute(
            "CREATE TEMP TABLE scale_agents ON COMMIT DROP AS SELECT id, row_number() OVER (ORDER BY id) - 1 AS k "
            "FROM agents_agent WHERE organization_id = %s AND id <> %s AND name LIKE 'scale-agent-%%'",
            [data.organization_id, big],
        )
        cursor.execute("CREATE UNIQUE INDEX ON scale_agents (k)")
        cursor.execute("SELECT count(*) FROM scale_agents")
        spread = int(cursor.fetchone()[0])

        def insert(agent_sql: str, first: int, last: int, params: list[Any], *, embed_every: int) -> None:
            embedded = f"i %% {embed_every} = 0"
            cursor.execute(
                f"""INSERT INTO agents_message (id, organization_id, agent_id, role, content, text, name,
                    tool_call_id, approval_request_id, denial_reason, otid, sender_id, model, is_err,
                    created_at, updated_at, embedding, embedding_dim)
                SELECT 'message-' || gen_random_uuid(), %s, {agent_sql},
                    CASE WHEN i %% 2 = 0 THEN 'user' ELSE 'assistant' END,
                    jsonb_build_array(jsonb_build_object('type', 'text', 'text', x.text)), x.text,
                    '', '', '', '', '', '', CASE WHEN i %% 2 = 0 THEN '' ELSE %s END, false,
                    x.at, x.at, CASE WHEN {embedded} THEN {VECTOR_SQL} END,
                    CASE WHEN {embedded} THEN {DIMENSION} END
                FROM generate_series(%s, %s) AS i,
                    LATERAL (SELECT {TEXT_SQL} AS text,
                             now() - interval '1 day' + i * interval '10 ms' AS at) AS x""",
                [data.organization_id, *params, MODEL, first, last],
            )

        def fill() -> None:
            for start in range(0, sizes.big_agent_messages, BATCH):
                t = time.monotonic()
                last = min(start + BATCH, sizes.big_agent_messages)
                insert("%s", start + 1, last, [big], embed_every=1)
                log(f"  big agent's messages {last:,} ({time.monotonic() - t:.0f} s)")
            for start in range(0, others, BATCH):
                t = time.monotonic()
                last = min(start + BATCH, others)
                insert(
                    f"(SELECT id FROM scale_agents WHERE k = i %% {spread})",
                    start + 1,
                    last,
                    [],
                    embed_every=OTHERS_EMBED_EVERY,
                )
                log(f"  other agents' messages {last:,} ({time.monotonic() - t:.0f} s)")

        data.seconds["message_index_build"] = round(
            _with_indexes_rebuilt(cursor, MESSAGE_INDEXES, fill, log), 1
        )
        # Contexts: the big agent's last 40 messages, every message of the others.
        cursor.execute(
            """UPDATE agents_agent a SET message_ids = s.ids FROM (
                SELECT agent_id, array_agg(id ORDER BY sequence_id) AS ids FROM agents_message
                WHERE organization_id = %s AND sequence_id > 0 AND agent_id <> %s GROUP BY agent_id) s
            WHERE a.id = s.agent_id""",
            [data.organization_id, big],
        )
        cursor.execute(
            """UPDATE agents_agent SET message_ids = ARRAY(SELECT id FROM (
                SELECT id, sequence_id FROM agents_message WHERE agent_id = %s AND sequence_id > 0
                ORDER BY sequence_id DESC LIMIT %s) s ORDER BY sequence_id) WHERE id = %s""",
            [big, BIG_IN_CONTEXT, big],
        )


STAGES: dict[str, Callable[[ScaleData, Sizes, Callable[[str], None]], None]] = {
    "agents": _seed_agents,
    "passages": _seed_passages,
    "messages": _seed_messages,
}


# --- entry points -----------------------------------------------------------------------------------


def _marker(agent_id: str) -> dict[str, Any]:
    metadata = Agent.all_objects.filter(id=agent_id).values_list("metadata", flat=True).first() or {}
    marker = metadata.get("scale_seed") or {}
    return marker if marker.get("version") == SEED_VERSION else {}


def _save_marker(agent_id: str, marker: dict[str, Any]) -> None:
    agent = Agent.all_objects.get(id=agent_id)
    agent.metadata = {**agent.metadata, "scale_seed": marker}
    agent.save(update_fields=["metadata"])


def _record_stage(agent_id: str, name: str, info: dict[str, Any], sizes: Sizes) -> None:
    """Add one finished stage to the marker, read under the row's lock (stages may run in parallel)."""
    agent = Agent.all_objects.select_for_update().get(id=agent_id)
    marker = dict(agent.metadata.get("scale_seed") or {"version": SEED_VERSION})
    marker["sizes"] = sizes.__dict__
    marker["stages"] = {**marker.get("stages", {}), name: info}
    agent.metadata = {**agent.metadata, "scale_seed": marker}
    agent.save(update_fields=["metadata"])


def delete_seed(log: Callable[[str], None] = print) -> None:
    """The organisation and all its rows; the big tables first, in SQL (the ORM would load them)."""
    org = Organization.objects.filter(name=ORG_NAME).first()
    if org is None:
        return
    started = time.monotonic()
    with transaction.atomic(), connection.cursor() as cursor:
        for table in ("memory_passage", "agents_message"):
            cursor.execute(f"DELETE FROM {table} WHERE organization_id = %s", [org.id])
        org.delete()
        users = User.objects.filter(username__startswith="scale-bench")
        users.delete()
    with connection.cursor() as cursor:  # 2M dead graph nodes otherwise
        for name in (PASSAGE_INDEX, *MESSAGE_INDEXES):
            cursor.execute(f'REINDEX INDEX "{name}"')
    log(f"deleted the {ORG_NAME} organisation in {time.monotonic() - started:.0f} s")


def _base(log: Callable[[str], None]) -> ScaleData:
    """The organisation, its owner, the big agent and its archive (made through the platform)."""
    org = Organization.objects.filter(name=ORG_NAME).first()
    if org is None:
        with transaction.atomic():
            org = Organization.objects.create(name=ORG_NAME)
            user = User.objects.create_user(username="scale-bench-owner")
            Membership.objects.create(user=user, organization=org, role=Role.OWNER)
            actor = Actor(organization_id=org.id, user_id=user.id, role=Role.OWNER)
            agent = agent_create(
                actor=actor,
                name=BIG_AGENT,
                model=MODEL,
                embedding=EMBEDDING_HANDLE,
                memory_blocks=[
                    BlockSpec("human", value="Name: Sam. Works on data pipelines; likes hiking.", limit=5000),
                    BlockSpec("persona", value="I am a helpful assistant with a long memory.", limit=5000),
                ],
            )
            agent_archive(actor=actor, agent_id=agent.id, embedding_handle=EMBEDDING_HANDLE)
            _save_marker(agent.id, {"version": SEED_VERSION, "stages": {}})
        log(f"created organisation {org.id}")
    user = User.objects.get(memberships__organization=org, memberships__role=Role.OWNER)
    agent = Agent.all_objects.get(organization_id=org.id, name=BIG_AGENT)
    actor = Actor(organization_id=org.id, user_id=user.id, role=Role.OWNER)
    archive = agent_archive(actor=actor, agent_id=agent.id, embedding_handle=EMBEDDING_HANDLE)
    return ScaleData(org.id, user.id, agent.id, archive.id, sizes={})


def seed(
    *,
    sizes: Sizes | None = None,
    reseed: bool = False,
    only: Collection[str] | None = None,
    log: Callable[[str], None] = print,
) -> ScaleData:
    """The seeded organisation, seeding what is missing (of the stages in `only`, default all). Stages
    done before (same version and sizes) are kept; a stage recorded with other sizes, or `reseed`, starts
    over from an empty organisation."""
    sizes = sizes or Sizes()
    org = Organization.objects.filter(name=ORG_NAME).first()
    if org is not None and not reseed:
        agent_id = Agent.all_objects.filter(organization_id=org.id, name=BIG_AGENT).values_list("id", flat=True).first()  # fmt: skip
        marker = _marker(agent_id) if agent_id else {}
        if not marker or marker.get("sizes", sizes.__dict__) != sizes.__dict__:
            reseed = True
            log("the seeded organisation is of another version or size: seeding again")
    if reseed:
        delete_seed(log)
    data = _base(log)
    for name, stage in STAGES.items():
        if name in _marker(data.big_agent_id).get("stages", {}) or (only is not None and name not in only):
            continue
        log(f"seeding {name}")
        started = time.monotonic()
        with transaction.atomic():
            stage(data, sizes, log)
            info = {"seconds": round(time.monotonic() - started, 1), **data.seconds}
            _record_stage(data.big_agent_id, name, info, sizes)
        data.seconds = {}
        log(f"seeded {name} in {info['seconds']} s")
        with connection.cursor() as cursor:  # visibility map and statistics, as autovacuum would set them
            for table in {"agents": ("agents_agent", "memory_block", "memory_agentblock", "agents_agenttool"),
                          "passages": ("memory_passage",), "messages": ("agents_message", "agents_agent")}[name]:  # fmt: skip
                cursor.execute(f"VACUUM (ANALYZE) {table}")
    data.sizes = sizes.__dict__
    stages = _marker(data.big_agent_id).get("stages", {})
    data.seconds = {name: value["seconds"] for name, value in stages.items()}
    return data


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reseed", action="store_true", help="delete the seeded organisation first")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every count (0.01: a smoke test)")
    parser.add_argument("--only", help=f"comma-separated stages to seed (of {', '.join(STAGES)})")
    args = parser.parse_args(argv)
    started = time.monotonic()
    data = seed(
        sizes=Sizes().scaled(args.scale) if args.scale != 1 else Sizes(),
        reseed=args.reseed,
        only=args.only.split(",") if args.only else None,
    )
    print(f"seeded organisation {data.organization_id} ({time.monotonic() - started:.0f} s): {data.sizes}")
    print(f"stage seconds: {data.seconds}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
