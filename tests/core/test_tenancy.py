import pytest

from apps.core.tenancy import OrgScopeMissing
from apps.memory.models import Block
from tests.factories import BlockFactory


def test_unscoped_query_on_tenant_model_fails_closed(db):
    BlockFactory()

    with pytest.raises(OrgScopeMissing, match=r"Block\.objects needs a scope"):
        list(Block.objects.all())


def test_for_actor_sees_only_its_own_organisation(actor, other_org_actor):
    mine = BlockFactory(organization_id=actor.organization_id)
    BlockFactory(organization_id=other_org_actor.organization_id)

    ids = list(Block.objects.for_actor(actor).values_list("id", flat=True))

    assert ids == [mine.id]


def test_create_through_scoped_queryset_fills_in_the_organisation(actor):
    block = Block.objects.for_actor(actor).create(label="human", value="x")

    assert block.organization_id == actor.organization_id


def test_create_for_another_organisation_through_a_scoped_queryset_is_refused(actor, other_org):
    with pytest.raises(OrgScopeMissing):
        Block.objects.for_actor(actor).create(label="human", organization=other_org)

    assert Block.objects.unscoped().count() == 0
