"""apps.identities: Letta's merge and replace rules, the identity filters other lists use, and the database
refusing a link between organisations."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from apps.core.errors import InvalidInput
from apps.identities import selectors, services
from apps.identities.errors import DuplicateIdentity
from apps.identities.models import Identity
from apps.identities.services import IdentityProperty
from tests.factories import AgentFactory, BlockFactory

pytestmark = pytest.mark.django_db


def new_identity(actor, key="user-1", **kwargs):
    kwargs.setdefault("name", "Sam")
    kwargs.setdefault("identity_type", "user")
    return services.identity_create(actor=actor, identifier_key=key, **kwargs)


def prop(key: str, value: object, type_: str = "string") -> IdentityProperty:
    return IdentityProperty(key=key, value=value, type=type_)  # type: ignore[arg-type]


# --- the database -----------------------------------------------------------------------------------------

CROSS_ORG_LINKS = {
    "agent": lambda identity, other: identity.agents.add(AgentFactory(organization=other)),
    "block": lambda identity, other: identity.blocks.add(BlockFactory(organization=other)),
}


@pytest.mark.parametrize("kind", CROSS_ORG_LINKS)
def test_the_database_refuses_a_link_between_organisations(kind, actor, org, other_org):
    identity = new_identity(actor)

    with (
        pytest.raises(IntegrityError, match=f"{kind} .* belongs to another organization than identity"),
        transaction.atomic(),
    ):
        CROSS_ORG_LINKS[kind](identity, other_org)

    assert (identity.agents.count(), identity.blocks.count()) == (0, 0)


def test_the_database_refuses_moving_a_link_to_another_organisations_agent(actor, org, other_org):
    identity = new_identity(actor)
    mine = AgentFactory(organization=org, name="mine")
    identity.agents.add(mine)
    foreign = AgentFactory(organization=other_org)

    with (
        pytest.raises(IntegrityError, match="belongs to another organization than identity"),
        transaction.atomic(),
    ):
        selectors.AgentLink.objects.filter(identity_id=identity.id).update(agent=foreign)

    assert list(identity.agents.values_list("name", flat=True)) == ["mine"]


def test_the_database_accepts_links_within_one_organisation(actor, org):
    identity = new_identity(actor)

    CROSS_ORG_LINKS["agent"](identity, org)
    CROSS_ORG_LINKS["block"](identity, org)

    assert (identity.agents.count(), identity.blocks.count()) == (1, 1)


def test_the_identifier_key_is_unique_in_an_organisation_only(actor, other_org_actor):
    new_identity(actor, "user-1")

    with pytest.raises(DuplicateIdentity, match="identifier_key 'user-1' already exists"):
        new_identity(actor, "user-1", name="Someone else")
    elsewhere = new_identity(other_org_actor, "user-1")

    assert Identity.objects.for_actor(actor).count() == 1
    assert elsewhere.organization_id == other_org_actor.organization_id


# --- Letta's update rules ----------------------------------------------------------------------------------


def test_modify_merges_properties_by_key_and_adds_agents(actor, org):
    first, second = AgentFactory(organization=org), AgentFactory(organization=org)
    identity = new_identity(
        actor, agent_ids=[first.id], properties=[prop("plan", "free"), prop("age", 30, "number")]
    )

    updated = services.identity_update(
        actor=actor,
        identity_id=identity.id,
        agent_ids=[second.id],
        properties=[prop("plan", "pro"), prop("vip", True, "boolean")],
    )

    assert updated.properties == [
        {"key": "plan", "value": "pro", "type": "string"},
        {"key": "age", "value": 30, "type": "number"},
        {"key": "vip", "value": True, "type": "boolean"},
    ]
    assert sorted(a.id for a in updated.agents.all()) == sorted([first.id, second.id])


def test_upsert_replaces_properties_agents_and_blocks_of_the_stored_identity(actor, org):
    first, second = AgentFactory(organization=org), AgentFactory(organization=org)
    block = BlockFactory(organization=org)
    stored = new_identity(
        actor, agent_ids=[first.id], block_ids=[block.id], properties=[prop("plan", "free")]
    )

    upserted = services.identity_upsert(
        actor=actor,
        identifier_key="user-1",
        name="Samantha",
        identity_type="other",
        agent_ids=[second.id],
        block_ids=[],
        properties=[prop("tier", 2, "number")],
    )

    assert upserted.id == stored.id
    assert (upserted.name, upserted.identity_type) == ("Samantha", "other")
    assert upserted.properties == [{"key": "tier", "value": 2, "type": "number"}]
    assert [a.id for a in upserted.agents.all()] == [second.id]
    assert list(upserted.blocks.all()) == []


def test_upsert_without_agents_keeps_the_linked_ones(actor, org):
    agent = AgentFactory(organization=org)
    new_identity(actor, agent_ids=[agent.id])

    upserted = services.identity_upsert(
        actor=actor, identifier_key="user-1", name="Sam", identity_type="user"
    )

    assert [a.id for a in upserted.agents.all()] == [agent.id]


def test_a_property_of_a_list_value_is_refused():
    with pytest.raises(InvalidInput, match="a string, a number, a boolean or an object"):
        prop("tags", ["a"])


# --- the filters other lists use ---------------------------------------------------------------------------


def test_agent_filters_keep_the_agents_of_an_identity_or_of_identifier_keys(actor, org):
    sams, alexs, nobodys = (AgentFactory(organization=org, name=n) for n in ("sam", "alex", "nobody"))
    sam = new_identity(actor, "user-sam", agent_ids=[sams.id])
    new_identity(actor, "user-alex", agent_ids=[alexs.id, sams.id])
    agents = AgentFactory._meta.model.objects.for_actor(actor)

    by_id = selectors.filter_agents_by_identity(agents, identity_id=sam.id)
    by_keys = selectors.filter_agents_by_identity(agents, identifier_keys=["user-sam", "user-alex"])
    both = selectors.filter_agents_by_identity(agents, identity_id=sam.id, identifier_keys=["user-alex"])
    neither = selectors.filter_agents_by_identity(agents)

    assert sorted(a.name for a in by_id) == ["sam"]
    assert sorted(a.name for a in by_keys) == ["alex", "sam"]  # each agent once
    assert sorted(a.name for a in both) == ["sam"]
    assert sorted(a.name for a in neither) == ["alex", "nobody", "sam"]
    assert nobodys.id not in {a.id for a in by_keys}


def test_blocks_for_identity_are_the_identitys_and_none_for_another_organisations(
    actor, org, other_org_actor
):
    block, other_block = BlockFactory(organization=org), BlockFactory(organization=org)
    identity = new_identity(actor, block_ids=[block.id])

    mine = selectors.blocks_for_identity(actor, identity.id)
    theirs = selectors.blocks_for_identity(other_org_actor, identity.id)
    by_key = selectors.filter_blocks_by_identity(
        BlockFactory._meta.model.objects.for_actor(actor), identifier_keys=["user-1"]
    )

    assert [b.id for b in mine] == [block.id]
    assert list(theirs) == []
    assert [b.id for b in by_key] == [block.id]
    assert other_block.id not in {b.id for b in mine}


def test_identity_ids_by_agent_lists_each_agents_identities_oldest_first(actor, org):
    agent, lonely = AgentFactory(organization=org), AgentFactory(organization=org)
    first = new_identity(actor, "a", agent_ids=[agent.id])
    second = new_identity(actor, "b", agent_ids=[agent.id])

    ids = selectors.identity_ids_by_agent([agent.id, lonely.id])

    assert ids == {agent.id: [first.id, second.id], lonely.id: []}


def test_deleting_a_linked_agent_or_block_unlinks_it_and_keeps_the_identity(actor, org):
    agent, block = AgentFactory(organization=org), BlockFactory(organization=org)
    identity = new_identity(actor, agent_ids=[agent.id], block_ids=[block.id])

    agent.delete()
    block.delete()

    assert Identity.objects.for_actor(actor).filter(id=identity.id).exists()
    assert (selectors.AgentLink.objects.count(), selectors.BlockLink.objects.count()) == (0, 0)
