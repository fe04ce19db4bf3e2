import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.db import connection

from apps.agents.errors import AgentNotFound
from apps.agents.models import Conversation, Message
from apps.agents.recall import (
    conversation_search,
    embed_messages,
    message_nearest,
    recall_queryset,
    reciprocal_rank_fusion,
)
from apps.core.errors import InvalidInput
from tests.factories import AgentFactory, MessageFactory
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
def agent(org, embeddings):
    return AgentFactory(organization=org, embedding=HANDLE)


@pytest.fixture
def text_only_agent(org):
    return AgentFactory(organization=org, embedding="")


def say(agent, text: str, role: str = Message.Role.USER, at: datetime | None = None, **kwargs) -> Message:
    message = MessageFactory(organization=agent.organization, agent=agent, role=role, text=text, **kwargs)
    if at is not None:
        Message.all_objects.filter(id=message.id).update(created_at=at)
        message.refresh_from_db()
    return message


def embedded(actor, agent, *messages: Message) -> list[Message]:
    embed_messages(actor=actor, messages=messages, embedding_handle=agent.embedding)
    return list(messages)


def contents(results: list[dict]) -> list[str]:
    return [result["content"] for result in results]


def test_embed_messages_fills_searchable_messages_in_one_request(actor, agent, embeddings):
    user = say(agent, "I love hiking")
    tool = say(agent, "Sent message successfully.", Message.Role.TOOL, name="send_message")
    system = say(agent, "You are a helpful agent", Message.Role.SYSTEM)
    empty = say(agent, "", Message.Role.ASSISTANT)
    own_search = say(agent, '{"results": []}', Message.Role.TOOL, name="conversation_search")

    count = embed_messages(
        actor=actor, messages=[user, tool, system, empty, own_search], embedding_handle=HANDLE
    )

    assert count == 2
    assert [r["body"]["input"] for r in embeddings.requests("/v1/embeddings")] == [
        ["I love hiking", "Sent message successfully."]
    ]
    stored = {m.id: m for m in Message.objects.for_actor(actor)}
    assert (stored[user.id].embedding_dim, stored[tool.id].embedding_dim) == (1536, 1536)
    assert list(stored[user.id].embedding) == pytest.approx(embed_text("I love hiking", 1536), abs=1e-6)
    assert [stored[m.id].embedding for m in (system, empty, own_search)] == [None, None, None]


def test_embed_messages_without_a_handle_does_nothing(actor, text_only_agent, embeddings):
    message = say(text_only_agent, "I love hiking")

    count = embed_messages(actor=actor, messages=[message], embedding_handle="")

    assert count == 0
    assert embeddings.requests("/v1/embeddings") == []
    assert Message.objects.for_actor(actor).get(id=message.id).embedding is None


def test_a_failing_embedding_provider_is_logged_and_leaves_messages_unembedded(
    actor, agent, settings, caplog
):
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"  # nothing listens on the discard port
    message = say(agent, "I love hiking")

    with caplog.at_level(logging.WARNING, logger="apps.agents.recall"):
        count = embed_messages(actor=actor, messages=[message], embedding_handle=HANDLE)

    assert count == 0
    assert [r.getMessage() for r in caplog.records] == ["recall.embedding_failed"]
    assert caplog.records[0].embedding_handle == HANDLE
    assert Message.objects.for_actor(actor).get(id=message.id).embedding is None


def test_embed_messages_never_touches_another_organisations_messages(other_org_actor, agent, embeddings):
    message = say(agent, "I love hiking")

    count = embed_messages(actor=other_org_actor, messages=[message], embedding_handle=HANDLE)

    assert count == 0
    assert Message.all_objects.get(id=message.id).embedding is None


def test_search_finds_a_message_by_keyword_with_stemming(actor, text_only_agent):
    say(text_only_agent, "The weather is nice today")
    hit = say(text_only_agent, "I went hiking in the Alps last summer")

    results = conversation_search(actor=actor, agent_id=text_only_agent.id, query="hike")

    assert results == [
        {
            "timestamp": hit.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "role": "user",
            "content": "I went hiking in the Alps last summer",
            "relevance": {"rrf_score": round(1 / 61, 6), "fts_rank": 1, "search_mode": "fts"},
        }
    ]


def test_keyword_search_ranks_messages_with_every_word_first_but_keeps_partial_matches(
    actor, text_only_agent
):
    say(text_only_agent, "My dog loves long walks")
    say(text_only_agent, "We walked the dog in the park", Message.Role.ASSISTANT)
    say(text_only_agent, "The park was closed")

    results = conversation_search(actor=actor, agent_id=text_only_agent.id, query="dog park")

    assert contents(results) == [
        "We walked the dog in the park",
        "The park was closed",
        "My dog loves long walks",
    ]


def test_search_finds_a_message_by_meaning_when_no_keyword_matches(actor, agent):
    # "again before" is all PostgreSQL stopwords, so full text search finds nothing; the scripted
    # embedding model still sees the words, as a real model would see the meaning.
    hit, other = embedded(
        actor, agent, say(agent, "Let us talk again before Friday"), say(agent, "Lunch was great")
    )

    results = conversation_search(actor=actor, agent_id=agent.id, query="again before", limit=1)

    assert contents(results) == [hit.text]
    assert results[0]["relevance"] == {
        "rrf_score": round(1 / 61, 6),
        "vector_rank": 1,
        "search_mode": "hybrid",
    }
    assert other.text not in contents(results)


def test_hybrid_search_puts_the_message_both_rankings_agree_on_first(actor, agent):
    embedded(
        actor,
        agent,
        say(agent, "Hiking boots are on sale"),
        say(agent, "I prefer hiking in the Alps with friends"),
        say(agent, "Friends visited the Alps museum"),
    )

    results = conversation_search(actor=actor, agent_id=agent.id, query="hiking alps friends")

    assert results[0]["content"] == "I prefer hiking in the Alps with friends"
    assert results[0]["relevance"] == {
        "rrf_score": round(2 / 61, 6),
        "fts_rank": 1,
        "vector_rank": 1,
        "search_mode": "hybrid",
    }
    assert len(results) == 3


def test_search_filters_by_role(actor, text_only_agent):
    say(text_only_agent, "hiking question", Message.Role.USER)
    say(text_only_agent, "hiking answer", Message.Role.ASSISTANT)
    say(text_only_agent, "hiking tool output", Message.Role.TOOL, name="web_search")

    results = conversation_search(
        actor=actor, agent_id=text_only_agent.id, query="hiking", roles=["assistant", "tool"]
    )

    assert sorted((r["role"], r["content"]) for r in results) == [
        ("assistant", "hiking answer"),
        ("tool", "hiking tool output"),
    ]


def test_dates_are_whole_inclusive_days_in_the_agents_timezone(actor, org):
    agent = AgentFactory(organization=org, timezone="America/New_York")
    say(agent, "hiking on the 30th local", at=datetime(2025, 1, 31, 3, 0, tzinfo=UTC))  # Jan 30, 22:00
    say(agent, "hiking early on the 31st", at=datetime(2025, 1, 31, 5, 30, tzinfo=UTC))  # Jan 31, 00:30
    say(agent, "hiking late on the 31st", at=datetime(2025, 2, 1, 4, 59, tzinfo=UTC))  # Jan 31, 23:59
    say(agent, "hiking on the 1st", at=datetime(2025, 2, 1, 5, 0, tzinfo=UTC))  # Feb 1, 00:00

    results = conversation_search(
        actor=actor, agent_id=agent.id, query="hiking", start_date="2025-01-31", end_date="2025-01-31"
    )

    assert sorted(contents(results)) == ["hiking early on the 31st", "hiking late on the 31st"]
    assert sorted(r["timestamp"] for r in results) == ["2025-01-31 00:30:00 EST", "2025-01-31 23:59:00 EST"]


def test_a_date_time_bound_is_an_inclusive_instant(actor, text_only_agent):
    say(text_only_agent, "hiking at noon", at=datetime(2025, 1, 31, 12, 0, tzinfo=UTC))
    say(text_only_agent, "hiking after noon", at=datetime(2025, 1, 31, 12, 0, 1, tzinfo=UTC))

    results = conversation_search(
        actor=actor, agent_id=text_only_agent.id, query="hiking", end_date="2025-01-31T12:00:00"
    )

    assert contents(results) == ["hiking at noon"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"start_date": "last week"},
            "Invalid start_date 'last week': use an ISO 8601 date (2025-01-31) or date-time (2025-01-31T14:30).",
        ),
        (
            {"start_date": "2025-02-01", "end_date": "2025-01-01"},
            "start_date (2025-02-01) is after end_date (2025-01-01).",
        ),
        ({"roles": ["system"]}, "Unknown role(s) system: roles may be user, assistant, tool."),
        ({"limit": 0}, "limit must be a positive integer, got 0."),
    ],
)
def test_bad_search_arguments_are_invalid_input(actor, text_only_agent, kwargs, message):
    with pytest.raises(InvalidInput) as excinfo:
        conversation_search(actor=actor, agent_id=text_only_agent.id, query="x", **kwargs)

    assert str(excinfo.value) == message


def test_search_stays_within_the_agent_and_the_conversation(actor, org, agent):
    conversation = Conversation.objects.for_actor(actor).create(agent=agent)
    mine = say(agent, "hiking plans")
    say(agent, "hiking plans in a thread", conversation=conversation)
    say(AgentFactory(organization=org), "hiking plans of another agent")
    embedded(actor, agent, *Message.objects.for_actor(actor).all())

    default_results = conversation_search(actor=actor, agent_id=agent.id, query="hiking plans")
    thread_results = conversation_search(
        actor=actor, agent_id=agent.id, conversation_id=conversation.id, query="hiking plans"
    )

    assert contents(default_results) == [mine.text]
    assert contents(thread_results) == ["hiking plans in a thread"]


def test_another_organisation_never_finds_these_messages(actor, other_org_actor, agent, other_org):
    embedded(actor, agent, say(agent, "secret hiking plans"))
    intruder = AgentFactory(organization=other_org, embedding=HANDLE)

    with pytest.raises(AgentNotFound):
        conversation_search(actor=other_org_actor, agent_id=agent.id, query="hiking")
    results = conversation_search(actor=other_org_actor, agent_id=intruder.id, query="secret hiking plans")

    assert results == []


def test_system_messages_and_earlier_searches_are_never_returned(actor, text_only_agent):
    say(text_only_agent, "hiking system prompt", Message.Role.SYSTEM)
    say(text_only_agent, '{"results": ["hiking"]}', Message.Role.TOOL, name="conversation_search")
    say(text_only_agent, "hiking is fun")

    with_query = conversation_search(actor=actor, agent_id=text_only_agent.id, query="hiking")
    newest = conversation_search(actor=actor, agent_id=text_only_agent.id)

    assert contents(with_query) == ["hiking is fun"]
    assert contents(newest) == ["hiking is fun"]


def test_without_a_query_the_newest_messages_come_first_without_relevance(actor, text_only_agent):
    for text in ["one", "two", "three"]:
        say(text_only_agent, text)

    results = conversation_search(actor=actor, agent_id=text_only_agent.id, limit=2)

    assert contents(results) == ["three", "two"]
    assert [sorted(r) for r in results] == [["content", "role", "timestamp"]] * 2


def test_an_agent_without_embeddings_searches_by_keywords_only(actor, text_only_agent, embeddings):
    say(text_only_agent, "hiking")

    results = conversation_search(actor=actor, agent_id=text_only_agent.id, query="hiking")

    assert results[0]["relevance"]["search_mode"] == "fts"
    assert embeddings.requests("/v1/embeddings") == []


def test_the_semantic_query_uses_the_hnsw_index(actor, agent):
    embedded(actor, agent, *[say(agent, f"note number {i}") for i in range(20)])
    base = recall_queryset(
        actor=actor,
        agent_id=agent.id,
        conversation_id=None,
        roles=["user"],
        start=datetime(2020, 1, 1, tzinfo=UTC),
    )
    queryset = message_nearest(base, embedding=embed_text("note", 1536))[:10]

    with connection.cursor() as cursor:
        # On a table this small the planner's choice follows its statistics; with no scan or sort to fall
        # back on, it must be able to use the HNSW index for the ordering (which is what is checked).
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        plan = queryset.explain()

    assert "message_emb_1536_hnsw" in plan
    assert "Index Scan" in plan


def test_reciprocal_rank_fusion_sums_reciprocal_ranks():
    fused = reciprocal_rank_fusion({"fts_rank": ["a", "b"], "vector_rank": ["b", "c"]}, k=60)

    assert fused == {
        "a": {"rrf_score": round(1 / 61, 6), "fts_rank": 1},
        "b": {"rrf_score": round(1 / 62 + 1 / 61, 6), "fts_rank": 2, "vector_rank": 1},
        "c": {"rrf_score": round(1 / 62, 6), "vector_rank": 2},
    }
