"""ADE: the workspace's left column: the agent's configuration (model, system prompt, tools, tool rules, sleeptime).

Every panel action answers with its own partial (422 with the message when the service refuses the input)
and, when something changed, the `HX-Trigger: ade:agent-changed` header so the memory column refreshes its
context window viewer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.http import HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_GET, require_http_methods
from django_htmx.http import reswap, retarget

from apps.ade.views.agents import handle_picker, picked_handle
from apps.ade.views.base import AdeRequest, ade_view, refusal_status
from apps.agents import services as agent_services
from apps.agents.models import Agent, AgentType
from apps.agents.prompts import DEFAULT_SYSTEM_PROMPT
from apps.agents.selectors import agent_get, embedding_model_list, model_list
from apps.core.errors import DomainError, InvalidInput
from apps.tools.builtin import BUILTIN_TOOLS
from apps.tools.rules import ToolRuleType, describe_tool_rule, parse_tool_rules
from apps.tools.selectors import tool_list
from apps.tools.services import tool_upsert_builtins

AGENT_CHANGED = "ade:agent-changed"
TEMPERATURE_RANGE = (0.0, 2.0)


def column_context(request: AdeRequest, agent: Agent) -> dict[str, Any]:
    """What ade/workspace/_config.html needs when the workspace page first renders."""
    return {
        "config": {
            "fields": {
                key: _field_context(agent, key) for key in ("name", "context_window_limit", "temperature")
            },
            "system": _field_context(agent, "system"),
            "tools": _tools_context(request, agent),
            "rules": _rules_context(agent),
            "sleeptime": _sleeptime_context(agent),
        }
    }


def _changed(response: HttpResponse) -> HttpResponse:
    response["HX-Trigger"] = AGENT_CHANGED
    return response


# --- single fields: name, model, embedding, context window, temperature, system prompt ---------------------


@dataclass(frozen=True)
class Field:
    label: str
    kind: str  # text | number | picker | textarea
    help: str = ""


FIELDS: dict[str, Field] = {
    "name": Field("Name", "text"),
    "model": Field("Model", "picker"),
    "embedding": Field("Embedding model", "picker"),
    "context_window_limit": Field("Context window", "number", "Tokens. Empty: the model's default."),
    "temperature": Field("Temperature", "number", "0 is focused and repeatable, 2 is most varied."),
    "system": Field("System prompt", "textarea"),
}


def _current(agent: Agent, key: str) -> str:
    if key == "system":
        return agent.system or DEFAULT_SYSTEM_PROMPT
    value = getattr(agent, key)
    return "" if value is None else str(value)


def _field_context(
    agent: Agent,
    key: str,
    *,
    value: str | None = None,
    error: str = "",
    saved: bool = False,
    request: AdeRequest | None = None,
) -> dict[str, Any]:
    field = FIELDS[key]
    current = _current(agent, key) if value is None else value
    context: dict[str, Any] = {
        "key": key,
        "label": field.label,
        "kind": field.kind,
        "help": field.help,
        "value": current,
        "error": error,
        "saved": saved,
        "uses_default": key == "system" and not agent.system,
    }
    if field.kind == "picker" and request is not None:
        options = (
            model_list(actor=request.actor) if key == "model" else embedding_model_list(actor=request.actor)
        )
        context["picker"] = handle_picker(
            name=key,
            label=field.label,
            kind="chat" if key == "model" else "embedding",
            options=options,
            value=current,
            error=error,
            allow_empty=key == "embedding",
        )
    return context


def _posted(request: AdeRequest, key: str) -> str:
    return picked_handle(request, key) if FIELDS[key].kind == "picker" else request.POST.get("value", "")


def _save_field(request: AdeRequest, agent: Agent, key: str) -> None:
    """Apply the posted value through agents.services (which raise InvalidInput and its kin)."""
    raw = _posted(request, key)
    text = raw.strip()
    if key == "name":
        agent_services.agent_update(actor=request.actor, agent_id=agent.id, name=text)
    elif key == "model":
        handle = agent_services.validate_model_available(actor=request.actor, model=text)
        agent_services.agent_update(actor=request.actor, agent_id=agent.id, model=handle)
    elif key == "embedding":
        agent_services.agent_update(actor=request.actor, agent_id=agent.id, embedding=text)
    elif key == "context_window_limit":
        limit = (
            _parse_number(text, int, "The context window limit must be a whole number of tokens")
            if text
            else None
        )
        if limit is not None and limit < 1:
            raise InvalidInput("The context window limit must be at least 1 token")
        agent_services.agent_update(actor=request.actor, agent_id=agent.id, context_window_limit=limit)
    elif key == "temperature":
        low, high = TEMPERATURE_RANGE
        temperature = _parse_number(text, float, f"Temperature must be a number between {low:g} and {high:g}")
        if not low <= temperature <= high:
            raise InvalidInput(f"Temperature must be between {low:g} and {high:g}")
        settings = {**agent.model_settings, "temperature": temperature}
        agent_services.agent_update(actor=request.actor, agent_id=agent.id, model_settings=settings)
    elif key == "system":
        agent_services.agent_update(actor=request.actor, agent_id=agent.id, system=raw)


def _parse_number(text: str, kind: type[int] | type[float], message: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise InvalidInput(message) from None


@require_http_methods(["GET", "POST"])
@ade_view
def config_field(request: AdeRequest, agent_id: str, key: str) -> HttpResponse:
    if key not in FIELDS:
        return HttpResponse(status=404)
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    if request.method != "POST":
        return render(
            request,
            "ade/workspace/config/_field.html",
            _ctx(agent, _field_context(agent, key, request=request)),
        )
    try:
        _save_field(request, agent, key)
    except DomainError as exc:
        field = _field_context(agent, key, value=_posted(request, key), error=exc.message, request=request)
        return render(
            request, "ade/workspace/config/_field.html", _ctx(agent, field), status=refusal_status(exc)
        )
    agent = agent_get(actor=request.actor, agent_id=agent.id)
    field = _field_context(agent, key, saved=True, request=request)
    return _changed(render(request, "ade/workspace/config/_field.html", _ctx(agent, field)))


def _ctx(agent: Agent, field: dict[str, Any]) -> dict[str, Any]:
    return {"agent": agent, "f": field}


# --- tools --------------------------------------------------------------------------------------------------

BUILTIN_PREFIX = "builtin:"


def _tools_context(request: AdeRequest, agent: Agent, *, error: str = "") -> dict[str, Any]:
    attached = sorted(agent.tools.all(), key=lambda t: t.name)
    attached_ids = {t.id for t in attached}
    org_tools = list(tool_list(actor=request.actor).order_by("name"))
    org_names = {t.name for t in org_tools}
    available = [
        {"value": t.id, "name": t.name, "group": "Built-in" if t.tool_type.startswith("letta_") else "Custom"}
        for t in org_tools
        if t.id not in attached_ids
    ]
    available += [
        {"value": f"{BUILTIN_PREFIX}{name}", "name": name, "group": "Built-in"}
        for name in BUILTIN_TOOLS
        if name not in org_names
    ]
    available.sort(key=lambda option: (option["group"], option["name"]))
    return {"attached": attached, "available": available, "error": error}


def _render_tools(request: AdeRequest, agent: Agent, *, error: str = "", status: int = 200) -> HttpResponse:
    context = {"agent": agent, "tools": _tools_context(request, agent, error=error)}
    return render(request, "ade/workspace/config/_tools.html", context, status=status)


@require_GET
@ade_view
def config_tools(request: AdeRequest, agent_id: str) -> HttpResponse:
    return _render_tools(request, agent_get(actor=request.actor, agent_id=agent_id))


@require_http_methods(["GET", "POST"])
@ade_view
def config_tool_attach(request: AdeRequest, agent_id: str) -> HttpResponse:
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    if request.method != "POST":
        return _render_tools(request, agent)
    choice = request.POST.get("tool", "")
    try:
        if not choice:
            raise InvalidInput("Choose a tool to attach.")
        if choice.startswith(BUILTIN_PREFIX):
            name = choice.removeprefix(BUILTIN_PREFIX)
            if name not in BUILTIN_TOOLS:
                raise InvalidInput(f"Unknown built-in tool '{name}'")
            choice = tool_upsert_builtins(actor=request.actor, names=[name])[name].id
        agent_services.agent_attach_tool(actor=request.actor, agent_id=agent.id, tool_id=choice)
    except DomainError as exc:
        return _render_tools(request, agent, error=exc.message, status=refusal_status(exc))
    return _changed(_render_tools(request, agent_get(actor=request.actor, agent_id=agent.id)))


@require_http_methods(["GET", "POST"])
@ade_view
def config_tool_detach(request: AdeRequest, agent_id: str, tool_id: str) -> HttpResponse:
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    if request.method != "POST":
        return _render_tools(request, agent)
    agent_services.agent_detach_tool(actor=request.actor, agent_id=agent.id, tool_id=tool_id)
    return _changed(_render_tools(request, agent_get(actor=request.actor, agent_id=agent.id)))


# --- tool rules ---------------------------------------------------------------------------------------------

RULE_TYPES: dict[str, tuple[str, str]] = {
    ToolRuleType.run_first: ("Run first", "This tool is called first in every run."),
    ToolRuleType.exit_loop: ("Exit loop", "Calling this tool ends the run."),
    ToolRuleType.continue_loop: ("Continue loop", "After this tool, the agent must take another step."),
    ToolRuleType.constrain_child_tools: (
        "Constrain children",
        "Right after this tool, only the children may be called.",
    ),
    ToolRuleType.parent_last_tool: (
        "Parent last tool",
        "The children may only be called right after this tool.",
    ),
    ToolRuleType.conditional: ("Conditional", "The tool's output picks the next tool."),
    ToolRuleType.max_count_per_step: (
        "Max calls per step",
        "The tool may be called at most N times per response.",
    ),
    ToolRuleType.required_before_exit: (
        "Required before exit",
        "The run cannot end until this tool was called.",
    ),
    ToolRuleType.requires_approval: ("Requires approval", "A person approves each call before it runs."),
}


def _rules_context(agent: Agent) -> dict[str, Any]:
    try:
        parsed = parse_tool_rules(agent.tool_rules)
        described = [describe_tool_rule(rule) for rule in parsed]
    except DomainError:
        described = ["" for _ in agent.tool_rules]
    rules = [
        {
            "index": index,
            "type": raw.get("type", ""),
            "label": RULE_TYPES.get(raw.get("type", ""), (raw.get("type", ""), ""))[0],
            "tool_name": raw.get("tool_name", ""),
            "text": text,
        }
        for index, (raw, text) in enumerate(zip(agent.tool_rules, described, strict=True))
    ]
    return {"rules": rules, "types": [(key, label, hint) for key, (label, hint) in RULE_TYPES.items()]}


def _render_rules(request: AdeRequest, agent: Agent) -> HttpResponse:
    return render(
        request, "ade/workspace/config/_rules.html", {"agent": agent, "rules": _rules_context(agent)}
    )


def _rule_form_context(
    request: AdeRequest,
    agent: Agent,
    rule_type: str,
    *,
    index: int | None,
    rule: dict[str, Any] | None = None,
    error: str = "",
) -> dict[str, Any]:
    """The per-type form, filled from the stored rule, or from what was posted when it was refused."""
    rule = rule or {"type": rule_type}
    mapping = rule.get("child_output_mapping") or {}
    args = rule.get("args")
    values: dict[str, Any] = {
        "tool_name": rule.get("tool_name", ""),
        "children": list(rule.get("children") or []),
        "mapping": "\n".join(f"{key} => {tool}" for key, tool in mapping.items()),
        "args": json.dumps(args, indent=2) if args is not None else "",
        "default_child": rule.get("default_child") or "",
        "require_output_mapping": bool(rule.get("require_output_mapping")),
        "max_count_limit": rule.get("max_count_limit", 1),
    }
    post = request.POST
    if request.method == "POST" and error:
        others = [name.strip() for name in post.get("children_other", "").split(",") if name.strip()]
        values = {
            "tool_name": post.get("tool_name", ""),
            "children": [*post.getlist("children"), *others],
            "mapping": post.get("mapping", ""),
            "args": post.get("args", ""),
            "default_child": post.get("default_child", ""),
            "require_output_mapping": post.get("require_output_mapping") == "on",
            "max_count_limit": post.get("max_count_limit", ""),
        }
    tool_names = sorted(t.name for t in agent.tools.all())
    return {
        "agent": agent,
        "index": index,
        "type": rule_type,
        "type_label": RULE_TYPES[rule_type][0],
        "type_hint": RULE_TYPES[rule_type][1],
        "v": values,
        "tool_names": tool_names,
        "other_children": ", ".join(c for c in values["children"] if c not in tool_names),
        "error": error,
        "original": post.get("original", "")
        if request.method == "POST"
        else json.dumps(rule, sort_keys=True),
    }


def _render_rule_form(request: AdeRequest, context: dict[str, Any], *, status: int = 200) -> HttpResponse:
    response = render(request, "ade/workspace/config/_rule_form.html", context, status=status)
    if status >= 400:
        # The form posts to the whole rules section; a refusal re-renders just the form, in place.
        reswap(retarget(response, "#rule-form"), "outerHTML")
    return response


def _rule_from_post(request: AdeRequest, rule_type: str, base: dict[str, Any]) -> dict[str, Any]:
    """The posted per-type form as a rule dict; shape only (the rules module validates meaning). Fields the
    form does not show (prompt_template, child_arg_nodes) are kept from the rule being edited."""
    post = request.POST
    rule: dict[str, Any] = {
        key: value for key, value in base.items() if key in ("prompt_template", "child_arg_nodes")
    }
    rule |= {"type": rule_type, "tool_name": post.get("tool_name", "").strip()}
    if rule_type == ToolRuleType.run_first:
        text = post.get("args", "").strip()
        if text:
            try:
                rule["args"] = json.loads(text)
            except ValueError:
                raise InvalidInput('Arguments must be a JSON object, e.g. {"query": "news"}') from None
    elif rule_type in (ToolRuleType.constrain_child_tools, ToolRuleType.parent_last_tool):
        others = [name.strip() for name in post.get("children_other", "").split(",") if name.strip()]
        rule["children"] = list(dict.fromkeys([*post.getlist("children"), *others]))
    elif rule_type == ToolRuleType.conditional:
        mapping: dict[str, str] = {}
        for number, line in enumerate(post.get("mapping", "").splitlines(), start=1):
            if not line.strip():
                continue
            if "=>" not in line:
                raise InvalidInput(f"Output mapping line {number}: write it as 'output => tool_name'")
            output, _, tool = line.rpartition("=>")
            mapping[output.strip()] = tool.strip()
        rule["child_output_mapping"] = mapping
        if post.get("default_child", "").strip():
            rule["default_child"] = post["default_child"].strip()
        rule["require_output_mapping"] = post.get("require_output_mapping") == "on"
    elif rule_type == ToolRuleType.max_count_per_step:
        rule["max_count_limit"] = _parse_number(
            post.get("max_count_limit", "").strip(), int, "The maximum count must be a whole number"
        )
    return rule


def _friendly(message: str, index: int) -> str:
    return message.replace(f"tool_rules[{index}] ", "This rule ").replace(f"tool_rules[{index}]", "this rule")


@require_GET
@ade_view
def config_rules(request: AdeRequest, agent_id: str) -> HttpResponse:
    return _render_rules(request, agent_get(actor=request.actor, agent_id=agent_id))


@require_http_methods(["GET", "POST"])
@ade_view
def config_rule_new(request: AdeRequest, agent_id: str) -> HttpResponse:
    """GET: the empty form for `?type=`; POST: add the rule."""
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    rule_type = (request.POST if request.method == "POST" else request.GET).get("type", "")
    if rule_type not in RULE_TYPES:
        if request.method != "POST" and not rule_type:
            return HttpResponse("")  # the type picker went back to "Add a rule…"
        message = f"Unknown rule type '{rule_type}'"
        context = _rule_form_context(request, agent, ToolRuleType.exit_loop, index=None, error=message)
        return _render_rule_form(request, context, status=422)
    if request.method != "POST":
        return _render_rule_form(request, _rule_form_context(request, agent, rule_type, index=None))
    return _save_rule(request, agent, rule_type, index=None)


@require_http_methods(["GET", "POST"])
@ade_view
def config_rule_edit(request: AdeRequest, agent_id: str, index: int) -> HttpResponse:
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    if index >= len(agent.tool_rules):
        return HttpResponse(status=404)
    rule = agent.tool_rules[index]
    if request.method != "POST":
        return _render_rule_form(
            request, _rule_form_context(request, agent, rule["type"], index=index, rule=rule)
        )
    return _save_rule(request, agent, rule["type"], index=index)


def _save_rule(request: AdeRequest, agent: Agent, rule_type: str, *, index: int | None) -> HttpResponse:
    rules = list(agent.tool_rules)
    base = rules[index] if index is not None else {}
    original = request.POST.get("original", "")
    position = len(rules) if index is None else index
    try:
        if index is not None and original and json.loads(original) != base:
            raise InvalidInput("The agent's rules changed since this form opened: cancel and edit again.")
        rule = _rule_from_post(request, rule_type, base)
        if index is None:
            rules.append(rule)
        else:
            rules[index] = rule
        agent_services.agent_set_tool_rules(actor=request.actor, agent_id=agent.id, tool_rules=rules)
    except DomainError as exc:
        context = _rule_form_context(
            request, agent, rule_type, index=index, error=_friendly(exc.message, position)
        )
        return _render_rule_form(request, context, status=refusal_status(exc))
    return _changed(_render_rules(request, agent_get(actor=request.actor, agent_id=agent.id)))


@require_http_methods(["GET", "POST"])
@ade_view
def config_rule_delete(request: AdeRequest, agent_id: str, index: int) -> HttpResponse:
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    if request.method != "POST":
        return _render_rules(request, agent)
    rules = list(agent.tool_rules)
    if index < len(rules):
        del rules[index]
        agent_services.agent_set_tool_rules(actor=request.actor, agent_id=agent.id, tool_rules=rules)
    return _changed(_render_rules(request, agent_get(actor=request.actor, agent_id=agent.id)))


# --- sleeptime ------------------------------------------------------------------------------------------------


def _sleeptime_context(
    agent: Agent, *, error: str = "", saved: bool = False, frequency: str = ""
) -> dict[str, Any]:
    return {
        "is_sleeptime_agent": agent.agent_type == AgentType.SLEEPTIME,
        "enabled": agent.enable_sleeptime,
        "frequency": frequency or agent.sleeptime_agent_frequency,
        "sleeptime_agent_id": agent.sleeptime_agent_id,
        "error": error,
        "saved": saved,
    }


@require_http_methods(["GET", "POST"])
@ade_view
def config_sleeptime(request: AdeRequest, agent_id: str) -> HttpResponse:
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    template = "ade/workspace/config/_sleeptime.html"
    if request.method != "POST":
        return render(request, template, {"agent": agent, "sleeptime": _sleeptime_context(agent)})
    text = request.POST.get("frequency", "").strip()
    try:
        frequency = _parse_number(text, int, "The frequency must be a whole number of turns")
        agent_services.agent_set_sleeptime(
            actor=request.actor,
            agent_id=agent.id,
            enabled=request.POST.get("enabled") == "on",
            frequency=frequency,
        )
    except DomainError as exc:
        context = {"agent": agent, "sleeptime": _sleeptime_context(agent, error=exc.message, frequency=text)}
        return render(request, template, context, status=refusal_status(exc))
    agent = agent_get(actor=request.actor, agent_id=agent.id)
    context = {"agent": agent, "sleeptime": _sleeptime_context(agent, saved=True)}
    return _changed(render(request, template, context))


PREFIX = "agents/<str:agent_id>/config/"

urlpatterns: list = [
    path(f"{PREFIX}field/<str:key>/", config_field, name="config-field"),
    path(f"{PREFIX}tools/", config_tools, name="config-tools"),
    path(f"{PREFIX}tools/attach/", config_tool_attach, name="config-tool-attach"),
    path(f"{PREFIX}tools/<str:tool_id>/detach/", config_tool_detach, name="config-tool-detach"),
    path(f"{PREFIX}rules/", config_rules, name="config-rules"),
    path(f"{PREFIX}rules/new/", config_rule_new, name="config-rule-new"),
    path(f"{PREFIX}rules/<int:index>/", config_rule_edit, name="config-rule-edit"),
    path(f"{PREFIX}rules/<int:index>/delete/", config_rule_delete, name="config-rule-delete"),
    path(f"{PREFIX}sleeptime/", config_sleeptime, name="config-sleeptime"),
]
