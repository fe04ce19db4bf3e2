import dataclasses
import json
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.agents.builtin_tools import EDIT_CONFIRMATION, executable_builtins, execute_builtin
from apps.agents.models import Message
from apps.core.actor import Actor
from apps.memory import edits
from apps.memory import services as memory_services
from apps.memory.models import AgentBlock, Archive, Block, BlockHistory, Passage
from apps.memory.services import Editor
from apps.tools.builtin import BUILTIN_TOOLS
from apps.tools.execution import ToolContext, ToolResult
from tests.factories import AgentFactory, BlockFactory, MessageFactory
from tests.support.scripted_llm import ScriptedLLM, ScriptedLLMServer

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
def ctx(org, agent) -> ToolContext:
    return ToolContext(actor=Actor.system(org.id), agent_id=agent.id)


def attach(agent, label: str, value: str = "", *, limit: int = 1000, read_only: bool = False) -> Block:
    block = BlockFactory(
        organization=agent.organization, label=label, value=value, limit=limit, read_only=read_only
    )
    AgentBlock.objects.create(agent=agent, block=block, block_label=label)
    return block


def run(ctx: ToolContext, agent, name: str, **arguments) -> ToolResult:
    return execute_builtin(name, arguments, ctx, agent=agent)


def history(block: Block) -> list[tuple[int, str, str, str, str]]:
    return [
        (h.version, h.actor_type, h.actor_id, h.value_before, h.value_after)
        for h in BlockHistory.all_objects.filter(block_id=block.id).order_by("version")
    ]


def value_of(block: Block) -> str:
    return Block.all_objects.get(id=block.id).value


# -- core memory tools: success ------------------------------------------------------------------------


def test_core_memory_append_adds_a_line_as_the_agent(ctx, agent):
    block = attach(agent, "human", "Name: Sam")

    result = run(ctx, agent, "core_memory_append", label="human", content="Likes tea")

    assert (result.status, result.return_value, result.memory_changed) == (
        "success",
        "Name: Sam\nLikes tea",
        True,
    )
    assert value_of(block) == "Name: Sam\nLikes tea"
    assert history(block) == [(2, "agent", agent.id, "Name: Sam", "Name: Sam\nLikes tea")]


def test_core_memory_replace_replaces_every_occurrence(ctx, agent):
    block = attach(agent, "human", "tea, more tea")

    result = run(ctx, agent, "core_memory_replace", label="human", old_content="tea", new_content="coffee")

    assert (result.status, result.return_value, result.memory_changed) == (
        "success",
        "coffee, more coffee",
        True,
    )
    assert history(block) == [(2, "agent", agent.id, "tea, more tea", "coffee, more coffee")]


def test_memory_replace_edits_the_single_occurrence(ctx, agent):
    block = attach(agent, "persona", "I am calm.\nI like chess.")

    result = run(ctx, agent, "memory_replace", label="persona", old_string="chess", new_string="go")

    assert (result.status, result.return_value, result.memory_changed) == (
        "success",
        EDIT_CONFIRMATION.format(label="persona"),
        True,
    )
    assert value_of(block) == "I am calm.\nI like go."
    assert history(block)[-1][:2] == (2, "agent")


def test_memory_insert_puts_text_after_the_given_line(ctx, agent):
    block = attach(agent, "notes", "first\nthird")

    result = run(ctx, agent, "memory_insert", label="notes", new_string="second", insert_line="1")

    assert (result.status, result.memory_changed) == ("success", True)
    assert value_of(block) == "first\nsecond\nthird"
    assert history(block) == [(2, "agent", agent.id, "first\nthird", "first\nsecond\nthird")]


def test_memory_rethink_rewrites_an_existing_block(ctx, agent):
    block = attach(agent, "notes", "messy notes")

    result = run(ctx, agent, "memory_rethink", label="notes", new_memory="clean notes")

    assert (result.status, result.return_value, result.memory_changed) == (
        "success",
        EDIT_CONFIRMATION.format(label="notes"),
        True,
    )
    assert history(block) == [(2, "agent", agent.id, "messy notes", "clean notes")]


def test_memory_rethink_creates_and_attaches_a_missing_block(ctx, agent):
    attach(agent, "human", "Sam")

    result = run(ctx, agent, "memory_rethink", label="plans", new_memory="Visit Rome")

    assert (result.status, result.memory_changed) == ("success", True)
    link = AgentBlock.objects.get(agent=agent, block_label="plans")
    assert (link.block.value, link.block.organization_id) == ("Visit Rome", agent.organization_id)
    assert history(link.block) == [(1, "system", "", "", ""), (2, "agent", agent.id, "", "Visit Rome")]


def test_memory_finish_edits_and_send_message_only_confirm(ctx, agent):
    finished = run(ctx, agent, "memory_finish_edits")
    sent = run(ctx, agent, "send_message", message="Hi there!")

    assert (finished.status, finished.return_value, finished.memory_changed) == ("success", "None", False)
    assert (sent.status, sent.return_value) == ("success", "Sent message successfully.")


def test_an_edit_that_changes_nothing_writes_no_history(ctx, agent):
    block = attach(agent, "human", "Sam")

    result = run(ctx, agent, "core_memory_replace", label="human", old_content="Sam", new_content="Sam")

    assert (result.status, result.memory_changed) == ("success", False)
    assert history(block) == []


def test_an_edit_moves_the_blocks_updated_at(ctx, agent):
    """The memory metadata's "last modified" line and the API's updated_at come from it."""
    block = attach(agent, "human", "Sam")
    read_before = type(block).objects.unscoped().get(id=block.id).updated_at

    result = run(ctx, agent, "memory_replace", label="human", old_string="Sam", new_string="Al")

    block.refresh_from_db()
    assert (result.status, block.value) == ("success", "Al")
    assert block.updated_at > read_before
    assert (result.edited_block.value, result.edited_block.updated_at) == ("Al", block.updated_at)


def test_a_concurrent_write_is_kept_and_the_edit_reapplied(ctx, agent, monkeypatch):
    block = attach(agent, "human", "Sam")
    real_append = edits.core_memory_append
    calls: list[str] = []

    def append_while_someone_else_writes(view, content):
        calls.append(view.value)
        if len(calls) == 1:
            memory_services.block_update(
                actor=ctx.actor, block_id=block.id, value="Sam (from the ADE)", editor=Editor("user", "u1")
            )
        return real_append(view, content)

    monkeypatch.setattr(edits, "core_memory_append", append_while_someone_else_writes)

    result = run(ctx, agent, "core_memory_append", label="human", content="Likes tea")

    assert result.return_value == "Sam (from the ADE)\nLikes tea"
    assert calls == ["Sam", "Sam (from the ADE)"]
    assert [h[:2] for h in history(block)] == [(2, "user"), (3, "agent")]


def test_an_edit_starts_from_the_runs_copy_and_reads_the_block_only_when_it_is_stale(ctx, agent):
    block = attach(agent, "human", "Sam")
    held = Block.objects.unscoped().get(id=block.id)  # what the run loaded
    with_copy = dataclasses.replace(ctx, blocks=(held,))

    with CaptureQueriesContext(connection) as fresh_copy:
        first = run(with_copy, agent, "core_memory_append", label="human", content="Likes tea")
    memory_services.block_update(
        actor=ctx.actor, block_id=block.id, value="Sam (from the ADE)", editor=Editor("user", "u1")
    )
    stale_copy = dataclasses.replace(ctx, blocks=(first.edited_block,))
    second = run(stale_copy, agent, "core_memory_append", label="human", content="Likes jazz")

    assert first.return_value == "Sam\nLikes tea"
    assert len(fresh_copy) == 1  # the compare-and-set write with its history row, no read
    assert second.return_value == "Sam (from the ADE)\nLikes jazz"  # the ADE's write is kept
    block.refresh_from_db()
    assert block.value == "Sam (from the ADE)\nLikes jazz"


def test_a_block_detached_after_the_run_loaded_it_is_not_written(ctx, agent):
    block = attach(agent, "human", "Sam")
    held = Block.objects.unscoped().get(id=block.id)
    memory_services.block_detach_from_agent(agent_id=agent.id, block_id=block.id)

    result = run(dataclasses.replace(ctx, blocks=(held,)), agent, "memory_replace",
                 label="human", old_string="Sam", new_string="Al")  # fmt: skip

    assert (result.status, result.return_value) == (
        "error",
        "No memory block labelled 'human': this agent has no memory blocks.",
    )
    block.refresh_from_db()
    assert (block.value, block.version) == ("Sam", held.version)


# -- core memory tools: errors the model can read -------------------------------------------------------


def test_an_unknown_label_lists_the_agents_blocks(ctx, agent):
    attach(agent, "persona")
    attach(agent, "human")

    result = run(ctx, agent, "core_memory_append", label="humans", content="x")

    assert (result.status, result.return_value, result.memory_changed) == (
        "error",
        "No memory block labelled 'humans'. This agent's memory blocks are: human, persona.",
        False,
    )


def test_an_unknown_label_on_an_agent_without_blocks(ctx, agent):
    result = run(ctx, agent, "memory_replace", label="human", old_string="a", new_string="b")

    assert (result.status, result.return_value) == (
        "error",
        "No memory block labelled 'human': this agent has no memory blocks.",
    )


def test_another_agents_block_is_not_this_agents(ctx, agent, org):
    other = AgentFactory(organization=org)
    block = attach(other, "human", "Sam")

    result = run(ctx, agent, "core_memory_append", label="human", content="x")

    assert result.status == "error"
    assert value_of(block) == "Sam"


def test_a_read_only_block_refuses_every_edit(ctx, agent):
    block = attach(agent, "persona", "fixed", read_only=True)

    results = [
        run(ctx, agent, "core_memory_append", label="persona", content="x"),
        run(ctx, agent, "memory_rethink", label="persona", new_memory="x"),
        run(ctx, agent, "memory_insert", label="persona", new_string="x"),
    ]

    assert {(r.status, r.return_value) for r in results} == {("error", edits.READ_ONLY_MESSAGE)}
    assert (value_of(block), history(block)) == ("fixed", [])


def test_an_edit_over_the_limit_is_refused_not_truncated(ctx, agent):
    block = attach(agent, "human", "12345", limit=10)

    result = run(ctx, agent, "core_memory_append", label="human", content="67890")

    assert (result.status, result.return_value) == (
        "error",
        "Edit failed: the new value of block 'human' would be 11 characters, over its limit of 10. "
        "Shorten or summarise the existing content first.",
    )
    assert (value_of(block), history(block)) == ("12345", [])


def test_an_ambiguous_memory_replace_is_refused(ctx, agent):
    block = attach(agent, "human", "tea\ntea")

    result = run(ctx, agent, "memory_replace", label="human", old_string="tea", new_string="coffee")

    assert result.status == "error"
    assert result.return_value.startswith("No replacement was performed: old_string `tea` was found 2 times")
    assert value_of(block) == "tea\ntea"


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        (
            "core_memory_append",
            {"label": "human"},
            "core_memory_append is missing required argument(s): content.",
        ),
        (
            "core_memory_append",
            {"label": "human", "content": None},
            "core_memory_append is missing required argument(s): content.",
        ),
        (
            "core_memory_append",
            {"label": "human", "content": "x", "mood": "happy"},
            "core_memory_append got unexpected argument(s): mood. Its parameters are: label, content.",
        ),
        (
            "core_memory_append",
            {"label": 5, "content": "x"},
            "core_memory_append: argument 'label' must be a string, got int.",
        ),
        (
            "memory_insert",
            {"label": "human", "new_string": "x", "insert_line": "two"},
            "memory_insert: argument 'insert_line' must be an integer, got 'two'.",
        ),
        (
            "archival_memory_insert",
            {"content": "x", "tags": "travel"},
            'archival_memory_insert: argument \'tags\' must be a list, e.g. ["a", "b"], got str.',
        ),
        (
            "archival_memory_search",
            {"query": "x", "tag_match_mode": "some"},
            "archival_memory_search: argument 'tag_match_mode' must be one of any, all, got 'some'.",
        ),
        (
            "conversation_search",
            {"roles": ["system"]},
            "conversation_search: argument 'roles[0]' must be one of assistant, user, tool, got 'system'.",
        ),
        (
            "send_message",
            ["hi"],
            "send_message takes its arguments as a JSON object, got list. Its parameters are: message.",
        ),
    ],
)
def test_bad_arguments_are_error_results(ctx, agent, name, arguments, message):
    block = attach(agent, "human", "Sam")

    result = execute_builtin(name, arguments, ctx, agent=agent)

    assert (result.status, result.return_value, result.memory_changed) == ("error", message, False)
    assert history(block) == []


def test_a_legacy_request_heartbeat_argument_is_ignored(ctx, agent):
    attach(agent, "human", "Sam")

    result = run(ctx, agent, "core_memory_append", label="human", content="x", request_heartbeat=True)

    assert result.status == "success"


def test_an_unknown_builtin_is_an_error_result(ctx, agent):
    result = run(ctx, agent, "memory_delete_everything")

    assert result.status == "error"
    assert result.return_value.startswith(
        "Unknown built-in tool 'memory_delete_everything'. Built-in tools are:"
    )


def test_every_builtin_tool_has_an_executor():
    assert executable_builtins() == frozenset(BUILTIN_TOOLS)


# -- archival memory ----------------------------------------------------------------------------------


def test_archival_insert_then_search_by_meaning_and_tags(ctx, agent):
    inserted = [
        run(ctx, agent, "archival_memory_insert", content="Sam went hiking in the Alps", tags=["travel"]),
        run(ctx, agent, "archival_memory_insert", content="Sam's cat is called Tom", tags=["pets"]),
        run(ctx, agent, "archival_memory_insert", content="Sam hiking boots size 44", tags=["shopping"]),
    ]

    by_meaning = run(ctx, agent, "archival_memory_search", query="hiking in the mountains", top_k="2")
    by_tag = run(ctx, agent, "archival_memory_search", query="hiking", tags=["travel", "pets"])

    assert [(r.status, r.return_value, r.memory_changed) for r in inserted] == [("success", "None", True)] * 3
    found = json.loads(by_meaning.return_value)
    assert [p["content"] for p in found] == ["Sam went hiking in the Alps", "Sam hiking boots size 44"]
    assert sorted(found[0]) == ["content", "id", "tags", "timestamp"]
    assert found[0]["tags"] == ["travel"]
    assert found[0]["id"] == Passage.objects.for_actor(ctx.actor).get(text="Sam went hiking in the Alps").id
    assert found[0]["timestamp"].endswith("+00:00")
    assert [p["content"] for p in json.loads(by_tag.return_value)] == [
        "Sam went hiking in the Alps",
        "Sam's cat is called Tom",
    ]


def test_archival_search_before_any_insert_finds_nothing(ctx, agent):
    result = run(ctx, agent, "archival_memory_search", query="anything")

    assert (result.status, result.return_value) == ("success", "[]")
    assert Archive.objects.for_actor(ctx.actor).count() == 0


def test_archival_search_with_a_bad_date_is_an_error_result(ctx, agent):
    result = run(ctx, agent, "archival_memory_search", query="x", start_datetime="yesterday")

    assert (result.status, result.return_value) == (
        "error",
        "Invalid start_datetime 'yesterday': use an ISO 8601 date (2025-01-31) or date-time (2025-01-31T14:30).",
    )


def test_an_agent_without_an_embedding_model_keeps_and_finds_passages_by_text(org):
    agent = AgentFactory(organization=org, embedding="")
    ctx = ToolContext(actor=Actor.system(org.id), agent_id=agent.id)

    inserted = run(ctx, agent, "archival_memory_insert", content="remember the blue door")
    searched = run(ctx, agent, "archival_memory_search", query="blue door")

    assert (inserted.status, inserted.memory_changed) == ("success", True)
    assert searched.status == "success"
    assert "remember the blue door" in searched.return_value
    assert Passage.objects.for_actor(ctx.actor).get().embedding is None


def test_a_failing_embedding_provider_is_an_error_result(ctx, agent, settings):
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"  # nothing listens on the discard port

    result = run(ctx, agent, "archival_memory_insert", content="remember this")

    assert result.status == "error"
    assert result.return_value.startswith("openai/text-embedding-3-small")
    assert Passage.objects.for_actor(ctx.actor).count() == 0


# -- conversation search ------------------------------------------------------------------------------


def test_conversation_search_returns_letta_shaped_json(ctx, agent):
    MessageFactory(organization=agent.organization, agent=agent, text="I love hiking")
    MessageFactory(organization=agent.organization, agent=agent, text="Lunch was fine")

    result = run(ctx, agent, "conversation_search", query="hiking", limit=1)

    body = json.loads(result.return_value)
    assert (result.status, body["message"]) == ("success", "Showing 1 results:")
    assert [(r["role"], r["content"]) for r in body["results"]] == [("user", "I love hiking")]
    assert body["results"][0]["relevance"]["fts_rank"] == 1


def test_conversation_search_without_matches(ctx, agent):
    result = run(ctx, agent, "conversation_search", query="hiking")

    assert (result.status, result.return_value) == (
        "success",
        '{"message": "No results found.", "results": []}',
    )


def test_an_agent_without_an_embedding_handle_still_searches_its_conversation(org, embeddings):
    agent = AgentFactory(organization=org, embedding="")
    ctx = ToolContext(actor=Actor.system(org.id), agent_id=agent.id)
    MessageFactory(organization=org, agent=agent, role=Message.Role.ASSISTANT, text="Hiking is great")

    result = run(ctx, agent, "conversation_search", query="hiking", roles=["assistant"])

    [found] = json.loads(result.return_value)["results"]
    assert (found["content"], found["relevance"]["search_mode"]) == ("Hiking is great", "fts")
    assert embeddings.requests("/v1/embeddings") == []


def test_conversation_search_errors_are_error_results(ctx, agent):
    result = run(ctx, agent, "conversation_search", query="x", end_date="31/01/2025")

    assert (result.status, result.return_value) == (
        "error",
        "Invalid end_date '31/01/2025': use an ISO 8601 date (2025-01-31) or date-time (2025-01-31T14:30).",
    )
