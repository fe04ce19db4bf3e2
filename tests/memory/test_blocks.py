import pytest
from django.db import IntegrityError, transaction

from apps.core.actor import Actor, Role
from apps.memory import services
from apps.memory.errors import BlockConcurrentUpdate, BlockNotFound, BlockTooLong, DuplicateBlockLabel
from apps.memory.models import Block, BlockHistory
from apps.memory.services import Editor
from tests.factories import AgentFactory, BlockFactory


def test_creating_a_block_over_its_limit_is_refused_with_the_numbers(actor):
    with pytest.raises(BlockTooLong) as excinfo:
        services.block_create(actor=actor, label="human", value="x" * 11, limit=10)

    assert excinfo.value.message == (
        "Block 'human' value is 11 characters, over its limit of 10. Shorten the value or raise the limit."
    )
    assert Block.objects.for_actor(actor).count() == 0


def test_the_database_itself_refuses_a_value_over_the_limit(org):
    with pytest.raises(IntegrityError), transaction.atomic():
        Block.all_objects.create(organization=org, label="human", value="x" * 11, limit=10)


def test_an_update_over_the_limit_never_truncates(actor):
    block = services.block_create(actor=actor, label="human", value="short", limit=10)

    with pytest.raises(BlockTooLong):
        services.block_update(actor=actor, block_id=block.id, value="y" * 11)

    block.refresh_from_db()
    assert block.value == "short"
    assert block.version == 1


def test_every_change_is_recorded_with_who_made_it(actor):
    block = services.block_create(actor=actor, label="human", value="Name: Sam")

    services.block_update(
        actor=actor, block_id=block.id, value="Name: Sam\nLikes hiking", editor=Editor.agent("agent-1")
    )
    services.block_update(actor=actor, block_id=block.id, value="Name: Sam (edited)")

    history = list(BlockHistory.objects.for_actor(actor).filter(block=block).order_by("version"))
    assert [(h.version, h.actor_type, h.actor_id) for h in history] == [
        (1, "user", actor.user_id),
        (2, "agent", "agent-1"),
        (3, "user", actor.user_id),
    ]
    assert (history[1].value_before, history[1].value_after) == ("Name: Sam", "Name: Sam\nLikes hiking")


def test_restoring_a_history_entry_brings_its_value_back_as_a_new_version(actor):
    block = services.block_create(actor=actor, label="human", value="v1")
    services.block_update(actor=actor, block_id=block.id, value="v2")
    first = BlockHistory.objects.for_actor(actor).get(block=block, version=1)

    restored = services.block_restore(actor=actor, history_id=first.id)

    assert (restored.value, restored.version) == ("v1", 3)


def test_a_stale_expected_version_is_refused(actor):
    block = services.block_create(actor=actor, label="human", value="v1")
    services.block_update(actor=actor, block_id=block.id, value="v2")

    with pytest.raises(BlockConcurrentUpdate):
        services.block_update(actor=actor, block_id=block.id, value="v3", expected_version=1)

    block.refresh_from_db()
    assert block.value == "v2"


def test_attaching_a_second_block_with_the_same_label_is_refused(actor):
    agent = AgentFactory(organization_id=actor.organization_id)
    first = services.block_create(actor=actor, label="human", value="a")
    second = services.block_create(actor=actor, label="human", value="b")
    services.block_attach_to_agent(actor=actor, agent_id=agent.id, block=first)

    with pytest.raises(DuplicateBlockLabel, match="Agent already has a block labelled 'human'"):
        services.block_attach_to_agent(actor=actor, agent_id=agent.id, block=second)

    assert list(agent.blocks.values_list("id", flat=True)) == [first.id]


def test_renaming_a_shared_block_onto_a_label_the_agent_already_has_is_refused(actor):
    agent = AgentFactory(organization_id=actor.organization_id)
    human = services.block_create(actor=actor, label="human", value="a")
    persona = services.block_create(actor=actor, label="persona", value="b")
    services.block_attach_to_agent(actor=actor, agent_id=agent.id, block=human)
    services.block_attach_to_agent(actor=actor, agent_id=agent.id, block=persona)

    with pytest.raises(DuplicateBlockLabel):
        services.block_update(actor=actor, block_id=persona.id, label="human")

    persona.refresh_from_db()
    assert persona.label == "persona"


def test_a_block_can_be_shared_by_two_agents(actor):
    block = services.block_create(actor=actor, label="project", value="framework: Flask")
    agents = [AgentFactory(organization_id=actor.organization_id) for _ in range(2)]

    for agent in agents:
        services.block_attach_to_agent(actor=actor, agent_id=agent.id, block=block)

    assert sorted(block.agents.values_list("id", flat=True)) == sorted(a.id for a in agents)


def test_another_organisation_cannot_read_change_or_delete_a_block(actor, other_org_actor):
    block = BlockFactory(organization_id=actor.organization_id, value="private")

    with pytest.raises(BlockNotFound):
        services.block_update(actor=other_org_actor, block_id=block.id, value="hacked")
    with pytest.raises(BlockNotFound):
        services.block_delete(actor=other_org_actor, block_id=block.id)

    block.refresh_from_db()
    assert block.value == "private"


def test_a_member_role_actor_is_recorded_as_user_editor(org, make_user):
    member = make_user(org, role=Role.MEMBER)
    actor = Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER)

    block = services.block_create(actor=actor, label="notes", value="")

    assert block.created_by_id == member.id
