"""The run's storage: every read and write the agent loop makes, behind a few functions the runner calls.

What every run reads and writes is SQL written out here: the ORM's compilation of these statements cost
more than running them (~1 ms of CPU each against ~0.2; bench/RESULTS.md), and the hot ones are one
round trip each (data-modifying CTEs, atomic by themselves, no BEGIN/COMMIT). Each is scoped to the run's
organisation or to rows the run has already read under it. The README's statement counts per turn rest
on this module: a plain turn is claim, load, one persist per step, finish.

Fencing: claiming a run gives it a new lease (Run.lease); the loop's writes during the run carry it and
call `agents_require_run_lease` (migration agents 0012) in the same statement, so a write from an executor
whose run was failed by recovery or handed to another executor since (a worker cut off from the database
that comes back) is refused by the database and changes nothing: the store raises LeaseLost.

A thread is an agent with its conversation (None: the agent's default thread); its in-context message ids
are on the conversation's row, or on the agent's for the default thread.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection, models, transaction
from django.utils import timezone

from apps.agents.locks import conversation_lock_key
from apps.agents.models import Agent, AgentTool, Conversation, Message, Run, Step, pack_trace
from apps.core.actor import Actor
from apps.core.db import insert_all, row_reader
from apps.memory.archival import archival_stats_from_row, archival_stats_query
from apps.memory.models import AgentBlock, Block
from apps.tools.models import Tool

LEASE_LOST_SQLSTATE = "LR001"
"""What agents_require_run_lease raises when the run is no longer held under the given lease."""


class LeaseLost(Exception):
    """The run was failed by recovery or claimed by another executor since this one claimed it; nothing
    this executor does to it may be stored any more."""


@contextmanager
def _fenced() -> Iterator[None]:
    try:
        yield
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == LEASE_LOST_SQLSTATE:
            raise LeaseLost(str(exc.__cause__)) from exc
        raise


def _lease_check(run_id: str, lease: str) -> tuple[str, list[Any]]:
    return "agents_require_run_lease(%s, %s)", [run_id, lease]


@dataclass(frozen=True, slots=True)
class Claim:
    """What claiming a run found: the run (None: not claimed), whether other runs of its agent are
    RUNNING, and whether an earlier run of its conversation still waits."""

    run: Run | None
    others_running: bool
    earlier_waiting: bool
    locked: bool = True  # claim_run(lock_key=...): whether this session took the conversation's lock


def _holder(agent_id: str, conversation_id: str | None) -> tuple[type[Agent] | type[Conversation], str]:
    """The model and id of the row that holds a thread's in-context message ids."""
    return (Conversation, conversation_id) if conversation_id else (Agent, agent_id)


# --- claiming and loading ---------------------------------------------------------------------------


def run_thread(run_id: str) -> tuple[str, str | None] | None:
    """(agent id, conversation id) of a run that is still `created`, else None."""
    known = Run.objects.unscoped().filter(id=run_id).values_list("agent_id", "conversation_id", "status")
    row = known.first()
    if row is None or row[2] != Run.Status.CREATED:
        return None
    return row[0], row[1]


RELAXED_CLAIM = "(SELECT set_config('synchronous_commit', 'off', true))"
"""The claim's statement is its own transaction (autocommit): this makes its commit asynchronous. Inside
a caller's transaction it would apply to the whole of it, so it is left out there."""


@contextmanager
def claim_locked(run_id: str, agent_id: str, conversation_id: str | None) -> Iterator[Claim | None]:
    """claim_run under the conversation's lock (apps.agents.locks), taken by the claim's own statement:
    one round trip for both. Yields None when another session holds the lock (nothing was claimed);
    otherwise the claim, with the lock held until the block ends."""
    key = conversation_lock_key(agent_id, conversation_id)
    try:
        claim = claim_run(run_id, agent_id, conversation_id, lock_key=key)
    except BaseException:
        # A session lock outlives a failed statement: give it back in case the statement had taken it.
        with contextlib.suppress(DatabaseError):
            _unlock(key)
        raise
    try:
        yield claim if claim.locked else None
    finally:
        if claim.locked:
            _unlock(key)


def _unlock(key: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


def claim_run(
    run_id: str, agent_id: str, conversation_id: str | None, *, lock_key: int | None = None
) -> Claim:
    """Claim the run (created -> running) unless an earlier run of its conversation still waits, and admit
    its input into the context window, in one statement. The caller holds the conversation's lock.

    Admitting appends the run's input (user messages, an approval decision), in sequence order, to the
    thread's in-context ids, skipping any the list holds already; the UPDATE's row lock orders it against
    any other writer of the list.

    Outside a transaction its commit does not wait for the disk (RELAXED_CLAIM): it is on the path to the
    run's first LLM call, and a flush costs several ms there. Only a crash of PostgreSQL itself within
    a fraction of a second can lose it, and then nothing of the run is stored after it either: the WAL is
    one sequence, so the run's next synchronous commit (its first step, a failed step, its end), or any
    other session's, makes the claim durable first. A lost claim leaves the run `created`, with its input
    (committed and flushed by run_create) outside the context, as if its worker had died before claiming:
    crash recovery enqueues it again (apps.agents.recovery.requeue_lost_tasks).

    lock_key: take that advisory lock (pg_try_advisory_lock) in this statement and claim only if it was
    taken (claim_locked). The statement's snapshot then predates the lock, so it may still see the run
    that held the lock as RUNNING or an earlier run as `created`: the first makes the caller's orphan
    check (a statement of its own) find nothing to fail, the second defers this run for a retry."""
    table = Run._meta.db_table
    reader = row_reader(Run, table)
    holder, holder_id = _holder(agent_id, conversation_id)
    params = {
        "id": run_id,
        "agent": agent_id,
        "conversation": conversation_id,
        "holder": holder_id,
        "created": Run.Status.CREATED,
        "running": Run.Status.RUNNING,
        "now": timezone.now(),
        "lease": uuid.uuid4().hex,
        "tool": Message.Role.TOOL,
        "assistant": Message.Role.ASSISTANT,
        "lock": lock_key,
    }
    # Materialized: evaluated once, before the UPDATE's rows (a one-time filter), and always (the final
    # SELECT reads it).
    lock = (
        "lk AS MATERIALIZED (SELECT pg_try_advisory_lock(%(lock)s) AS got)"
        if lock_key is not None
        else "lk AS MATERIALIZED (SELECT true AS got)"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH {lock}, others AS (
                SELECT status FROM {table}
                WHERE agent_id = %(agent)s AND id <> %(id)s AND (
                    status = %(running)s
                    OR (status = %(created)s AND conversation_id IS NOT DISTINCT FROM %(conversation)s
                        AND created_at < (SELECT created_at FROM {table} WHERE id = %(id)s))
                )
                LIMIT 1000
            ), claimed AS (
                UPDATE {table} SET status = %(running)s, started_at = %(now)s, lease = %(lease)s
                WHERE id = %(id)s AND agent_id = %(agent)s AND status = %(created)s
                  AND conversation_id IS NOT DISTINCT FROM %(conversation)s
                  AND NOT EXISTS (SELECT 1 FROM others WHERE status = %(created)s)
                  AND (SELECT got FROM lk)
                RETURNING {reader.columns}
            ), admitted AS (
                UPDATE {holder._meta.db_table} AS holder SET message_ids = holder.message_ids || ARRAY(
                    SELECT m.id FROM {Message._meta.db_table} AS m
                    WHERE m.run_id = %(id)s AND m.step_id IS NULL AND m.role NOT IN (%(tool)s, %(assistant)s)
                      AND NOT (m.id = ANY(holder.message_ids))
                    ORDER BY m.sequence_id
                )::varchar[]
                WHERE holder.id = %(holder)s AND EXISTS (SELECT 1 FROM claimed)
            )
            SELECT claimed.*,
                   EXISTS (SELECT 1 FROM others WHERE status = %(running)s),
                   EXISTS (SELECT 1 FROM others WHERE status = %(created)s),
                   (SELECT got FROM lk)
            FROM {RELAXED_CLAIM if connection.get_autocommit() else "(SELECT 1)"} AS one
            LEFT JOIN claimed ON true
            """,
            params,
        )
        row = cursor.fetchone()
    *values, others_running, earlier_waiting, locked = row
    claimed = None if values[reader.position("id")] is None else reader.instance(values)
    return Claim(claimed, others_running, earlier_waiting, locked)


@dataclass(frozen=True, slots=True)
class Read:
    """One SELECT of a batch that `read_together` sends at once: its rows as instances of `model` (its
    select list written `{columns}`, apps.core.db.RowReader), or as tuples when model is None."""

    sql: str
    params: Sequence[Any]
    model: type[models.Model] | None = None
    alias: str = ""
    exclude: frozenset[str] = frozenset()


def read_together(*reads: Read) -> list[list[Any]]:
    """The rows of each read, in one round trip to the database: psycopg's pipeline mode sends every
    statement before waiting for the first answer. They run one after the other, each seeing what the ones
    before it committed, as if sent one by one; a run's first LLM call waits for these, and under load
    every round trip costs a wake-up of the database backend (several ms on a busy machine)."""
    readers = [row_reader(r.model, r.alias, r.exclude) if r.model is not None else None for r in reads]
    texts = [
        r.sql.replace("{columns}", reader.columns) if reader else r.sql
        for r, reader in zip(reads, readers, strict=True)
    ]
    connection.ensure_connection()
    raw = connection.connection
    cursors = [connection.cursor() for _ in reads]
    try:
        if len(reads) > 1 and _pipelines_supported():
            with connection.wrap_database_errors, raw.pipeline():
                for cursor, text, read in zip(cursors, texts, reads, strict=True):
                    cursor.execute(text, read.params)
        else:
            for cursor, text, read in zip(cursors, texts, reads, strict=True):
                cursor.execute(text, read.params)
        return [
            [reader.instance(row) for row in cursor.fetchall()] if reader else list(cursor.fetchall())
            for cursor, reader in zip(cursors, readers, strict=True)
        ]
    finally:
        for cursor in cursors:
            cursor.close()


def _pipelines_supported() -> bool:
    import psycopg

    return bool(psycopg.Pipeline.is_supported())


def _one_read(model: type[Any], row_id: str, actor: Actor) -> Read:
    return Read(
        f"SELECT {{columns}} FROM {model._meta.db_table} AS loaded "
        "WHERE loaded.id = %s AND loaded.organization_id = %s",
        [row_id, actor.organization_id],
        model=model,
        alias="loaded",
    )


def _the_one(model: type[Any], rows: list[Any], row_id: str) -> Any:
    if not rows:
        raise model.DoesNotExist(f"{model.__name__} '{row_id}' not found")
    return rows[0]


def load_agent(agent_id: str, actor: Actor) -> Agent:
    return _the_one(Agent, read_together(_one_read(Agent, agent_id, actor))[0], agent_id)


def load_conversation(conversation_id: str, actor: Actor) -> Conversation:
    return _the_one(
        Conversation, read_together(_one_read(Conversation, conversation_id, actor))[0], conversation_id
    )


def _blocks_read(agent_id: str, actor: Actor) -> Read:
    return Read(
        f"SELECT {{columns}} FROM {Block._meta.db_table} AS block "
        f"JOIN {AgentBlock._meta.db_table} AS link ON link.block_id = block.id "
        "WHERE link.agent_id = %s AND block.organization_id = %s ORDER BY block.created_at, block.id",
        [agent_id, actor.organization_id],
        model=Block,
        alias="block",
    )


def _tools_read(agent_id: str, actor: Actor) -> Read:
    return Read(
        f"SELECT {{columns}} FROM {Tool._meta.db_table} AS tool "
        f"JOIN {AgentTool._meta.db_table} AS link ON link.tool_id = tool.id "
        "WHERE link.agent_id = %s AND tool.organization_id = %s ORDER BY tool.name",
        [agent_id, actor.organization_id],
        model=Tool,
        alias="tool",
    )


def load_blocks(agent_id: str, actor: Actor) -> list[Block]:
    """The agent's memory blocks, oldest first."""
    return read_together(_blocks_read(agent_id, actor))[0]


def load_tools(agent_id: str, actor: Actor) -> list[Tool]:
    """The agent's attached tools, by name."""
    return read_together(_tools_read(agent_id, actor))[0]


@dataclass(frozen=True, slots=True)
class Loaded:
    """What a run reads of its thread before its first step (load_thread)."""

    agent: Agent
    conversation: Conversation | None
    blocks: list[Block]
    tools: list[Tool]
    archival_count: int
    archival_tags: list[str]


def load_thread(agent_id: str, conversation_id: str | None, actor: Actor) -> Loaded:
    """The agent (and conversation), its blocks and tools, and its archives' passage count and tags, in one
    round trip (read_together). Raises DoesNotExist for a missing agent or conversation."""
    sql, params = archival_stats_query(actor=actor, agent_id=agent_id)
    reads = [
        _one_read(Agent, agent_id, actor),
        _blocks_read(agent_id, actor),
        _tools_read(agent_id, actor),
        Read(sql, params),
    ]
    if conversation_id:
        reads.append(_one_read(Conversation, conversation_id, actor))
    agent_rows, blocks, tools, stats, *conversation_rows = read_together(*reads)
    count, tags = archival_stats_from_row(stats[0])
    return Loaded(
        agent=_the_one(Agent, agent_rows, agent_id),
        conversation=_the_one(Conversation, conversation_rows[0], conversation_id)
        if conversation_id
        else None,
        blocks=blocks,
        tools=tools,
        archival_count=count,
        archival_tags=tags,
    )


def stored_message_count(agent_id: str, conversation_id: str | None) -> int:
    """The thread's stored messages (kept by a trigger, migration agents 0005), read now."""
    holder, holder_id = _holder(agent_id, conversation_id)
    return holder.all_objects.filter(id=holder_id).values_list("message_count", flat=True).get()


def run_status(run_id: str) -> str | None:
    """The run's stored status (a cancel check). Plain SQL: every step with tool calls makes one, and the
    ORM's version costs a third of the step's database time."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status FROM {Run._meta.db_table} WHERE id = %s", [run_id])
        row = cursor.fetchone()
    return row[0] if row else None


# --- writing a step ---------------------------------------------------------------------------------


def persist_step(
    step: Step,
    messages: Sequence[Message],
    *,
    agent_id: str,
    conversation_id: str | None,
    run_id: str,
    lease: str,
    also: Sequence[tuple[str, list[Any]]] = (),
) -> str | None:
    """The step, its messages and their ids appended to the thread's in-context list, with the `also`
    statements, in one statement; returns the run's status as that statement read it (the next step's
    cancel check). Appends the new ids only (not the hundreds already there); the row lock orders it like
    any writer of the list. Raises LeaseLost (nothing written) when the run is no longer held under `lease`."""
    holder, holder_id = _holder(agent_id, conversation_id)
    held, held_params = _lease_check(run_id, lease)
    status = f"(SELECT status FROM {Run._meta.db_table} WHERE id = %s)"
    if messages:
        then = (
            f"UPDATE {holder._meta.db_table} SET message_ids = message_ids || %s::varchar[] "
            f"WHERE id = %s AND {held} RETURNING {status}",
            [[m.id for m in messages], holder_id, *held_params, run_id],
        )
    else:
        then = (f"SELECT {status} WHERE {held}", [run_id, *held_params])
    with _fenced():
        row = insert_all((Step, [step]), (Message, list(messages)), also=list(also), then=then)
    return row[0] if row else None


def save_failed_step(step: Step, *, run_id: str, lease: str) -> None:
    """A step of run `run_id` whose LLM call failed. Raises LeaseLost (nothing written) when the run is no
    longer held under `lease`."""
    held, held_params = _lease_check(run_id, lease)
    with _fenced():
        insert_all((Step, [step]), then=(f"SELECT {held}", held_params))


def add_messages_in_context(
    messages: Sequence[Message],
    in_context_ids: list[str],
    *,
    agent_id: str,
    conversation_id: str | None,
    run_id: str | None,
    lease: str,
) -> None:
    """Store new messages outside a step (an alert, a summary, settled approvals) and the thread's whole
    in-context id list after them, in one transaction. `run_id` None: made by no run (a compaction
    requested through the API, which holds the thread's lock), so no lease is checked. Raises LeaseLost
    (nothing written) when the run is no longer held under `lease`."""
    holder, holder_id = _holder(agent_id, conversation_id)
    condition, params = ("", []) if run_id is None else _lease_check(run_id, lease)
    with _fenced(), transaction.atomic():
        Message.all_objects.bulk_create(list(messages))
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {holder._meta.db_table} SET message_ids = %s::varchar[] WHERE id = %s"
                + (f" AND {condition}" if condition else ""),
                [in_context_ids, holder_id, *params],
            )


def store_traces(
    traces: Sequence[tuple[str, Any, Any]],
    *,
    records: Sequence[models.Model] = (),
    also: Sequence[tuple[str, list[Any]]] = (),
) -> None:
    """The exact request and response of each step (step id, request, response), compressed (Step.trace),
    in one statement for the run; `records` (unsaved rows of one model: the run's LLM call records,
    apps.llm.records) are inserted by the same statement, and `also` (SQL, params: the run's spans,
    apps.observability) run in it."""
    inserts = [(type(records[0]), records)] if records else []
    if not traces:
        insert_all(*inserts, also=also)
        return
    rows = [(step_id, pack_trace(request, response)) for step_id, request, response in traces]
    values = ", ".join(["(%s, %s::bytea)"] * len(rows))
    update = (
        f"UPDATE {Step._meta.db_table} AS step SET trace = packed.trace "
        f"FROM (VALUES {values}) AS packed (id, trace) WHERE step.id = packed.id",
        [value for row in rows for value in row],
    )
    insert_all(*inserts, also=also, then=update)


# --- finishing --------------------------------------------------------------------------------------


def save_finished(run: Run, agent_id: str) -> tuple[bool, str | None]:
    """The run's terminal state and the agent's last-run fields in one statement. A cancelled run keeps its
    status: the user's cancel wins over the loop's own ending. Returns False when the run had been
    cancelled, and the id of the conversation's next waiting run, if any (the same statement reads it).
    Raises LeaseLost (nothing written) when the run is no longer held under `run.lease`."""

    def run_field(name: str) -> models.Field[Any, Any]:
        return _column_field(Run, name)

    def agent_field(name: str) -> models.Field[Any, Any]:
        return _column_field(Agent, name)

    run_values = {
        "status": run.status,
        "stop_reason": run.stop_reason,
        "completed_at": run.completed_at,
        "total_duration_ns": run.total_duration_ns,
        "error": run.error,
        "metadata": run.metadata,
    }
    agent_values = {
        "last_run_completion": run.completed_at,
        "last_stop_reason": run.stop_reason,
        "last_run_duration_ms": (run.total_duration_ns or 0) // 1_000_000,
    }
    run_set = ", ".join(f"{run_field(name).column} = %s" for name in run_values)
    agent_set = ", ".join(f"{agent_field(name).column} = %s" for name in agent_values)
    params = [
        *(run_field(name).get_db_prep_save(value, connection) for name, value in run_values.items()),
        run.id,
        Run.Status.CANCELLED,
        run.id,
        run.lease,
        *(agent_field(name).get_db_prep_save(value, connection) for name, value in agent_values.items()),
        agent_id,
        agent_id,
        run.conversation_id,
        Run.Status.CREATED,
    ]
    with _fenced(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH finished AS (
                UPDATE {Run._meta.db_table} SET {run_set}
                WHERE id = %s AND status <> %s AND agents_require_run_lease(%s, %s) RETURNING id
            ), agent AS (
                UPDATE {Agent._meta.db_table} SET {agent_set} WHERE id = %s
            )
            SELECT (SELECT count(*) FROM finished), (
                SELECT id FROM {Run._meta.db_table}
                WHERE agent_id = %s AND conversation_id IS NOT DISTINCT FROM %s AND status = %s
                ORDER BY created_at LIMIT 1
            )
            """,
            params,
        )
        finished, next_run_id = cursor.fetchone()
        return finished > 0, next_run_id


def _column_field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)  # a concrete column, not a reverse relation
    return field


def fail_before_start(run: Run, reason: str, error: str | None) -> None:
    """A run that failed before its first step (its agent or model could not be loaded), read back; not
    when it is no longer held under its lease."""
    Run.all_objects.filter(id=run.id, lease=run.lease).update(
        status=Run.Status.FAILED,
        stop_reason=reason,
        completed_at=timezone.now(),
        error={"message": error or reason},
    )
    run.refresh_from_db()
