"""ADE: the workspace's left column: the agent's configuration (model, system prompt, tools, tool rules, sleeptime).

Every panel action answers with its own partial (422 with the message when the form or the service refuses
the input) and, when something changed, the `ade:agent-changed` client event (HX-Trigger) so the memory
column refreshes its context window viewer.
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

from apps.ade.forms.config import (
    BUILTIN_PREFIX,
    FIELD_FORMS,
    FieldForm,
    SleeptimeForm,
    ToolAttachForm,
    ToolRuleForm,
)
from apps.ade.views.agents import handle_picker
from apps.ade.views.base import AdeRequest, ade_view, agent_changed, refusal_status
from apps.agents import services as agent_services
from apps.agents.models import Agent, AgentType
from apps.agents.selectors import agent_get, agent_system_prompt, embedding_model_list, model_list
from apps.core.errors import DomainError
from apps.tools.selectors import ToolRuleType, builtin_tool_names, tool_list, tool_rule_descriptions
from apps.tools.services import tool_upsert_builtin


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
        return agent_system_prompt(agent)
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


def _save_field(request: AdeRequest, agent: Agent, key: str, form: FieldForm) -> None:
    """The form's value through agents.services (which raise InvalidInput and its kin)."""
    if key == "temperature":
        agent_services.agent_set_temperature(actor=request.actor, agent_id=agent.id, temperature=form.value)
    else:  # the other keys are agent_update's own arguments
        agent_services.agent_update(actor=request.actor, agent_id=agent.id, **{key: form.value})


@require_http_methods(["GET", "POST"])
@ade_view
def config_field(request: AdeRequest, agent_id: str, key: str) -> HttpResponse:
    if key not in FIELDS:
        return HttpResponse(status=404)
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    template = "ade/workspace/config/_field.html"
    if request.method != "POST":
        return render(request, template, _ctx(agent, _field_context(agent, key, request=request)))
    form = FIELD_FORMS[key](request.POST, actor=request.actor)
    status = 422
    if form.is_valid():
        try:
            _save_field(request, agent, key, form)
        except DomainError as exc:
            form.add_domain_error(exc)
            status = refusal_status(exc)
        else:
            agent = agent_get(actor=request.actor, agent_id=agent.id)
            field = _field_context(agent, key, saved=True, request=request)
            return agent_changed(render(request, template, _ctx(agent, field)))
    field = _field_context(agent, key, value=form.posted_text, error=form.first_error, request=request)
    return render(request, template, _ctx(agent, field), status=status)


def _ctx(agent: Agent, field: dict[str, Any]) -> dict[str, Any]:
    return {"agent": agent, "f": field}


# --- tools --------------------------------------------------------------------------------------------------


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
        for name in builtin_tool_names()
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
    form = ToolAttachForm(request.POST)
    if not form.is_valid():
        return _render_tools(request, agent, error=form.first_error, status=422)
    try:
        name = form.builtin_name
        tool_id = tool_upsert_builtin(actor=request.actor, name=name).id if name is not None else form.tool_id
        agent_services.agent_attach_tool(actor=request.actor, agent_id=agent.id, tool_id=tool_id)
    except DomainError as exc:
        return _render_tools(request, agent, error=exc.message, status=refusal_status(exc))
    return agent_changed(_render_tools(request, agent_get(actor=request.actor, agent_id=agent.id)))


@require_http_methods(["GET", "POST"])
@ade_view
def config_tool_detach(request: AdeRequest, agent_id: str, tool_id: str) -> HttpResponse:
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    if request.method != "POST":
        return _render_tools(request, agent)
    agent_services.agent_detach_tool(actor=request.actor, agent_id=agent.id, tool_id=tool_id)
    return agent_changed(_render_tools(request, agent_get(actor=request.actor, agent_id=agent.id)))


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
    described = tool_rule_descriptions(agent.tool_rules)
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
    agent: Agent,
    rule_type: str,
    *,
    index: int | None,
    rule: dict[str, Any] | None = None,
    refused: ToolRuleForm | None = None,
    error: str = "",
) -> dict[str, Any]:
    """The per-type form, filled from the stored rule, or from what was posted when it was `refused`."""
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
    original = json.dumps(rule, sort_keys=True)
    if refused is not None:
        values = refused.redisplay()
        original = refused.posted("original") or ""
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
        "original": original,
    }


def _render_rule_form(request: AdeRequest, context: dict[str, Any], *, status: int = 200) -> HttpResponse:
    response = render(request, "ade/workspace/config/_rule_form.html", context, status=status)
    if status >= 400:
        # The form posts to the whole rules section; a refusal re-renders just the form, in place.
        reswap(retarget(response, "#rule-form"), "outerHTML")
    return response


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
        posted = (
            ToolRuleForm(request.POST, rule_type=rule_type, base={}) if request.method == "POST" else None
        )
        context = _rule_form_context(
            agent,
            ToolRuleType.exit_loop,
            index=None,
            refused=posted,
            error=f"Unknown rule type '{rule_type}'",
        )
        return _render_rule_form(request, context, status=422)
    if request.method != "POST":
        return _render_rule_form(request, _rule_form_context(agent, rule_type, index=None))
    return _save_rule(request, agent, rule_type, index=None)


@require_http_methods(["GET", "POST"])
@ade_view
def config_rule_edit(request: AdeRequest, agent_id: str, index: int) -> HttpResponse:
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    if index >= len(agent.tool_rules):
        return HttpResponse(status=404)
    rule = agent.tool_rules[index]
    if request.method != "POST":
        return _render_rule_form(request, _rule_form_context(agent, rule["type"], index=index, rule=rule))
    return _save_rule(request, agent, rule["type"], index=index)


def _save_rule(request: AdeRequest, agent: Agent, rule_type: str, *, index: int | None) -> HttpResponse:
    base = agent.tool_rules[index] if index is not None else {}
    form = ToolRuleForm(request.POST, rule_type=rule_type, base=base)
    status = 422
    if form.is_valid():
        try:
            agent_services.agent_tool_rule_save(
                actor=request.actor,
                agent_id=agent.id,
                rule=form.cleaned_data["rule"],
                index=index,
                expected=form.cleaned_data["original"] if index is not None else None,
            )
        except DomainError as exc:
            form.add_domain_error(exc)
            status = refusal_status(exc)
        else:
            return agent_changed(_render_rules(request, agent_get(actor=request.actor, agent_id=agent.id)))
    position = len(agent.tool_rules) if index is None else index
    error = _friendly(form.first_error, position)
    context = _rule_form_context(agent, rule_type, index=index, refused=form, error=error)
    return _render_rule_form(request, context, status=status)


@require_http_methods(["GET", "POST"])
@ade_view
def config_rule_delete(request: AdeRequest, agent_id: str, index: int) -> HttpResponse:
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    if request.method != "POST":
        return _render_rules(request, agent)
    agent_services.agent_tool_rule_delete(actor=request.actor, agent_id=agent.id, index=index)
    return agent_changed(_render_rules(request, agent_get(actor=request.actor, agent_id=agent.id)))


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
    form = SleeptimeForm(request.POST)
    status = 422
    if form.is_valid():
        try:
            agent_services.agent_set_sleeptime(
                actor=request.actor,
                agent_id=agent.id,
                enabled=form.cleaned_data["enabled"],
                frequency=form.cleaned_data["frequency"],
            )
        except DomainError as exc:
            form.add_domain_error(exc)
            status = refusal_status(exc)
        else:
            agent = agent_get(actor=request.actor, agent_id=agent.id)
            context = {"agent": agent, "sleeptime": _sleeptime_context(agent, saved=True)}
            return agent_changed(render(request, template, context))
    sleeptime = _sleeptime_context(agent, error=form.first_error, frequency=form.values()["frequency"])
    return render(request, template, {"agent": agent, "sleeptime": sleeptime}, status=status)


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
