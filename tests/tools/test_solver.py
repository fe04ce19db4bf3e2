"""The tool-rule solver over one run (pure: no Django, no database)."""

from __future__ import annotations

import json

import pytest

from apps.core.errors import DomainError
from apps.tools.rules import parse_tool_rules
from apps.tools.solver import ToolRulesSolver, ToolRuleViolation, conditional_output, output_matches

TOOLS = ["send_message", "search", "a", "b", "c", "d"]


def solver_for(*rules: dict[str, object]) -> ToolRulesSolver:
    return ToolRulesSolver(parse_tool_rules(list(rules)))


def packaged(message: object) -> str:
    """A tool response as Letta packages it for the model."""
    return json.dumps({"status": "OK", "message": message, "time": "2025-01-01 10:00:00 AM UTC+0000"})


def test_without_rules_every_tool_is_allowed():
    solver = ToolRulesSolver([])

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == TOOLS
    assert solver.forced_tool() is None
    assert solver.requires_tool_call() is False


def test_allowed_tools_keeps_the_order_of_available():
    solver = solver_for({"type": "constrain_child_tools", "tool_name": "search", "children": ["d", "a"]})
    solver.record_call("search")

    allowed = solver.allowed_tools(["d", "c", "a"])

    assert allowed == ["d", "a"]


def test_run_first_is_the_only_tool_before_any_call():
    solver = solver_for({"type": "run_first", "tool_name": "search"})

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["search"]
    assert solver.forced_tool() == "search"
    assert solver.requires_tool_call() is True


def test_run_first_no_longer_applies_after_a_call():
    solver = solver_for({"type": "run_first", "tool_name": "search"})
    solver.record_call("search", "found")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == TOOLS
    assert solver.forced_tool() is None
    assert solver.requires_tool_call() is False


def test_run_first_applies_again_after_reset():
    solver = solver_for({"type": "run_first", "tool_name": "search"})
    solver.record_call("search")

    solver.reset()

    assert solver.calls == ()
    assert solver.allowed_tools(TOOLS) == ["search"]


def test_unavailable_run_first_tool_leaves_nothing_to_offer():
    solver = solver_for({"type": "run_first", "tool_name": "missing"})

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == []
    assert solver.forced_tool() == "missing"
    assert solver.forced_tool(TOOLS) is None


def test_run_first_args_are_prefilled_only_before_any_call():
    solver = solver_for({"type": "run_first", "tool_name": "search", "args": {"query": "x"}})

    before = solver.prefilled_args("search")
    solver.record_call("search")
    after = solver.prefilled_args("search")

    assert before == {"query": "x"}
    assert after == {}


def test_children_are_the_only_tools_right_after_the_parent():
    solver = solver_for({"type": "constrain_child_tools", "tool_name": "search", "children": ["a", "b"]})
    solver.record_call("search")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["a", "b"]
    assert solver.forced_tool() is None
    assert solver.requires_tool_call() is True


def test_child_constraint_lifts_after_another_tool():
    solver = solver_for({"type": "constrain_child_tools", "tool_name": "search", "children": ["a"]})
    solver.record_call("search")
    solver.record_call("a")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == TOOLS
    assert solver.requires_tool_call() is False


def test_single_child_is_forced():
    solver = solver_for({"type": "constrain_child_tools", "tool_name": "search", "children": ["a"]})
    solver.record_call("search")

    forced = solver.forced_tool()

    assert forced == "a"


def test_child_arg_nodes_prefill_the_child_after_the_parent():
    solver = solver_for(
        {
            "type": "constrain_child_tools",
            "tool_name": "search",
            "children": ["a", "b"],
            "child_arg_nodes": [{"name": "a", "args": {"limit": 3}}, {"name": "b"}],
        }
    )

    before = solver.prefilled_args("a")
    solver.record_call("search")

    assert before == {}
    assert solver.prefilled_args("a") == {"limit": 3}
    assert solver.prefilled_args("b") == {}


def test_two_child_rules_on_one_tool_intersect():
    solver = solver_for(
        {"type": "constrain_child_tools", "tool_name": "search", "children": ["a", "b"]},
        {"type": "constrain_child_tools", "tool_name": "search", "children": ["b", "c"]},
    )
    solver.record_call("search")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["b"]
    assert solver.forced_tool() == "b"


def test_unavailable_children_leave_nothing_to_offer():
    solver = solver_for({"type": "constrain_child_tools", "tool_name": "search", "children": ["missing"]})
    solver.record_call("search")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == []


def test_parent_gated_children_are_hidden_before_any_call():
    solver = solver_for({"type": "parent_last_tool", "tool_name": "search", "children": ["a", "b"]})

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["send_message", "search", "c", "d"]
    assert solver.requires_tool_call() is False


def test_parent_gated_children_are_the_only_tools_right_after_the_parent():
    solver = solver_for({"type": "parent_last_tool", "tool_name": "search", "children": ["a", "b"]})
    solver.record_call("search")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["a", "b"]
    assert solver.requires_tool_call() is True


def test_parent_gated_children_are_hidden_again_after_another_tool():
    solver = solver_for({"type": "parent_last_tool", "tool_name": "search", "children": ["a"]})
    solver.record_call("search")
    solver.record_call("a")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["send_message", "search", "b", "c", "d"]


def test_conditional_routes_on_the_packaged_message():
    solver = solver_for(
        {"type": "conditional", "tool_name": "search", "child_output_mapping": {"found": "a", "empty": "b"}}
    )
    solver.record_call("search", packaged("empty"))

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["b"]
    assert solver.forced_tool() == "b"
    assert solver.requires_tool_call() is True


def test_conditional_routes_on_a_raw_return_string():
    solver = solver_for(
        {"type": "conditional", "tool_name": "search", "child_output_mapping": {"found": "a"}}
    )
    solver.record_call("search", "found")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["a"]


def test_conditional_first_matching_case_wins():
    solver = ToolRulesSolver(
        parse_tool_rules(
            [{"type": "conditional", "tool_name": "search", "child_output_mapping": {"1": "a", 1: "b"}}]
        )
    )
    solver.record_call("search", "1")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["a"]


def test_conditional_falls_back_to_default_child():
    solver = solver_for(
        {
            "type": "conditional",
            "tool_name": "search",
            "child_output_mapping": {"found": "a"},
            "default_child": "c",
        }
    )
    solver.record_call("search", packaged("something else"))

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["c"]


def test_conditional_without_match_or_default_allows_everything():
    solver = solver_for(
        {"type": "conditional", "tool_name": "search", "child_output_mapping": {"found": "a"}}
    )
    solver.record_call("search", "nothing")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == TOOLS
    assert solver.forced_tool() is None
    assert solver.requires_tool_call() is True


def test_conditional_without_output_uses_default_child():
    solver = solver_for(
        {
            "type": "conditional",
            "tool_name": "search",
            "child_output_mapping": {"found": "a"},
            "default_child": "c",
        }
    )
    solver.record_call("search")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["c"]


def test_conditional_does_not_apply_after_another_tool():
    solver = solver_for(
        {"type": "conditional", "tool_name": "search", "child_output_mapping": {"found": "a"}}
    )
    solver.record_call("search", "found")
    solver.record_call("a", "found")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == TOOLS


def test_strict_conditional_without_match_is_a_violation():
    solver = solver_for(
        {
            "type": "conditional",
            "tool_name": "search",
            "child_output_mapping": {"found": "a", "empty": "b"},
            "default_child": "c",
            "require_output_mapping": True,
        }
    )
    solver.record_call("search", packaged("maybe"))

    with pytest.raises(ToolRuleViolation) as excinfo:
        solver.allowed_tools(TOOLS)

    assert isinstance(excinfo.value, DomainError)
    assert excinfo.value.code == "tool_rule_violation"
    assert str(excinfo.value) == (
        'search returned output "maybe", which matches none of its conditional cases ("found", "empty"), '
        "and the rule requires a match."
    )


def test_strict_conditional_without_output_is_a_violation():
    solver = solver_for(
        {
            "type": "conditional",
            "tool_name": "search",
            "child_output_mapping": {"found": "a"},
            "require_output_mapping": True,
        }
    )
    solver.record_call("search")

    with pytest.raises(ToolRuleViolation) as excinfo:
        solver.forced_tool()

    assert str(excinfo.value) == (
        'search returned no output, which matches none of its conditional cases ("found"), and the rule requires a match.'
    )


def test_strict_conditional_with_a_match_routes_normally():
    solver = solver_for(
        {
            "type": "conditional",
            "tool_name": "search",
            "child_output_mapping": {"found": "a"},
            "require_output_mapping": True,
        }
    )
    solver.record_call("search", packaged("found"))

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["a"]


def test_conditional_bool_key_matches_case_insensitively():
    solver = ToolRulesSolver(
        parse_tool_rules(
            [{"type": "conditional", "tool_name": "search", "child_output_mapping": {True: "a", False: "b"}}]
        )
    )
    solver.record_call("search", packaged("True"))

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["a"]


def test_conditional_json_boolean_message_matches_string_key():
    solver = solver_for({"type": "conditional", "tool_name": "search", "child_output_mapping": {"true": "a"}})
    solver.record_call("search", packaged(True))

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["a"]


def test_conditional_int_key_matches_numerically():
    solver = ToolRulesSolver(
        parse_tool_rules([{"type": "conditional", "tool_name": "search", "child_output_mapping": {2: "b"}}])
    )
    solver.record_call("search", packaged(" 2 "))

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["b"]


def test_max_count_removes_the_tool_once_exhausted():
    solver = solver_for({"type": "max_count_per_step", "tool_name": "search", "max_count_limit": 2})
    solver.record_call("search")
    once = solver.allowed_tools(TOOLS)
    solver.record_call("search")

    twice = solver.allowed_tools(TOOLS)

    assert once == TOOLS
    assert twice == ["send_message", "a", "b", "c", "d"]
    assert solver.requires_tool_call() is False


def test_max_count_counts_calls_across_the_run():
    solver = solver_for({"type": "max_count_per_step", "tool_name": "search", "max_count_limit": 1})
    solver.record_call("search")
    solver.record_call("a")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["send_message", "a", "b", "c", "d"]


def test_max_count_applies_inside_a_child_constraint():
    solver = solver_for(
        {"type": "constrain_child_tools", "tool_name": "search", "children": ["search", "a"]},
        {"type": "max_count_per_step", "tool_name": "search", "max_count_limit": 1},
    )
    solver.record_call("search")

    allowed = solver.allowed_tools(TOOLS)

    assert allowed == ["a"]
    assert solver.forced_tool() == "a"


def test_exit_loop_marks_the_tool_terminal():
    solver = solver_for({"type": "exit_loop", "tool_name": "send_message"})

    terminal = [solver.is_terminal("send_message"), solver.is_terminal("search")]

    assert terminal == [True, False]


def test_continue_loop_marks_the_tool_as_continuing():
    solver = solver_for({"type": "continue_loop", "tool_name": "search"})

    continuing = [solver.must_continue("search"), solver.must_continue("send_message")]

    assert continuing == [True, False]


def test_child_and_conditional_rules_give_a_tool_children():
    solver = solver_for(
        {"type": "constrain_child_tools", "tool_name": "search", "children": ["a"]},
        {"type": "conditional", "tool_name": "a", "child_output_mapping": {"x": "b"}},
        {"type": "max_count_per_step", "tool_name": "b", "max_count_limit": 1},
    )

    has_children = [solver.has_children("search"), solver.has_children("a"), solver.has_children("b")]

    assert has_children == [True, True, False]


def test_requires_approval_marks_the_tool():
    solver = solver_for({"type": "requires_approval", "tool_name": "d"})

    approval = [solver.requires_approval("d"), solver.requires_approval("a")]

    assert approval == [True, False]
    assert solver.allowed_tools(TOOLS) == TOOLS


def test_required_before_exit_lists_uncalled_tools_in_rule_order():
    solver = solver_for(
        {"type": "required_before_exit", "tool_name": "c"},
        {"type": "required_before_exit", "tool_name": "a"},
        {"type": "required_before_exit", "tool_name": "b"},
    )
    solver.record_call("a")

    uncalled = solver.uncalled_required_tools()

    assert uncalled == ["c", "b"]
    assert solver.allowed_tools(TOOLS) == TOOLS


def test_required_before_exit_ignores_tools_the_agent_lacks():
    solver = solver_for(
        {"type": "required_before_exit", "tool_name": "missing"},
        {"type": "required_before_exit", "tool_name": "a"},
    )

    uncalled = solver.uncalled_required_tools(TOOLS)

    assert uncalled == ["a"]


def test_required_before_exit_is_empty_once_all_are_called():
    solver = solver_for({"type": "required_before_exit", "tool_name": "a"})
    solver.record_call("a")

    uncalled = solver.uncalled_required_tools(TOOLS)

    assert uncalled == []


def test_calls_are_recorded_in_order():
    solver = ToolRulesSolver([])
    solver.record_call("a", "x")
    solver.record_call("b")

    calls = solver.calls

    assert calls == ("a", "b")


def test_check_call_accepts_an_allowed_tool():
    solver = solver_for({"type": "constrain_child_tools", "tool_name": "search", "children": ["a"]})
    solver.record_call("search")

    problem = solver.check_call("a", TOOLS)

    assert problem is None


def test_check_call_explains_a_child_violation():
    solver = solver_for(
        {"type": "constrain_child_tools", "tool_name": "search", "children": ["a", "b"]},
        {"type": "exit_loop", "tool_name": "send_message"},
    )
    solver.record_call("search")

    problem = solver.check_call("send_message", TOOLS)

    assert problem == (
        "Tool rule violation: cannot call send_message now. Allowed tools: a, b.\n"
        "Rules that apply:\n"
        "- After calling search, you must call one of: a, b"
    )


def test_check_call_explains_run_first():
    solver = solver_for({"type": "run_first", "tool_name": "search"})

    problem = solver.check_call("a", TOOLS)

    assert problem == (
        "Tool rule violation: cannot call a now. Allowed tools: search.\n"
        "Rules that apply:\n"
        "- You must call search first, before any other tool."
    )


def test_check_call_explains_a_parent_gate():
    solver = solver_for({"type": "parent_last_tool", "tool_name": "search", "children": ["a"]})

    problem = solver.check_call("a", ["search", "a"])

    assert problem == (
        "Tool rule violation: cannot call a now. Allowed tools: search.\n"
        "Rules that apply:\n"
        "- a can only be called right after search, and after search you must call one of: a"
    )


def test_check_call_explains_an_exhausted_count():
    solver = solver_for({"type": "max_count_per_step", "tool_name": "search", "max_count_limit": 1})
    solver.record_call("search")

    problem = solver.check_call("search", ["search", "a"])

    assert problem == (
        "Tool rule violation: cannot call search now. Allowed tools: a.\n"
        "Rules that apply:\n"
        "- You may call search at most 1 time(s) per response."
    )


def test_check_call_refuses_a_tool_the_agent_lacks():
    solver = ToolRulesSolver([])

    problem = solver.check_call("ghost", ["a", "b"])

    assert problem == "Tool rule violation: ghost is not one of your tools. Allowed tools: a, b."


def test_check_call_says_when_nothing_may_be_called():
    solver = solver_for({"type": "max_count_per_step", "tool_name": "search", "max_count_limit": 1})
    solver.record_call("search")

    problem = solver.check_call("search", ["search"])

    assert problem == (
        "Tool rule violation: cannot call search now. No tool may be called now.\n"
        "Rules that apply:\n"
        "- You may call search at most 1 time(s) per response."
    )


def test_check_call_reports_a_strict_conditional_violation():
    solver = solver_for(
        {
            "type": "conditional",
            "tool_name": "search",
            "child_output_mapping": {"found": "a"},
            "require_output_mapping": True,
        }
    )
    solver.record_call("search", "nope")

    problem = solver.check_call("a", TOOLS)

    assert problem == (
        'Tool rule violation: cannot call a. search returned output "nope", which matches none of its '
        'conditional cases ("found"), and the rule requires a match.'
    )


def test_conditional_output_unwraps_the_message_field():
    outputs = [
        conditional_output(packaged("hi")),
        conditional_output(packaged(3)),
        conditional_output(packaged(False)),
        conditional_output(packaged({"k": 1})),
    ]

    assert outputs == ["hi", "3", "false", '{"k": 1}']


def test_conditional_output_keeps_non_envelope_text():
    outputs = [
        conditional_output("plain"),
        conditional_output("42"),
        conditional_output('{"other": 1}'),
        conditional_output(None),
    ]

    assert outputs == ["plain", "42", '{"other": 1}', None]


def test_output_matches_follows_letta_key_semantics():
    results = [
        output_matches("TRUE", True),
        output_matches("false", False),
        output_matches("yes", True),
        output_matches("7", 7),
        output_matches("7.0", 7),
        output_matches("x", 7),
        output_matches("0.5", 0.5),
        output_matches("half", 0.5),
        output_matches("Found", "found"),
        output_matches("found", "found"),
    ]

    assert results == [True, True, False, True, False, False, True, False, False, True]
