"""Letta tool rules: the wire models, parsing with readable errors, and prompt rendering.

Pure module (no Django): agents store rules as JSON and hand them to `parse_tool_rules`;
the solver in `apps.tools.solver` interprets them during a run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from apps.core.errors import InvalidInput

__all__ = [
    "ChildToolRule",
    "ConditionalToolRule",
    "ContinueToolRule",
    "InitToolRule",
    "MaxCountPerStepToolRule",
    "OutputKey",
    "ParentToolRule",
    "RequiredBeforeExitToolRule",
    "RequiresApprovalToolRule",
    "TerminalToolRule",
    "ToolCallNode",
    "ToolRule",
    "ToolRuleError",
    "ToolRuleType",
    "describe_tool_rule",
    "describe_tool_rules",
    "dump_tool_rules",
    "parse_tool_rules",
]


class ToolRuleError(InvalidInput):
    """A `tool_rules` payload that cannot be stored; the message names the offending index."""

    code = "invalid_tool_rule"


class ToolRuleType(StrEnum):
    """The `type` discriminator values, in Letta's spelling."""

    run_first = "run_first"
    exit_loop = "exit_loop"
    continue_loop = "continue_loop"
    constrain_child_tools = "constrain_child_tools"
    parent_last_tool = "parent_last_tool"
    conditional = "conditional"
    max_count_per_step = "max_count_per_step"
    required_before_exit = "required_before_exit"
    requires_approval = "requires_approval"


def _non_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


Name = Annotated[str, Field(strict=True), AfterValidator(_non_blank)]
"""A tool name inside a rule: a real string with something in it."""


class _BaseToolRule(BaseModel):
    """Fields shared by every rule. Unknown keys are ignored, as Letta does, so newer SDKs still parse."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    tool_name: Name
    prompt_template: Annotated[str | None, Field(strict=True)] = None


class InitToolRule(_BaseToolRule):
    """The tool must be the first call of every run; `args` override the model's arguments."""

    type: Literal[ToolRuleType.run_first] = ToolRuleType.run_first
    args: dict[str, Any] | None = None


class TerminalToolRule(_BaseToolRule):
    """Calling the tool ends the run (stop reason `tool_rule`)."""

    type: Literal[ToolRuleType.exit_loop] = ToolRuleType.exit_loop


class ContinueToolRule(_BaseToolRule):
    """Calling the tool forces another step."""

    type: Literal[ToolRuleType.continue_loop] = ToolRuleType.continue_loop


class ToolCallNode(BaseModel):
    """A child of a `constrain_child_tools` rule with arguments prefilled when it is called next."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: Name
    args: dict[str, Any] | None = None


class ChildToolRule(_BaseToolRule):
    """Right after `tool_name`, only `children` may be called."""

    type: Literal[ToolRuleType.constrain_child_tools] = ToolRuleType.constrain_child_tools
    children: Annotated[list[Name], Field(min_length=1)]
    child_arg_nodes: list[ToolCallNode] | None = None

    @model_validator(mode="after")
    def _nodes_are_children(self) -> ChildToolRule:
        for node in self.child_arg_nodes or []:
            if node.name not in self.children:
                raise ValueError(f"'child_arg_nodes' names '{node.name}', which is not in 'children'")
        return self


class ParentToolRule(_BaseToolRule):
    """`children` may only be called right after `tool_name` (and, as in Letta, are then the only choice)."""

    type: Literal[ToolRuleType.parent_last_tool] = ToolRuleType.parent_last_tool
    children: Annotated[list[Name], Field(min_length=1)]


OutputKey = bool | int | float | str
"""A `child_output_mapping` key. JSON always yields str; Python callers may use typed keys, matched as Letta does."""


class ConditionalToolRule(_BaseToolRule):
    """The output of `tool_name` picks the next tool; `default_child` when nothing matches."""

    type: Literal[ToolRuleType.conditional] = ToolRuleType.conditional
    child_output_mapping: Annotated[dict[OutputKey, Name], Field(min_length=1)]
    default_child: Name | None = None
    require_output_mapping: Annotated[bool, Field(strict=True)] = False


class MaxCountPerStepToolRule(_BaseToolRule):
    """At most `max_count_limit` calls of the tool per run (Letta's "per step" means per request)."""

    type: Literal[ToolRuleType.max_count_per_step] = ToolRuleType.max_count_per_step
    max_count_limit: Annotated[int, Field(strict=True, ge=1)]


class RequiredBeforeExitToolRule(_BaseToolRule):
    """The run cannot end until the tool has been called."""

    type: Literal[ToolRuleType.required_before_exit] = ToolRuleType.required_before_exit


class RequiresApprovalToolRule(_BaseToolRule):
    """A human must approve each call before it runs."""

    type: Literal[ToolRuleType.requires_approval] = ToolRuleType.requires_approval


ToolRule = Annotated[
    InitToolRule
    | TerminalToolRule
    | ContinueToolRule
    | ChildToolRule
    | ParentToolRule
    | ConditionalToolRule
    | MaxCountPerStepToolRule
    | RequiredBeforeExitToolRule
    | RequiresApprovalToolRule,
    Field(discriminator="type"),
]

_RULE_CLASSES: dict[str, type[_BaseToolRule]] = {
    ToolRuleType.run_first: InitToolRule,
    ToolRuleType.exit_loop: TerminalToolRule,
    ToolRuleType.continue_loop: ContinueToolRule,
    ToolRuleType.constrain_child_tools: ChildToolRule,
    ToolRuleType.parent_last_tool: ParentToolRule,
    ToolRuleType.conditional: ConditionalToolRule,
    ToolRuleType.max_count_per_step: MaxCountPerStepToolRule,
    ToolRuleType.required_before_exit: RequiredBeforeExitToolRule,
    ToolRuleType.requires_approval: RequiresApprovalToolRule,
}
_TYPE_LIST = ", ".join(_RULE_CLASSES)
_RULE_TYPES = tuple(_RULE_CLASSES.values())


def parse_tool_rules(raw: object) -> list[ToolRule]:
    """Validate a `tool_rules` payload (None, or a list of dicts / rule objects) into rule models; a rule
    given twice is kept once.

    Raises ToolRuleError naming every bad entry by index, or a contradiction between entries.
    """
    if raw is None:
        return []
    if not isinstance(raw, list | tuple):
        raise ToolRuleError(f"tool_rules must be a list of rules, got {_kind(raw)}")
    rules: list[ToolRule] = []
    problems: list[str] = []
    for index, item in enumerate(raw):
        if isinstance(item, _RULE_TYPES):
            rules.append(cast("ToolRule", item))
            continue
        rule, problem = _parse_one(index, item)
        if problem is not None:
            problems.append(problem)
        elif rule is not None:
            rules.append(rule)
    if problems:
        raise ToolRuleError("; ".join(problems))
    rules = _without_repeats(rules)
    _check_contradictions(rules)
    return rules


def _without_repeats(rules: list[ToolRule]) -> list[ToolRule]:
    """The rules with exact repeats dropped, first occurrences kept in order (Letta stores a rule given
    twice once; a repeated run_first is then no contradiction)."""
    seen: set[str] = set()
    unique: list[ToolRule] = []
    for rule in rules:
        key = json.dumps(rule.model_dump(mode="json"), sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(rule)
    return unique


def _parse_one(index: int, item: object) -> tuple[ToolRule | None, str | None]:
    where = f"tool_rules[{index}]"
    if not isinstance(item, dict):
        return None, f"{where}: expected an object with a 'type', got {_kind(item)}"
    rule_type = item.get("type")
    if rule_type is None:
        return None, f"{where}: 'type' is required; expected one of: {_TYPE_LIST}"
    cls = _RULE_CLASSES.get(rule_type) if isinstance(rule_type, str) else None
    if cls is None:
        return None, f"{where}: unknown rule type {_show(rule_type)}; expected one of: {_TYPE_LIST}"
    try:
        return cast("ToolRule", cls.model_validate(item)), None
    except ValidationError as exc:
        details = "; ".join(dict.fromkeys(_describe_error(error) for error in exc.errors()))
        return None, f"{where} ({rule_type}): {details}"


def _describe_error(error: ErrorDetails) -> str:
    """Turn one pydantic error into a sentence about the field, without pydantic's repr noise."""
    loc = error["loc"]
    if "[key]" in loc:
        return f"{_field_path(loc[: loc.index('[key]') - 1])} keys must be strings, numbers or booleans"
    field = _field_path(loc)
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return f"{field} is required"
    if kind == "too_short":
        return f"{field} must not be empty"
    if kind == "greater_than_equal":
        return f"{field} must be at least {ctx['ge']}"
    if kind in _EXPECTED_TYPES:
        return f"{field} must be {_EXPECTED_TYPES[kind]}, got {_kind(error['input'])}"
    message = str(ctx["error"]) if kind == "value_error" else error["msg"]
    return f"{field} {message}" if loc else message


_EXPECTED_TYPES: dict[str, str] = {
    "string_type": "a string",
    "int_type": "an integer",
    "bool_type": "a boolean",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}
_DICT_FIELDS = frozenset({"child_output_mapping", "args"})


def _field_path(loc: tuple[int | str, ...]) -> str:
    """('child_arg_nodes', 0, 'name') -> 'child_arg_nodes[0].name', quoted for messages."""
    path = ""
    previous: int | str | None = None
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif previous in _DICT_FIELDS:
            path += f"[{json.dumps(part)}]"
        else:
            path += f".{part}" if path else part
        previous = part
    return f"'{path}'"


def _kind(value: object) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list"}
    names |= {dict: "an object", tuple: "a list"}
    return names.get(type(value), type(value).__name__)


def _show(value: object) -> str:
    return f"'{value}'" if isinstance(value, str) else repr(value)


def _check_contradictions(rules: Sequence[ToolRule]) -> None:
    """Refuse rule sets no run could satisfy: two first tools, or a tool that both stops and continues."""
    firsts = [(i, r.tool_name) for i, r in enumerate(rules) if isinstance(r, InitToolRule)]
    if len(firsts) > 1:
        listed = ", ".join(f"tool_rules[{i}] '{name}'" for i, name in firsts)
        raise ToolRuleError(f"tool_rules: only one run_first rule is allowed, got {len(firsts)} ({listed})")
    exits = {r.tool_name: i for i, r in enumerate(rules) if isinstance(r, TerminalToolRule)}
    for index, rule in enumerate(rules):
        if isinstance(rule, ContinueToolRule) and rule.tool_name in exits:
            raise ToolRuleError(
                f"tool_rules: tool '{rule.tool_name}' cannot be both exit_loop "
                f"(tool_rules[{exits[rule.tool_name]}]) and continue_loop (tool_rules[{index}])"
            )


def dump_tool_rules(rules: Iterable[ToolRule]) -> list[dict[str, Any]]:
    """JSON-ready dicts (with `type`, without unset optional fields) that `parse_tool_rules` reads back."""
    return [rule.model_dump(mode="json", exclude_none=True) for rule in rules]


def describe_tool_rules(rules: Iterable[ToolRule]) -> str:
    """The rules as plain English, one line per rule in the given order, for the system prompt."""
    return "\n".join(describe_tool_rule(rule) for rule in rules)


def describe_tool_rule(rule: ToolRule) -> str:
    """One rule as one deterministic English line (prompt_template is ignored, as in Letta)."""
    name = rule.tool_name
    if isinstance(rule, InitToolRule):
        return f"You must call {name} first, before any other tool."
    if isinstance(rule, TerminalToolRule):
        return f"Calling {name} ends your response."
    if isinstance(rule, ContinueToolRule):
        return f"After calling {name}, you must continue your response with another step."
    if isinstance(rule, ChildToolRule):
        return f"After calling {name}, you must call one of: {', '.join(rule.children)}"
    if isinstance(rule, ParentToolRule):
        children = ", ".join(rule.children)
        return f"{children} can only be called right after {name}, and after {name} you must call one of: {children}"
    if isinstance(rule, ConditionalToolRule):
        cases = "; ".join(f"{json.dumps(key)} -> {tool}" for key, tool in rule.child_output_mapping.items())
        if rule.default_child is not None:
            fallback = f"otherwise {rule.default_child}"
        elif rule.require_output_mapping:
            fallback = "any other output is an error"
        else:
            fallback = "otherwise any tool"
        return f"After calling {name}, the next tool depends on its output: {cases}; {fallback}."
    if isinstance(rule, MaxCountPerStepToolRule):
        return f"You may call {name} at most {rule.max_count_limit} time(s) per response."
    if isinstance(rule, RequiredBeforeExitToolRule):
        return f"You must call {name} before ending your response."
    return f"Calling {name} requires human approval before it runs."
