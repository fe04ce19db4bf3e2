from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.db import connection

from apps.core.errors import InvalidInput, NotFound
from apps.memory.archival import (
    ARCHIVAL_NEEDS_EMBEDDING,
    EmbeddingModelMissing,
    PassageNotFound,
    agent_archival_stats,
    agent_archive,
    agent_archives,
    archival_count,
    archival_tags,
    passage_delete,
    passage_insert,
    passage_list,
    passage_search,
    passage_search_queryset,
)
from apps.memory.models import Archive, Passage
from tests.factories import AgentFactory, ArchiveFactory, PassageFactory
from tests.support.scripted_llm import ScriptedLLM, ScriptedLLMServer, embed_text

HANDLE = "openai/text-embedding-3-small"


@pytest.fixture(scope="module")
def llm_server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
def embeddings(settings, llm_server: ScriptedLLMServer) -> ScriptedLLM:
    """`openai/...` embedding handles served by the scripted server's bag-of-words vectors."""
    settings.OPENAI_BASE_URL = llm_server.url
    settings.OPENAI_API_KEY = "sk-test"
    settings.LLM_MAX_ATTEMPTS = 1
    settings.LLM_RETRY_BASE_DELAY = 0.001
    settings.LLM_RETRY_MAX_DELAY = 0.01
    settings.LLM_REQUEST_TIMEOUT = 10.0
    client = llm_server.client()
    client.reset(config=True)
    return client


@pytest.fixture
def agent(org):
    return AgentFactory(organization=org, name="Ada", embedding=HANDLE)


@pytest.fixture
def archive(actor, agent, embeddings) -> Archive:
    return agent_archive(actor=actor, agent_id=agent.id, embedding_handle=HANDLE)


def insert(actor, archive, *texts: str, tags: list[str] | None = None) -> list[Passage]:
    return passage_insert(actor=actor, archive=archive, texts=list(texts), tags=tags, embedding_handle=HANDLE)


def search(actor, archive, query: str, **kwargs) -> list[str]:
    hits = passage_search(
        actor=actor, archive_ids=[archive.id], query=query, embedding_handle=HANDLE, **kwargs
    )
    return [passage.text for passage, _distance in hits]


def test_the_default_archive_is_created_once_and_attached_to_the_agent(actor, agent, embeddings):
    first = agent_archive(actor=actor, agent_id=agent.id, embedding_handle=HANDLE)

    second = agent_archive(actor=actor, agent_id=agent.id, embedding_handle=HANDLE)

    assert second.id == first.id
    assert (first.name, first.embedding, first.embedding_dim) == ("Ada's archive", HANDLE, None)
    assert list(agent.archives.values_list("id", flat=True)) == [first.id]
    assert [a.id for a in agent_archives(actor=actor, agent_id=agent.id)] == [first.id]


def test_an_agent_without_an_embedding_handle_gets_a_text_only_archive(actor, agent):
    archive = agent_archive(actor=actor, agent_id=agent.id, embedding_handle="")

    assert (archive.embedding, archive.embedding_dim) == ("", None)
    assert list(archive.agents.values_list("id", flat=True)) == [agent.id]


def test_another_organisations_agent_gets_no_archive(other_org_actor, agent):
    with pytest.raises(NotFound) as excinfo:
        agent_archive(actor=other_org_actor, agent_id=agent.id, embedding_handle=HANDLE)

    assert str(excinfo.value) == f"Agent with id '{agent.id}' not found"
    assert Archive.objects.unscoped().count() == 0


def test_insert_embeds_all_texts_in_one_request_and_stores_tags(actor, archive, embeddings):
    passages = insert(actor, archive, "I love hiking", "My cat is Tom", tags=["pets", " life ", "pets"])

    requests = embeddings.requests("/v1/embeddings")
    assert [r["body"]["input"] for r in requests] == [["I love hiking", "My cat is Tom"]]
    stored = list(Passage.objects.for_actor(actor).order_by("text"))
    assert [(p.text, p.tags, p.embedding_dim, p.archive_id) for p in stored] == [
        ("I love hiking", ["pets", "life"], 1536, archive.id),
        ("My cat is Tom", ["pets", "life"], 1536, archive.id),
    ]
    assert [p.id for p in sorted(passages, key=lambda p: p.text)] == [p.id for p in stored]
    assert list(stored[0].embedding) == pytest.approx(embed_text("I love hiking", 1536), abs=1e-6)
    archive.refresh_from_db()
    assert (archive.embedding, archive.embedding_dim) == (HANDLE, 1536)


@pytest.mark.parametrize(
    ("handle", "detail"),
    [
        ("nowhere/model", " (Unknown provider 'nowhere' in handle 'nowhere/model': add a provider"),
    ],
)
def test_insert_without_a_usable_embedding_handle_is_invalid_input(actor, org, handle, detail):
    archive = ArchiveFactory(organization=org)

    with pytest.raises(EmbeddingModelMissing) as excinfo:
        passage_insert(actor=actor, archive=archive, texts=["x"], embedding_handle=handle)

    assert str(excinfo.value).startswith(ARCHIVAL_NEEDS_EMBEDDING + detail)
    assert Passage.objects.for_actor(actor).count() == 0


def test_insert_refuses_a_second_embedding_model_in_one_archive(actor, archive):
    insert(actor, archive, "first")

    with pytest.raises(InvalidInput) as excinfo:
        passage_insert(
            actor=actor, archive=archive, texts=["second"], embedding_handle="openai/text-embedding-small-384"
        )

    assert str(excinfo.value) == (
        "Archive 'Ada's archive' is embedded with 'openai/text-embedding-3-small', not "
        "'openai/text-embedding-small-384': passages of one archive must share one embedding model."
    )
    assert Passage.objects.for_actor(actor).count() == 1


def test_insert_refuses_empty_text(actor, archive, embeddings):
    with pytest.raises(InvalidInput) as excinfo:
        insert(actor, archive, "  ")

    assert str(excinfo.value) == "Archival memory content must be non-empty text."
    assert embeddings.requests("/v1/embeddings") == []


def test_search_finds_passages_by_meaning_nearest_first(actor, archive):
    insert(actor, archive, "Quarterly budget report", "I love hiking in the Alps", "My cat is named Tom")

    found = search(actor, archive, "where do I go hiking", top_k=2)

    assert found[0] == "I love hiking in the Alps"
    assert len(found) == 2


def test_search_by_tags_with_any_and_all(actor, archive):
    insert(actor, archive, "hiking trip", tags=["travel", "outdoors"])
    insert(actor, archive, "hiking boots", tags=["shopping", "outdoors"])
    insert(actor, archive, "hiking club dues", tags=["money"])

    any_travel_or_money = search(actor, archive, "hiking", tags=["travel", "money"], tag_match_mode="any")
    all_outdoors_and_shopping = search(
        actor, archive, "hiking", tags=["outdoors", "shopping"], tag_match_mode="all"
    )

    assert sorted(any_travel_or_money) == ["hiking club dues", "hiking trip"]
    assert all_outdoors_and_shopping == ["hiking boots"]


def test_search_within_a_date_range_is_inclusive(actor, archive):
    old, edge, new = insert(actor, archive, "hiking in 2023", "hiking in january", "hiking in march")
    for passage, moment in [
        (old, datetime(2023, 6, 1, tzinfo=UTC)),
        (edge, datetime(2025, 1, 31, 23, 59, tzinfo=UTC)),
        (new, datetime(2025, 3, 1, tzinfo=UTC)),
    ]:
        Passage.all_objects.filter(id=passage.id).update(created_at=moment)

    found = search(
        actor,
        archive,
        "hiking",
        start=datetime(2025, 1, 1, tzinfo=UTC),
        end=datetime(2025, 1, 31, 23, 59, tzinfo=UTC),
    )

    assert found == ["hiking in january"]


def test_search_rejects_a_bad_tag_match_mode(actor, archive):
    insert(actor, archive, "hiking")

    with pytest.raises(InvalidInput) as excinfo:
        search(actor, archive, "hiking", tags=["x"], tag_match_mode="some")

    assert str(excinfo.value) == "tag_match_mode must be 'any' or 'all', got 'some'."


def test_another_organisation_never_finds_these_passages(actor, other_org_actor, archive):
    insert(actor, archive, "secret hiking plans", tags=["private"])

    found = passage_search(
        actor=other_org_actor, archive_ids=[archive.id], query="hiking plans", embedding_handle=HANDLE
    )

    assert found == []
    assert archival_count(actor=other_org_actor, archive_ids=[archive.id]) == 0
    assert archival_tags(actor=other_org_actor, archive_ids=[archive.id]) == []
    assert list(passage_list(actor=other_org_actor, archive_ids=[archive.id])) == []


def test_the_search_query_uses_the_hnsw_index(actor, archive):
    insert(actor, archive, *[f"note number {i}" for i in range(20)], tags=["notes"])
    queryset = passage_search_queryset(
        actor=actor,
        archive_ids=[archive.id],
        embedding=embed_text("note", 1536),
        tags=["notes"],
        start=datetime(2020, 1, 1, tzinfo=UTC),
        top_k=5,
    )

    with connection.cursor() as cursor:
        # Rule out every other plan, so the planner's statistics (which the other tests' rows move)
        # cannot prefer one: what is checked is that the query's shape can use the index at all.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        plan = queryset.explain()

    assert "passage_emb_1536_hnsw" in plan
    assert "Index Scan" in plan


def test_a_filtered_search_still_finds_its_passage_behind_many_closer_ones(actor, archive, org):
    # 100 passages of another archive are nearer than ours. A plain HNSW scan stops after ef_search (40)
    # candidates, all filtered out; passage_search's iterative scan keeps reading until it has top_k.
    crowd = agent_archive(actor=actor, agent_id=AgentFactory(organization=org).id, embedding_handle=HANDLE)
    insert(actor, crowd, *[f"hiking boots {i}" for i in range(100)])
    insert(actor, archive, "tax forms")
    plain = passage_search_queryset(
        actor=actor, archive_ids=[archive.id], embedding=embed_text("hiking boots", 1536), top_k=1
    )

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = plain.explain()
        plain_found = list(plain)
        found = search(actor, archive, "hiking boots", top_k=1)

    assert "passage_emb_1536_hnsw" in plan
    assert plain_found == []
    assert found == ["tax forms"]


def test_list_count_tags_and_delete(actor, archive):
    first, second = insert(actor, archive, "one", "two", tags=["b", "a"])
    insert(actor, archive, "three", tags=["c"])

    passage_delete(actor=actor, passage_id=first.id, archive_ids=[archive.id])

    assert sorted(p.text for p in passage_list(actor=actor, archive_ids=[archive.id])) == ["three", "two"]
    assert archival_count(actor=actor, archive_ids=[archive.id]) == 2
    assert archival_tags(actor=actor, archive_ids=[archive.id]) == ["a", "b", "c"]
    assert Passage.objects.for_actor(actor).filter(id=second.id).exists()


def test_counts_and_tags_follow_every_writer_of_passages(actor, agent, archive, org):
    """The counts are kept by triggers: right after services, plain ORM writes, updates and bulk deletes."""

    def stats() -> tuple[int, list[str]]:
        count, tags = agent_archival_stats(actor=actor, agent_id=agent.id)
        return count, sorted(tags)

    assert stats() == (0, [])
    [first] = insert(actor, archive, "one", tags=["b", "a"])
    insert(actor, archive, "two", "three", tags=["a"])
    PassageFactory(organization=org, archive=archive, tags=["z"])  # admin, import: no service
    assert stats() == (4, ["a", "b", "z"])

    Passage.objects.for_actor(actor).filter(id=first.id).update(tags=["c"])
    assert stats() == (4, ["a", "c", "z"])
    assert archival_tags(actor=actor, archive_ids=[archive.id]) == ["a", "c", "z"]

    passage_delete(actor=actor, passage_id=first.id, archive_ids=[archive.id])
    Passage.objects.for_actor(actor).filter(tags__contains=["z"]).delete()
    assert stats() == (2, ["a"])
    assert archival_count(actor=actor, archive_ids=[archive.id]) == 2
    assert archival_count(actor=actor, archive_ids=[]) == 0

    Passage.objects.for_actor(actor).filter(archive=archive).delete()
    assert stats() == (0, [])


def test_deleting_another_organisations_passage_is_not_found(actor, other_org_actor, archive):
    [passage] = insert(actor, archive, "mine")

    with pytest.raises(PassageNotFound) as excinfo:
        passage_delete(actor=other_org_actor, passage_id=passage.id)

    assert str(excinfo.value) == f"Passage with id '{passage.id}' not found"
    assert Passage.objects.for_actor(actor).filter(id=passage.id).exists()
