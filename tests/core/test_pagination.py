from apps.core.pagination import PageParams, paginate
from apps.memory.models import Block
from tests.factories import BlockFactory


def test_after_walks_forward_and_ends_on_an_empty_page(actor):
    blocks = [BlockFactory(organization_id=actor.organization_id, label=f"b{i}") for i in range(5)]
    qs = Block.objects.for_actor(actor)

    first = paginate(qs, PageParams(limit=2, order="asc"))
    second = paginate(qs, PageParams(after=first[-1].id, limit=2, order="asc"))
    third = paginate(qs, PageParams(after=second[-1].id, limit=2, order="asc"))
    past_end = paginate(qs, PageParams(after=third[-1].id, limit=2, order="asc"))

    assert [b.id for b in first + second + third] == [b.id for b in blocks]
    assert past_end == []


def test_descending_order_with_after_moves_to_older_rows(actor):
    blocks = [BlockFactory(organization_id=actor.organization_id, label=f"b{i}") for i in range(3)]
    qs = Block.objects.for_actor(actor)

    page = paginate(qs, PageParams(after=blocks[2].id, limit=10, order="desc"))

    assert [b.id for b in page] == [blocks[1].id, blocks[0].id]
