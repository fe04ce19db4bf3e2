import pytest

from apps.agents.loop.budget import (
    ContextBudget,
    MessageInfo,
    chunk_for_summary,
    context_breakdown,
    group_tool_exchanges,
    tool_return_char_limit,
    truncate_tool_return,
)
from apps.agents.loop.context import SystemSections

SYSTEM = MessageInfo(id="sys", role="system", tokens=50)


def _ids(groups: list[list[MessageInfo]]) -> list[list[str]]:
    return [[message.id for message in group] for group in groups]


def _conversation() -> list[MessageInfo]:
    """sys, u1, a1 calling c1+c2, their two results, u2, a2, u3: 600 tokens after the system message."""
    return [
        SYSTEM,
        MessageInfo(id="u1", role="user", tokens=100),
        MessageInfo(id="a1", role="assistant", tokens=100, tool_call_ids=("c1", "c2")),
        MessageInfo(id="t1", role="tool", tokens=50, tool_call_id="c1"),
        MessageInfo(id="t2", role="tool", tokens=50, tool_call_id="c2"),
        MessageInfo(id="u2", role="user", tokens=100),
        MessageInfo(id="a2", role="assistant", tokens=100),
        MessageInfo(id="u3", role="user", tokens=100),
    ]


def test_default_thresholds_follow_the_window():
    budget = ContextBudget(context_window=128_000)

    assert budget.warning_threshold == 89_600
    assert budget.compact_threshold == 115_200


def test_zero_window_is_refused():
    with pytest.raises(ValueError, match="context_window must be positive"):
        ContextBudget(context_window=0)


def test_warning_above_compaction_is_refused():
    with pytest.raises(ValueError, match="warning_fraction <= compact_fraction"):
        ContextBudget(context_window=1000, warning_fraction=0.95)


def test_keep_everything_fraction_is_refused():
    with pytest.raises(ValueError, match="keep_recent_fraction"):
        ContextBudget(context_window=1000, keep_recent_fraction=1.0)


def test_assess_at_the_warning_threshold_is_ok():
    budget = ContextBudget(context_window=1000)

    verdict = budget.assess(system_tokens=300, message_tokens=[100, 200], tool_schema_tokens=100)

    assert (verdict.state, verdict.total, verdict.fixed, verdict.context_window) == ("ok", 700, 400, 1000)


def test_assess_past_the_warning_threshold_warns():
    budget = ContextBudget(context_window=1000)

    verdict = budget.assess(system_tokens=300, message_tokens=[100, 201], tool_schema_tokens=100)

    assert (verdict.state, verdict.total) == ("warning", 701)


def test_assess_at_the_compaction_threshold_still_only_warns():
    budget = ContextBudget(context_window=1000)

    verdict = budget.assess(system_tokens=300, message_tokens=[500], tool_schema_tokens=100)

    assert (verdict.state, verdict.total) == ("warning", 900)


def test_assess_past_the_compaction_threshold_overflows():
    budget = ContextBudget(context_window=1000)

    verdict = budget.assess(system_tokens=300, message_tokens=[500, 1], tool_schema_tokens=100)

    assert (verdict.state, verdict.total) == ("overflow", 901)


def test_assess_system_and_tools_filling_the_window_is_a_system_overflow():
    budget = ContextBudget(context_window=1000)

    verdict = budget.assess(system_tokens=900, message_tokens=[], tool_schema_tokens=100)

    assert (verdict.state, verdict.total, verdict.fixed) == ("system_overflow", 1000, 1000)


def test_assess_system_just_under_the_window_is_an_ordinary_overflow():
    budget = ContextBudget(context_window=1000)

    verdict = budget.assess(system_tokens=899, message_tokens=[], tool_schema_tokens=100)

    assert (verdict.state, verdict.total) == ("overflow", 999)


def test_assess_refuses_negative_counts():
    budget = ContextBudget(context_window=1000)

    with pytest.raises(ValueError, match="negative"):
        budget.assess(system_tokens=10, message_tokens=[5, -1], tool_schema_tokens=0)


def test_compaction_keeps_the_system_message_and_the_recent_share():
    budget = ContextBudget(context_window=1000)

    plan = budget.choose_messages_to_compact(_conversation())

    assert plan.keep_ids == ("sys", "u3")
    assert plan.summarize_ids == ("u1", "a1", "t1", "t2", "u2", "a2")
    assert (plan.kept_tokens, plan.summarized_tokens) == (150, 500)


def test_compaction_never_keeps_tool_results_without_their_call():
    budget = ContextBudget(context_window=1000)

    plan = budget.choose_messages_to_compact(_conversation(), keep_tokens=400)

    assert plan.keep_ids == ("sys", "u2", "a2", "u3")
    assert plan.summarize_ids == ("u1", "a1", "t1", "t2")
    assert (plan.kept_tokens, plan.summarized_tokens) == (350, 300)


def test_compaction_keeps_a_whole_tool_exchange_when_it_fits():
    budget = ContextBudget(context_window=1000)

    plan = budget.choose_messages_to_compact(_conversation(), keep_tokens=500)

    assert plan.keep_ids == ("sys", "a1", "t1", "t2", "u2", "a2", "u3")
    assert plan.summarize_ids == ("u1",)
    assert (plan.kept_tokens, plan.summarized_tokens) == (550, 100)


def test_compaction_keeps_the_newest_exchange_even_when_it_is_too_big():
    messages = [
        SYSTEM,
        MessageInfo(id="u1", role="user", tokens=100),
        MessageInfo(id="a1", role="assistant", tokens=10, tool_call_ids=("c1",)),
        MessageInfo(id="t1", role="tool", tokens=1000, tool_call_id="c1"),
    ]

    plan = ContextBudget(context_window=1000).choose_messages_to_compact(messages)

    assert plan.keep_ids == ("sys", "a1", "t1")
    assert plan.summarize_ids == ("u1",)
    assert (plan.kept_tokens, plan.summarized_tokens) == (1060, 100)


def test_compaction_keeps_a_pending_tool_call():
    messages = [
        SYSTEM,
        MessageInfo(id="u1", role="user", tokens=100),
        MessageInfo(id="a1", role="assistant", tokens=100, tool_call_ids=("c9",)),
    ]

    plan = ContextBudget(context_window=1000).choose_messages_to_compact(messages)

    assert plan.keep_ids == ("sys", "a1")
    assert plan.summarize_ids == ("u1",)


def test_compaction_never_starts_the_tail_with_an_orphan_tool_result():
    messages = [
        SYSTEM,
        MessageInfo(id="t0", role="tool", tokens=10, tool_call_id="gone"),
        MessageInfo(id="u1", role="user", tokens=10),
    ]

    plan = ContextBudget(context_window=1000).choose_messages_to_compact(messages, keep_tokens=1000)

    assert plan.keep_ids == ("sys", "u1")
    assert plan.summarize_ids == ("t0",)
    assert (plan.kept_tokens, plan.summarized_tokens) == (60, 10)


def test_compaction_of_a_lone_orphan_tool_result_keeps_only_the_system_message():
    messages = [SYSTEM, MessageInfo(id="t0", role="tool", tokens=10, tool_call_id="gone")]

    plan = ContextBudget(context_window=1000).choose_messages_to_compact(messages)

    assert plan.keep_ids == ("sys",)
    assert plan.summarize_ids == ("t0",)
    assert (plan.kept_tokens, plan.summarized_tokens) == (50, 10)


def test_compaction_of_the_system_message_alone_has_nothing_to_summarise():
    plan = ContextBudget(context_window=1000).choose_messages_to_compact([SYSTEM])

    assert plan.keep_ids == ("sys",)
    assert plan.summarize_ids == ()
    assert (plan.kept_tokens, plan.summarized_tokens) == (50, 0)


def test_compaction_of_no_messages_is_empty():
    plan = ContextBudget(context_window=1000).choose_messages_to_compact([])

    assert (plan.keep_ids, plan.summarize_ids, plan.kept_tokens, plan.summarized_tokens) == ((), (), 0, 0)


def test_tool_exchange_spans_messages_between_a_call_and_its_late_result():
    messages = [
        MessageInfo(id="a1", role="assistant", tokens=1, tool_call_ids=("c1",)),
        MessageInfo(id="ok", role="user", tokens=1),
        MessageInfo(id="t1", role="tool", tokens=1, tool_call_id="c1"),
        MessageInfo(id="a2", role="assistant", tokens=1),
    ]

    groups = group_tool_exchanges(messages)

    assert _ids(groups) == [["a1", "ok", "t1"], ["a2"]]


def test_tool_exchange_grows_with_calls_made_inside_it():
    messages = [
        MessageInfo(id="a1", role="assistant", tokens=1, tool_call_ids=("c1",)),
        MessageInfo(id="a2", role="assistant", tokens=1, tool_call_ids=("c2",)),
        MessageInfo(id="t1", role="tool", tokens=1, tool_call_id="c1"),
        MessageInfo(id="u1", role="user", tokens=1),
        MessageInfo(id="t2", role="tool", tokens=1, tool_call_id="c2"),
        MessageInfo(id="u2", role="user", tokens=1),
    ]

    groups = group_tool_exchanges(messages)

    assert _ids(groups) == [["a1", "a2", "t1", "u1", "t2"], ["u2"]]


def test_chunks_keep_tool_exchanges_together_and_fit_the_limit():
    messages = _conversation()[1:6]

    chunks = chunk_for_summary(messages, max_tokens=300)

    assert _ids(chunks) == [["u1", "a1", "t1", "t2"], ["u2"]]


def test_chunks_split_an_exchange_too_big_for_one_piece():
    messages = [
        MessageInfo(id="a1", role="assistant", tokens=100, tool_call_ids=("c1", "c2")),
        MessageInfo(id="t1", role="tool", tokens=200, tool_call_id="c1"),
        MessageInfo(id="t2", role="tool", tokens=100, tool_call_id="c2"),
    ]

    chunks = chunk_for_summary(messages, max_tokens=250)

    assert _ids(chunks) == [["a1"], ["t1"], ["t2"]]


def test_chunks_give_an_oversized_message_a_piece_of_its_own():
    messages = [
        MessageInfo(id="u1", role="user", tokens=500),
        MessageInfo(id="u2", role="user", tokens=10),
        MessageInfo(id="u3", role="user", tokens=10),
    ]

    chunks = chunk_for_summary(messages, max_tokens=100)

    assert _ids(chunks) == [["u1"], ["u2", "u3"]]


def test_chunks_of_nothing_are_empty():
    assert chunk_for_summary([], max_tokens=100) == []


def test_chunks_need_a_positive_limit():
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        chunk_for_summary([], max_tokens=0)


def test_tool_return_limit_is_a_tenth_of_the_window_in_characters():
    assert tool_return_char_limit(128_000) == 51_200
    assert tool_return_char_limit(1000) == 400
    assert tool_return_char_limit(100, fraction=0.05) == 20


def test_tool_return_limit_is_at_least_one_character():
    assert tool_return_char_limit(1) == 1


def test_tool_return_limit_refuses_bad_fractions():
    with pytest.raises(ValueError, match="fraction"):
        tool_return_char_limit(1000, fraction=1.5)


def test_tool_return_limit_refuses_a_zero_window():
    with pytest.raises(ValueError, match="context_window"):
        tool_return_char_limit(0)


def test_tool_return_at_the_limit_is_untouched():
    text = "x" * 400

    assert truncate_tool_return(text, context_window=1000) == text


def test_long_tool_return_keeps_the_head_and_says_what_was_cut():
    text = "a" * 400 + "b" * 50

    truncated = truncate_tool_return(text, context_window=1000)

    assert truncated == (
        "a" * 400 + "\n[... 50 characters cut: the tool returned 450 characters "
        "and at most 400 fit in the context window]"
    )


def test_breakdown_counts_each_section_and_the_summary_apart():
    sections = SystemSections(
        system_prompt="You are Sam. {CORE_MEMORY}", memory_blocks="a b c", tool_rules="", metadata="d e"
    )
    messages = [
        MessageInfo(id="sum", role="user", tokens=40),
        MessageInfo(id="u1", role="user", tokens=10),
        MessageInfo(id="a1", role="assistant", tokens=25),
    ]

    breakdown = context_breakdown(
        context_window=200,
        sections=sections,
        count_tokens=lambda text: len(text.split()) + 1,
        tool_schema_tokens=100,
        messages=messages,
        summary_message_id="sum",
    )

    assert (
        breakdown.system_prompt,
        breakdown.memory_blocks,
        breakdown.tool_rules,
        breakdown.metadata,
        breakdown.summary,
        breakdown.tool_schemas,
        breakdown.messages,
    ) == (4, 4, 0, 3, 40, 100, 35)
    assert (breakdown.total, breakdown.free) == (186, 14)


def test_breakdown_without_a_summary_counts_all_messages_and_never_goes_negative():
    sections = SystemSections(system_prompt="p", memory_blocks="", tool_rules="r", metadata="m")
    messages = [MessageInfo(id="u1", role="user", tokens=90)]

    breakdown = context_breakdown(
        context_window=50,
        sections=sections,
        count_tokens=len,
        tool_schema_tokens=0,
        messages=messages,
    )

    assert (breakdown.summary, breakdown.messages) == (0, 90)
    assert (breakdown.tool_rules, breakdown.memory_blocks) == (1, 0)
    assert (breakdown.total, breakdown.free) == (93, 0)
