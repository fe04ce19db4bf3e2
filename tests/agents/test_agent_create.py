import pytest

from apps.agents.errors import AgentNotFound
from apps.agents.models import Agent, Message
from apps.agents.selectors import agent_get, agent_list
from apps.agents.services import BlockSpec, agent_create, agent_delete, agent_set_tool_rules
from apps.core.errors import InvalidInput, NotFound
from apps.memory.errors import BlockTooLong, DuplicateBlockLabel
from apps.memory.models import Block
from apps.tools.rules import ToolRuleError
from tests.factories import AgentFactory, BlockFactory, MessageFactory


def test_agent_is_created_with_its_memory_blocks_and_letta_style_ids(actor):
    agent = agent_create(
        actor=actor,
        name="Assistant",
        model="openai/gpt-4o-mini",
        memory_blocks=[
            BlockSpec(label="human", value="Name: Sam"),
            BlockSpec(label="persona", value="I help"),
        ],
        tool_rules=[{"type": "exit_loop", "tool_name": "send_message"}],
        tags=["b", "a"],
    )

    assert agent.id.startswith("agent-")
    labels = sorted(agent.blocks.values_list("label", flat=True))
    assert labels == ["human", "persona"]
    assert all(i.startswith("block-") for i in agent.blocks.values_list("id", flat=True))
    assert agent.blocks.get(label="human").description.startswith("Key details about the person")
    assert agent.tool_rules == [{"type": "exit_loop", "tool_name": "send_message"}]
    assert agent.tags == ["a", "b"]


def test_a_tool_rule_of_an_unknown_type_is_refused_and_nothing_is_written(actor):
    with pytest.raises(ToolRuleError) as excinfo:
        agent_create(
            actor=actor,
            name="Assistant",
            memory_blocks=[BlockSpec(label="human", value="x")],
            tool_rules=[{"type": "exit_loop", "tool_name": "a"}, {"type": "teleport", "tool_name": "b"}],
        )

    assert "tool_rules[1]" in excinfo.value.message
    assert "unknown rule type 'teleport'" in excinfo.value.message
    assert Agent.objects.for_actor(actor).count() == 0
    assert Block.objects.for_actor(actor).count() == 0


def test_changing_tool_rules_validates_them(actor):
    agent = AgentFactory(organization_id=actor.organization_id)

    with pytest.raises(ToolRuleError, match="children"):
        agent_set_tool_rules(
            actor=actor, agent_id=agent.id, tool_rules=[{"type": "constrain_child_tools", "tool_name": "a"}]
        )

    agent.refresh_from_db()
    assert agent.tool_rules == []


def test_two_memory_blocks_with_one_label_are_refused(actor):
    with pytest.raises(DuplicateBlockLabel, match="more than one block labelled: human"):
        agent_create(actor=actor, memory_blocks=[BlockSpec(label="human"), BlockSpec(label="human")])

    assert Agent.objects.for_actor(actor).count() == 0


def test_attaching_an_existing_block_whose_label_is_taken_is_refused(actor):
    existing = BlockFactory(organization_id=actor.organization_id, label="human")

    with pytest.raises(DuplicateBlockLabel):
        agent_create(actor=actor, memory_blocks=[BlockSpec(label="human")], block_ids=[existing.id])

    assert Agent.objects.for_actor(actor).count() == 0


def test_a_block_of_another_organisation_cannot_be_attached(actor, other_org_actor):
    foreign = BlockFactory(organization_id=other_org_actor.organization_id, label="secret")

    with pytest.raises(NotFound, match="not found"):
        agent_create(actor=actor, block_ids=[foreign.id])

    assert foreign.agents.count() == 0


def test_a_memory_block_over_its_limit_is_refused(actor):
    with pytest.raises(BlockTooLong):
        agent_create(actor=actor, memory_blocks=[BlockSpec(label="human", value="x" * 20, limit=5)])

    assert Agent.objects.for_actor(actor).count() == 0


@pytest.mark.parametrize("name", ["bad/name", "", "x" * 201])
def test_invalid_agent_names_are_refused(actor, name):
    with pytest.raises(InvalidInput, match="Invalid agent name"):
        agent_create(actor=actor, name=name)


def test_a_model_handle_without_provider_is_refused(actor):
    with pytest.raises(InvalidInput, match="provider/model-name"):
        agent_create(actor=actor, model="gpt-4o")


def test_message_sequence_ids_are_monotonic_across_agents(org):
    first = MessageFactory(organization=org)
    second = MessageFactory(organization=org)
    third = MessageFactory(organization=org, agent=first.agent)

    assert first.sequence_id < second.sequence_id < third.sequence_id
    assert Message.all_objects.get(id=third.id).sequence_id == third.sequence_id
    assert first.id.startswith("message-")


def test_another_organisation_cannot_read_change_or_delete_an_agent(actor, other_org_actor):
    agent = AgentFactory(organization_id=actor.organization_id)

    with pytest.raises(AgentNotFound):
        agent_get(actor=other_org_actor, agent_id=agent.id)
    with pytest.raises(AgentNotFound):
        agent_set_tool_rules(actor=other_org_actor, agent_id=agent.id, tool_rules=[])
    with pytest.raises(AgentNotFound):
        agent_delete(actor=other_org_actor, agent_id=agent.id)

    assert agent_get(actor=actor, agent_id=agent.id).id == agent.id
    assert [a.id for a in agent_list(actor=other_org_actor)] == []


def test_agents_are_listed_by_tags_any_or_all(actor):
    both = AgentFactory(organization_id=actor.organization_id, tags=["a", "b"])
    only_a = AgentFactory(organization_id=actor.organization_id, tags=["a"])

    any_of = {a.id for a in agent_list(actor=actor, tags=["a", "b"])}
    all_of = {a.id for a in agent_list(actor=actor, tags=["a", "b"], match_all_tags=True)}

    assert any_of == {both.id, only_a.id}
    assert all_of == {both.id}
