from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from apps.agents.errors import InvalidAgentName
from apps.agents.models import Agent, AgentSecret, AgentTool, AgentType
from apps.agents.selectors import agent_get
from apps.core.actor import Actor
from apps.core.errors import InvalidInput
from apps.memory import services as memory_services
from apps.memory.errors import DuplicateBlockLabel
from apps.memory.models import Block
from apps.memory.selectors import block_get
from apps.tools.models import Tool
from apps.tools.rules import dump_tool_rules, parse_tool_rules

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
    for key, value in (secrets_ or {}).items():
        AgentSecret.objects.for_actor(actor).create(agent=agent, key=key, value=value)
    return agent


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
