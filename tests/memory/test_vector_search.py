import math

from django.db import connection

from apps.memory.models import Passage
from apps.memory.selectors import passage_nearest
from tests.factories import ArchiveFactory, PassageFactory


def unit(dimension: int, hot: int) -> list[float]:
    """A vector pointing mostly along axis `hot`, so nearest neighbours are predictable."""
    vector = [0.01] * dimension
    vector[hot] = 1.0
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector]


def make_passages(org, archive, dimension: int, count: int) -> list[Passage]:
    return [
        PassageFactory(
            organization=org,
            archive=archive,
            text=f"p{i}",
            embedding=unit(dimension, i),
            embedding_dim=dimension,
        )
        for i in range(count)
    ]


def test_similarity_search_returns_the_nearest_passage_first(actor, org):
    archive = ArchiveFactory(organization=org)
    passages = make_passages(org, archive, 1536, 5)

    results = list(passage_nearest(actor=actor, archive_ids=[archive.id], embedding=unit(1536, 3), top_k=2))

    assert results[0].id == passages[3].id
    assert results[0].distance < 1e-6
    assert len(results) == 2


def test_agents_with_different_embedding_sizes_share_the_table(actor, org):
    small = ArchiveFactory(organization=org, embedding="openai/small-384", embedding_dim=384)
    large = ArchiveFactory(organization=org, embedding="openai/text-embedding-3-small", embedding_dim=1536)
    small_passages = make_passages(org, small, 384, 3)
    make_passages(org, large, 1536, 3)

    results = list(passage_nearest(actor=actor, archive_ids=[small.id, large.id], embedding=unit(384, 1)))

    assert results[0].id == small_passages[1].id
    assert {p.embedding_dim for p in results} == {384}


def test_the_search_query_uses_the_hnsw_index(actor, org):
    archive = ArchiveFactory(organization=org)
    make_passages(org, archive, 1536, 20)
    queryset = passage_nearest(actor=actor, archive_ids=[archive.id], embedding=unit(1536, 2), top_k=5)

    with connection.cursor() as cursor:
        # With 20 rows the planner would rightly prefer a scan; forbid it to show the index matches the query.
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = queryset.explain()

    assert "passage_emb_1536_hnsw" in plan
    assert "Index Scan" in plan


def test_another_organisation_never_gets_these_passages(actor, other_org_actor, org):
    archive = ArchiveFactory(organization=org)
    make_passages(org, archive, 1536, 3)

    results = list(passage_nearest(actor=other_org_actor, archive_ids=[archive.id], embedding=unit(1536, 0)))

    assert results == []
