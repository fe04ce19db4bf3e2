"""Tool-rule parsing, dumping and prompt rendering (pure: no Django, no database)."""

from __future__ import annotations

import pytest

from apps.core.errors import InvalidInput
from apps.tools.rules import (
    ChildToolRule,
    ConditionalToolRule,
    ContinueToolRule,
    InitToolRule,
    MaxCountPerStepToolRule,
    ParentToolRule,
    RequiredBeforeExitToolRule,
    RequiresApprovalToolRule,
    TerminalToolRule,
    ToolCallNode,
    ToolRuleError,
    describe_tool_rule,
    describe_tool_rules,
    dump_tool_rules,
    parse_tool_rules,
)

ALL_TYPES = (
    "run_first, exit_loop, continue_loop, constrain_child_tools, parent_last_tool, conditional, "
    "max_count_per_step, required_before_exit, requires_approval"
)

ONE_OF_EACH = [
    {"type": "run_first", "tool_name": "start", "args": {"mode": "fast"}},
    {"type": "exit_loop", "tool_name": "send_message"},
    {"type": "continue_loop", "tool_name": "search"},
    {
        "type": "constrain_child_tools",
        "tool_name": "memory_insert",
        "children": ["a", "b"],
        "child_arg_nodes": [{"name": "a", "args": {"x": 1}}, {"name": "b"}],
    },
    {"type": "parent_last_tool", "tool_name": "login", "children": ["fetch"]},
    {
        "type": "conditional",
        "tool_name": "check",
        "child_output_mapping": {"yes": "a", "no": "b"},
        "default_child": "c",
        "require_output_mapping": False,
    },
    {"type": "max_count_per_step", "tool_name": "web_search", "max_count_limit": 2},
    {"type": "required_before_exit", "tool_name": "save"},
    {"type": "requires_approval", "tool_name": "delete_everything"},
]


def _error(raw: object) -> str:
    with pytest.raises(ToolRuleError) as excinfo:
        parse_tool_rules(raw)
    return str(excinfo.value)


def test_none_parses_to_no_rules():
    rules = parse_tool_rules(None)

    assert rules == []


def test_empty_list_parses_to_no_rules():
    rules = parse_tool_rules([])

    assert rules == []


def test_run_first_parses_with_args():
    raw = [{"type": "run_first", "tool_name": "start", "args": {"mode": "fast"}}]

    rules = parse_tool_rules(raw)

    assert rules == [InitToolRule(tool_name="start", args={"mode": "fast"})]


def test_exit_loop_parses():
    rules = parse_tool_rules([{"type": "exit_loop", "tool_name": "send_message"}])

    assert rules == [TerminalToolRule(tool_name="send_message")]


def test_continue_loop_parses():
    rules = parse_tool_rules([{"type": "continue_loop", "tool_name": "search"}])

    assert rules == [ContinueToolRule(tool_name="search")]


def test_constrain_child_tools_parses_children_and_arg_nodes():
    raw = [ONE_OF_EACH[3]]

    rules = parse_tool_rules(raw)

    assert rules == [
        ChildToolRule(
            tool_name="memory_insert",
            children=["a", "b"],
            child_arg_nodes=[ToolCallNode(name="a", args={"x": 1}), ToolCallNode(name="b")],
        )
    ]


def test_parent_last_tool_parses():
    rules = parse_tool_rules([{"type": "parent_last_tool", "tool_name": "login", "children": ["fetch"]}])

    assert rules == [ParentToolRule(tool_name="login", children=["fetch"])]


def test_conditional_parses_with_defaults():
    raw = [{"type": "conditional", "tool_name": "check", "child_output_mapping": {"yes": "a"}}]

    rules = parse_tool_rules(raw)

    assert rules == [
        ConditionalToolRule(
            tool_name="check",
            child_output_mapping={"yes": "a"},
            default_child=None,
            require_output_mapping=False,
        )
    ]


def test_conditional_keeps_typed_python_keys():
    raw = [
        {"type": "conditional", "tool_name": "check", "child_output_mapping": {True: "a", 2: "b", 1.5: "c"}}
    ]

    rules = parse_tool_rules(raw)

    assert list(rules[0].child_output_mapping) == [True, 2, 1.5]
    assert [type(key) for key in rules[0].child_output_mapping] == [bool, int, float]


def test_conditional_json_keys_stay_strings():
    raw = [{"type": "conditional", "tool_name": "check", "child_output_mapping": {"true": "a", "1": "b"}}]

    rules = parse_tool_rules(raw)

    assert list(rules[0].child_output_mapping) == ["true", "1"]


def test_max_count_per_step_parses():
    rules = parse_tool_rules(
        [{"type": "max_count_per_step", "tool_name": "web_search", "max_count_limit": 2}]
    )

    assert rules == [MaxCountPerStepToolRule(tool_name="web_search", max_count_limit=2)]


def test_required_before_exit_parses():
    rules = parse_tool_rules([{"type": "required_before_exit", "tool_name": "save"}])

    assert rules == [RequiredBeforeExitToolRule(tool_name="save")]


def test_requires_approval_parses():
    rules = parse_tool_rules([{"type": "requires_approval", "tool_name": "delete_everything"}])

    assert rules == [RequiresApprovalToolRule(tool_name="delete_everything")]


def test_prompt_template_is_kept():
    raw = [{"type": "exit_loop", "tool_name": "send_message", "prompt_template": "<x>{{ tool_name }}</x>"}]

    rules = parse_tool_rules(raw)

    assert rules[0].prompt_template == "<x>{{ tool_name }}</x>"


def test_unknown_keys_are_ignored():
    raw = [{"type": "exit_loop", "tool_name": "send_message", "id": "tool_rule-1"}]

    rules = parse_tool_rules(raw)

    assert rules == [TerminalToolRule(tool_name="send_message")]


def test_parsed_rule_objects_pass_through():
    rule = TerminalToolRule(tool_name="send_message")

    rules = parse_tool_rules([rule, {"type": "continue_loop", "tool_name": "search"}])

    assert rules == [rule, ContinueToolRule(tool_name="search")]
    assert rules[0] is rule


def test_tuple_is_accepted_like_a_list():
    rules = parse_tool_rules(({"type": "exit_loop", "tool_name": "send_message"},))

    assert rules == [TerminalToolRule(tool_name="send_message")]


def test_error_is_an_invalid_input_with_a_stable_code():
    with pytest.raises(ToolRuleError) as excinfo:
        parse_tool_rules("nope")

    assert isinstance(excinfo.value, InvalidInput)
    assert excinfo.value.code == "invalid_tool_rule"


def test_non_list_payload_is_refused():
    message = _error({"type": "exit_loop"})

    assert message == "tool_rules must be a list of rules, got an object"


def test_non_object_entry_is_refused():
    message = _error([{"type": "exit_loop", "tool_name": "a"}, "exit_loop"])

    assert message == "tool_rules[1]: expected an object with a 'type', got a string"


def test_unknown_type_is_refused_with_the_valid_types():
    message = _error([{"type": "exit_loop", "tool_name": "a"}, {"type": "foo", "tool_name": "b"}])

    assert message == f"tool_rules[1]: unknown rule type 'foo'; expected one of: {ALL_TYPES}"


def test_non_string_type_is_refused():
    message = _error([{"type": 3, "tool_name": "b"}])

    assert message == f"tool_rules[0]: unknown rule type 3; expected one of: {ALL_TYPES}"


def test_missing_type_is_refused():
    message = _error([{"tool_name": "a"}])

    assert message == f"tool_rules[0]: 'type' is required; expected one of: {ALL_TYPES}"


def test_missing_tool_name_is_refused():
    message = _error([{"type": "requires_approval"}])

    assert message == "tool_rules[0] (requires_approval): 'tool_name' is required"


def test_blank_tool_name_is_refused():
    message = _error([{"type": "required_before_exit", "tool_name": "  "}])

    assert message == "tool_rules[0] (required_before_exit): 'tool_name' must not be empty"


def test_non_string_tool_name_is_refused():
    message = _error([{"type": "continue_loop", "tool_name": 7}])

    assert message == "tool_rules[0] (continue_loop): 'tool_name' must be a string, got an integer"


def test_constrain_child_tools_requires_children():
    message = _error([{"type": "constrain_child_tools", "tool_name": "a"}])

    assert message == "tool_rules[0] (constrain_child_tools): 'children' is required"


def test_constrain_child_tools_refuses_empty_children():
    message = _error([{"type": "constrain_child_tools", "tool_name": "a", "children": []}])

    assert message == "tool_rules[0] (constrain_child_tools): 'children' must not be empty"


def test_children_entries_must_be_non_blank_strings():
    message = _error([{"type": "constrain_child_tools", "tool_name": "a", "children": ["x", "", 3]}])

    assert message == (
        "tool_rules[0] (constrain_child_tools): 'children[1]' must not be empty; "
        "'children[2]' must be a string, got an integer"
    )


def test_child_arg_nodes_must_name_children():
    raw = [
        {
            "type": "constrain_child_tools",
            "tool_name": "a",
            "children": ["x"],
            "child_arg_nodes": [{"name": "y"}],
        }
    ]

    message = _error(raw)

    assert (
        message
        == "tool_rules[0] (constrain_child_tools): 'child_arg_nodes' names 'y', which is not in 'children'"
    )


def test_child_arg_node_fields_are_checked():
    raw = [
        {
            "type": "constrain_child_tools",
            "tool_name": "a",
            "children": ["x"],
            "child_arg_nodes": [{"args": 1}],
        }
    ]

    message = _error(raw)

    assert message == (
        "tool_rules[0] (constrain_child_tools): 'child_arg_nodes[0].name' is required; "
        "'child_arg_nodes[0].args' must be an object, got an integer"
    )


def test_parent_last_tool_requires_children():
    message = _error([{"type": "parent_last_tool", "tool_name": "login", "children": "fetch"}])

    assert message == "tool_rules[0] (parent_last_tool): 'children' must be a list, got a string"


def test_conditional_requires_a_mapping():
    message = _error([{"type": "conditional", "tool_name": "check"}])

    assert message == "tool_rules[0] (conditional): 'child_output_mapping' is required"


def test_conditional_refuses_an_empty_mapping():
    message = _error([{"type": "conditional", "tool_name": "check", "child_output_mapping": {}}])

    assert message == "tool_rules[0] (conditional): 'child_output_mapping' must not be empty"


def test_conditional_field_types_are_checked():
    raw = [
        {
            "type": "conditional",
            "tool_name": "check",
            "child_output_mapping": {"yes": 3, "no": ""},
            "default_child": 5,
            "require_output_mapping": "yes",
        }
    ]

    message = _error(raw)

    assert message == (
        "tool_rules[0] (conditional): 'child_output_mapping[\"yes\"]' must be a string, got an integer; "
        "'child_output_mapping[\"no\"]' must not be empty; 'default_child' must be a string, got an integer; "
        "'require_output_mapping' must be a boolean, got a string"
    )


def test_conditional_refuses_unusable_keys():
    raw = [{"type": "conditional", "tool_name": "check", "child_output_mapping": {None: "a"}}]

    message = _error(raw)

    assert (
        message
        == "tool_rules[0] (conditional): 'child_output_mapping' keys must be strings, numbers or booleans"
    )


def test_max_count_must_be_at_least_one():
    message = _error([{"type": "max_count_per_step", "tool_name": "a", "max_count_limit": 0}])

    assert message == "tool_rules[0] (max_count_per_step): 'max_count_limit' must be at least 1"


def test_max_count_must_be_an_integer():
    message = _error([{"type": "max_count_per_step", "tool_name": "a", "max_count_limit": "2"}])

    assert message == "tool_rules[0] (max_count_per_step): 'max_count_limit' must be an integer, got a string"


def test_run_first_args_must_be_an_object():
    message = _error([{"type": "run_first", "tool_name": "start", "args": ["x"]}])

    assert message == "tool_rules[0] (run_first): 'args' must be an object, got a list"


def test_every_bad_entry_is_reported():
    raw = [{"type": "exit_loop"}, {"type": "exit_loop", "tool_name": "ok"}, {"type": "bar", "tool_name": "b"}]

    message = _error(raw)

    assert message == (
        "tool_rules[0] (exit_loop): 'tool_name' is required; "
        f"tool_rules[2]: unknown rule type 'bar'; expected one of: {ALL_TYPES}"
    )


def test_two_run_first_rules_are_refused():
    raw = [
        {"type": "run_first", "tool_name": "a"},
        {"type": "exit_loop", "tool_name": "z"},
        {"type": "run_first", "tool_name": "b"},
    ]

    message = _error(raw)

    assert (
        message
        == "tool_rules: only one run_first rule is allowed, got 2 (tool_rules[0] 'a', tool_rules[2] 'b')"
    )


def test_a_tool_cannot_both_exit_and_continue():
    raw = [
        {"type": "continue_loop", "tool_name": "other"},
        {"type": "exit_loop", "tool_name": "send"},
        {"type": "continue_loop", "tool_name": "send"},
    ]

    message = _error(raw)

    assert (
        message
        == "tool_rules: tool 'send' cannot be both exit_loop (tool_rules[1]) and continue_loop (tool_rules[2])"
    )


def test_contradictions_are_checked_for_parsed_objects_too():
    raw = [InitToolRule(tool_name="a"), InitToolRule(tool_name="b")]

    message = _error(raw)

    assert (
        message
        == "tool_rules: only one run_first rule is allowed, got 2 (tool_rules[0] 'a', tool_rules[1] 'b')"
    )


def test_dump_includes_type_and_drops_unset_optionals():
    rules = parse_tool_rules(
        [
            {
                "type": "constrain_child_tools",
                "tool_name": "a",
                "children": ["b"],
                "child_arg_nodes": [{"name": "b"}],
            }
        ]
    )

    dumped = dump_tool_rules(rules)

    assert dumped == [
        {
            "type": "constrain_child_tools",
            "tool_name": "a",
            "children": ["b"],
            "child_arg_nodes": [{"name": "b"}],
        }
    ]


def test_dump_round_trips_every_rule_type():
    rules = parse_tool_rules(ONE_OF_EACH)

    dumped = dump_tool_rules(rules)

    assert dumped == ONE_OF_EACH
    assert parse_tool_rules(dumped) == rules


def test_dump_turns_typed_keys_into_json_strings():
    rules = [ConditionalToolRule(tool_name="check", child_output_mapping={True: "a", 2: "b"})]

    dumped = dump_tool_rules(rules)

    assert dumped == [
        {
            "type": "conditional",
            "tool_name": "check",
            "child_output_mapping": {"true": "a", "2": "b"},
            "require_output_mapping": False,
        }
    ]


def test_describe_no_rules_is_empty():
    text = describe_tool_rules([])

    assert text == ""


def test_describe_renders_one_line_per_rule_in_order():
    rules = parse_tool_rules(ONE_OF_EACH)

    text = describe_tool_rules(rules)

    assert text.splitlines() == [
        "You must call start first, before any other tool.",
        "Calling send_message ends your response.",
        "After calling search, you must continue your response with another step.",
        "After calling memory_insert, you must call one of: a, b",
        "fetch can only be called right after login, and after login you must call one of: fetch",
        'After calling check, the next tool depends on its output: "yes" -> a; "no" -> b; otherwise c.',
        "You may call web_search at most 2 time(s) per response.",
        "You must call save before ending your response.",
        "Calling delete_everything requires human approval before it runs.",
    ]


def test_describe_strict_conditional_says_other_outputs_fail():
    rule = ConditionalToolRule(
        tool_name="check", child_output_mapping={True: "a", 3: "b"}, require_output_mapping=True
    )

    line = describe_tool_rule(rule)

    assert (
        line
        == "After calling check, the next tool depends on its output: true -> a; 3 -> b; any other output is an error."
    )


def test_describe_conditional_without_default_allows_any_tool():
    rule = ConditionalToolRule(tool_name="check", child_output_mapping={"ok": "a"})

    line = describe_tool_rule(rule)

    assert line == 'After calling check, the next tool depends on its output: "ok" -> a; otherwise any tool.'


def test_describe_ignores_prompt_template():
    rule = TerminalToolRule(tool_name="send_message", prompt_template="custom {{ tool_name }}")

    line = describe_tool_rule(rule)

    assert line == "Calling send_message ends your response."
