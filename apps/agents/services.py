from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.accounts.models import Organization
from apps.agents.agent_file import (  # noqa: F401 - agent files' operations, for the adapters
    AgentFile,
    ImportResult,
    Refusal,
    agent_clone,
    agent_export,
    agent_import,
    parse_agent_file,
)
from apps.agents.errors import (
    AgentNotFound,
    ApprovalAlreadyDecided,
    InvalidAgentName,
    MaxStepsExceeded,
    NoPendingApproval,
    PendingApproval,
    ToolRulesChanged,
)
from apps.agents.groups import sleeptime_group_sync
from apps.agents.loop.convert import text_of, to_letta_messages
from apps.agents.loop.events import EventSink, StopReasonEvent
from apps.agents.loop.messages import summary_from_message_text
from apps.agents.loop.runner import (
    Compaction,
    RunDeferred,
    TurnResult,
    Usage,
    compact_thread,
    execute_run,
    execute_run_streamed,
)
from apps.agents.models import (
    FEEDBACK_NOTE_MAX_CHARS,
    Agent,
    AgentSecret,
    AgentTool,
    AgentType,
    Conversation,
    Message,
    Run,
    Step,
    StopReason,
)
from apps.agents.prompts import DEFAULT_SYSTEM_PROMPT, SLEEPTIME_SYSTEM_PROMPT
from apps.agents.recovery import enqueue_run
from apps.agents.selectors import (
    ACTIVE_RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    agent_block_get_by_label,
    agent_get,
    run_produced_messages,
    run_stop_reason,
    run_usage_event,
    thread_system_message,
)
from apps.agents.system_messages import save_thread_system_message, without_thread_system_message
from apps.core import permissions
from apps.core.actor import Actor
from apps.core.db import insert_all, prepared_cursor, release_pooled_connection, row_reader
from apps.core.errors import Conflict, InvalidInput, NotFound
from apps.core.permissions import Action
from apps.llm import client as llm_client
from apps.llm import services as llm_services
from apps.llm.errors import UnknownModelHandle
from apps.llm.handles import resolve_model
from apps.llm.retry import CallBounds
from apps.memory import archival
from apps.memory import services as memory_services
from apps.memory.errors import BlockNotFound, DuplicateBlockLabel
from apps.memory.models import AgentBlock, Archive, Block, Passage
from apps.memory.selectors import block_get
from apps.memory.services import UNSET
from apps.streams.events import StreamEvent, end_stream, follow_events, read_events, request_cancel
from apps.tools.builtin import BUILTIN_TOOLS, base_tool_names
from apps.tools.models import Tool
from apps.tools.rules import dump_tool_rules, parse_tool_rules
from apps.tools.selectors import tool_get, tools_by_name
from apps.tools.services import tool_upsert_builtins

logger = logging.getLogger(__name__)


# --- Agents: creation -----------------------------------------------------------------------------------


AGENT_NAME_PATTERN = re.compile(r"^[A-Za-z0-9 _'\-]+$")
DEFAULT_BLOCK_DESCRIPTIONS = {
    "human": "Key details about the person you are conversing with, to personalise the conversation.",
    "persona": "Your persona: who you are, how you speak and behave.",
}


@dataclass(frozen=True)
class BlockSpec:
    label: str
    value: str = ""
    limit: int | None = None
    description: str = ""
    read_only: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


def validate_agent_name(name: str) -> str:
    if not name or len(name) > 200 or not AGENT_NAME_PATTERN.match(name):
        raise InvalidAgentName(
            f"Invalid agent name {name!r}: use 1-200 letters, digits, spaces, '-', '_' or \"'\""
        )
    return name


def random_agent_name() -> str:
    return f"agent-{secrets.token_hex(3)}"


@transaction.atomic
def agent_create(
    *,
    actor: Actor,
    name: str | None = None,
    description: str = "",
    agent_type: str = AgentType.LETTA_V1,
    system: str = "",
    model: str = "",
    embedding: str = "",
    context_window_limit: int | None = None,
    temperature: float = 0.7,
    max_tokens: int | None = None,
    parallel_tool_calls: bool = False,
    memory_blocks: list[BlockSpec] | None = None,
    block_ids: list[str] | None = None,
    tool_ids: list[str] | None = None,
    tools: list[str] | None = None,
    include_base_tools: bool = True,
    tool_rules: list[Any] | None = None,
    tags: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    secrets_: dict[str, str] | None = None,
    enable_sleeptime: bool = False,
    timezone_name: str = "UTC",
    initial_messages: list[MessageIn] | None = None,
    store_system_message: bool = True,
) -> Agent:
    """Create an agent with new and existing blocks, tools and validated tool rules; `initial_messages`
    (Letta's initial_message_sequence) are its context window, in order.

    Raises InvalidInput (bad name, unknown agent type, bad tool rules, duplicate block labels,
    unknown block or tool ids) and BlockTooLong. Nothing is written when it raises.
    """
    if agent_type not in AgentType.values:
        raise InvalidInput(
            f"Unknown agent_type {agent_type!r}; expected one of: {', '.join(AgentType.values)}"
        )
    if model and "/" not in model:
        raise InvalidInput(f"Invalid model handle {model!r}: expected 'provider/model-name'")
    rules = dump_tool_rules(parse_tool_rules(tool_rules or []))
    specs = memory_blocks or []
    labels = [spec.label for spec in specs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise DuplicateBlockLabel(f"memory_blocks has more than one block labelled: {', '.join(duplicates)}")

    agent = Agent.objects.for_actor(actor).create(
        name=validate_agent_name(name) if name is not None else random_agent_name(),
        description=description,
        agent_type=agent_type,
        system=system,
        model=model,
        embedding=embedding,
        context_window_limit=context_window_limit,
        temperature=temperature,
        max_tokens=max_tokens,
        parallel_tool_calls=parallel_tool_calls,
        tool_rules=rules,
        tags=sorted(set(tags or [])),
        metadata=metadata or {},
        enable_sleeptime=enable_sleeptime,
        timezone=timezone_name,
        created_by_id=actor.user_id,
        last_updated_by_id=actor.user_id,
    )
    for spec in specs:
        block = memory_services.block_create(
            actor=actor,
            label=spec.label,
            value=spec.value,
            limit=spec.limit,
            description=spec.description or DEFAULT_BLOCK_DESCRIPTIONS.get(spec.label, ""),
            read_only=spec.read_only,
            metadata=spec.metadata,
        )
        memory_services.block_attach_to_agent(actor=actor, agent_id=agent.id, block=block)
    for block_id in block_ids or []:
        _link_block(actor=actor, agent=agent, block_id=block_id)
    for tool_id in tool_ids or []:
        _link_tool(actor=actor, agent=agent, tool_id=tool_id)
    for tool in _tools_by_name(
        actor=actor,
        agent_type=agent_type,
        names=tools or [],
        include_base_tools=include_base_tools,
        enable_sleeptime=enable_sleeptime,
    ):
        AgentTool.objects.get_or_create(agent=agent, tool=tool)
    for key, value in (secrets_ or {}).items():
        AgentSecret.objects.for_actor(actor).create(agent=agent, key=key, value=value)
    if initial_messages:
        _store_initial_messages(actor=actor, agent=agent, messages=initial_messages)
    if store_system_message:
        store_thread_system_message(actor=actor, agent=agent)
    if enable_sleeptime and agent_type != AgentType.SLEEPTIME:
        _create_sleeptime_agent(actor=actor, primary=agent)
    memory_services.git_memory_tags_saved(agent=agent)  # tagged git-memory-enabled: build its repository
    return agent


def store_thread_system_message(*, actor: Actor, agent: Agent, conversation_id: str | None = None) -> str:
    """Compile the thread's system message from the agent's current memory and store it (what
    `messages.list` starts with; apps.agents.system_messages). An agent whose model cannot be used yet
    gets its system prompt as written: its first run compiles the rest. Returns the stored text."""
    try:
        text = thread_system_message(actor=actor, agent_id=agent.id, conversation_id=conversation_id)
    except InvalidInput:
        text = agent.system or DEFAULT_SYSTEM_PROMPT
    _save_system_message(agent, conversation_id, text)
    return text


def _save_system_message(agent: Agent, conversation_id: str | None, text: str) -> None:
    save_thread_system_message(
        organization_id=agent.organization_id,
        agent_id=agent.id,
        conversation_id=conversation_id,
        text=text,
        model=agent.model,
    )


def _store_initial_messages(*, actor: Actor, agent: Agent, messages: list[MessageIn]) -> None:
    """The given messages become the agent's context window, in order, as if they had been sent."""
    rows = []
    for message in messages:
        if message.role not in ("user", "system", "assistant"):
            raise InvalidInput(f"Unknown message role {message.role!r}; expected user, system or assistant")
        parts = message.parts()
        rows.append(
            Message(
                organization_id=actor.organization_id,
                agent=agent,
                role=message.role,
                content=parts,
                text=text_of(parts),
                otid=message.otid,
                name=message.name,
                sender_id=message.sender_id,
            )
        )
    Message.objects.for_actor(actor).bulk_create(rows)
    agent.message_ids = [row.id for row in rows]
    agent.save(update_fields=["message_ids", "updated_at"])


def _create_sleeptime_agent(*, actor: Actor, primary: Agent) -> Agent:
    """Letta's background memory agent: same model, the primary's blocks (shared, not copied), the
    sleeptime memory tools, and memory_finish_edits as its way to end a turn."""
    sleeptime = agent_create(
        actor=actor,
        name=f"{primary.name}-sleeptime"[:200],
        agent_type=AgentType.SLEEPTIME,
        system=SLEEPTIME_SYSTEM_PROMPT,
        model=primary.model,
        embedding=primary.embedding,
        context_window_limit=primary.context_window_limit,
        block_ids=list(primary.blocks.values_list("id", flat=True)),
        tool_rules=[{"type": "exit_loop", "tool_name": "memory_finish_edits"}],
        tags=primary.tags,
    )
    primary.sleeptime_agent = sleeptime
    primary.save(update_fields=["sleeptime_agent", "updated_at"])
    sleeptime_group_sync(primary=primary)
    return sleeptime


def _tools_by_name(
    *, actor: Actor, agent_type: str, names: list[str], include_base_tools: bool, enable_sleeptime: bool
) -> list[Tool]:
    """Resolve tool names (built-ins are created for the organisation on first use). Unknown names fail."""
    wanted = list(
        dict.fromkeys(
            [
                *(
                    base_tool_names(agent_type, enable_sleeptime=enable_sleeptime)
                    if include_base_tools
                    else ()
                ),
                *names,
            ]
        )
    )
    builtins = tool_upsert_builtins(actor=actor, names=[n for n in wanted if n in BUILTIN_TOOLS])
    found = builtins | tools_by_name(actor=actor, names=[n for n in wanted if n not in BUILTIN_TOOLS])
    missing = [n for n in wanted if n not in found]
    if missing:
        raise InvalidInput(f"Unknown tool name(s): {', '.join(missing)}")
    return [found[n] for n in wanted]


def _link_block(*, actor: Actor, agent: Agent, block_id: str) -> Block:
    """Link a block to an agent whose permission the caller has checked (agent_create, agent_update,
    agent_attach_block). Raises BlockNotFound (also for other organisations' blocks), DuplicateBlockLabel, PermissionDenied
    (a writable block someone else created)."""
    block = block_get(actor=actor, block_id=block_id)
    memory_services.block_attach_to_agent(actor=actor, agent_id=agent.id, block=block)
    return block


def _link_tool(*, actor: Actor, agent: Agent, tool_id: str) -> Tool:
    """Link a tool named by id in a create or update body (agent_create, agent_update: the caller has
    checked the agent's permission). An unknown id there is bad input (InvalidInput), as in Letta;
    agent_attach_tool, whose path names the tool, answers NotFound instead."""
    tool = Tool.objects.for_actor(actor).filter(id=tool_id).first()
    if tool is None:
        raise InvalidInput(f"Tool with id '{tool_id}' not found")
    AgentTool.objects.get_or_create(agent=agent, tool=tool)
    return tool


# --- Agents: configuration ------------------------------------------------------------------------------


MODEL_SETTINGS_FIELDS = {
    "temperature": "temperature",
    "max_output_tokens": "max_tokens",
    "parallel_tool_calls": "parallel_tool_calls",
}
"""Letta's model_settings keys kept as Agent columns (the loop reads them); other keys are kept verbatim."""
TERMINAL_BASE_TOOLS = frozenset({"send_message", "send_message_to_agent_async", "memory_finish_edits"})
DEFAULT_TEMPERATURE = 0.7


SLEEPTIME_FREQUENCY_MAX = 1000


def require_agent_permission(actor: Actor, agent: Agent, action: Action = Action.AGENT_CONFIGURE) -> None:
    """The role matrix for an agent the actor can see: its creator, owners and admins configure it.
    Raises PermissionDenied (403 with the reason)."""
    permissions.require(actor, action, creator_id=agent.created_by_id, subject=f"agent '{agent.name}'")


def validate_timezone(name: str) -> str:
    """An IANA zone name (the agent's clock in prompts and tool timestamps). Raises InvalidInput."""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(f"Unknown timezone {name!r}: use an IANA name such as 'Europe/Paris'") from exc
    return name


def validate_handle(handle: str, *, kind: str) -> str:
    """Shape only ('provider/model'): whether a provider can serve it is decided at call time."""
    if handle and "/" not in handle:
        raise InvalidInput(f"Invalid {kind} handle {handle!r}: expected 'provider/model-name'")
    return handle


def validate_context_window_limit(*, actor: Actor, model: str, limit: int | None) -> None:
    """Refuse a limit above what the model is known to accept (ContextWindowLimitTooLarge), now rather
    than at the first run. A handle that cannot be resolved yet (no key configured) is not judged here."""
    if not model or limit is None:
        return
    try:
        resolve_model(model, organization_id=actor.organization_id, context_window_limit=limit)
    except UnknownModelHandle:
        return


def validate_model_available(*, actor: Actor, model: str) -> str:
    """A chat handle some provider of the organisation can serve now (not only the right shape).

    Raises InvalidInput for an empty or malformed handle, UnknownModelHandle (ProviderNotConfigured)
    for one no configured provider serves.
    """
    handle = (model or "").strip()
    if not handle:
        raise InvalidInput("Choose a model: a handle such as 'openai/gpt-4o-mini'")
    validate_handle(handle, kind="model")
    resolve_model(handle, organization_id=actor.organization_id)
    return handle


def split_model_settings(model_settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Agent column values, provider extras). `provider_type` is dropped: the handle decides it."""
    columns = {
        column: model_settings[key] for key, column in MODEL_SETTINGS_FIELDS.items() if key in model_settings
    }
    extras = {
        key: value
        for key, value in model_settings.items()
        if key not in MODEL_SETTINGS_FIELDS and key != "provider_type"
    }
    return columns, extras


def base_tool_rules(*, agent: Agent, tool_rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Letta's `include_base_tool_rules`: exit_loop for terminal base tools, continue_loop for the others,
    for each attached base tool that has no loop rule yet."""
    base = set(base_tool_names(agent.agent_type, enable_sleeptime=agent.enable_sleeptime))
    ruled = {r.get("tool_name") for r in tool_rules if r.get("type") in ("exit_loop", "continue_loop")}
    names = sorted(base & {t.name for t in agent.tools.all()} - ruled)
    return [
        *tool_rules,
        *(
            {"type": "exit_loop" if n in TERMINAL_BASE_TOOLS else "continue_loop", "tool_name": n}
            for n in names
        ),
    ]


@transaction.atomic
def agent_create_with_settings(
    *,
    actor: Actor,
    model_settings: dict[str, Any] | None = None,
    compaction_settings: dict[str, Any] | None = None,
    message_buffer_autoclear: bool = False,
    hidden: bool = False,
    include_base_tool_rules: bool = False,
    timezone_name: str = "UTC",
    embedding: str = "",
    **fields: Any,
) -> Agent:
    """`agent_create` plus what Letta's CreateAgent adds on top: model_settings (columns and provider extras),
    compaction settings, the base tool rules, a validated timezone. Raises what agent_create raises."""
    columns, extras = split_model_settings(model_settings or {})
    validate_context_window_limit(
        actor=actor, model=fields.get("model", ""), limit=fields.get("context_window_limit")
    )
    agent = agent_create(
        actor=actor,
        timezone_name=validate_timezone(timezone_name),
        embedding=validate_handle(embedding, kind="embedding"),
        store_system_message=False,  # below, once the tool rules are final
        **{**fields, **columns},
    )
    agent.model_settings = extras
    agent.compaction_settings = compaction_settings or {}
    agent.message_buffer_autoclear = message_buffer_autoclear
    agent.hidden = hidden
    if include_base_tool_rules:
        agent.tool_rules = dump_tool_rules(
            parse_tool_rules(base_tool_rules(agent=agent, tool_rules=agent.tool_rules))
        )
    agent.save(
        update_fields=[
            "model_settings",
            "compaction_settings",
            "message_buffer_autoclear",
            "hidden",
            "tool_rules",
            "updated_at",
        ]
    )
    store_thread_system_message(actor=actor, agent=agent)
    return agent


def _lock_agent(*, actor: Actor, agent_id: str) -> Agent:
    agent = Agent.objects.for_actor(actor).select_for_update().filter(id=agent_id).first()
    if agent is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    return agent


@transaction.atomic
def agent_update(
    *,
    actor: Actor,
    agent_id: str,
    name: str = UNSET,
    description: str | None = UNSET,
    system: str | None = UNSET,
    tags: list[str] | None = UNSET,
    metadata: dict[str, Any] | None = UNSET,
    model: str = UNSET,
    embedding: str | None = UNSET,
    context_window_limit: int | None = UNSET,
    model_settings: dict[str, Any] | None = UNSET,
    compaction_settings: dict[str, Any] | None = UNSET,
    timezone_name: str | None = UNSET,
    secrets_: dict[str, str] | None = UNSET,
    message_buffer_autoclear: bool = UNSET,
    enable_sleeptime: bool = UNSET,
    hidden: bool = UNSET,
    tool_ids: list[str] = UNSET,
    block_ids: list[str] = UNSET,
    tool_rules: list[Any] | None = UNSET,
    message_ids: list[str] = UNSET,
    last_run_completion: datetime | None = UNSET,
    last_run_duration_ms: int | None = UNSET,
    last_stop_reason: str | None = UNSET,
) -> Agent:
    """Change any subset of an agent (UNSET = keep; None = clear back to the default).

    Turning sleeptime on creates the sleeptime agent (as agent_create does); turning it off unlinks it.
    List fields (tags, tool_ids, block_ids, message_ids, secrets) replace the whole set. Only changed
    columns are written, so a run saving message_ids meanwhile is not overwritten by an unrelated edit.
    Raises AgentNotFound, InvalidInput (bad name, handle, timezone, tool rules, unknown tool or message
    ids), BlockNotFound and DuplicateBlockLabel; nothing is written when it raises.
    """
    agent = _lock_agent(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    changes: dict[str, Any] = {}
    if name is not UNSET:
        changes["name"] = validate_agent_name(name)
    if description is not UNSET:
        changes["description"] = description or ""
    if system is not UNSET:
        changes["system"] = system or ""
    if tags is not UNSET:
        changes["tags"] = sorted(set(tags or []))
    if metadata is not UNSET:
        changes["metadata"] = metadata or {}
    if model is not UNSET:
        changes["model"] = validate_handle(model, kind="model")
    if embedding is not UNSET:
        changes["embedding"] = validate_handle(embedding or "", kind="embedding")
        if changes["embedding"] != agent.embedding:
            changes["embedding_dim"] = None  # learned again from the new model's first call
    if context_window_limit is not UNSET:
        changes["context_window_limit"] = context_window_limit
    if model_settings is not UNSET:
        columns, extras = split_model_settings(model_settings or {})
        if model_settings is None:
            columns = {"temperature": DEFAULT_TEMPERATURE, "max_tokens": None, "parallel_tool_calls": False}
        changes |= {**columns, "model_settings": extras}
    if compaction_settings is not UNSET:
        changes["compaction_settings"] = compaction_settings or {}
    if timezone_name is not UNSET:
        changes["timezone"] = validate_timezone(timezone_name or "UTC")
    if message_buffer_autoclear is not UNSET:
        changes["message_buffer_autoclear"] = message_buffer_autoclear
    if enable_sleeptime is not UNSET:
        changes["enable_sleeptime"] = enable_sleeptime
        if not enable_sleeptime:
            changes["sleeptime_agent"] = None  # unlinked, not deleted: it is an agent the user can see
    if hidden is not UNSET:
        changes["hidden"] = hidden
    if tool_rules is not UNSET:
        changes["tool_rules"] = dump_tool_rules(parse_tool_rules(tool_rules or []))
    if message_ids is not UNSET:
        changes["message_ids"] = _validated_message_ids(
            actor=actor, agent=agent, message_ids=without_thread_system_message(agent.id, None, message_ids)
        )
    if last_run_completion is not UNSET:
        changes["last_run_completion"] = last_run_completion
    if last_run_duration_ms is not UNSET:
        changes["last_run_duration_ms"] = last_run_duration_ms
    if last_stop_reason is not UNSET:
        changes["last_stop_reason"] = last_stop_reason or ""

    if tool_ids is not UNSET:
        _replace_tools(actor=actor, agent=agent, tool_ids=tool_ids)
    if block_ids is not UNSET:
        _replace_blocks(actor=actor, agent=agent, block_ids=block_ids)
    if secrets_ is not UNSET:
        _replace_secrets(actor=actor, agent=agent, secrets_=secrets_ or {})

    if "model" in changes or changes.get("context_window_limit") is not None:
        validate_context_window_limit(
            actor=actor,
            model=changes.get("model", agent.model),
            limit=changes.get("context_window_limit", agent.context_window_limit),
        )
    for column, value in changes.items():
        setattr(agent, column, value)
    agent.last_updated_by_id = actor.user_id
    agent.save(update_fields=[*changes, "last_updated_by", "updated_at"])
    if "tags" in changes:
        memory_services.git_memory_tags_saved(agent=agent)  # tagged git-memory-enabled: build its repository
    if "system" in changes or block_ids is not UNSET:
        # What it lists changes now, as on Letta (the loop would compile the new prompt anyway).
        store_thread_system_message(actor=actor, agent=agent)
    if (
        agent.enable_sleeptime
        and agent.sleeptime_agent_id is None
        and agent.agent_type != AgentType.SLEEPTIME
    ):
        _create_sleeptime_agent(actor=actor, primary=agent)
    elif "enable_sleeptime" in changes:
        sleeptime_group_sync(primary=agent)
    return agent


def _validated_message_ids(*, actor: Actor, agent: Agent, message_ids: list[str]) -> list[str]:
    found = set(
        Message.objects.for_actor(actor).filter(agent=agent, id__in=message_ids).values_list("id", flat=True)
    )
    missing = [m for m in message_ids if m not in found]
    if missing:
        raise InvalidInput(f"Messages not found on agent '{agent.id}': {', '.join(missing)}")
    return list(message_ids)


def _replace_tools(*, actor: Actor, agent: Agent, tool_ids: list[str]) -> None:
    AgentTool.objects.filter(agent=agent).exclude(tool_id__in=tool_ids).delete()
    for tool_id in dict.fromkeys(tool_ids):
        _link_tool(actor=actor, agent=agent, tool_id=tool_id)


def _replace_blocks(*, actor: Actor, agent: Agent, block_ids: list[str]) -> None:
    """Detach first, so a new block may take the label of one it replaces."""
    AgentBlock.objects.filter(agent=agent).exclude(block_id__in=block_ids).delete()
    for block_id in dict.fromkeys(block_ids):
        _link_block(actor=actor, agent=agent, block_id=block_id)


def _replace_secrets(*, actor: Actor, agent: Agent, secrets_: dict[str, str]) -> None:
    AgentSecret.objects.for_actor(actor).filter(agent=agent).exclude(key__in=list(secrets_)).delete()
    for key, value in secrets_.items():
        AgentSecret.objects.for_actor(actor).update_or_create(agent=agent, key=key, defaults={"value": value})


@transaction.atomic
def agent_set_tool_rules(*, actor: Actor, agent_id: str, tool_rules: list[Any]) -> Agent:
    """Replace the agent's tool rules (approvals included). Raises ToolRuleError with a readable message
    on a bad rule, PermissionDenied."""
    agent = agent_get(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    agent.tool_rules = dump_tool_rules(parse_tool_rules(tool_rules))
    agent.last_updated_by_id = actor.user_id
    agent.save(update_fields=["tool_rules", "last_updated_by", "updated_at"])
    return agent


@transaction.atomic
def agent_tool_rule_save(
    *,
    actor: Actor,
    agent_id: str,
    rule: dict[str, Any],
    index: int | None = None,
    expected: dict[str, Any] | None = None,
) -> Agent:
    """Append a tool rule (`index` None) or replace the one at `index`. With `expected`, the rule being
    replaced must still be that one: compare-and-set under the agent's lock, so an edit made on a stale copy
    never overwrites someone else's. Raises ToolRulesChanged, ToolRuleError (the rules module's readable
    message, `tool_rules[i]` naming the rule), AgentNotFound, PermissionDenied."""
    agent = _lock_agent(actor=actor, agent_id=agent_id)
    rules = list(agent.tool_rules)
    if index is not None and (index >= len(rules) or (expected is not None and rules[index] != expected)):
        raise ToolRulesChanged("The agent's rules changed since this form opened: cancel and edit again.")
    if index is None:
        rules.append(rule)
    else:
        rules[index] = rule
    return agent_set_tool_rules(actor=actor, agent_id=agent.id, tool_rules=rules)


@transaction.atomic
def agent_tool_rule_delete(*, actor: Actor, agent_id: str, index: int) -> Agent:
    """Remove the tool rule at `index` (none there: nothing changes). Raises AgentNotFound, PermissionDenied."""
    agent = _lock_agent(actor=actor, agent_id=agent_id)
    rules = list(agent.tool_rules)
    if index >= len(rules):
        return agent
    del rules[index]
    return agent_set_tool_rules(actor=actor, agent_id=agent.id, tool_rules=rules)


@transaction.atomic
def agent_set_sleeptime(*, actor: Actor, agent_id: str, enabled: bool, frequency: int) -> Agent:
    """Turn the agent's sleeptime memory agent on or off (as agent_update does) and set how many of the
    primary's turns pass between its runs. Raises AgentNotFound, InvalidInput (frequency out of range)."""
    if not 1 <= frequency <= SLEEPTIME_FREQUENCY_MAX:
        raise InvalidInput(f"Sleeptime frequency must be between 1 and {SLEEPTIME_FREQUENCY_MAX} turns")
    agent = agent_update(actor=actor, agent_id=agent_id, enable_sleeptime=enabled)
    agent.sleeptime_agent_frequency = frequency
    agent.save(update_fields=["sleeptime_agent_frequency", "updated_at"])
    sleeptime_group_sync(primary=agent)
    return agent


@transaction.atomic
def agent_set_temperature(*, actor: Actor, agent_id: str, temperature: float) -> Agent:
    """Set the sampling temperature, keeping the provider extras of model_settings (read under the agent's
    lock, so a concurrent change of them is not undone). Raises AgentNotFound, PermissionDenied."""
    agent = _lock_agent(actor=actor, agent_id=agent_id)
    settings_ = {**agent.model_settings, "temperature": temperature}
    return agent_update(actor=actor, agent_id=agent.id, model_settings=settings_)


@transaction.atomic
def agent_delete(*, actor: Actor, agent_id: str) -> None:
    """Delete the agent, its messages, runs and steps. Blocks survive if other agents still use them.
    Owners and admins delete any agent, members the agents they created. Raises AgentNotFound,
    PermissionDenied."""
    agent = agent_get(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent, Action.AGENT_DELETE)
    with transaction.atomic():
        agent.delete()
        llm_services.llm_calls_forget_agents(organization_id=agent.organization_id, agent_ids=[agent_id])


def agent_reset_messages(*, actor: Actor, agent_id: str) -> Agent:
    """Empty the context window; every message stays in recall. Raises AgentNotFound, PermissionDenied."""
    agent = agent_get(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent, Action.AGENT_RESET_MESSAGES)
    return agent_update(actor=actor, agent_id=agent_id, message_ids=[])


# --- Agents: what is attached (tools, blocks, archives) and archival passages ---------------------------


@transaction.atomic
def agent_attach_tool(*, actor: Actor, agent_id: str, tool_id: str) -> Agent:
    """Attach an existing tool (idempotent). Raises AgentNotFound, NotFound for the tool, PermissionDenied."""
    agent = _lock_agent(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    tool = tool_get(actor=actor, tool_id=tool_id)
    AgentTool.objects.get_or_create(agent=agent, tool=tool)
    return agent


@transaction.atomic
def agent_detach_tool(*, actor: Actor, agent_id: str, tool_id: str) -> Agent:
    """Detach a tool; detaching one that is not attached is a no-op. Raises AgentNotFound, NotFound,
    PermissionDenied."""
    agent = _lock_agent(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    tool = tool_get(actor=actor, tool_id=tool_id)
    AgentTool.objects.filter(agent=agent, tool=tool).delete()
    return agent


@transaction.atomic
def agent_attach_block(*, actor: Actor, agent_id: str, block_id: str) -> Agent:
    """Attach an existing (possibly shared) block. Raises AgentNotFound, BlockNotFound, DuplicateBlockLabel,
    PermissionDenied."""
    agent = _lock_agent(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    _link_block(actor=actor, agent=agent, block_id=block_id)
    return agent


@transaction.atomic
def agent_detach_block(*, actor: Actor, agent_id: str, block_id: str) -> Agent:
    """Detach a block; the block itself survives. Raises AgentNotFound, BlockNotFound (also when the block
    exists but is not attached to this agent), PermissionDenied."""
    agent = _lock_agent(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    block = block_get(actor=actor, block_id=block_id)
    if not memory_services.block_detach_from_agent(agent_id=agent.id, block_id=block.id):
        raise BlockNotFound(f"Block with id '{block_id}' is not attached to agent '{agent_id}'")
    return agent


def agent_block_update_by_label(*, actor: Actor, agent_id: str, block_label: str, **fields: Any) -> Block:
    """Edit the agent's block with this label as the acting user (recorded in the block's history).

    Raises AgentNotFound, BlockNotFound, BlockTooLong, DuplicateBlockLabel.
    """
    block = agent_block_get_by_label(actor=actor, agent_id=agent_id, label=block_label)
    return memory_services.block_update(actor=actor, block_id=block.id, **fields)


@transaction.atomic
def agent_attach_archive(*, actor: Actor, agent_id: str, archive_id: str) -> Agent:
    """Attach an archive of the organisation to the agent (an archive may serve several agents): the
    agent's archival searches then cover it. Attaching twice is a no-op. Raises AgentNotFound,
    ArchiveNotFound, PermissionDenied (AGENT_CONFIGURE on the agent, ARCHIVE_WRITE on the archive)."""
    agent = _lock_agent(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    archival.archive_attach_agent(actor=actor, archive_id=archive_id, agent_id=agent.id)
    return agent


@transaction.atomic
def agent_detach_archive(*, actor: Actor, agent_id: str, archive_id: str) -> Agent:
    """Detach an archive from the agent; the archive and its passages stay. Detaching one that is not
    attached is a no-op (as in Letta). Raises AgentNotFound, ArchiveNotFound, PermissionDenied
    (AGENT_CONFIGURE on the agent, ARCHIVE_WRITE on the archive)."""
    agent = _lock_agent(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    archival.archive_detach_agent(actor=actor, archive_id=archive_id, agent_id=agent.id)
    return agent


def agent_passage_insert(
    *, actor: Actor, agent_id: str, text: str, tags: list[str] | None = None
) -> tuple[Archive, list[Passage]]:
    """Add a passage to the agent's archival memory as the acting person (embedded with the archive's
    model). Raises AgentNotFound, PermissionDenied, InvalidInput, EmbeddingModelMissing, LLM errors."""
    agent = agent_get(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    archive = archival.agent_archive(
        actor=actor, agent_id=agent.id, embedding_handle=agent.embedding, embedding_dim=agent.embedding_dim
    )
    passages = archival.passage_insert(
        actor=actor,
        archive=archive,
        texts=[text],
        tags=tags,
        embedding_handle=archive.embedding or agent.embedding,
        created_by_id=actor.user_id,
    )
    return archive, passages


def agent_passage_delete(*, actor: Actor, agent_id: str, passage_id: str) -> None:
    """Raises AgentNotFound, PermissionDenied, NotFound (a passage of none of the agent's archives)."""
    agent = agent_get(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    archive_ids = [archive.id for archive in archival.agent_archives(actor=actor, agent_id=agent.id)]
    archival.passage_delete(actor=actor, passage_id=passage_id, archive_ids=archive_ids)


# --- Runs: sending messages, approvals, cancelling, collecting the answer -------------------------------


@dataclass(frozen=True)
class MessageIn:
    """One input message (Letta's MessageCreate); content is a string or a list of content parts."""

    content: str | list[dict[str, Any]]
    role: str = "user"
    otid: str = ""
    name: str = ""
    sender_id: str = ""

    def parts(self) -> list[dict[str, Any]]:
        if isinstance(self.content, str):
            return [{"type": "text", "text": self.content}]
        return list(self.content)


def pending_approval(*, agent: Agent, conversation: Conversation | None) -> Message | None:
    """The approval request awaiting a decision: the last in-context message, when it is one."""
    ids = conversation.message_ids if conversation else agent.message_ids
    if not ids:
        return None
    last = Message.all_objects.filter(id=ids[-1]).first()
    return last if last is not None and last.is_approval_request else None


def pending_approval_for(*, agent: Agent, conversation: Conversation | None, request_id: str) -> Message:
    """The approval request `request_id`, while it is the one awaiting a decision (a decision is made on
    what a person saw). Raises ApprovalAlreadyDecided when it was decided meanwhile, or never pending."""
    pending = pending_approval(agent=agent, conversation=conversation)
    if pending is None or pending.id != request_id:
        raise ApprovalAlreadyDecided("This tool call was already decided. Reload to see what happened.")
    return pending


def _locked_with_last_message_role(
    model: type[Agent] | type[Conversation], actor: Actor, row_id: str, *, agent_id: str | None = None
) -> Any:
    """The agent's (or the agent's conversation's) row, locked FOR UPDATE, without its long message_ids,
    with `last_message_role`: the role of its last in-context message (None when it has none), and
    `org_max_steps_limit`: its organisation's Organization.max_steps_limit. None when the actor's
    organisation has no such row. Hand-written: every send takes it, and the ORM's compilation of the
    annotated query cost more than running it; prepared (prepared_cursor)."""
    reader = row_reader(model, "holder", frozenset({"message_ids"}))
    of_agent = " AND holder.agent_id = %s" if agent_id is not None else ""
    with prepared_cursor() as cursor:
        cursor.execute(
            f"SELECT {reader.columns}, (SELECT message.role FROM {Message._meta.db_table} AS message "
            "WHERE message.id = holder.message_ids[cardinality(holder.message_ids)]), "
            f"(SELECT org.max_steps_limit FROM {Organization._meta.db_table} AS org "
            "WHERE org.id = holder.organization_id) "
            f"FROM {model._meta.db_table} AS holder WHERE holder.id = %s AND holder.organization_id = %s"
            f"{of_agent} FOR UPDATE OF holder",
            [row_id, actor.organization_id, *([agent_id] if agent_id is not None else [])],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    holder = reader.instance(row)
    holder.last_message_role = row[reader.width]
    holder.org_max_steps_limit = row[reader.width + 1]
    return holder


DEFAULT_MAX_STEPS = 50
"""Letta's default `max_steps`: a run's step budget when the request names none (at most the limit)."""


def _step_budget(max_steps: int | None, org_limit: int | None) -> int:
    """The run's max_steps: the request's, which may not exceed the organisation's limit
    (Organization.max_steps_limit, else MAX_STEPS_LIMIT), or by default Letta's 50 within that limit."""
    limit = org_limit if org_limit is not None else settings.MAX_STEPS_LIMIT
    if max_steps is None:
        return min(DEFAULT_MAX_STEPS, limit)
    if max_steps > limit:
        raise MaxStepsExceeded(
            f"max_steps must be at most {limit} (this organisation's step limit), got {max_steps}"
        )
    return max_steps


def _validate_approvals(pending: Message, approvals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One decision per pending call, by tool-call id (or, for a single call, the request's message id, as
    Letta accepts). Raises InvalidInput with Letta's texts."""
    expected = [call["id"] for call in pending.tool_calls or []]
    normalized = []
    for item in approvals:
        call_id = item.get("tool_call_id") or ""
        if call_id == pending.id and len(expected) == 1:  # Letta accepts the message id for a single call
            call_id = expected[0]
        normalized.append({**item, "tool_call_id": call_id})
    given = [a["tool_call_id"] for a in normalized]
    if sorted(given) != sorted(expected):
        received = [item.get("tool_call_id") for item in approvals]
        raise InvalidInput(f"Invalid tool call IDs. Expected '{expected}', but received '{received}'.")
    for item in normalized:
        kind = item.get("type", "approval")
        if kind == "approval" and not isinstance(item.get("approve"), bool):
            raise InvalidInput(f"Approval for {item['tool_call_id']} needs 'approve': true or false")
        if kind == "tool" and item.get("status", "success") not in ("success", "error"):
            raise InvalidInput("A tool return's status must be 'success' or 'error'")
    return normalized


@transaction.atomic
def run_create(
    *,
    actor: Actor,
    agent_id: str,
    messages: list[MessageIn] | None = None,
    approvals: list[dict[str, Any]] | None = None,
    conversation_id: str | None = None,
    max_steps: int | None = None,
    client_tools: list[dict[str, Any]] | None = None,
    stream_tokens: bool = False,
    background: bool = False,
    callback_url: str = "",
    include_return_message_types: list[str] | None = None,
    approval_otid: str = "",
    override_model: str | None = None,
    override_system: str | None = None,
    client_skills: list[dict[str, str]] | None = None,
    include_compaction_messages: bool = False,
    return_logprobs: bool = False,
    top_logprobs: int | None = None,
    return_token_ids: bool = False,
) -> Run:
    """Persist the input (user messages and/or an approval decision) and a Run that will process it.

    The input is committed before any LLM call, so a crash never loses a user message; it joins the
    in-context messages when the run starts. The run's options (Letta's LettaRequest) travel in its
    request_config: `override_model` (a handle the organisation can use, for this run's LLM calls only),
    `override_system` (sent instead of the compiled system message), `client_skills` (listed in the
    system message's <available_skills>), `include_compaction_messages` (compaction answers as
    event_message + summary_message instead of Letta's older user_message), `return_logprobs` and
    `top_logprobs` (asked of the model at every call; kept with each step, the last call's in the answer).
    Raises PendingApproval (409) for a normal message while a call awaits approval, NoPendingApproval or
    InvalidInput for an approval that matches nothing, MaxStepsExceeded past the organisation's step
    limit (`max_steps` None: Letta's default, 50, within that limit), NotFound for an override_model
    the organisation cannot use.
    """
    messages = messages or []
    if not messages and approvals is None:
        raise InvalidInput("Send at least one message or an approval")
    if max_steps is not None and max_steps < 1:
        raise InvalidInput("max_steps must be at least 1")
    # The locked row without its (long) message_ids, with the role of its last in-context message: a
    # pending approval is looked up only when that is one (a send is one query here, not two).
    agent = _locked_with_last_message_role(Agent, actor, agent_id)
    if agent is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    max_steps = _step_budget(max_steps, agent.org_max_steps_limit)
    conversation = None
    if conversation_id:
        conversation = _locked_with_last_message_role(Conversation, actor, conversation_id, agent_id=agent.id)
        if conversation is None:
            raise NotFound(f"Conversation with id '{conversation_id}' not found")
    holder = conversation or agent
    pending = (
        pending_approval(agent=agent, conversation=conversation)
        if holder.last_message_role == Message.Role.APPROVAL
        else None
    )
    if pending is not None and approvals is None:
        raise PendingApproval(
            "Cannot send a new message: a tool call is awaiting approval. Approve or deny it first.",
            pending_request_id=pending.id,
        )
    if approvals is not None and pending is None:
        raise NoPendingApproval(
            "Cannot process approval response: No tool call is currently awaiting approval. "
            "Please send a regular message to interact with the agent."
        )
    if approvals and any(item.get("type", "approval") == "approval" for item in approvals):
        # Approving runs the agent's tool with its secrets: the decision is its creator's (or an admin's).
        # Returns of client-side tools (type "tool") are the caller's own.
        require_agent_permission(actor, agent, Action.APPROVAL_RESPOND)
    for message in messages:
        if message.role not in ("user", "system", "assistant"):
            raise InvalidInput(f"Unknown message role {message.role!r}; expected user, system or assistant")
    if override_model:
        try:
            resolve_model(override_model, organization_id=actor.organization_id)
        except UnknownModelHandle as exc:
            raise NotFound(f"Model '{override_model}' not found or not accessible") from exc
    options = {
        "override_model": override_model or None,
        "override_system": override_system,
        "client_skills": client_skills or None,
        "include_compaction_messages": include_compaction_messages or None,
        "return_logprobs": return_logprobs or None,
        "top_logprobs": top_logprobs if return_logprobs else None,
        "return_token_ids": return_token_ids or None,  # each call's output token ids (LlmCall), as `turns`
    }

    run = Run(
        organization_id=actor.organization_id,
        agent=agent,
        conversation=conversation,
        background=background,
        callback_url=callback_url,
        created_by_id=actor.user_id,
        request_config={
            "max_steps": max_steps,
            "client_tools": client_tools or [],
            "stream_tokens": stream_tokens,
            "include_return_message_types": sorted(include_return_message_types)
            if include_return_message_types
            else None,
            **{name: value for name, value in options.items() if value is not None},
        },
    )
    rows = []
    if approvals is not None and pending is not None:
        response = Message(
            organization_id=actor.organization_id,
            agent=agent,
            conversation=conversation,
            run=run,
            role=Message.Role.APPROVAL,
            approvals=_validate_approvals(pending, approvals),
            otid=approval_otid,
        )
        rows.append(response)
        run.request_config["approval_response_id"] = response.id
    for message in messages:
        parts = message.parts()
        rows.append(
            Message(
                organization_id=actor.organization_id,
                agent=agent,
                conversation=conversation,
                run=run,
                role=message.role,
                content=parts,
                text=text_of(parts),
                otid=message.otid,
                name=message.name,
                sender_id=message.sender_id,
            )
        )
    # The input enters the context window when its run starts (runs of one conversation queue up, and
    # each must see only what came before it); until then it is stored, and searchable, like any message.
    # The run and its input in one statement.
    insert_all((Run, [run]), (Message, rows))
    return run


def agent_send_message(
    *, actor: Actor, agent_id: str, sink: EventSink | None = None, **inputs: Any
) -> TurnResult:
    """Persist the input and process it now, in this process (the workers issue moves execution to Celery;
    see run_create for the input and its errors)."""
    run = run_create(actor=actor, agent_id=agent_id, **inputs)
    result = _execute_when_its_turn(
        lambda: execute_run(run.id, sink=sink, agent_id=run.agent_id, conversation_id=run.conversation_id)
    )
    if result is None:  # claimed by someone else in between: report its current state
        run.refresh_from_db()
        return TurnResult(run=run, messages=[], stop_reason=run.stop_reason, usage=Usage())
    return result


def _execute_when_its_turn(
    execute: Callable[[], TurnResult | None], timeout_s: float = 600
) -> TurnResult | None:
    """In-process execution waits (instead of a worker's retry) while an earlier run of the conversation
    is unfinished."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return execute()
        except RunDeferred:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@transaction.atomic
def run_cancel(*, actor: Actor, run_id: str) -> Run:
    """Ask a run to stop at its next safe point (between steps; within about a second during an LLM
    call); what it produced so far is kept."""
    run = Run.objects.for_actor(actor).filter(id=run_id).first()
    if run is None:
        raise NotFound(f"Run with id '{run_id}' not found")
    runs = Run.objects.for_actor(actor).filter(id=run_id)
    cancelled = dict(status=Run.Status.CANCELLED, stop_reason=StopReason.CANCELLED)
    if runs.filter(status=Run.Status.CREATED).update(**cancelled, completed_at=timezone.now()):
        # No worker will ever claim it, so none will close its stream: close it here, or a client
        # following the run (SSE, the ADE's WebSocket) would wait for an end that never comes.
        end_stream(run_id, status=Run.Status.CANCELLED, stop_reason=StopReason.CANCELLED)
    elif runs.filter(status=Run.Status.RUNNING).update(**cancelled):
        # Between steps its executor reads the status; an LLM call it has in flight checks this signal
        # and ends within about a second. Sent on commit: it never says more than the database does.
        transaction.on_commit(lambda: request_cancel(run_id))
    run.refresh_from_db()
    return run


def run_submit(run: Run) -> None:
    """Have the run executed once the current transaction commits (by a worker, or in this process
    when RUN_EXECUTOR=in_process). Its events arrive in the run's stream (apps.streams.events)."""
    if settings.RUN_EXECUTOR == "in_process":
        transaction.on_commit(
            lambda: _execute_when_its_turn(
                lambda: execute_run_streamed(
                    run.id, agent_id=run.agent_id, conversation_id=run.conversation_id
                )
            )
        )
    else:
        transaction.on_commit(lambda: enqueue_run(run.id, run.agent_id, run.conversation_id))


@dataclass
class CollectedRun:
    run: Run
    messages: list[dict[str, Any]]
    stop_reason: dict[str, Any] | None
    usage: dict[str, Any] | None
    finished: bool


COLLECT_POLL_MS = 200
COLLECT_DB_CHECK_EVERY = 5
"""While the stream is silent, the run's status is read from the database every 5 polls (1 s)."""
COLLECT_TERMINAL_GRACE_POLLS = 2
"""Silent polls to go on reading after the database says the run ended: a worker commits the run's end
before it appends stop_reason, usage and run_end, and the events it appended just before the commit may
arrive while this reader was between its stream read and its database check."""


def run_collect(
    *,
    actor: Actor,
    run_id: str,
    after: str = "0-0",
    timeout_s: float = 55.0,
    run: Run | None = None,
    reread: bool = True,
) -> CollectedRun:
    """Wait for a run's events (from `after`) until it ends or the timeout; gather its messages.

    A run that is over in the database but whose stream has nothing (expired, or its worker died before
    writing) is answered from its stored messages and steps.
    `run`: the Run when the caller has just read or created it (a send), so it is not read first.
    `reread=False`: a run that ended with its end event and did not fail is not read again at the end
    (a pool checkout and a query between the end and the answer): the returned run's status and stop
    reason are the event's, its other fields as they were. A cancel that lost the race with the loop's
    own end is "cancelled" in both (the loop reports the cancel). A failed run is always read again, for
    its error."""
    if run is None:
        run = Run.objects.for_actor(actor).filter(id=run_id).first()
    if run is None:
        raise NotFound(f"Run with id '{run_id}' not found")
    if run.status in TERMINAL_RUN_STATUSES and not read_events(run_id, after=after, count=1):
        return _collected_from_database(actor=actor, run=run)
    messages: list[dict[str, Any]] = []
    stop_reason = usage = None
    finished = False
    end: dict[str, Any] = {}
    seen_events = False
    cursor = after

    def terminal_in_db() -> bool:
        status = Run.objects.for_actor(actor).filter(id=run_id).values_list("status", flat=True).first()
        release_pooled_connection()
        return status in TERMINAL_RUN_STATUSES

    idle_checks = terminal_polls = 0

    def on_idle() -> bool:
        # A dead worker never writes its end event: end from the database, after a grace (see above).
        nonlocal idle_checks, terminal_polls
        idle_checks += 1
        if not terminal_polls and idle_checks % COLLECT_DB_CHECK_EVERY:
            return False
        if not terminal_in_db():
            return False
        terminal_polls += 1
        return terminal_polls > COLLECT_TERMINAL_GRACE_POLLS

    def take(event: StreamEvent) -> None:
        nonlocal stop_reason, usage, finished, seen_events, cursor, end
        seen_events, cursor = True, event.cursor
        kind = event.data.get("message_type")
        if kind == "stop_reason":
            stop_reason = event.data
        elif kind == "usage_statistics":
            usage = event.data
        elif kind == "run_end":
            finished, end = True, event.data
        elif kind != "delta":
            messages.append(event.data)

    release_pooled_connection()
    events = follow_events(run_id, after=after, timeout_s=timeout_s, poll_ms=COLLECT_POLL_MS, on_idle=on_idle)
    for event in events:
        if event is not None:
            take(event)
    if not finished:  # ended from the database or by the timeout: whatever arrived meanwhile
        for event in read_events(run_id, after=cursor):
            take(event)
    if not reread and finished and end.get("status") in (Run.Status.COMPLETED, Run.Status.CANCELLED):
        # Saves taking a pooled connection (a health check and a query) between the end and the answer.
        run.status, run.stop_reason = end["status"], end.get("stop_reason") or run.stop_reason
    else:
        run.refresh_from_db()
    if not seen_events and run.status in TERMINAL_RUN_STATUSES:
        logger.warning("agents.run_collect_from_database", extra={"run_id": run_id})
        return _collected_from_database(actor=actor, run=run)
    return CollectedRun(
        run=run,
        messages=messages,
        stop_reason=stop_reason,
        usage=usage,
        finished=finished or run.status in TERMINAL_RUN_STATUSES,
    )


def _collected_from_database(*, actor: Actor, run: Run) -> CollectedRun:
    """What a finished run produced, from its stored messages and steps (its event stream has nothing)."""
    produced = run_produced_messages(actor=actor, run_id=run.id)
    return CollectedRun(
        run=run,
        messages=[letta for message in produced for letta in to_letta_messages(message)],
        stop_reason=StopReasonEvent(run_stop_reason(run)).event(),
        usage=run_usage_event(actor=actor, run=run),
        finished=True,
    )


# --- Steps ----------------------------------------------------------------------------------------------


@transaction.atomic
def step_set_feedback(
    *, actor: Actor, step_id: str, feedback: Any = UNSET, tags: Any = UNSET, note: Any = UNSET
) -> Step:
    """Record or clear (None) a person's thumbs up/down on a step; tags, when given, replace the step's;
    `note` (None or "" clears it) is their words with it (at most FEEDBACK_NOTE_MAX_CHARS).

    Raises NotFound, also for another organisation's step; InvalidInput for a note too long."""
    step = Step.objects.for_actor(actor).select_for_update().filter(id=step_id).first()
    if step is None:
        raise NotFound(f"Step with id '{step_id}' not found")
    fields = ["updated_at"]
    if feedback is not UNSET:
        if feedback not in (None, "", Step.Feedback.POSITIVE, Step.Feedback.NEGATIVE):
            raise InvalidInput("feedback must be 'positive', 'negative' or null")
        step.feedback = feedback or ""
        fields.append("feedback")
    if tags is not UNSET:
        step.tags = sorted(set(tags or []))
        fields.append("tags")
    if note is not UNSET:
        if note and len(note) > FEEDBACK_NOTE_MAX_CHARS:
            raise InvalidInput(f"note: at most {FEEDBACK_NOTE_MAX_CHARS} characters")
        step.feedback_note = note or ""
        fields.append("feedback_note")
    step.save(update_fields=fields)
    return step


# --- Conversations and threads: create, update, delete, fork, compact, recompile ------------------------


def conversation_create(*, actor: Actor, agent_id: str, summary: str = "") -> Conversation:
    """A new thread of the agent: its own messages, the agent's shared memory blocks."""
    agent = agent_get(actor=actor, agent_id=agent_id)
    conversation = Conversation.objects.for_actor(actor).create(
        agent=agent, summary=summary, created_by_id=actor.user_id
    )
    store_thread_system_message(actor=actor, agent=agent, conversation_id=conversation.id)
    return conversation


CONVERSATION_FIELDS_NOT_STORED = ("model", "model_settings", "last_message_at")
"""Fields of Letta's UpdateConversation this server keeps no column for: a value is refused rather than
dropped unseen (a conversation always runs with its agent's model). Null changes nothing, as in Letta."""


def _agent_row(*, actor: Actor, agent_id: str) -> Agent:
    """The agent without its prefetched relations. Raises AgentNotFound (also another organisation's)."""
    agent = Agent.objects.for_actor(actor).filter(id=agent_id).first()
    if agent is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    return agent


def require_conversation_permission(actor: Actor, conversation: Conversation, agent: Agent) -> None:
    """The role matrix for a conversation: its creator, its agent's creator, owners and admins change it.
    Raises PermissionDenied (403 with the reason)."""
    permissions.require(
        actor,
        Action.CONVERSATION_WRITE,
        creator_id=(conversation.created_by_id, agent.created_by_id),
        subject=f"conversation '{conversation.id}'",
    )


def _writable_conversation(*, actor: Actor, conversation_id: str) -> Conversation:
    """The conversation, locked FOR UPDATE, once the actor may change it (call inside a transaction).
    Raises NotFound (also another organisation's), PermissionDenied."""
    conversation = (
        Conversation.objects.for_actor(actor)
        .select_for_update(of=("self",))
        .select_related("agent")
        .filter(id=conversation_id)
        .first()
    )
    if conversation is None:
        raise NotFound(f"Conversation with id '{conversation_id}' not found")
    require_conversation_permission(actor, conversation, conversation.agent)
    return conversation


@transaction.atomic
def conversation_update(
    *, actor: Actor, conversation_id: str, summary: str | None = UNSET, **not_stored: Any
) -> Conversation:
    """Rename the conversation (its `summary`; None keeps it, as in Letta). `not_stored`: other fields of
    Letta's UpdateConversation (CONVERSATION_FIELDS_NOT_STORED), refused unless None. Raises NotFound,
    PermissionDenied, InvalidInput; nothing is written when it raises."""
    conversation = _writable_conversation(actor=actor, conversation_id=conversation_id)
    refused = sorted(name for name, value in not_stored.items() if value is not None)
    if refused:
        raise InvalidInput(
            f"Conversations here run with their agent's model and store no {', '.join(refused)}: "
            "leave it out (or null), or change the agent"
        )
    if summary is not UNSET and summary is not None:
        conversation.summary = summary
        conversation.save(update_fields=["summary", "updated_at"])
    return conversation


@transaction.atomic
def conversation_delete(*, actor: Actor, conversation_id: str) -> None:
    """Delete the conversation with its runs and the messages only it has: a message that another
    conversation (a fork) still has in context is handed over to it. Raises NotFound, PermissionDenied,
    Conflict (a run of the conversation is queued or executing: cancel it first)."""
    conversation = _writable_conversation(actor=actor, conversation_id=conversation_id)
    runs = Run.objects.for_actor(actor).filter(conversation=conversation)
    if runs.filter(status__in=ACTIVE_RUN_STATUSES).exists():
        raise Conflict(
            f"Conversation '{conversation.id}' has a run in progress: cancel it or wait for it to finish "
            "before deleting the conversation",
            code="CONVERSATION_BUSY",
        )
    _hand_shared_messages_over(actor=actor, conversation=conversation)
    conversation.delete()


def _hand_shared_messages_over(*, actor: Actor, conversation: Conversation) -> None:
    """Move the conversation's messages that other conversations of its agent have in context (a fork
    shares its source's messages) to the oldest such conversation, so deleting this one keeps them.

    Their run link is cleared (that run goes with this conversation). The stored-message counts are
    adjusted here: the triggers of migration 0005 count inserts and deletes only. One statement."""
    messages, conversations = Message._meta.db_table, Conversation._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH shared AS (
                SELECT DISTINCT ON (held.message_id) held.message_id, held.heir
                FROM (
                    SELECT c.id AS heir, c.created_at, unnest(c.message_ids) AS message_id
                    FROM {conversations} AS c
                    WHERE c.agent_id = %(agent)s AND c.organization_id = %(org)s AND c.id <> %(id)s
                ) AS held
                JOIN {messages} AS m ON m.id = held.message_id AND m.conversation_id = %(id)s
                ORDER BY held.message_id, held.created_at, held.heir
            ), moved AS (
                UPDATE {messages} AS m SET conversation_id = shared.heir, run_id = NULL
                FROM shared WHERE m.id = shared.message_id
                RETURNING shared.heir
            )
            UPDATE {conversations} AS c SET message_count = c.message_count + counted.n
            FROM (SELECT heir, count(*) AS n FROM moved GROUP BY heir) AS counted
            WHERE c.id = counted.heir
            """,
            {"agent": conversation.agent_id, "org": actor.organization_id, "id": conversation.id},
        )


@transaction.atomic
def conversation_fork(*, actor: Actor, agent_id: str, conversation_id: str | None) -> Conversation:
    """A new conversation of the agent whose context is the source thread's (a conversation, or the
    agent's default thread when `conversation_id` is None): the same in-context messages, shared rather
    than copied, minus system messages (the loop's alerts); the fork gets its own stored system message,
    compiled now, as every new thread. Raises AgentNotFound, NotFound (a conversation of
    another agent), PermissionDenied (CONVERSATION_WRITE on the source)."""
    agent = _agent_row(actor=actor, agent_id=agent_id)
    if conversation_id is None:
        source_ids = agent.message_ids
        require_agent_permission(actor, agent, Action.CONVERSATION_WRITE)
    else:
        source = Conversation.objects.for_actor(actor).filter(id=conversation_id, agent=agent).first()
        if source is None:
            raise NotFound(f"Conversation with id '{conversation_id}' not found")
        require_conversation_permission(actor, source, agent)
        source_ids = source.message_ids
    system = set(
        Message.objects.for_actor(actor)
        .filter(id__in=source_ids, role=Message.Role.SYSTEM)
        .values_list("id", flat=True)
    )
    fork = Conversation.objects.for_actor(actor).create(
        agent=agent,
        message_ids=[message_id for message_id in source_ids if message_id not in system],
        created_by_id=actor.user_id,
    )
    store_thread_system_message(actor=actor, agent=agent, conversation_id=fork.id)
    return fork


def _compaction_choice(
    agent_settings: dict[str, Any] | None, requested: dict[str, Any] | None
) -> tuple[str, str | None]:
    """(mode, prompt) as Letta merges them: the request's fields over the agent's compaction_settings; a
    mode the request changes without a prompt of its own takes that mode's default prompt (None here)."""
    agent_settings, requested = agent_settings or {}, requested or {}
    merged = {**agent_settings, **requested}
    mode = merged.get("mode") or "sliding_window"
    prompt = merged.get("prompt")
    if "mode" in requested and "prompt" not in requested and requested["mode"] != agent_settings.get("mode"):
        prompt = None
    return str(mode), str(prompt) if prompt else None


def conversation_compact(
    *,
    actor: Actor,
    agent_id: str,
    conversation_id: str | None,
    compaction_settings: dict[str, Any] | None = None,
) -> Compaction:
    """Summarise a thread's in-context messages now (apps.agents.loop.runner.compact_thread): a
    conversation (CONVERSATION_WRITE), or the agent's default thread when `conversation_id` is None
    (compacting the agent's messages: AGENT_CONFIGURE). Raises AgentNotFound, NotFound, PermissionDenied,
    InvalidInput (nothing to summarise, or it would not reduce the count), Conflict (a run executes),
    LLM errors."""
    agent = _agent_row(actor=actor, agent_id=agent_id)
    if conversation_id is None:
        require_agent_permission(actor, agent)
    else:
        conversation = Conversation.objects.for_actor(actor).filter(id=conversation_id, agent=agent).first()
        if conversation is None:
            raise NotFound(f"Conversation with id '{conversation_id}' not found")
        require_conversation_permission(actor, conversation, agent)
    mode, prompt = _compaction_choice(agent.compaction_settings, compaction_settings)
    return compact_thread(
        organization_id=actor.organization_id,
        agent_id=agent.id,
        conversation_id=conversation_id,
        mode=mode,
        prompt=prompt,
    )


def agent_summarize(
    *, actor: Actor, agent_id: str, compaction_settings: dict[str, Any] | None = None
) -> Compaction:
    """Compact the agent's default thread (POST /v1/agents/{id}/summarize); when its context holds nothing
    but system messages and summaries, nothing is done and the current summary is returned, as in Letta.
    Raises AgentNotFound, PermissionDenied (AGENT_CONFIGURE), InvalidInput, Conflict, LLM errors."""
    agent = _agent_row(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    found = {
        m.id: m
        for m in Message.objects.for_actor(actor).filter(id__in=agent.message_ids).only("id", "role", "text")
    }
    in_context = [found[message_id] for message_id in agent.message_ids if message_id in found]
    quiet = (Message.Role.SYSTEM, Message.Role.SUMMARY)
    if all(m.role in quiet for m in in_context):
        summaries = [m for m in in_context if m.role == Message.Role.SUMMARY]
        summary = summary_from_message_text(summaries[0].text) if summaries else ""
        return Compaction(summary=summary, messages_before=len(in_context), messages_after=len(in_context))
    return conversation_compact(
        actor=actor, agent_id=agent.id, conversation_id=None, compaction_settings=compaction_settings
    )


def thread_recompile(
    *, actor: Actor, agent_id: str, conversation_id: str | None = None, dry_run: bool = False
) -> str:
    """The thread's system message compiled now from current memory (Letta's recompile), stored as the
    thread's system message unless `dry_run`. The loop compiles it afresh for every LLM call anyway, so
    this changes only what is listed. Raises AgentNotFound, NotFound, PermissionDenied (AGENT_USE),
    InvalidInput (the agent's model is unusable)."""
    agent = _agent_row(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent, Action.AGENT_USE)
    text = thread_system_message(actor=actor, agent_id=agent.id, conversation_id=conversation_id)
    if not dry_run:
        _save_system_message(agent, conversation_id, text)
    return text


# --- Outside a turn: generating a completion, running an attached tool ----------------------------------


GENERATE_DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
STRUCTURED_OUTPUT_TOOL = "structured_output"


@dataclass(frozen=True)
class Generation:
    """One completion of POST /v1/agents/{id}/generate; `model` is the model's name (not its handle)."""

    content: str
    model: str
    prompt_tokens: int
    completion_tokens: int


def agent_generate(
    *,
    actor: Actor,
    agent_id: str,
    prompt: str,
    system_prompt: str | None = None,
    override_model: str | None = None,
    response_schema: dict[str, Any] | None = None,
) -> Generation:
    """One completion of `prompt` by the agent's model (or `override_model`, a handle the organisation can
    use) with `system_prompt` or a minimal one: no memory, no tools, nothing stored or changed. With a
    `response_schema` the model is made to answer through one tool call whose arguments are the content.
    The call is bounded by LLM_CALL_DEADLINE, transient failures retried. Raises AgentNotFound,
    PermissionDenied (AGENT_USE), InvalidInput (a blank prompt; the agent's model unusable), NotFound (an
    override_model the organisation cannot use), LLM errors."""
    if not prompt.strip():
        raise InvalidInput("prompt cannot be empty or whitespace-only")
    agent = _agent_row(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent, Action.AGENT_USE)
    try:
        target = resolve_model(
            override_model or agent.model,
            organization_id=actor.organization_id,
            context_window_limit=None if override_model else agent.context_window_limit,
        )
    except UnknownModelHandle as exc:
        if override_model:
            raise NotFound(f"Model '{override_model}' not found or not accessible") from exc
        raise
    tools = tool_choice = None
    if response_schema is not None:
        properties = response_schema.get("properties") or {}
        tools = [
            {
                "type": "function",
                "function": {
                    "name": STRUCTURED_OUTPUT_TOOL,
                    "description": "Returns a structured response matching the requested schema.",
                    "parameters": {
                        "type": "object",
                        "properties": properties,
                        "required": response_schema.get("required", list(properties)),
                    },
                },
            }
        ]
        tool_choice = {"type": "function", "function": {"name": STRUCTURED_OUTPUT_TOOL}}
    request = llm_client.ChatRequest(
        messages=[
            {"role": "system", "content": system_prompt or GENERATE_DEFAULT_SYSTEM_PROMPT},
            {"role": "user", "content": prompt},
        ],
        tools=tools,
        tool_choice=tool_choice,
        temperature=None if override_model else agent.temperature,
        max_tokens=None if override_model else agent.max_tokens,
    )
    response = llm_client.complete(target, request, bounds=CallBounds.from_settings())
    if response_schema is not None and response.tool_calls:
        content = response.tool_calls[0].arguments
    else:
        content = response.content or ""
    return Generation(
        content=content,
        model=target.litellm_model.split("/", 1)[-1],
        prompt_tokens=response.prompt_tokens,
        completion_tokens=response.completion_tokens,
    )


def agent_tool_run(*, actor: Actor, agent_id: str, tool_name: str, args: dict[str, Any]) -> Any:
    """Run the agent's attached tool `tool_name` on `args` as a turn would (Letta's run_tool_for_agent):
    a built-in in-process on the agent's memory, an MCP tool on its server, a custom tool in the sandbox
    with the agent's secrets. Returns the ToolResult, cut to the tool's return_char_limit; a failing
    tool is an error result, never raised.

    Raises AgentNotFound, NotFound (no tool of that name attached), PermissionDenied (AGENT_CONFIGURE:
    a built-in may edit the agent's memory, a custom tool reads its secrets).
    """
    import dataclasses

    from apps.agents.builtin_tools import execute_builtin  # imports the memory layer; as in the runner
    from apps.agents.custom_tools import run_custom_tool
    from apps.tools.execution import ToolContext, ToolResult, cut_to_limit
    from apps.tools.mcp import run_mcp_tool

    agent = agent_get(actor=actor, agent_id=agent_id)
    require_agent_permission(actor, agent)
    tool = next((t for t in agent.tools.all() if t.name == tool_name), None)
    if tool is None:
        raise NotFound(f"Tool '{tool_name}' not found or not attached to agent '{agent_id}'")
    ctx = ToolContext(
        actor=Actor.system(agent.organization_id),  # what the loop runs tools as
        agent_id=agent.id,
        embedding_handle=agent.embedding,
        timezone=agent.timezone or "UTC",
    )
    if tool.tool_type.startswith("letta_"):
        result = execute_builtin(tool.name, args, ctx, agent=agent)
    elif tool.tool_type == Tool.Type.EXTERNAL_MCP:
        result = run_mcp_tool(tool, args, ctx)
    elif tool.tool_type == Tool.Type.CLIENT:
        result = ToolResult.error(
            f"Tool '{tool.name}' is a client-side tool: the caller runs it, not the server."
        )
    else:
        result = run_custom_tool(tool, args, ctx)
    return dataclasses.replace(
        result, return_value=cut_to_limit(result.return_value, tool.return_char_limit), edited_block=None
    )
