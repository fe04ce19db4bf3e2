"""Forms of the workspace's configuration column: one per field, attaching a tool, a tool rule, sleeptime.

A field form's cleaned `value` is what the service takes for that field (a name, a handle, a number of
tokens, a temperature, a prompt); a rule form builds the rule dict from its per-type inputs, shape only:
apps.tools.rules decides whether the rule means anything when the service stores it.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms

from apps.ade.forms.base import AdeForm, checkbox_field, handle_field, text_field
from apps.agents import services as agent_services
from apps.core.actor import Actor
from apps.core.errors import DomainError
from apps.tools.selectors import ToolRuleType

TEMPERATURE_RANGE = (0.0, 2.0)
BUILTIN_PREFIX = "builtin:"
"""The tool picker's value for a built-in the organisation has no row of yet."""


class FieldForm(AdeForm):
    """One configuration field, posted as `value` (or, for a picker, under the field's own key)."""

    posted_name = "value"

    def __init__(self, *args: Any, actor: Actor, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actor = actor

    @property
    def value(self) -> Any:
        return self.cleaned_data[self.posted_name]

    @property
    def posted_text(self) -> str:
        """What was typed or picked, shown again when the value is refused."""
        return str(self.posted(self.posted_name) or "")


class NameForm(FieldForm):
    value = text_field()  # agent_update validates the name


class SystemForm(FieldForm):
    value = text_field(strip=False)  # the prompt as typed, whitespace and all


class ModelHandleForm(FieldForm):
    posted_name = "model"
    model = handle_field()

    def clean_model(self) -> str:
        try:
            return agent_services.validate_model_available(actor=self.actor, model=self.cleaned_data["model"])
        except DomainError as exc:
            raise forms.ValidationError(exc.message) from exc


class EmbeddingHandleForm(FieldForm):
    posted_name = "embedding"
    embedding = handle_field()  # agent_update validates the handle's shape


class ContextWindowForm(FieldForm):
    value = forms.IntegerField(
        required=False,
        min_value=1,
        error_messages={
            "invalid": "The context window limit must be a whole number of tokens",
            "min_value": "The context window limit must be at least 1 token",
        },
    )


_low, _high = TEMPERATURE_RANGE


class TemperatureForm(FieldForm):
    value = forms.FloatField(
        min_value=_low,
        max_value=_high,
        error_messages={
            "required": f"Temperature must be a number between {_low:g} and {_high:g}",
            "invalid": f"Temperature must be a number between {_low:g} and {_high:g}",
            "min_value": f"Temperature must be between {_low:g} and {_high:g}",
            "max_value": f"Temperature must be between {_low:g} and {_high:g}",
        },
    )


FIELD_FORMS: dict[str, type[FieldForm]] = {
    "name": NameForm,
    "model": ModelHandleForm,
    "embedding": EmbeddingHandleForm,
    "context_window_limit": ContextWindowForm,
    "temperature": TemperatureForm,
    "system": SystemForm,
}


class ToolAttachForm(AdeForm):
    """A tool of the organisation by id, or `builtin:<name>` for a built-in it has no row of yet."""

    tool = forms.CharField(error_messages={"required": "Choose a tool to attach."})

    @property
    def builtin_name(self) -> str | None:
        choice: str = self.cleaned_data["tool"]
        return choice.removeprefix(BUILTIN_PREFIX) if choice.startswith(BUILTIN_PREFIX) else None

    @property
    def tool_id(self) -> str:
        tool_id: str = self.cleaned_data["tool"]
        return tool_id


def other_children(text: str) -> list[str]:
    """The rule form's comma-separated children that are not the agent's tools (yet)."""
    return [name.strip() for name in text.split(",") if name.strip()]


class ToolRuleForm(AdeForm):
    """The per-type form of one tool rule. `rule` is the posted rule as a dict; fields the form does not
    show (prompt_template, child_arg_nodes) are kept from `base`, the rule being edited. `original` is that
    rule as the form showed it (JSON), for the service's check that no one changed it meanwhile."""

    tool_name = text_field()
    args = text_field()
    children = forms.Field(required=False, widget=forms.MultipleHiddenInput)
    children_other = text_field()
    mapping = text_field(strip=False)
    default_child = text_field()
    require_output_mapping = checkbox_field()
    max_count_limit = text_field()
    original = text_field(strip=False)

    def __init__(self, *args: Any, rule_type: str, base: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rule_type = rule_type
        self.base = base

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        rule: dict[str, Any] = {
            key: value for key, value in self.base.items() if key in ("prompt_template", "child_arg_nodes")
        }
        rule |= {"type": self.rule_type, "tool_name": data["tool_name"]}
        if self.rule_type == ToolRuleType.run_first:
            if data["args"]:
                try:
                    rule["args"] = json.loads(data["args"])
                except ValueError:
                    raise forms.ValidationError(
                        'Arguments must be a JSON object, e.g. {"query": "news"}'
                    ) from None
        elif self.rule_type in (ToolRuleType.constrain_child_tools, ToolRuleType.parent_last_tool):
            posted = [*(data["children"] or []), *other_children(data["children_other"])]
            rule["children"] = list(dict.fromkeys(posted))
        elif self.rule_type == ToolRuleType.conditional:
            rule["child_output_mapping"] = _output_mapping(data["mapping"])
            if data["default_child"]:
                rule["default_child"] = data["default_child"]
            rule["require_output_mapping"] = data["require_output_mapping"]
        elif self.rule_type == ToolRuleType.max_count_per_step:
            try:
                rule["max_count_limit"] = int(data["max_count_limit"])
            except ValueError:
                raise forms.ValidationError("The maximum count must be a whole number") from None
        data["rule"] = rule
        return data

    def clean_original(self) -> dict[str, Any] | None:
        """The rule the form was opened on; None when the form did not say (a new rule, an old page)."""
        text: str = self.cleaned_data["original"]
        if not text:
            return None
        try:
            original = json.loads(text)
        except ValueError:
            raise forms.ValidationError("Reload the page: the rule form is stale.") from None
        return original if isinstance(original, dict) else {}

    def redisplay(self) -> dict[str, Any]:
        """The form's inputs as posted, for the per-type template (ade/workspace/config/_rule_form.html)."""
        children = [*(self.posted("children") or []), *other_children(self.posted("children_other") or "")]
        return {
            "tool_name": self.posted("tool_name") or "",
            "children": children,
            "mapping": self.posted("mapping") or "",
            "args": self.posted("args") or "",
            "default_child": self.posted("default_child") or "",
            "require_output_mapping": self.posted("require_output_mapping"),
            "max_count_limit": self.posted("max_count_limit") or "",
        }


def _output_mapping(text: str) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if "=>" not in line:
            raise forms.ValidationError(f"Output mapping line {number}: write it as 'output => tool_name'")
        output, _, tool = line.rpartition("=>")
        mapping[output.strip()] = tool.strip()
    return mapping


class SleeptimeForm(AdeForm):
    enabled = checkbox_field()
    frequency = text_field()

    def clean_frequency(self) -> int:
        try:
            return int(self.cleaned_data["frequency"])
        except ValueError:
            raise forms.ValidationError("The frequency must be a whole number of turns") from None
