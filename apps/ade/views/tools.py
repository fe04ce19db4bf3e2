"""ADE: the tool list, the tool editor (live schema from the docstring) and test runs in the sandbox.

Who may do what is the /v1 API's rule, enforced by apps.tools.services: every member of the
organisation can create, edit and delete its custom tools (as in Letta, where any organisation user
may), but only owners and admins may run tool code by hand (`tool_run`). Built-in, MCP and client-side
tools are read-only here: the server or their MCP server defines them.
"""

from __future__ import annotations

import json
import time
from typing import Any

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from apps.ade.forms.tools import SourceForm, ToolForm, ToolRunForm
from apps.ade.views.base import AdeRequest, ade_view, redirect_after_action
from apps.core.errors import Conflict, InvalidInput, PermissionDenied
from apps.tools import selectors as tool_selectors
from apps.tools import services as tool_services
from apps.tools.errors import ToolSchemaError
from apps.tools.models import DEFAULT_RETURN_CHAR_LIMIT, Tool

STARTER_SOURCE = '''def roll_dice(sides: int = 6, count: int = 1) -> str:
    """Roll dice and say what came up.

    Args:
        sides: How many faces each die has.
        count: How many dice to roll.

    Returns:
        The faces rolled, separated by commas.
    """
    import random

    return ", ".join(str(random.randint(1, sides)) for _ in range(count))
'''

KINDS = {"custom": "custom", "builtin": "built-in", "mcp": "MCP", "client": "client-side"}
"""The type filter's values and their labels."""

SAMPLE_VALUES: dict[str, Any] = {
    "string": "",
    "integer": 0,
    "number": 0,
    "boolean": False,
    "array": [],
    "object": {},
}


def tool_kind(tool: Tool) -> str:
    if tool_services.is_builtin_tool(tool):
        return "builtin"
    if tool.tool_type == Tool.Type.EXTERNAL_MCP:
        return "mcp"
    if tool.tool_type == Tool.Type.CLIENT:
        return "client"
    return "custom"


def is_editable(tool: Tool | None) -> bool:
    """Custom Python tools are edited here; the others are defined elsewhere and shown read-only."""
    return tool is None or (tool_kind(tool) == "custom" and tool.source_type == "python")


def sample_args(schema: dict[str, Any] | None) -> str:
    """A JSON object to start a test run from: every parameter, with its default-ish value by type."""
    properties = ((schema or {}).get("parameters") or {}).get("properties") or {}
    sample = {}
    for name, spec in properties.items():
        if spec.get("enum"):
            sample[name] = spec["enum"][0]
        else:
            sample[name] = SAMPLE_VALUES.get(spec.get("type", "string"), "")
    return json.dumps(sample, indent=2)


# --- the list --------------------------------------------------------------------------------------


@require_GET
@ade_view
def tool_list(request: AdeRequest) -> HttpResponse:
    actor = request.actor
    tool_services.tool_upsert_builtins(actor=actor)  # as /v1/tools does: the built-ins are listed too
    query = request.GET.get("q", "").strip()
    kind = request.GET.get("type", "")
    filters: dict[str, Any] = {"search": query or None}
    if kind == "builtin":
        filters["letta_only"] = True
    elif kind in ("custom", "mcp", "client"):
        filters["tool_types"] = [{"mcp": Tool.Type.EXTERNAL_MCP, "client": Tool.Type.CLIENT}.get(kind, kind)]
    tools = [
        (tool, tool_kind(tool))
        for tool in tool_selectors.tool_list_filtered(actor=actor, **filters).order_by("name")[:500]
    ]
    context = {"tools": tools, "query": query, "kind": kind, "kinds": KINDS}
    if request.htmx and request.htmx.target == "tool-rows":
        return render(request, "ade/tools/_rows.html", context)
    return render(request, "ade/tools/list.html", context)


# --- the editor ------------------------------------------------------------------------------------


def _editor_context(request: AdeRequest, tool: Tool | None, **extra: Any) -> dict[str, Any]:
    source = tool.source_code if tool else STARTER_SOURCE
    refusal = ""
    if tool is not None and is_editable(tool):
        try:
            tool_services.require_tool_writer(request.actor, tool)
        except PermissionDenied as exc:  # shown read-only, with why
            refusal = exc.message
    schema, schema_error = (_readable(tool.json_schema), None) if tool else _schema_of(source)
    context = {
        "tool": tool,
        "kind": tool_kind(tool) if tool else "custom",
        "kinds": KINDS,
        "editable": is_editable(tool) and not refusal,
        "refusal": refusal,
        "can_run": request.actor.can_manage,
        "source": source,
        "schema": schema,
        "schema_json": json.dumps(schema, indent=2) if schema else "",
        "schema_error": schema_error,
        "sample_args": sample_args(schema),
        "tags": ", ".join(tool.tags) if tool else "",
        "return_char_limit": tool.return_char_limit if tool else DEFAULT_RETURN_CHAR_LIMIT,
    }
    return context | extra


def _readable(schema: dict[str, Any]) -> dict[str, Any]:
    """name, description, parameters first (jsonb stores keys in its own order)."""
    first = {key: schema[key] for key in ("name", "description", "parameters") if key in schema}
    return first | schema


def _schema_of(source: str) -> tuple[dict[str, Any] | None, str | None]:
    if not source.strip():
        return None, "Write a Python function with type annotations and a Google-style docstring."
    try:
        return tool_services.build_tool_schema(source_code=source), None
    except ToolSchemaError as exc:
        return None, exc.message


def _save_failed(
    request: AdeRequest, tool: Tool | None, error: str, form: ToolForm | None = None
) -> HttpResponse:
    if request.htmx:
        return render(request, "ade/tools/_save_status.html", {"error": error, "tool": tool}, status=422)
    fields = (form or ToolForm(request.POST)).redisplay()
    context = _editor_context(request, tool, **fields, save_error=error)
    context["schema"], context["schema_error"] = _schema_of(fields["source"])
    context["schema_json"] = json.dumps(context["schema"], indent=2) if context["schema"] else ""
    return render(request, "ade/tools/editor.html", context, status=422)


@require_http_methods(["GET", "POST"])
@ade_view
def tool_new(request: AdeRequest) -> HttpResponse:
    if request.method != "POST":
        return render(request, "ade/tools/editor.html", _editor_context(request, None))
    form = ToolForm(request.POST)
    if not form.is_valid():
        return _save_failed(request, None, form.first_error, form)
    try:
        tool = tool_services.tool_create(actor=request.actor, **form.cleaned_data)
    except (InvalidInput, Conflict) as exc:
        return _save_failed(request, None, exc.message, form)
    messages.success(request, f"Tool '{tool.name}' created.")
    return redirect_after_action(request, reverse("ade:tool-detail", args=[tool.id]))


@require_http_methods(["GET", "POST"])
@ade_view
def tool_detail(request: AdeRequest, tool_id: str) -> HttpResponse:
    tool = tool_selectors.tool_get(actor=request.actor, tool_id=tool_id)
    if request.method != "POST":
        return render(request, "ade/tools/editor.html", _editor_context(request, tool))
    form = ToolForm(request.POST)
    if not form.is_valid():
        return _save_failed(request, tool, form.first_error, form)
    try:
        tool = tool_services.tool_update(actor=request.actor, tool_id=tool.id, **form.cleaned_data)
    except (InvalidInput, Conflict) as exc:
        return _save_failed(request, tool, exc.message, form)
    if not request.htmx:
        messages.success(request, f"Tool '{tool.name}' saved.")
        return redirect("ade:tool-detail", tool.id)
    return render(request, "ade/tools/_save_status.html", {"tool": tool, "saved": True})


@require_POST
@ade_view
def tool_delete(request: AdeRequest, tool_id: str) -> HttpResponse:
    tool = tool_selectors.tool_get(actor=request.actor, tool_id=tool_id)
    try:
        tool_services.tool_delete(actor=request.actor, tool_id=tool.id)
    except InvalidInput as exc:  # a built-in
        return _save_failed(request, tool, exc.message)
    messages.success(request, f"Tool '{tool.name}' deleted.")
    return redirect_after_action(request, reverse("ade:tool-list"))


@require_POST
@ade_view
def schema_preview(request: AdeRequest) -> HttpResponse:
    """The schema the editor's current source would get (the live preview as the user types)."""
    form = SourceForm(request.POST)
    schema, error = (
        _schema_of(form.cleaned_data["source_code"]) if form.is_valid() else (None, form.first_error)
    )
    context = {
        "schema": schema,
        "schema_json": json.dumps(schema, indent=2) if schema else "",
        "schema_error": error,
        "sample_args": sample_args(schema),
    }
    return render(request, "ade/tools/_schema.html", context, status=422 if error else 200)


@require_POST
@ade_view
def tool_run(request: AdeRequest) -> HttpResponse:
    """Run the editor's current source with the given arguments in the sandbox an agent would use."""

    def failed(error: str, status: int = 422) -> HttpResponse:
        return render(request, "ade/tools/_run_result.html", {"error": error}, status=status)

    form = ToolRunForm(request.POST)
    if not form.is_valid():
        return failed(form.first_error)
    started = time.monotonic()
    try:
        outcome = tool_services.tool_run(
            actor=request.actor, args=form.cleaned_data["args"], source_code=form.cleaned_data["source_code"]
        )
    except InvalidInput as exc:
        return failed(exc.message)
    except PermissionDenied as exc:
        return failed(exc.message, 403)
    duration_ms = round((time.monotonic() - started) * 1000)
    context = {
        "outcome": outcome,
        "duration_ms": duration_ms,
        "stdout": "\n".join(outcome.stdout),
        "stderr": "\n".join(outcome.stderr),
    }
    return render(request, "ade/tools/_run_result.html", context)


urlpatterns = [
    path("tools/", tool_list, name="tool-list"),
    path("tools/new/", tool_new, name="tool-new"),
    path("tools/schema/", schema_preview, name="tool-schema-preview"),
    path("tools/run/", tool_run, name="tool-run"),
    path("tools/<str:tool_id>/", tool_detail, name="tool-detail"),
    path("tools/<str:tool_id>/delete/", tool_delete, name="tool-delete"),
]
