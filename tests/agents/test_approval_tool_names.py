"""agent_approval_tool_names: which of an agent's tool calls a token stream holds back for a decision."""

from __future__ import annotations

import pytest

from apps.agents.errors import AgentNotFound
from apps.agents.models import AgentTool
from apps.agents.selectors import agent_approval_tool_names
from tests.factories import AgentFactory, ToolFactory


def test_the_rules_and_the_attached_tools_approved_by_default(org, actor, other_org_actor):
    agent = AgentFactory(
        organization=org,
        tool_rules=[
            {"type": "requires_approval", "tool_name": "deploy"},
            {"type": "run_first", "tool_name": "search"},
            {"type": "requires_approval"},  # no tool named: nothing held
        ],
    )
    for name, by_default in (("approve_me", True), ("plain", False)):
        AgentTool.objects.create(
            agent=agent, tool=ToolFactory(organization=org, name=name, default_requires_approval=by_default)
        )
    ToolFactory(organization=org, name="not_attached", default_requires_approval=True)

    names = agent_approval_tool_names(actor=actor, agent_id=agent.id)

    assert names == frozenset({"deploy", "approve_me"})
    with pytest.raises(AgentNotFound):
        agent_approval_tool_names(actor=other_org_actor, agent_id=agent.id)


def test_an_agent_without_rules_or_tools_holds_nothing(org, actor):
    agent = AgentFactory(organization=org, tool_rules=[])

    assert agent_approval_tool_names(actor=actor, agent_id=agent.id) == frozenset()
