from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction

from apps.agents.errors import AgentNotFound, InvalidAgentName, NoPendingApproval, PendingApproval
from apps.agents.loop.convert import text_of
from apps.agents.loop.events import EventSink
from apps.agents.loop.runner import TurnResult, Usage, execute_run, execute_run_streamed
from apps.agents.models import (
    Agent,
    AgentSecret,
    AgentTool,
    AgentType,
    Conversation,
    Message,
    Run,
    StopReason,
)
from apps.agents.selectors import agent_get
from apps.agents.tasks import execute_run_task
from apps.core.actor import Actor
from apps.core.errors import InvalidInput, NotFound
from apps.memory import services as memory_services
from apps.memory.errors import DuplicateBlockLabel
from apps.memory.models import Block
from apps.memory.selectors import block_get
from apps.streams.events import follow_events
from apps.tools.builtin import BUILTIN_TOOLS, base_tool_names
from apps.tools.models import Tool
from apps.tools.rules import dump_tool_rules, parse_tool_rules
from apps.tools.selectors import tools_by_name
from apps.tools.services import tool_upsert_builtins

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
) -> Agent:
    """Create an agent with new and existing blocks, tools and validated tool rules.

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
        agent_attach_block(actor=actor, agent=agent, block_id=block_id)
    for tool_id in tool_ids or []:
        agent_attach_tool(actor=actor, agent=agent, tool_id=tool_id)
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
    return agent


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


def agent_attach_block(*, actor: Actor, agent: Agent, block_id: str) -> Block:
    """Raises BlockNotFound (also for other organisations' blocks) and DuplicateBlockLabel."""
    block = block_get(actor=actor, block_id=block_id)
    memory_services.block_attach_to_agent(actor=actor, agent_id=agent.id, block=block)
    return block


def agent_detach_block(*, actor: Actor, agent_id: str, block_id: str) -> None:
    agent = agent_get(actor=actor, agent_id=agent_id)
    memory_services.block_detach_from_agent(agent_id=agent.id, block_id=block_id)


def agent_attach_tool(*, actor: Actor, agent: Agent, tool_id: str) -> Tool:
    tool = Tool.objects.for_actor(actor).filter(id=tool_id).first()
    if tool is None:
        raise InvalidInput(f"Tool with id '{tool_id}' not found")
    AgentTool.objects.get_or_create(agent=agent, tool=tool)
    return tool


@transaction.atomic
def agent_set_tool_rules(*, actor: Actor, agent_id: str, tool_rules: list[Any]) -> Agent:
    """Replace the agent's tool rules. Raises ToolRuleError with a readable message on a bad rule."""
    agent = agent_get(actor=actor, agent_id=agent_id)
    agent.tool_rules = dump_tool_rules(parse_tool_rules(tool_rules))
    agent.last_updated_by_id = actor.user_id
    agent.save(update_fields=["tool_rules", "last_updated_by", "updated_at"])
    return agent


@transaction.atomic
def agent_delete(*, actor: Actor, agent_id: str) -> None:
    """Delete the agent, its messages, runs and steps. Blocks survive if other agents still use them."""
    agent = agent_get(actor=actor, agent_id=agent_id)
    agent.delete()


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
    if last is not None and last.role == Message.Role.APPROVAL and last.tool_calls:
        return last
    return None


def _validate_approvals(pending: Message, approvals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    expected = {call["id"] for call in pending.tool_calls or []}
    normalized = []
    for item in approvals:
        call_id = item.get("tool_call_id") or ""
        if call_id == pending.id and len(expected) == 1:  # Letta accepts the message id for a single call
            call_id = next(iter(expected))
        normalized.append({**item, "tool_call_id": call_id})
    given = [a["tool_call_id"] for a in normalized]
    if sorted(given) != sorted(expected):
        raise InvalidInput(
            f"Invalid tool call IDs: expected a decision for each of {sorted(expected)}, got {given}"
        )
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
    max_steps: int = 50,
    client_tools: list[dict[str, Any]] | None = None,
    stream_tokens: bool = False,
    background: bool = False,
) -> Run:
    """Persist the input (user messages and/or an approval decision) and a Run that will process it.

    The input is committed before any LLM call, so a crash never loses a user message.
    Raises PendingApproval (409) for a normal message while a call awaits approval, NoPendingApproval or
    InvalidInput for an approval that matches nothing.
    """
    messages = messages or []
    if not messages and approvals is None:
        raise InvalidInput("Send at least one message or an approval")
    if max_steps < 1:
        raise InvalidInput("max_steps must be at least 1")
    agent = Agent.objects.for_actor(actor).select_for_update().filter(id=agent_id).first()
    if agent is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    conversation = None
    if conversation_id:
        conversation = (
            Conversation.objects.for_actor(actor)
            .select_for_update()
            .filter(id=conversation_id, agent=agent)
            .first()
        )
        if conversation is None:
            raise NotFound(f"Conversation with id '{conversation_id}' not found")
    pending = pending_approval(agent=agent, conversation=conversation)
    if pending is not None and approvals is None:
        raise PendingApproval(
            "Cannot send a new message: a tool call is awaiting approval. Approve or deny it first.",
            pending_request_id=pending.id,
        )
    if approvals is not None and pending is None:
        raise NoPendingApproval("No tool call is awaiting approval")
    for message in messages:
        if message.role not in ("user", "system", "assistant"):
            raise InvalidInput(f"Unknown message role {message.role!r}; expected user, system or assistant")

    run = Run.objects.for_actor(actor).create(
        agent=agent,
        conversation=conversation,
        background=background,
        created_by_id=actor.user_id,
        request_config={
            "max_steps": max_steps,
            "client_tools": client_tools or [],
            "stream_tokens": stream_tokens,
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
        )
        rows.append(response)
        run.request_config["approval_response_id"] = response.id
        run.save(update_fields=["request_config"])
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
    Message.all_objects.bulk_create(rows)
    ids = [m.id for m in rows]
    if conversation is not None:
        conversation.message_ids = [*conversation.message_ids, *ids]
        conversation.save(update_fields=["message_ids", "updated_at"])
    else:
        agent.message_ids = [*agent.message_ids, *ids]
        agent.save(update_fields=["message_ids", "updated_at"])
    return run


def agent_send_message(
    *, actor: Actor, agent_id: str, sink: EventSink | None = None, **inputs: Any
) -> TurnResult:
    """Persist the input and process it now, in this process (the workers issue moves execution to Celery;
    see run_create for the input and its errors)."""
    run = run_create(actor=actor, agent_id=agent_id, **inputs)
    result = execute_run(run.id, sink=sink)
    if result is None:  # claimed by someone else in between: report its current state
        run.refresh_from_db()
        return TurnResult(run=run, messages=[], stop_reason=run.stop_reason, usage=Usage())
    return result


@transaction.atomic
def run_cancel(*, actor: Actor, run_id: str) -> Run:
    """Ask a run to stop at its next safe point; what it produced so far is kept."""
    run = Run.objects.for_actor(actor).filter(id=run_id).first()
    if run is None:
        raise NotFound(f"Run with id '{run_id}' not found")
    Run.objects.for_actor(actor).filter(
        id=run_id, status__in=[Run.Status.CREATED, Run.Status.RUNNING]
    ).update(status=Run.Status.CANCELLED, stop_reason=StopReason.CANCELLED)
    run.refresh_from_db()
    return run


def conversation_create(*, actor: Actor, agent_id: str, summary: str = "") -> Conversation:
    """A new thread of the agent: its own messages, the agent's shared memory blocks."""
    agent = agent_get(actor=actor, agent_id=agent_id)
    return Conversation.objects.for_actor(actor).create(
        agent=agent, summary=summary, created_by_id=actor.user_id
    )


def run_submit(run: Run) -> None:
    """Have the run executed once the current transaction commits (by a worker, or in this process
    when RUN_EXECUTOR=in_process). Its events arrive in the run's stream (apps.streams.events)."""
    if settings.RUN_EXECUTOR == "in_process":
        transaction.on_commit(lambda: execute_run_streamed(run.id))
    else:
        transaction.on_commit(lambda: execute_run_task.delay(run.id))


@dataclass
class CollectedRun:
    run: Run
    messages: list[dict[str, Any]]
    stop_reason: dict[str, Any] | None
    usage: dict[str, Any] | None
    finished: bool


def run_collect(*, actor: Actor, run_id: str, after: str = "0-0", timeout_s: float = 55.0) -> CollectedRun:
    """Wait for a run's events (from `after`) until it ends or the timeout; gather its messages."""
    run = Run.objects.for_actor(actor).filter(id=run_id).first()
    if run is None:
        raise NotFound(f"Run with id '{run_id}' not found")
    messages: list[dict[str, Any]] = []
    stop_reason = usage = None
    finished = False

    def terminal_in_db() -> bool:
        status = Run.objects.for_actor(actor).filter(id=run_id).values_list("status", flat=True).first()
        return status in (Run.Status.COMPLETED, Run.Status.FAILED, Run.Status.CANCELLED)

    idle_checks = 0

    def on_idle() -> bool:
        nonlocal idle_checks
        idle_checks += 1
        return idle_checks % 5 == 0 and terminal_in_db()  # a dead worker never writes its end event

    for event in follow_events(run_id, after=after, timeout_s=timeout_s, poll_ms=200, on_idle=on_idle):
        if event is None:
            continue
        kind = event.data.get("message_type")
        if kind == "stop_reason":
            stop_reason = event.data
        elif kind == "usage_statistics":
            usage = event.data
        elif kind == "run_end":
            finished = True
        elif kind != "delta":
            messages.append(event.data)
    run.refresh_from_db()
    return CollectedRun(
        run=run,
        messages=messages,
        stop_reason=stop_reason,
        usage=usage,
        finished=finished or run.status in (Run.Status.COMPLETED, Run.Status.FAILED, Run.Status.CANCELLED),
    )
