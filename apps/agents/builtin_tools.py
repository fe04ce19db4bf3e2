"""Letta's built-in tools, executed in-process for one agent (they read and write the agent's own memory).

Every failure the model can act on (an unknown block label, a read-only block, an edit over the limit,
a missing/unknown/mistyped argument, no embedding model, a provider failure) comes back as an error
`ToolResult` whose text tells the model what to do; nothing is truncated and nothing half-written.
Programming errors still raise: the loop records those as failed steps rather than showing them to the
model as its own mistake.

Arguments are checked against the tool's JSON schema (apps.tools.builtin), the same one the model saw.
Memory edits use the pure rules in apps.memory.edits and write through the memory services with
`Editor.agent`, so block history names the agent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from apps.agents import agent_messaging, recall
from apps.agents.models import Agent
from apps.core.errors import DomainError
from apps.memory import archival, edits
from apps.memory import services as memory_services
from apps.memory.edits import BlockView, MemoryEditError
from apps.memory.errors import BlockConcurrentUpdate
from apps.memory.models import DEFAULT_BLOCK_LIMIT, AgentBlock, Block
from apps.memory.services import Editor
from apps.tools.builtin import BUILTIN_TOOLS, builtin_definition
from apps.tools.execution import ToolContext, ToolResult

SEND_MESSAGE_RESULT = "Sent message successfully."
EDIT_CONFIRMATION = (
    "The core memory block with label `{label}` has been edited. Review the changes and make sure they "
    "are as expected (correct indentation, no duplicate lines, etc). Edit the memory block again if necessary."
)
SKILL_PREFIX = "skills/"  # blocks labelled skills/<name> are skills (Letta's MemFS convention)
MAX_LABEL_LENGTH = 200  # as apps.memory.services.validate_block_fields
EDIT_ATTEMPTS = 3
"""A block edited concurrently (a sleeptime agent, a person in the ADE) is re-read and the edit re-applied
to its new value, at most this many times, instead of overwriting the other writer."""
IGNORED_ARGUMENTS = frozenset({"request_heartbeat"})
"""Loop-control arguments of legacy (MemGPT) schemas: the loop reads them, tools never see them."""


class ToolArgumentError(DomainError):
    """The model's arguments do not fit the tool's schema."""

    code = "tool_argument_error"


Handler = Callable[[dict[str, Any], ToolContext, Agent], ToolResult]


def execute_builtin(
    name: str, arguments: dict[str, Any] | None, ctx: ToolContext, *, agent: Agent
) -> ToolResult:
    """Run built-in tool `name` for `agent`; domain failures become `ToolResult.error` for the model."""
    handler = _HANDLERS.get(name)
    if handler is None:
        return ToolResult.error(
            f"Unknown built-in tool '{name}'. Built-in tools are: {', '.join(sorted(_HANDLERS))}."
        )
    try:
        return handler(validate_arguments(name, arguments), ctx, agent)
    except DomainError as exc:
        return ToolResult.error(exc.message)


def validate_arguments(name: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """Check arguments against the tool's schema: unknown, missing and mistyped ones are errors.

    A null optional argument counts as omitted. Integers may come as digit strings (models quote
    numbers). Raises ToolArgumentError with a message naming the tool's parameters.
    """
    parameters = builtin_definition(name)["json_schema"]["parameters"]
    properties: dict[str, dict[str, Any]] = parameters.get("properties", {})
    expected = ", ".join(properties) or "none"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ToolArgumentError(
            f"{name} takes its arguments as a JSON object, got {type(arguments).__name__}. "
            f"Its parameters are: {expected}."
        )
    unknown = sorted(set(arguments) - set(properties) - IGNORED_ARGUMENTS)
    if unknown:
        raise ToolArgumentError(
            f"{name} got unexpected argument(s): {', '.join(unknown)}. Its parameters are: {expected}."
        )
    missing = [key for key in parameters.get("required", []) if arguments.get(key) is None]
    if missing:
        raise ToolArgumentError(f"{name} is missing required argument(s): {', '.join(missing)}.")
    return {
        key: _coerce(name, key, properties[key], value)
        for key, value in arguments.items()
        if key in properties and value is not None
    }


def _coerce(tool: str, key: str, schema: dict[str, Any], value: Any) -> Any:
    kind = schema.get("type")
    where = f"{tool}: argument '{key}'"
    if kind == "string":
        if not isinstance(value, str):
            raise ToolArgumentError(f"{where} must be a string, got {type(value).__name__}.")
        if "enum" in schema and value not in schema["enum"]:
            raise ToolArgumentError(f"{where} must be one of {', '.join(schema['enum'])}, got {value!r}.")
        return value
    if kind == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            return int(value)
        raise ToolArgumentError(f"{where} must be an integer, got {value!r}.")
    if kind == "array":
        if not isinstance(value, list):
            raise ToolArgumentError(f'{where} must be a list, e.g. ["a", "b"], got {type(value).__name__}.')
        return [_coerce(tool, f"{key}[{i}]", schema.get("items", {}), item) for i, item in enumerate(value)]
    return value


def _send_message(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    """The loop shows the `message` argument as the assistant message; the tool only confirms."""
    return ToolResult.ok(SEND_MESSAGE_RESULT)


def _conversation_search(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    results = recall.conversation_search(
        actor=ctx.actor,
        agent_id=agent.id,
        conversation_id=ctx.conversation_id,
        query=args.get("query"),
        roles=args.get("roles"),
        limit=args.get("limit"),
        start_date=args.get("start_date"),
        end_date=args.get("end_date"),
    )
    if not results:
        return ToolResult.ok(json.dumps({"message": "No results found.", "results": []}))
    return ToolResult.ok(
        json.dumps({"message": f"Showing {len(results)} results:", "results": results}, ensure_ascii=False)
    )


def _archival_memory_insert(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    """Stores one passage; memory_changed because the system message shows the archival count and tags.
    Without an embedding model (the agent's or its archive's) the passage is stored without a vector."""
    archive = archival.agent_archive(
        actor=ctx.actor,
        agent_id=agent.id,
        embedding_handle=agent.embedding,
        embedding_dim=agent.embedding_dim,
    )
    archival.passage_insert(
        actor=ctx.actor,
        archive=archive,
        texts=[args["content"]],
        tags=args.get("tags"),
        embedding_handle=archive.embedding or agent.embedding,
    )
    return ToolResult.ok(None, memory_changed=True)


def _archival_memory_search(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    """Searches every archive attached to the agent: by meaning where the archive has an embedding model,
    by a text match (every word of the query) where it has none (see archival.archive_search)."""
    zone = recall.agent_zone(agent.timezone)
    start = recall.parse_time_bound(args.get("start_datetime"), zone=zone, end=False, name="start_datetime")
    end = recall.parse_time_bound(args.get("end_datetime"), zone=zone, end=True, name="end_datetime")
    archives = list(archival.agent_archives(actor=ctx.actor, agent_id=agent.id))
    if not archives:
        return ToolResult.ok("[]")
    hits = archival.archive_search(
        actor=ctx.actor,
        archives=archives,
        query=args["query"],
        tags=args.get("tags"),
        tag_match_mode=args.get("tag_match_mode") or "any",
        top_k=archival.DEFAULT_TOP_K if args.get("top_k") is None else args["top_k"],
        start=start,
        end=end,
    )
    results = [
        {
            "id": hit.passage.id,
            "timestamp": hit.passage.created_at.astimezone(zone).isoformat(timespec="seconds"),
            "content": hit.passage.text,
            "tags": hit.passage.tags,
        }
        for hit in hits
    ]
    return ToolResult.ok(json.dumps(results, ensure_ascii=False))


def _core_memory_append(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    block, changed = _edit_block(
        ctx, agent, args["label"], lambda view: edits.core_memory_append(view, args["content"])
    )
    return ToolResult.ok(block.value, memory_changed=changed, edited_block=block)


def _core_memory_replace(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    block, changed = _edit_block(
        ctx,
        agent,
        args["label"],
        lambda view: edits.core_memory_replace(view, args["old_content"], args["new_content"]),
    )
    return ToolResult.ok(block.value, memory_changed=changed, edited_block=block)


def _memory_replace(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    block, changed = _edit_block(
        ctx,
        agent,
        args["label"],
        lambda view: edits.memory_replace(view, args["old_string"], args["new_string"]),
    )
    return ToolResult.ok(
        EDIT_CONFIRMATION.format(label=block.label), memory_changed=changed, edited_block=block
    )


def _memory_insert(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    block, changed = _edit_block(
        ctx,
        agent,
        args["label"],
        lambda view: edits.memory_insert(view, args["new_string"], args.get("insert_line", -1)),
    )
    return ToolResult.ok(
        EDIT_CONFIRMATION.format(label=block.label), memory_changed=changed, edited_block=block
    )


def _memory_rethink(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    label, new_memory = args["label"], args["new_memory"]
    if _known_block(ctx, label) is None and _attachment(ctx, agent, label) is None:
        block = _create_block(ctx, agent, label, new_memory)
        return ToolResult.ok(EDIT_CONFIRMATION.format(label=block.label), memory_changed=True)
    block, changed = _edit_block(ctx, agent, label, lambda view: edits.memory_rethink(view, new_memory))
    return ToolResult.ok(
        EDIT_CONFIRMATION.format(label=block.label), memory_changed=changed, edited_block=block
    )


PATCH_APPLIED = (
    "The memory patch was applied and your memory blocks are updated in your context.\n\n"
    "Operations completed:\n- {operations}"
)


@dataclass
class _PatchTarget:
    """A block as a patch leaves it: `block` is None for one the patch adds; `label` may be a new name."""

    block: Block | None
    label: str
    value: str
    limit: int
    description: str = ""
    read_only: bool = False
    detached: bool = False

    def view(self) -> BlockView:
        return BlockView(label=self.label, value=self.value, limit=self.limit, read_only=self.read_only)


def _memory_apply_patch(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    """Letta's memory_apply_patch, all or nothing: every operation is computed on the blocks as read, and
    only if all of them apply are the changes written, in one transaction, each block compare-and-set on
    its version (a concurrent writer makes the whole patch re-read and re-apply, as _edit_block does)."""
    operations = edits.parse_memory_patch(args["label"], args["patch"])
    for attempt in range(EDIT_ATTEMPTS):
        attached = _blocks_by_label(ctx, agent, fresh=attempt > 0)
        if attempt == 0 and any(
            op.label not in attached and op.kind != "add" for op in operations
        ):  # the run's copy may predate a block attached since
            attached = _blocks_by_label(ctx, agent, fresh=True)
        targets, done = _plan_patch(operations, attached, agent)
        try:
            with transaction.atomic():
                edited = _write_patch(ctx, agent, targets)
        except BlockConcurrentUpdate:
            continue
        if not edited:
            return ToolResult.ok("The patch changed nothing: the blocks already read that way.")
        single = len(operations) == 1 and not any(t.block is None or t.detached for t in targets)
        if single and not edits.is_extended_patch(args["patch"]):
            # Letta returns the patched block's new value for a plain (single-block) patch.
            return ToolResult.ok(edited[0].value, memory_changed=True, edited_block=edited[0])
        return ToolResult.ok(PATCH_APPLIED.format(operations="\n- ".join(done)), memory_changed=True)
    raise BlockConcurrentUpdate(
        "The memory blocks of this patch kept changing while you edited them; read them again and retry."
    )


def _plan_patch(
    operations: list[edits.PatchOperation], attached: dict[str, Block], agent: Agent
) -> tuple[list[_PatchTarget], list[str]]:
    """What the patch makes of each block it names (nothing written); raises MemoryEditError on the first
    operation that cannot apply, so a failed patch changes nothing."""
    live: dict[str, _PatchTarget] = {}  # label -> what holds it now
    targets: list[_PatchTarget] = []
    planned: set[str] = set()  # ids of the attached blocks the patch has touched
    done: list[str] = []

    def taken(label: str) -> bool:
        return label in live or (label in attached and attached[label].id not in planned)

    def existing(label: str) -> _PatchTarget:
        if label not in live and label in attached and attached[label].id not in planned:
            block = attached[label]
            live[label] = _PatchTarget(
                block, block.label, block.value, block.limit, block.description, block.read_only
            )
            targets.append(live[label])
            planned.add(block.id)
        if label not in live:
            raise MemoryEditError("The patch was not applied. " + _unknown_label_message(agent, label))
        return live[label]

    for op in operations:
        if op.kind == "add":
            if taken(op.label):
                raise MemoryEditError(f"The patch was not applied: memory block '{op.label}' already exists.")
            _check_label(op.label)
            value = edits.memory_patch_new_block(op.label, op.text, DEFAULT_BLOCK_LIMIT)
            target = _PatchTarget(None, op.label, value, DEFAULT_BLOCK_LIMIT, op.description)
            live[op.label] = target
            targets.append(target)
            done.append(f"Created memory block '{op.label}'")
        elif op.kind == "update":
            target = existing(op.label)
            target.value = edits.memory_apply_hunks(target.view(), op.text)
            done.append(f"Updated memory block '{op.label}'")
        elif op.kind == "delete":
            target = existing(op.label)
            edits.check_patch_target(target.view())
            target.detached = True
            del live[op.label]
            done.append(f"Deleted memory block '{op.label}'")
        else:  # move
            target = existing(op.label)
            edits.check_patch_target(target.view())
            if op.new_label != op.label and taken(op.new_label):
                raise MemoryEditError(
                    f"The patch was not applied: cannot rename '{op.label}' to '{op.new_label}', "
                    "a memory block with that label already exists."
                )
            _check_label(op.new_label)
            del live[op.label]
            target.label = op.new_label
            live[op.new_label] = target
            done.append(f"Renamed memory block '{op.label}' to '{op.new_label}'")
    return targets, done


def _write_patch(ctx: ToolContext, agent: Agent, targets: list[_PatchTarget]) -> list[Block]:
    """Write a planned patch (inside the caller's transaction); the blocks written, in patch order."""
    written: list[Block] = []
    editor = Editor.agent(agent.id)
    for target in targets:
        block = target.block
        if block is None:
            if not target.detached:
                written.append(_create_block(ctx, agent, target.label, target.value, target.description))
            continue
        if target.detached:
            memory_services.block_detach_from_agent(agent_id=agent.id, block_id=block.id)
            written.append(block)
            continue
        if target.value != block.value:
            block = memory_services.block_write_read_value(
                block=block,
                value=target.value,
                editor=editor,
                user_id=ctx.actor.user_id,
                attached_to=agent.id,
            )
        if target.label != block.label:
            block = memory_services.block_update(
                actor=ctx.actor,
                block_id=block.id,
                editor=editor,
                expected_version=block.version,
                label=target.label,
            )
        if block is not target.block:
            written.append(block)
    return written


def _blocks_by_label(ctx: ToolContext, agent: Agent, *, fresh: bool) -> dict[str, Block]:
    """The agent's blocks by label: the run's copies (fresh=False, when it holds them) or read now."""
    if not fresh and ctx.blocks:
        return {block.label: block for block in ctx.blocks}
    links = AgentBlock.objects.filter(agent_id=agent.id, block__organization_id=ctx.actor.organization_id)
    return {link.block_label: link.block for link in links.select_related("block")}


def _check_label(label: str) -> None:
    if len(label) > MAX_LABEL_LENGTH:
        raise MemoryEditError(
            f"The patch was not applied: the label '{label[:40]}...' is longer than {MAX_LABEL_LENGTH} characters."
        )


def _load_skill(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    """A skill's full text, which then stays in context as this tool's return. The name may be given as
    <available_skills> shows it (`pdf`, `pdf/SKILL.md`, `${MEMORY_DIR}/skills/pdf/SKILL.md`) or as the
    block's label (`skills/pdf`); `skills/pdf/SKILL` is Letta's older label for the same skill."""
    name = _skill_name(args["name"])
    blocks = _blocks_by_label(ctx, agent, fresh=False)
    for _ in range(2):  # the run's copy may predate a skill added since
        for label in (f"{SKILL_PREFIX}{name}", f"{SKILL_PREFIX}{name}/SKILL"):
            if name and label in blocks:
                return ToolResult.ok(blocks[label].value)
        blocks = _blocks_by_label(ctx, agent, fresh=True)
    skills = sorted(
        {
            label.split("/")[1]
            for label in blocks
            if label.startswith(SKILL_PREFIX) and label.count("/") in (1, 2)
        }
    )
    listed = f"Your skills are: {', '.join(skills)}." if skills else "You have no skills."
    return ToolResult.error(f"No skill named '{args['name']}'. {listed}")


def _skill_name(raw: str) -> str:
    name = raw.strip()
    for prefix in ("${MEMORY_DIR}/", "$MEMORY_DIR/", "/memories/", "/"):
        name = name.removeprefix(prefix)
    name = name.removeprefix(SKILL_PREFIX)
    for suffix in ("/SKILL.md", "/SKILL", ".md"):
        name = name.removesuffix(suffix)
    return name.strip("/")


def _memory_finish_edits(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    return ToolResult.ok(None)


def _send_message_to_agent_async(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    return agent_messaging.send_message_to_agent_async(
        ctx=ctx, sender=agent, message=args["message"], other_agent_id=args["other_agent_id"]
    )


def _send_message_to_agent_and_wait_for_reply(
    args: dict[str, Any], ctx: ToolContext, agent: Agent
) -> ToolResult:
    return agent_messaging.send_message_to_agent_and_wait_for_reply(
        ctx=ctx, sender=agent, message=args["message"], other_agent_id=args["other_agent_id"]
    )


def _send_message_to_agents_matching_tags(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    return agent_messaging.send_message_to_agents_matching_tags(
        ctx=ctx,
        sender=agent,
        message=args["message"],
        match_all=args.get("match_all") or [],
        match_some=args.get("match_some") or [],
    )


def _edit_block(
    ctx: ToolContext, agent: Agent, label: str, compute: Callable[[BlockView], str]
) -> tuple[Block, bool]:
    """Apply a pure edit to the agent's block `label` and persist it as the agent; (block, changed).

    The write is compare-and-set on the version read here, so a concurrent writer is never overwritten:
    the edit is recomputed on the newer value. Raises MemoryEditError (unknown label, edit refused).
    """
    for attempt in range(EDIT_ATTEMPTS):
        block = _known_block(ctx, label) if attempt == 0 else None
        if block is None:
            link = _attachment(ctx, agent, label)
            if link is None:
                raise MemoryEditError(_unknown_label_message(agent, label))
            block = link.block
        view = BlockView(label=block.label, value=block.value, limit=block.limit, read_only=block.read_only)
        new_value = compute(view)
        if new_value == block.value:
            return block, False
        try:
            updated = memory_services.block_write_read_value(
                block=block,
                value=new_value,
                editor=Editor.agent(agent.id),
                user_id=ctx.actor.user_id,
                attached_to=agent.id,
            )
        except BlockConcurrentUpdate:
            continue
        return updated, True
    raise BlockConcurrentUpdate(
        f"Memory block '{label}' kept changing while you edited it; read it again and retry."
    )


@transaction.atomic
def _create_block(ctx: ToolContext, agent: Agent, label: str, value: str, description: str = "") -> Block:
    """memory_rethink on a missing label (and a patch's `*** Add Block:`): a new block attached to the
    agent, its content written as the agent (the empty first version is the system's), so history shows
    who wrote what."""
    new_value = edits.memory_rethink(BlockView(label=label, value="", limit=DEFAULT_BLOCK_LIMIT), value)
    block = memory_services.block_create(actor=ctx.actor, label=label, description=description)
    memory_services.block_attach_to_agent(actor=ctx.actor, agent_id=agent.id, block=block)
    if not new_value:
        return block
    return memory_services.block_update(
        actor=ctx.actor, block_id=block.id, value=new_value, editor=Editor.agent(agent.id)
    )


def _known_block(ctx: ToolContext, label: str) -> Block | None:
    """The run's copy of the block labelled `label`, if it holds one (possibly stale: see _edit_block)."""
    return next((block for block in ctx.blocks if block.label == label), None)


def _attachment(ctx: ToolContext, agent: Agent, label: str) -> AgentBlock | None:
    return (
        AgentBlock.objects.filter(
            agent_id=agent.id, block_label=label, block__organization_id=ctx.actor.organization_id
        )
        .select_related("block")
        .first()
    )


def _unknown_label_message(agent: Agent, label: str) -> str:
    labels = sorted(AgentBlock.objects.filter(agent_id=agent.id).values_list("block_label", flat=True))
    if not labels:
        return f"No memory block labelled '{label}': this agent has no memory blocks."
    return f"No memory block labelled '{label}'. This agent's memory blocks are: {', '.join(labels)}."


_HANDLERS: dict[str, Handler] = {
    "send_message": _send_message,
    "conversation_search": _conversation_search,
    "archival_memory_insert": _archival_memory_insert,
    "archival_memory_search": _archival_memory_search,
    "core_memory_append": _core_memory_append,
    "core_memory_replace": _core_memory_replace,
    "memory_replace": _memory_replace,
    "memory_insert": _memory_insert,
    "memory_rethink": _memory_rethink,
    "memory_finish_edits": _memory_finish_edits,
    "memory_apply_patch": _memory_apply_patch,
    "load_skill": _load_skill,
    "send_message_to_agent_async": _send_message_to_agent_async,
    "send_message_to_agent_and_wait_for_reply": _send_message_to_agent_and_wait_for_reply,
    "send_message_to_agents_matching_tags": _send_message_to_agents_matching_tags,
}


def executable_builtins() -> frozenset[str]:
    """The built-in tool names this module can run (a test keeps it equal to apps.tools.builtin's)."""
    return frozenset(_HANDLERS)


# --- Letta base tools this server does not run yet -----------------------------------------------------


def _not_built_yet(name: str) -> Handler:
    """A handler for a Letta base tool whose name resolves (agents may attach it, the model may call it)
    but whose behaviour is not built here yet: the call is an error result saying so, never a crash."""

    def handler(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
        return ToolResult.error(
            f"The built-in tool '{name}' is not available on this server yet: its call did nothing. "
            "Carry on without it."
        )

    return handler


for _name in BUILTIN_TOOLS:
    _HANDLERS.setdefault(_name, _not_built_yet(_name))


# --- Built-ins implemented by apps above this one (folders: the file tools) --------------------------------


def register_builtin(name: str, handler: Handler) -> None:
    """Run built-in tool `name` with `handler` (replacing its not-built-yet placeholder). For apps this one
    must not import, from their AppConfig.ready: apps.folders registers open_files, grep_files and
    semantic_search_files."""
    if name not in BUILTIN_TOOLS:
        raise ValueError(f"'{name}' is not a Letta built-in tool")
    _HANDLERS[name] = handler
