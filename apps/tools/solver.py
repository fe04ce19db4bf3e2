"""The tool-rule solver: which tools the model may call next, given the calls made so far in one run.

Pure and in-memory. The agent loop builds one solver per run (Letta builds one per request, so
`run_first` applies at the start of every request), records each executed call, and asks it what
to offer the model, whether a call is allowed, and whether the run may stop.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from apps.core.errors import DomainError
from apps.tools.rules import (
    ChildToolRule,
    ConditionalToolRule,
    ContinueToolRule,
    InitToolRule,
    MaxCountPerStepToolRule,
    OutputKey,
    ParentToolRule,
    RequiredBeforeExitToolRule,
    RequiresApprovalToolRule,
    TerminalToolRule,
    ToolRule,
    describe_tool_rule,
)

__all__ = ["ToolRuleViolation", "ToolRulesSolver", "conditional_output", "output_matches"]


class ToolRuleViolation(DomainError):
    """The rules leave the model no legal next tool (a strict conditional rule got an unmapped output)."""

    code = "tool_rule_violation"


class ToolRulesSolver:
    """Tracks one run's tool calls and answers what the rules allow next."""

    def __init__(self, rules: Iterable[ToolRule]) -> None:
        self.rules: tuple[ToolRule, ...] = tuple(rules)
        self._calls: list[str] = []
        self._last_output: str | None = None

    @property
    def calls(self) -> tuple[str, ...]:
        """The tools recorded so far in this run, oldest first."""
        return tuple(self._calls)

    def record_call(self, tool_name: str, output: str | None = None) -> None:
        """Record a call that was executed (successfully or not); rejected calls must not be recorded.

        `output` is the tool's return string, or Letta's packaged `{"status", "message", "time"}` JSON;
        conditional rules route on it.
        """
        self._calls.append(tool_name)
        self._last_output = output

    def reset(self) -> None:
        """Forget the calls, for the start of a new run."""
        self._calls.clear()
        self._last_output = None

    def allowed_tools(self, available: Sequence[str]) -> list[str]:
        """The subset of `available` (order kept) the model may be offered at this step.

        An empty list means the rules leave nothing callable; raises ToolRuleViolation when a conditional
        rule with `require_output_mapping` got an output that matches none of its cases.
        """
        whitelist = self._whitelist()
        excluded = self._excluded()
        return [
            tool for tool in available if (whitelist is None or tool in whitelist) and tool not in excluded
        ]

    def forced_tool(self, available: Sequence[str] | None = None) -> str | None:
        """The one tool the model must call next (run_first, a single child, a routed conditional), if any.

        When `available` is given, a forced tool the agent does not have is not reported.
        """
        whitelist = self._whitelist()
        if whitelist is None:
            return None
        candidates = [tool for tool in whitelist if tool not in self._excluded()]
        if available is not None:
            candidates = [tool for tool in candidates if tool in available]
        return candidates[0] if len(candidates) == 1 else None

    def requires_tool_call(self) -> bool:
        """Whether the model must call some tool now (Letta's tool_choice "required"), i.e. a
        run_first, child, conditional or parent rule is active. max_count_per_step never forces a call."""
        if not self._calls:
            return any(isinstance(rule, InitToolRule) for rule in self.rules)
        last = self._calls[-1]
        return any(
            isinstance(rule, ChildToolRule | ConditionalToolRule | ParentToolRule) and rule.tool_name == last
            for rule in self.rules
        )

    def prefilled_args(self, tool_name: str) -> dict[str, Any]:
        """Arguments the rules fix for `tool_name` at this step; they override the model's values.

        From run_first `args` before any call, and from `child_arg_nodes` right after the parent.
        """
        merged: dict[str, Any] = {}
        for rule in self.rules:
            if isinstance(rule, InitToolRule) and not self._calls and rule.tool_name == tool_name:
                merged.update(rule.args or {})
            if isinstance(rule, ChildToolRule) and self._calls and rule.tool_name == self._calls[-1]:
                for node in rule.child_arg_nodes or []:
                    if node.name == tool_name:
                        merged.update(node.args or {})
        return merged

    def check_call(self, tool_name: str, available: Sequence[str]) -> str | None:
        """None when the model may call `tool_name` now, else a message for the model saying what it may call."""
        try:
            allowed = self.allowed_tools(available)
        except ToolRuleViolation as exc:
            return f"Tool rule violation: cannot call {tool_name}. {exc.message}"
        if tool_name in allowed:
            return None
        if tool_name not in available:
            reason = f"Tool rule violation: {tool_name} is not one of your tools."
        else:
            reason = f"Tool rule violation: cannot call {tool_name} now."
        offer = f"Allowed tools: {', '.join(allowed)}." if allowed else "No tool may be called now."
        relevant = self._relevant_rules(tool_name)
        hints = "".join(f"\n- {describe_tool_rule(rule)}" for rule in relevant)
        return f"{reason} {offer}" + (f"\nRules that apply:{hints}" if hints else "")

    def is_terminal(self, tool_name: str) -> bool:
        """Whether calling the tool ends the run (an exit_loop rule)."""
        return any(isinstance(rule, TerminalToolRule) and rule.tool_name == tool_name for rule in self.rules)

    def must_continue(self, tool_name: str) -> bool:
        """Whether calling the tool forces another step (a continue_loop rule)."""
        return any(isinstance(rule, ContinueToolRule) and rule.tool_name == tool_name for rule in self.rules)

    def has_children(self, tool_name: str) -> bool:
        """Whether a constrain_child_tools or conditional rule picks what follows the tool (so the run goes on)."""
        return any(
            isinstance(rule, ChildToolRule | ConditionalToolRule) and rule.tool_name == tool_name
            for rule in self.rules
        )

    def requires_approval(self, tool_name: str) -> bool:
        """Whether a requires_approval rule covers the tool."""
        return any(
            isinstance(rule, RequiresApprovalToolRule) and rule.tool_name == tool_name for rule in self.rules
        )

    def uncalled_required_tools(self, available: Iterable[str] | None = None) -> list[str]:
        """required_before_exit tools not yet called this run, in rule order.

        With `available`, tools the agent does not have are left out, as Letta does, so a stale rule
        cannot keep a run going forever.
        """
        offered = None if available is None else set(available)
        names = [rule.tool_name for rule in self.rules if isinstance(rule, RequiredBeforeExitToolRule)]
        return [
            name
            for name in dict.fromkeys(names)
            if name not in self._calls and (offered is None or name in offered)
        ]

    def _whitelist(self) -> list[str] | None:
        """Tools the active rules positively allow (rule order), or None when no rule is active."""
        if not self._calls:
            firsts = [rule.tool_name for rule in self.rules if isinstance(rule, InitToolRule)]
            return list(dict.fromkeys(firsts)) if firsts else None
        last = self._calls[-1]
        allowed: list[str] | None = None
        for rule in self.rules:
            if rule.tool_name != last:
                continue
            if isinstance(rule, ChildToolRule | ParentToolRule):
                names = list(rule.children)
            elif isinstance(rule, ConditionalToolRule):
                routed = _route(rule, self._last_output)
                if routed is None:
                    continue
                names = routed
            else:
                continue
            allowed = names if allowed is None else [name for name in allowed if name in names]
        return None if allowed is None else list(dict.fromkeys(allowed))

    def _excluded(self) -> set[str]:
        """Tools removed whatever the whitelist says: exhausted max counts, and parent-gated children
        whenever their parent was not the last call (including before any call)."""
        last = self._calls[-1] if self._calls else None
        excluded: set[str] = set()
        for rule in self.rules:
            if isinstance(rule, MaxCountPerStepToolRule) and self._exhausted(rule):
                excluded.add(rule.tool_name)
            elif isinstance(rule, ParentToolRule) and rule.tool_name != last:
                excluded.update(rule.children)
        return excluded

    def _exhausted(self, rule: MaxCountPerStepToolRule) -> bool:
        return self._calls.count(rule.tool_name) >= rule.max_count_limit

    def _relevant_rules(self, tool_name: str) -> list[ToolRule]:
        """The rules that currently restrict the model, to explain a refusal of `tool_name`."""
        last = self._calls[-1] if self._calls else None
        relevant: list[ToolRule] = []
        for rule in self.rules:
            if isinstance(rule, InitToolRule):
                applies = last is None
            elif isinstance(rule, ChildToolRule | ConditionalToolRule):
                applies = rule.tool_name == last
            elif isinstance(rule, ParentToolRule):
                applies = rule.tool_name == last or tool_name in rule.children
            elif isinstance(rule, MaxCountPerStepToolRule):
                applies = rule.tool_name == tool_name and self._exhausted(rule)
            else:
                applies = False
            if applies:
                relevant.append(rule)
        return relevant


def _route(rule: ConditionalToolRule, output: str | None) -> list[str] | None:
    """The tools a conditional rule allows after its tool returned `output`; None means no constraint."""
    value = conditional_output(output)
    if value is not None:
        for key, tool in rule.child_output_mapping.items():
            if output_matches(value, key):
                return [tool]
    if rule.require_output_mapping:
        cases = ", ".join(json.dumps(key) for key in rule.child_output_mapping)
        shown = "no output" if value is None else f"output {json.dumps(value)}"
        raise ToolRuleViolation(
            f"{rule.tool_name} returned {shown}, which matches none of its conditional cases ({cases}), "
            f"and the rule requires a match."
        )
    return [rule.default_child] if rule.default_child is not None else None


def conditional_output(output: str | None) -> str | None:
    """The text a conditional rule matches on: the `message` of a JSON object that has one (Letta's
    packaged tool response), else the raw output. JSON scalars in `message` become JSON text."""
    if output is None:
        return None
    try:
        decoded = json.loads(output)
    except ValueError:
        return output
    if not isinstance(decoded, dict) or "message" not in decoded:
        return output
    message = decoded["message"]
    return message if isinstance(message, str) else json.dumps(message)


def output_matches(output: str, key: OutputKey) -> bool:
    """Letta's matching: bool keys compare case-insensitively with true/false, int and float keys
    numerically (unparseable output never matches), str keys exactly."""
    if isinstance(key, bool):
        return output.lower() == ("true" if key else "false")
    if isinstance(key, int):
        try:
            return int(output) == key
        except ValueError:
            return False
    if isinstance(key, float):
        try:
            return float(output) == key
        except ValueError:
            return False
    return output == key
