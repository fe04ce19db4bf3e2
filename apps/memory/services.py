"""Writes to memory. Every change of a block's value goes through `_block_write`, which checks the limit,
bumps the version with compare-and-set and records a BlockHistory row."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from apps.core import fencing, permissions
from apps.core.actor import Actor
from apps.core.db import insert_sql, mark_saved
from apps.core.errors import InvalidInput
from apps.core.permissions import Action
from apps.memory.archival import (  # noqa: F401 - archival memory's writes, for the other apps and adapters
    PassageSpec,
    archive_create,
    archive_delete,
    archive_passage_delete,
    archive_passages_create,
    archive_update,
)
from apps.memory.errors import BlockConcurrentUpdate, BlockNotFound, BlockTooLong, DuplicateBlockLabel
from apps.memory.git_memory import (  # noqa: F401 - git memory (the smart HTTP protocol), for the adapters
    GIT_MEMORY_TAG,
    CommitView,
    GitMemoryNotEnabled,
    GitRequestInvalid,
    decode_body,
    git_commit_log,
    git_info_refs,
    git_memory_enable,
    git_memory_tags_saved,
    git_receive_pack,
    git_upload_pack,
)
from apps.memory.models import DEFAULT_BLOCK_LIMIT, AgentBlock, Block, BlockHistory
from apps.memory.selectors import block_get

UNSET: Any = object()


@dataclass(frozen=True)
class Editor:
    """Who changes memory: a user, an agent (through its tools) or the system."""

    actor_type: str  # BlockHistory.ActorType
    actor_id: str = ""

    @classmethod
    def for_actor(cls, actor: Actor) -> Editor:
        if actor.user_id:
            return cls(BlockHistory.ActorType.USER, actor.user_id)
        return cls(BlockHistory.ActorType.SYSTEM)

    @classmethod
    def agent(cls, agent_id: str) -> Editor:
        return cls(BlockHistory.ActorType.AGENT, agent_id)


def validate_block_fields(*, label: str, value: str, limit: int) -> None:
    if not label or not label.strip():
        raise InvalidInput("A block needs a non-empty label")
    if len(label) > 200:
        raise InvalidInput("A block label may be at most 200 characters")
    if limit < 1:
        raise InvalidInput("A block's limit must be a positive number of characters")
    if len(value) > limit:
        raise BlockTooLong(
            f"Block '{label}' value is {len(value)} characters, over its limit of {limit}. "
            "Shorten the value or raise the limit."
        )


@transaction.atomic
def block_create(
    *,
    actor: Actor,
    label: str,
    value: str = "",
    limit: int | None = None,
    description: str = "",
    read_only: bool = False,
    is_template: bool = False,
    template_name: str = "",
    hidden: bool = False,
    metadata: dict[str, Any] | None = None,
    tags: list[str] | None = None,
) -> Block:
    """Create a block and its first history row. Raises BlockTooLong / InvalidInput."""
    limit = DEFAULT_BLOCK_LIMIT if limit is None else limit
    validate_block_fields(label=label, value=value, limit=limit)
    block = Block.objects.for_actor(actor).create(
        label=label,
        value=value,
        limit=limit,
        description=description,
        read_only=read_only,
        is_template=is_template,
        template_name=template_name,
        hidden=hidden,
        metadata=metadata or {},
        tags=tags or [],
        created_by_id=actor.user_id,
        last_updated_by_id=actor.user_id,
    )
    _record_history(block, editor=Editor.for_actor(actor), value_before="")
    return block


@transaction.atomic
def block_update(
    *,
    actor: Actor,
    block_id: str,
    editor: Editor | None = None,
    expected_version: int | None = None,
    label: str = UNSET,
    value: str = UNSET,
    limit: int = UNSET,
    description: str = UNSET,
    read_only: bool = UNSET,
    is_template: bool = UNSET,
    template_name: str = UNSET,
    hidden: bool = UNSET,
    metadata: dict[str, Any] = UNSET,
    tags: list[str] = UNSET,
) -> Block:
    """Change any subset of a block's fields (UNSET = keep). Never truncates: over the limit is an error.

    With `expected_version`, fails with BlockConcurrentUpdate if someone else wrote in between.
    """
    block = _lock_block(actor=actor, block_id=block_id)
    _require_block_writer(actor, block)
    if expected_version is not None and block.version != expected_version:
        raise BlockConcurrentUpdate(
            f"Block '{block.label}' changed since version {expected_version} (now {block.version}); reload it"
        )
    value_before = block.value
    changes = {
        name: new
        for name, new in {
            "label": label,
            "value": value,
            "limit": limit,
            "description": description,
            "read_only": read_only,
            "is_template": is_template,
            "template_name": template_name,
            "hidden": hidden,
            "metadata": metadata,
            "tags": tags,
        }.items()
        if new is not UNSET and getattr(block, name) != new
    }
    if not changes:
        return block
    for name, new in changes.items():
        setattr(block, name, new)
    validate_block_fields(label=block.label, value=block.value, limit=block.limit)
    return _block_write(
        block,
        changes=list(changes),
        editor=editor or Editor.for_actor(actor),
        value_before=value_before,
        user_id=actor.user_id,
    )


def block_write_read_value(
    *,
    block: Block,
    value: str,
    editor: Editor,
    user_id: str | None = None,
    attached_to: str | None = None,
) -> Block:
    """The write behind the memory tools: `block` as the caller read it (from its organisation), its value
    replaced if nobody wrote since (compare-and-set on the version read, no row lock) and, with
    `attached_to` (an agent id), only while it is still attached to that agent (a detach does not change
    the version). Raises BlockConcurrentUpdate when either changed: the caller re-reads and recomputes
    its edit. Returns the written block (a copy; `block` keeps what was read).

    One statement, atomic by itself: the UPDATE and, only when it wrote, its history row (an agent's
    memory edit was BEGIN, UPDATE, INSERT, COMMIT)."""
    validate_block_fields(label=block.label, value=value, limit=block.limit)
    written = copy.copy(block)
    written.value, written.version, written.updated_at = value, block.version + 1, timezone.now()
    changed = {"value": value, "updated_at": written.updated_at}
    if user_id:
        written.last_updated_by_id = changed["last_updated_by_id"] = user_id
    history = _history_row(written, editor=editor, value_before=block.value)
    insert, insert_params = insert_sql(BlockHistory, [history])
    if " VALUES (" not in insert or not insert.endswith(")"):
        raise AssertionError(f"unexpected INSERT shape: {insert[:80]}")
    only_if_written = (
        insert.replace(" VALUES (", " SELECT ", 1)[:-1] + " WHERE EXISTS (SELECT 1 FROM updated)"
    )
    fields = {Block._meta.get_field(name).column: field_value for name, field_value in changed.items()}
    assignments = ", ".join(f'"{column}" = %s' for column in fields)
    still_attached = (
        f' AND EXISTS (SELECT 1 FROM {AgentBlock._meta.db_table} WHERE "agent_id" = %s AND "block_id" = %s)'
        if attached_to
        else ""
    )
    # Written on a run's behalf (a memory tool): only while the run is still held under its lease.
    fence, fence_params = fencing.lease_condition()
    if fence:
        still_attached += f" AND {fence}"
    statement = (
        f'WITH updated AS (UPDATE {Block._meta.db_table} SET "version" = "version" + 1, {assignments} '
        f'WHERE "id" = %s AND "organization_id" = %s AND "version" = %s{still_attached} RETURNING 1), '
        f"history AS ({only_if_written}) SELECT count(*) FROM updated"
    )
    attachment_params = [attached_to, block.id] if attached_to else []
    params = [
        *fields.values(),
        block.id,
        block.organization_id,
        block.version,
        *attachment_params,
        *fence_params,
        *insert_params,
    ]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        (updated,) = cursor.fetchone()
    if updated != 1:
        raise BlockConcurrentUpdate(f"Block '{block.label}' was changed concurrently; retry")
    mark_saved([history])
    return written


@transaction.atomic
def block_restore(*, actor: Actor, history_id: str) -> Block:
    """Set a block back to the value it had right after the given history entry."""
    entry = BlockHistory.objects.for_actor(actor).filter(id=history_id).first()
    if entry is None:
        raise InvalidInput(f"Block history entry '{history_id}' not found")
    return block_update(actor=actor, block_id=entry.block_id, value=entry.value_after)


@transaction.atomic
def block_delete(*, actor: Actor, block_id: str) -> None:
    """Raises BlockNotFound, PermissionDenied (the role matrix's BLOCK_WRITE)."""
    block = block_get(actor=actor, block_id=block_id)
    _require_block_writer(actor, block)
    block.delete()


def _require_block_writer(actor: Actor, block: Block) -> None:
    permissions.require(
        actor, Action.BLOCK_WRITE, creator_id=block.created_by_id, subject=f"block '{block.label}'"
    )


def _lock_block(*, actor: Actor, block_id: str) -> Block:
    """The block, row-locked; raises BlockNotFound (as block_get), in one query."""
    block = Block.objects.for_actor(actor).select_for_update().filter(id=block_id).first()
    if block is None:
        raise BlockNotFound(f"Block with id '{block_id}' not found")
    return block


def _block_write(
    block: Block, *, changes: list[str], editor: Editor, value_before: str, user_id: str | None
) -> Block:
    """Compare-and-set on version, so a concurrent writer that skipped the row lock cannot be lost."""
    block.updated_at = timezone.now()  # .update() skips auto_now
    fields = {name: getattr(block, name) for name in changes}
    fields["updated_at"] = block.updated_at
    if user_id:
        fields["last_updated_by_id"] = user_id
    versioned = Block.objects.for_org(block.organization_id).filter(id=block.id, version=block.version)
    if "label" in changes:
        try:
            # A savepoint: a duplicate label must not break the caller's transaction.
            with transaction.atomic():
                updated = versioned.update(version=F("version") + 1, **fields)
                AgentBlock.objects.filter(block_id=block.id).update(block_label=block.label)
        except IntegrityError as exc:
            raise DuplicateBlockLabel(
                f"An agent using this block already has another block labelled '{block.label}'"
            ) from exc
    else:  # a value edit (the memory tools): no savepoint round trips
        updated = versioned.update(version=F("version") + 1, **fields)
    if updated != 1:
        raise BlockConcurrentUpdate(f"Block '{block.label}' was changed concurrently; retry")
    block.version += 1
    _record_history(block, editor=editor, value_before=value_before)
    return block


def _record_history(block: Block, *, editor: Editor, value_before: str) -> None:
    _history_row(block, editor=editor, value_before=value_before).save(force_insert=True)


def _history_row(block: Block, *, editor: Editor, value_before: str) -> BlockHistory:
    """The history entry for `block` as just written (its new version and value)."""
    return BlockHistory(
        organization_id=block.organization_id,
        block=block,
        version=block.version,
        actor_type=editor.actor_type,
        actor_id=editor.actor_id,
        label=block.label,
        description=block.description,
        limit=block.limit,
        value_before=value_before,
        value_after=block.value,
    )


@transaction.atomic
def block_attach_to_agent(*, actor: Actor, agent_id: str, block: Block) -> AgentBlock:
    """Attach; the agent must belong to the actor's organisation (the caller has fetched it scoped).

    Raises DuplicateBlockLabel when the agent already has a block with this label.
    """
    if block.organization_id != actor.organization_id:
        raise InvalidInput("Block not found")
    if not block.read_only:  # the agent could rewrite it: attaching is writing
        _require_block_writer(actor, block)
    existing = AgentBlock.objects.filter(agent_id=agent_id, block_label=block.label).first()
    if existing is not None:
        if existing.block_id == block.id:
            return existing
        raise DuplicateBlockLabel(
            f"Agent already has a block labelled '{block.label}' ({existing.block_id}); "
            "detach it first or use another label"
        )
    try:
        with transaction.atomic():
            return AgentBlock.objects.create(agent_id=agent_id, block=block, block_label=block.label)
    except IntegrityError as exc:  # a concurrent attach won the race
        raise DuplicateBlockLabel(f"Agent already has a block labelled '{block.label}'") from exc


def block_detach_from_agent(*, agent_id: str, block_id: str) -> bool:
    deleted, _ = AgentBlock.objects.filter(agent_id=agent_id, block_id=block_id).delete()
    return deleted > 0
