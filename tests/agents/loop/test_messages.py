import pytest

from apps.agents.loop.messages import memory_pressure_warning, summary_message_text


def test_summary_message_says_how_many_were_removed_and_where_they_are():
    text = summary_message_text("  Ada likes tea; we planned a trip.\n", evicted_count=5, total_count=12)

    assert text == (
        "[Automated system message, not shown to the user] 5 earlier messages (of 12 in this conversation) "
        "were removed from your context window to make room. They are still stored in recall memory, "
        "where your tools can search.\n"
        "Summary of what was removed:\n"
        "Ada likes tea; we planned a trip."
    )


def test_summary_message_for_one_removed_message_is_singular():
    text = summary_message_text("Hi.", evicted_count=1, total_count=3)

    assert text.startswith(
        "[Automated system message, not shown to the user] 1 earlier message (of 3 in this conversation) "
        "was removed from your context window to make room. It is still stored in recall memory"
    )


def test_summary_message_refuses_more_evicted_than_total():
    with pytest.raises(ValueError, match="evicted_count must be between 0 and total_count"):
        summary_message_text("x", evicted_count=4, total_count=3)


def test_summary_message_refuses_a_negative_count():
    with pytest.raises(ValueError, match="evicted_count"):
        summary_message_text("x", evicted_count=-1, total_count=3)


def test_memory_pressure_warning_gives_the_usage_and_asks_to_save():
    text = memory_pressure_warning(7500, 10_000)

    assert text == (
        "[Automated system message, not shown to the user] Your context window is 75% full "
        "(7500 of 10000 tokens). The oldest messages will soon be summarised and removed from view. "
        "If they hold anything important about the user or yourself that is not yet in memory, "
        "save it now with your memory tools. Do not mention this alert to the user."
    )


def test_memory_pressure_warning_names_the_agents_memory_tools():
    text = memory_pressure_warning(7199, 10_000, tool_names=["memory_insert", "archival_memory_insert"])

    assert "is 71% full (7199 of 10000 tokens)" in text
    assert "save it now with your memory tools (memory_insert, archival_memory_insert)." in text


def test_memory_pressure_warning_refuses_a_zero_window():
    with pytest.raises(ValueError, match="context_window must be positive"):
        memory_pressure_warning(10, 0)
