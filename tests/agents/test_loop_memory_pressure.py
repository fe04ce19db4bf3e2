"""Memory pressure, compaction and the cost of a step, through the real loop."""

from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.agents.models import Message, Run
from apps.agents.prompts import SUMMARIZER_PROMPT
from apps.agents.services import BlockSpec
from apps.llm.tokens import count_tokens
from apps.memory.models import Block
from tests.agents.test_loop import custom_tool
from tests.support.scripted_llm import text, tool_call, tool_calls

LONG = "I went hiking in the Alps last summer and the views were amazing. " * 8  # about 130 tokens


def test_a_long_conversation_warns_then_compacts_and_every_request_fits(make_agent, send, llm):
    agent = make_agent(context_window_limit=1200, include_base_tools=False)
    llm.configure(strict=False, default_turn={"content": "Noted."})

    results = [send(agent, f"Message {i}: {LONG}") for i in range(8)]

    assert all(r.stop_reason == "end_turn" for r in results)
    alerts = Message.all_objects.filter(agent=agent, role="system", name="memory_pressure")
    summaries = Message.all_objects.filter(agent=agent, role="summary")
    assert alerts.exists()
    assert summaries.exists()
    assert "Summary of what was removed" in summaries.first().text
    chat = [r for r in llm.chat_requests() if r["messages"][0]["content"] != SUMMARIZER_PROMPT]
    assert max(count_tokens("gpt-4o-mini", r["messages"], r.get("tools")) for r in chat) <= 1200
    agent.refresh_from_db()
    first_user = Message.all_objects.filter(agent=agent, role="user").order_by("sequence_id").first()
    assert first_user.id not in agent.message_ids  # evicted from context...
    assert Message.all_objects.filter(agent=agent, role="user").count() == 8  # ...but kept in recall


def test_a_summary_request_carries_the_evicted_messages(make_agent, send, llm):
    agent = make_agent(context_window_limit=1200, include_base_tools=False)
    llm.configure(strict=False, default_turn={"content": "Noted."})

    for i in range(8):
        send(agent, f"Message {i}: {LONG}")

    summarizer = next(r for r in llm.chat_requests() if r["messages"][0]["content"] == SUMMARIZER_PROMPT)
    assert "Message 0:" in summarizer["messages"][1]["content"]


def test_a_system_prompt_that_cannot_fit_stops_before_calling_the_llm(make_agent, send, llm):
    agent = make_agent(
        context_window_limit=500,
        memory_blocks=[BlockSpec(label="human", value="facts " * 1000, limit=10_000)],
    )

    result = send(agent, "hi")

    assert result.stop_reason == "context_window_overflow_in_system_prompt"
    assert result.run.status == Run.Status.FAILED
    assert "context window" in result.run.error["message"]
    assert llm.chat_requests() == []


def queries_for_one_turn(send, llm, agent) -> int:
    send(agent, "warm up")
    llm.push(text("hi"))
    with CaptureQueriesContext(connection) as captured:
        send(agent, "hello")
    return len(captured)


def test_a_step_costs_a_fixed_number_of_queries_however_many_blocks_tools_and_messages(
    make_agent, send, llm, actor, org
):
    small = make_agent()
    big = make_agent(
        tool_ids=[custom_tool(org, name=f"t{i}").id for i in range(8)],
        memory_blocks=[BlockSpec(label=f"b{i}", value="x" * 50) for i in range(10)],
    )
    llm.configure(strict=False, default_turn={"content": "ok"})
    for i in range(20):
        send(big, f"filler {i}")

    small_count = queries_for_one_turn(send, llm, small)
    big_count = queries_for_one_turn(send, llm, big)

    # The bound (README, "Agent loop"): 15 statements and 2 savepoints for a one-step turn.
    # Input: agent lock (with its last message's role), run and messages (one statement). Start: one
    # statement that takes the advisory lock, checks for orphaned and earlier runs, claims and admits the
    # input. Loading (two round trips, apps.agents.loop.store.read_together): agent
    # (with its message count, kept by a trigger), provider, messages (only those this process has not
    # loaded before), blocks, tools, archival counts. The step: one statement (step, messages, append to
    # the in-context list; no cancel check: the claim just read the run). Finishing: run and agent (one
    # statement), unlock. After the answer: the steps' provider traces (one UPDATE, which also inserts the
    # run's LLM call records, apps/llm/records.py, and its trace spans, RUN_TRACES: GET
    # /v1/runs/{id}/trace and the ADE's waterfall, apps/observability), the run's recall embeddings
    # (provider, one UPDATE).
    assert big_count == small_count
    assert small_count == 17


def test_a_memory_edit_step_costs_a_fixed_number_of_queries(make_agent, send, llm):
    agent = make_agent(memory_blocks=[BlockSpec(label="human", value="Name: Sam")])
    simple = queries_for_one_turn(send, llm, agent)
    llm.push(
        tool_calls(tool_call("memory_replace", {"label": "human", "old_string": "Sam", "new_string": "Al"})),
        text("Noted."),
    )
    with CaptureQueriesContext(connection) as captured:
        result = send(agent, "I am Al now")

    statements = [q["sql"] for q in captured.captured_queries]
    assert result.stop_reason == "end_turn"
    assert (
        Block.objects.unscoped().get(agent_attachments__agent_id=agent.id, label="human").value == "Name: Al"
    )
    # Over a one-step turn: the second step (one statement), the cancel check between the answer and the
    # tool, and the edit: one statement that writes the block the run loaded (compare-and-set on its
    # version, while still attached) with its history row; the block is not read again before or after,
    # and the second step's cancel check reads the status the first step's statement returned.
    assert len(statements) - simple == 3
    edit = next(i for i, sql in enumerate(statements) if "UPDATE memory_block SET" in sql)
    assert 'INSERT INTO "memory_blockhistory"' in statements[edit]
    block_reads = [i for i, sql in enumerate(statements) if "FROM memory_block AS block" in sql]
    assert len(block_reads) == 1  # the run's load: no read before or after the edit
    assert block_reads[0] < edit - 2  # before the first step
    assert sum(sql.startswith("SELECT status FROM agents_run") for sql in statements) == 1


def test_a_prompt_already_far_over_the_window_is_summarised_in_pieces_that_fit(make_agent, send, llm):
    agent = make_agent(context_window_limit=8000, include_base_tools=False)
    llm.configure(strict=False, default_turn={"content": "Noted."})
    for i in range(12):
        send(agent, f"Message {i}: {LONG}")
    type(agent).all_objects.filter(id=agent.id).update(context_window_limit=1500)  # e.g. a smaller model
    llm.reset()
    llm.configure(strict=False, default_turn={"content": "Noted."})

    result = send(agent, "and now?")

    summaries = [r for r in llm.chat_requests() if r["messages"][0]["content"] == SUMMARIZER_PROMPT]
    chat = [r for r in llm.chat_requests() if r["messages"][0]["content"] != SUMMARIZER_PROMPT]
    assert result.stop_reason == "end_turn"
    assert len(summaries) >= 2  # the part to evict did not fit one summariser request
    assert all(count_tokens("gpt-4o-mini", r["messages"]) <= 1500 for r in summaries)
    assert count_tokens("gpt-4o-mini", chat[-1]["messages"], chat[-1].get("tools")) <= 1500


def test_a_provider_context_overflow_is_compacted_and_the_step_retried(make_agent, send, llm):
    from tests.support.scripted_llm import context_length_exceeded

    agent = make_agent(include_base_tools=False)
    llm.configure(strict=False, default_turn={"content": "Noted."})
    for i in range(4):
        send(agent, f"Message {i}: {LONG}")
    llm.reset()
    llm.push(context_length_exceeded(), text("summary of earlier talk"), text("Fits now."))

    result = send(agent, "hello again")

    assert result.stop_reason == "end_turn"
    assert result.messages[-1].text == "Fits now."
    assert Message.all_objects.filter(agent=agent, role="summary").count() == 1


def _overflowing_agent(make_agent, send, llm):
    agent = make_agent(include_base_tools=False)
    llm.configure(strict=False, default_turn={"content": "Noted."})
    for i in range(4):
        send(agent, f"Message {i}: {LONG}")
    llm.reset()
    return agent


def test_a_provider_error_on_the_retry_after_compaction_stops_with_llm_api_error(make_agent, send, llm):
    from apps.agents.models import Step
    from tests.support.scripted_llm import context_length_exceeded, error

    agent = _overflowing_agent(make_agent, send, llm)
    llm.push(context_length_exceeded(), text("summary of earlier talk"), error(400, "bad request on retry"))

    result = send(agent, "hello again")

    assert result.stop_reason == "llm_api_error"
    assert (result.run.status, "bad request on retry" in result.run.error["message"]) == ("failed", True)
    assert Step.all_objects.get(run=result.run).status == Step.Status.FAILED


def test_a_summariser_that_fails_during_compaction_stops_with_llm_api_error(make_agent, send, llm):
    from apps.agents.models import Step
    from tests.support.scripted_llm import context_length_exceeded, error

    agent = _overflowing_agent(make_agent, send, llm)
    llm.push(context_length_exceeded(), error(400, "the summariser was refused"))

    result = send(agent, "hello again")

    assert result.stop_reason == "llm_api_error"
    assert "the summariser was refused" in result.run.error["message"]
    assert Step.all_objects.get(run=result.run).status == Step.Status.FAILED


def test_a_summariser_that_fails_when_the_window_fills_stops_with_llm_api_error(make_agent, send, llm):
    from tests.support.scripted_llm import error

    agent = make_agent(context_window_limit=1200, include_base_tools=False)
    llm.configure(strict=False, default_turn={"content": "Noted."})
    # Only the summariser's request carries the oldest message (its transcript): it alone is refused.
    llm.push(error(400, "no summary for you", when_last_user_contains="Message 0:", persist=True))

    results = [send(agent, f"Message {i}: {LONG}") for i in range(8)]

    failed = [r for r in results if r.stop_reason != "end_turn"]
    assert failed
    assert {r.stop_reason for r in failed} == {"llm_api_error"}
    assert "no summary for you" in failed[0].run.error["message"]
