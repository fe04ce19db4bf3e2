"""Core-memory edit rules: Letta-compatible results and model-readable refusals."""

from __future__ import annotations

import dataclasses
import re
from contextlib import AbstractContextManager

import pytest

from apps.core.errors import DomainError
from apps.memory.edits import (
    LINE_NUMBER_WARNING,
    MEMORY_TOOL_NAMES,
    READ_ONLY_MESSAGE,
    BlockView,
    MemoryEditError,
    core_memory_append,
    core_memory_replace,
    memory_insert,
    memory_replace,
    memory_rethink,
    render_block_with_line_numbers,
    should_show_line_numbers,
)

PREFIX_ERROR = (
    "{name} contains a line-number prefix (such as '3→ ' or 'Line 3: '). "
    "Line numbers are display-only; pass only the block's own text."
)
WARNING_ERROR = (
    "{name} contains the line-number note shown above the block. "
    "That note is display-only; pass only the block's own text."
)


def block(value: str = "", *, label: str = "human", limit: int = 5000, read_only: bool = False) -> BlockView:
    return BlockView(label=label, value=value, limit=limit, read_only=read_only)


def limit_error(label: str, size: int, limit: int) -> str:
    return (
        f"Edit failed: the new value of block '{label}' would be {size} characters, "
        f"over its limit of {limit}. Shorten or summarise the existing content first."
    )


def raises_edit_error(message: str) -> AbstractContextManager[pytest.ExceptionInfo[MemoryEditError]]:
    return pytest.raises(MemoryEditError, match=f"^{re.escape(message)}$")


# --- errors and block view -------------------------------------------------------------------------


def test_memory_edit_error_is_a_domain_error_with_stable_code():
    error = MemoryEditError("nope")

    assert isinstance(error, DomainError)
    assert error.code == "memory_edit_error"
    assert str(error) == "nope"


def test_block_view_is_frozen():
    view = block("Name: Alice")

    with pytest.raises(dataclasses.FrozenInstanceError):
        view.value = "changed"


def test_block_view_defaults_to_writable():
    view = BlockView(label="human", value="x", limit=10)

    assert view.read_only is False


# --- core_memory_append -------------------------------------------------------------------------


def test_append_joins_with_newline():
    view = block("Name: Alice")

    result = core_memory_append(view, "Likes tea")

    assert result == "Name: Alice\nLikes tea"


def test_append_to_empty_block_keeps_leading_newline_like_letta():
    view = block("")

    result = core_memory_append(view, "Likes tea")

    assert result == "\nLikes tea"


def test_append_leaves_tabs_and_line_number_lookalikes_alone():
    view = block("a")

    result = core_memory_append(view, "1→\tb")

    assert result == "a\n1→\tb"


def test_append_refuses_read_only_block():
    view = block("Name: Alice", read_only=True)

    with raises_edit_error("This block is read-only and cannot be edited."):
        core_memory_append(view, "Likes tea")


def test_append_refuses_non_string_content():
    view = block("a")

    with raises_edit_error("content must be a string, got NoneType."):
        core_memory_append(view, None)


def test_append_exactly_at_limit_passes():
    view = block("abcd", limit=10)

    result = core_memory_append(view, "efghi")

    assert result == "abcd\nefghi"
    assert len(result) == 10


def test_append_one_over_limit_fails_and_block_is_unchanged():
    view = block("abcd", limit=10)

    with raises_edit_error(limit_error("human", 11, 10)):
        core_memory_append(view, "efghij")

    assert view == block("abcd", limit=10)


def test_append_limit_message_names_the_numbers():
    view = block("x" * 5000, limit=5000)

    with raises_edit_error(
        "Edit failed: the new value of block 'human' would be 5123 characters, over its limit of 5000. "
        "Shorten or summarise the existing content first."
    ):
        core_memory_append(view, "y" * 122)


def test_append_strips_nul_characters_before_measuring():
    view = block("ab", limit=5)

    result = core_memory_append(view, "c\x00d\x00")

    assert result == "ab\ncd"


# --- core_memory_replace ------------------------------------------------------------------------


def test_core_replace_swaps_exact_text():
    view = block("Name: Alice\nLikes tea")

    result = core_memory_replace(view, "Alice", "Bob")

    assert result == "Name: Bob\nLikes tea"


def test_core_replace_replaces_every_occurrence_like_letta():
    view = block("tea, tea, tea")

    result = core_memory_replace(view, "tea", "coffee")

    assert result == "coffee, coffee, coffee"


def test_core_replace_with_empty_new_content_deletes():
    view = block("Name: Alice\nLikes tea")

    result = core_memory_replace(view, "\nLikes tea", "")

    assert result == "Name: Alice"


def test_core_replace_missing_text_names_text_and_label():
    view = block("Name: Alice", label="persona")

    with raises_edit_error(
        "Old content `alice` was not found in memory block 'persona'. "
        "It must match the block's current text exactly, including case and whitespace."
    ):
        core_memory_replace(view, "alice", "Bob")


def test_core_replace_refuses_empty_old_content():
    view = block("Name: Alice")

    with raises_edit_error(
        "old_content must not be empty: quote the exact text to replace "
        "(use core_memory_append to add new text)."
    ):
        core_memory_replace(view, "", "Bob")


def test_core_replace_refuses_read_only_block():
    view = block("Name: Alice", read_only=True)

    with raises_edit_error(READ_ONLY_MESSAGE):
        core_memory_replace(view, "Alice", "Bob")


def test_core_replace_refuses_non_string_new_content():
    view = block("Name: Alice")

    with raises_edit_error("new_content must be a string, got int."):
        core_memory_replace(view, "Alice", 5)


def test_core_replace_exactly_at_limit_passes():
    view = block("Name: Al", limit=10)

    result = core_memory_replace(view, "Al", "Alic")

    assert result == "Name: Alic"


def test_core_replace_one_over_limit_fails_and_block_is_unchanged():
    view = block("Name: Al", limit=10)

    with raises_edit_error(limit_error("human", 11, 10)):
        core_memory_replace(view, "Al", "Alice")

    assert view.value == "Name: Al"


def test_core_replace_shrinking_a_block_still_over_its_limit_fails():
    view = block("0123456789ABC", limit=10)

    with raises_edit_error(limit_error("human", 12, 10)):
        core_memory_replace(view, "ABC", "AB")


# --- memory_replace ------------------------------------------------------------------------------


def test_memory_replace_swaps_unique_text():
    view = block("Name: Alice\nLikes tea")

    result = memory_replace(view, "Likes tea", "Likes coffee")

    assert result == "Name: Alice\nLikes coffee"


def test_memory_replace_with_empty_new_string_deletes():
    view = block("Name: Alice\nLikes tea")

    result = memory_replace(view, "\nLikes tea", "")

    assert result == "Name: Alice"


def test_memory_replace_can_span_lines():
    view = block("a\nb\nc")

    result = memory_replace(view, "a\nb", "x")

    assert result == "x\nc"


def test_memory_replace_zero_matches_names_the_count():
    view = block("Name: Alice", label="persona")

    with raises_edit_error(
        "No replacement was performed: old_string `Bob` was found 0 times in memory block 'persona'. "
        "It must appear verbatim (including whitespace) exactly once."
    ):
        memory_replace(view, "Bob", "Carol")


def test_memory_replace_multiple_matches_names_count_and_lines():
    view = block("tea\ncoffee\ntea")

    with raises_edit_error(
        "No replacement was performed: old_string `tea` was found 2 times in memory block 'human' "
        "(on lines 1, 3). It must appear exactly once; include more surrounding text to make it unique."
    ):
        memory_replace(view, "tea", "water")


def test_memory_replace_multiple_matches_on_one_line():
    view = block("intro\ntea, tea, tea")

    with raises_edit_error(
        "No replacement was performed: old_string `tea` was found 3 times in memory block 'human' "
        "(on line 2). It must appear exactly once; include more surrounding text to make it unique."
    ):
        memory_replace(view, "tea", "water")


def test_memory_replace_counts_non_overlapping_matches():
    view = block("aaa")

    with raises_edit_error(
        "No replacement was performed: old_string `a` was found 3 times in memory block 'human' "
        "(on line 1). It must appear exactly once; include more surrounding text to make it unique."
    ):
        memory_replace(view, "a", "b")


def test_memory_replace_overlapping_pattern_counts_once():
    view = block("aaa")

    result = memory_replace(view, "aa", "b")

    assert result == "ba"


def test_memory_replace_refuses_empty_old_string():
    view = block("Name: Alice")

    with raises_edit_error(
        "old_string must not be empty: quote the exact text to replace (use memory_insert to add new text)."
    ):
        memory_replace(view, "", "x")


def test_memory_replace_expands_tabs_in_block_and_arguments():
    view = block("\tName: Alice\nx\ty")

    result = memory_replace(view, "\tName: Alice", "\tName: Bob")

    assert result == "        Name: Bob\nx       y"


def test_memory_replace_expands_tabs_in_old_string_independently_of_column():
    view = block("x\ty")

    with raises_edit_error(
        "No replacement was performed: old_string `        y` was found 0 times in memory block 'human'. "
        "It must appear verbatim (including whitespace) exactly once."
    ):
        memory_replace(view, "\ty", "z")


def test_memory_replace_refuses_arrow_prefix_in_old_string():
    view = block("Name: Alice")

    with raises_edit_error(PREFIX_ERROR.format(name="old_string")):
        memory_replace(view, "1→ Name: Alice", "Name: Bob")


def test_memory_replace_refuses_indented_arrow_prefix_on_later_line():
    view = block("a\nb")

    with raises_edit_error(PREFIX_ERROR.format(name="old_string")):
        memory_replace(view, "a\n  2→ b", "c")


def test_memory_replace_refuses_line_colon_prefix_in_old_string():
    view = block("Name: Alice")

    with raises_edit_error(PREFIX_ERROR.format(name="old_string")):
        memory_replace(view, "Line 1: Name: Alice", "Name: Bob")


def test_memory_replace_refuses_line_colon_prefix_after_newline():
    view = block("a\nb")

    with raises_edit_error(PREFIX_ERROR.format(name="old_string")):
        memory_replace(view, "a\nLine 2: b", "c")


def test_memory_replace_refuses_arrow_prefix_in_new_string():
    view = block("Name: Alice")

    with raises_edit_error(PREFIX_ERROR.format(name="new_string")):
        memory_replace(view, "Name: Alice", "1→ Name: Bob")


def test_memory_replace_refuses_line_colon_prefix_in_new_string():
    view = block("Name: Alice")

    with raises_edit_error(PREFIX_ERROR.format(name="new_string")):
        memory_replace(view, "Name: Alice", "Line 1: Name: Bob")


def test_memory_replace_refuses_warning_banner_in_old_string():
    view = block("Name: Alice")

    with raises_edit_error(WARNING_ERROR.format(name="old_string")):
        memory_replace(view, f"{LINE_NUMBER_WARNING}\nName: Alice", "Name: Bob")


def test_memory_replace_refuses_warning_banner_in_new_string():
    view = block("Name: Alice")

    with raises_edit_error(WARNING_ERROR.format(name="new_string")):
        memory_replace(view, "Name: Alice", f"{LINE_NUMBER_WARNING}\nName: Bob")


def test_memory_replace_allows_arrow_and_line_word_mid_line():
    view = block("Name: Alice")

    result = memory_replace(view, "Alice", "Alice (step 1→2, Line 3: done)")

    assert result == "Name: Alice (step 1→2, Line 3: done)"


def test_memory_replace_refuses_read_only_before_checking_arguments():
    view = block("Name: Alice", read_only=True)

    with raises_edit_error(READ_ONLY_MESSAGE):
        memory_replace(view, "1→ Name: Alice", "x")


def test_memory_replace_refuses_non_string_old_string():
    view = block("Name: Alice")

    with raises_edit_error("old_string must be a string, got list."):
        memory_replace(view, ["Alice"], "Bob")


def test_memory_replace_exactly_at_limit_passes():
    view = block("Name: Al", limit=10)

    result = memory_replace(view, "Al", "Alic")

    assert result == "Name: Alic"


def test_memory_replace_one_over_limit_fails_and_block_is_unchanged():
    view = block("Name: Al", limit=10)

    with raises_edit_error(limit_error("human", 11, 10)):
        memory_replace(view, "Al", "Alice")

    assert view.value == "Name: Al"


def test_memory_replace_limit_counts_expanded_tabs():
    view = block("\tx", limit=8)

    with raises_edit_error(limit_error("human", 9, 8)):
        memory_replace(view, "x", "x")


# --- memory_insert -------------------------------------------------------------------------------


def test_memory_insert_defaults_to_end():
    view = block("a\nb")

    result = memory_insert(view, "c")

    assert result == "a\nb\nc"


def test_memory_insert_minus_one_appends():
    view = block("a\nb")

    result = memory_insert(view, "c", insert_line=-1)

    assert result == "a\nb\nc"


def test_memory_insert_zero_prepends():
    view = block("a\nb")

    result = memory_insert(view, "z", insert_line=0)

    assert result == "z\na\nb"


def test_memory_insert_after_given_line():
    view = block("a\nb\nc")

    result = memory_insert(view, "x\ny", insert_line=1)

    assert result == "a\nx\ny\nb\nc"


def test_memory_insert_at_last_line_number_appends():
    view = block("a\nb")

    result = memory_insert(view, "c", insert_line=2)

    assert result == "a\nb\nc"


def test_memory_insert_into_empty_block_keeps_blank_line_like_letta():
    view = block("")

    appended = memory_insert(view, "c")
    prepended = memory_insert(view, "c", insert_line=0)

    assert appended == "\nc"
    assert prepended == "c\n"


def test_memory_insert_accepts_digit_string_line():
    view = block("a\nb")

    result = memory_insert(view, "x", insert_line="1")

    assert result == "a\nx\nb"


def test_memory_insert_expands_tabs():
    view = block("\ta")

    result = memory_insert(view, "\tb")

    assert result == "        a\n        b"


def test_memory_insert_line_past_end_is_refused():
    view = block("a\nb", label="todos")

    with raises_edit_error(
        "Invalid insert_line 3: memory block 'todos' has 2 lines, so insert_line must be between 0 and 2 "
        "(0 inserts before the first line), or -1 to append at the end."
    ):
        memory_insert(view, "c", insert_line=3)


def test_memory_insert_negative_line_other_than_minus_one_is_refused():
    view = block("")

    with raises_edit_error(
        "Invalid insert_line -2: memory block 'human' has 1 line, so insert_line must be between 0 and 1 "
        "(0 inserts before the first line), or -1 to append at the end."
    ):
        memory_insert(view, "c", insert_line=-2)


def test_memory_insert_non_integer_line_is_refused():
    view = block("a")

    with raises_edit_error(
        "insert_line must be an integer line number (0 for the start, -1 for the end), got 'end'."
    ):
        memory_insert(view, "c", insert_line="end")


def test_memory_insert_bool_line_is_refused():
    view = block("a")

    with raises_edit_error(
        "insert_line must be an integer line number (0 for the start, -1 for the end), got True."
    ):
        memory_insert(view, "c", insert_line=True)


def test_memory_insert_refuses_arrow_prefix():
    view = block("a")

    with raises_edit_error(PREFIX_ERROR.format(name="new_string")):
        memory_insert(view, "2→ b")


def test_memory_insert_refuses_line_colon_prefix():
    view = block("a")

    with raises_edit_error(PREFIX_ERROR.format(name="new_string")):
        memory_insert(view, "Line 2: b")


def test_memory_insert_refuses_warning_banner():
    view = block("a")

    with raises_edit_error(WARNING_ERROR.format(name="new_string")):
        memory_insert(view, LINE_NUMBER_WARNING)


def test_memory_insert_refuses_read_only_block():
    view = block("a", read_only=True)

    with raises_edit_error(READ_ONLY_MESSAGE):
        memory_insert(view, "b")


def test_memory_insert_refuses_non_string_new_string():
    view = block("a")

    with raises_edit_error("new_string must be a string, got dict."):
        memory_insert(view, {"text": "b"})


def test_memory_insert_exactly_at_limit_passes():
    view = block("abcd", limit=10)

    result = memory_insert(view, "efghi")

    assert result == "abcd\nefghi"


def test_memory_insert_one_over_limit_fails_and_block_is_unchanged():
    view = block("abcd", limit=10)

    with raises_edit_error(limit_error("human", 11, 10)):
        memory_insert(view, "efghij")

    assert view.value == "abcd"


# --- memory_rethink ------------------------------------------------------------------------------


def test_memory_rethink_replaces_whole_value():
    view = block("old\nstuff")

    result = memory_rethink(view, "new summary")

    assert result == "new summary"


def test_memory_rethink_may_empty_the_block():
    view = block("old")

    result = memory_rethink(view, "")

    assert result == ""


def test_memory_rethink_keeps_tabs():
    view = block("old")

    result = memory_rethink(view, "a\tb")

    assert result == "a\tb"


def test_memory_rethink_refuses_arrow_prefix():
    view = block("old")

    with raises_edit_error(PREFIX_ERROR.format(name="new_memory")):
        memory_rethink(view, "1→ new")


def test_memory_rethink_refuses_line_colon_prefix():
    view = block("old")

    with raises_edit_error(PREFIX_ERROR.format(name="new_memory")):
        memory_rethink(view, "Line 1: new")


def test_memory_rethink_refuses_warning_banner():
    view = block("old")

    with raises_edit_error(WARNING_ERROR.format(name="new_memory")):
        memory_rethink(view, f"{LINE_NUMBER_WARNING}\nnew")


def test_memory_rethink_refuses_read_only_block():
    view = block("old", read_only=True)

    with raises_edit_error(READ_ONLY_MESSAGE):
        memory_rethink(view, "new")


def test_memory_rethink_refuses_non_string():
    view = block("old")

    with raises_edit_error("new_memory must be a string, got NoneType."):
        memory_rethink(view, None)


def test_memory_rethink_exactly_at_limit_passes():
    view = block("old", limit=10)

    result = memory_rethink(view, "0123456789")

    assert result == "0123456789"


def test_memory_rethink_one_over_limit_fails_and_block_is_unchanged():
    view = block("old", limit=10, label="persona")

    with raises_edit_error(limit_error("persona", 11, 10)):
        memory_rethink(view, "0123456789A")

    assert view.value == "old"


def test_memory_rethink_brings_an_over_limit_block_back_under_its_limit():
    view = block("0123456789ABCDEF", limit=10)

    result = memory_rethink(view, "0123456789")

    assert result == "0123456789"


# --- line-number display -------------------------------------------------------------------------


def test_render_numbers_each_line_with_arrow():
    value = "Name: Alice\n\nLikes tea"

    rendered = render_block_with_line_numbers(value)

    assert rendered == "1→ Name: Alice\n2→ \n3→ Likes tea"


def test_render_empty_value_is_empty():
    value = ""

    rendered = render_block_with_line_numbers(value)

    assert rendered == ""


def test_rendered_lines_are_refused_when_echoed_back():
    view = block("Name: Alice")
    rendered = render_block_with_line_numbers(view.value)

    with raises_edit_error(PREFIX_ERROR.format(name="old_string")):
        memory_replace(view, rendered, "Name: Bob")


def test_line_numbers_shown_for_memory_agent_types_on_anthropic():
    shown = [
        should_show_line_numbers(agent_type, "anthropic")
        for agent_type in ("letta_v1_agent", "memgpt_v2_agent", "sleeptime_agent", "LETTA_V1_AGENT")
    ]

    assert shown == [True, True, True, True]


def test_line_numbers_hidden_for_other_agent_types_or_providers():
    shown = [
        should_show_line_numbers("memgpt_agent", "anthropic"),
        should_show_line_numbers("letta_v1_agent", "openai"),
        should_show_line_numbers(None, "anthropic"),
        should_show_line_numbers("letta_v1_agent", None),
    ]

    assert shown == [False, False, False, False]


# --- dispatch ------------------------------------------------------------------------------------


def test_tool_names_map_to_functions():
    names = dict(MEMORY_TOOL_NAMES)

    assert names == {
        "core_memory_append": core_memory_append,
        "core_memory_replace": core_memory_replace,
        "memory_replace": memory_replace,
        "memory_insert": memory_insert,
        "memory_rethink": memory_rethink,
    }


def test_tool_names_dispatch_with_letta_argument_names():
    view = block("a\nb")
    arguments = {"label": "human", "new_string": "c", "insert_line": 1}

    result = MEMORY_TOOL_NAMES["memory_insert"](view, **{k: v for k, v in arguments.items() if k != "label"})

    assert result == "a\nc\nb"


def test_tool_names_mapping_is_read_only():
    mapping = MEMORY_TOOL_NAMES

    with pytest.raises(TypeError):
        mapping["memory_apply_patch"] = memory_rethink
