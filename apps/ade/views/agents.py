"""ADE: the agent list, creating agents (templates or from scratch), cloning, deleting, Agent Files."""

from __future__ import annotations

import json
import re
from typing import Any

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_http_methods

from apps.ade.forms.agents import AgentCreateForm, AgentImportForm
from apps.ade.starter_templates import DEFAULT_TEMPLATE, STARTER_TEMPLATES
from apps.ade.views.base import AdeRequest, ade_view, error_response, redirect_after_action, refusal_status
from apps.agents import services as agent_services
from apps.agents.models import Agent
from apps.agents.selectors import (
    agent_get,
    agent_state_list,
    agent_tag_list,
    embedding_model_list,
    model_list,
)
from apps.core.errors import DomainError
from apps.llm.selectors import llm_configured

LIST_LIMIT = 200


# --- list -------------------------------------------------------------------------------------------------


def _list_context(request: AdeRequest) -> dict[str, Any]:
    query = request.GET.get("q", "").strip()
    tag = request.GET.get("tag", "").strip()
    agents = (
        agent_state_list(actor=request.actor, query_text=query or None, tags=[tag] if tag else None)
        .exclude(hidden=True)
        .order_by("-updated_at")
    )
    shown = list(agents[: LIST_LIMIT + 1])
    return {
        "agents": shown[:LIST_LIMIT],
        "truncated": len(shown) > LIST_LIMIT,
        "q": query,
        "tag": tag,
        "tags": agent_tag_list(actor=request.actor, limit=100),
        "filtered": bool(query or tag),
    }


@require_GET
@ade_view
def agent_list(request: AdeRequest) -> HttpResponse:
    context = _list_context(request)
    if request.htmx and request.htmx.target == "agent-results":
        return render(request, "ade/agents/_results.html", context)
    context["llm_configured"] = llm_configured(actor=request.actor)
    return render(request, "ade/agents/list.html", context)


@require_GET
@ade_view
def provider_check(request: AdeRequest) -> HttpResponse:
    """The 'no LLM provider' banner, or nothing: loaded after the page so a slow provider never delays it."""
    return render(
        request, "ade/agents/_no_provider.html", {"has_models": bool(model_list(actor=request.actor))}
    )


@require_GET
@ade_view
def agent_row(request: AdeRequest, agent_id: str) -> HttpResponse:
    return render(
        request, "ade/agents/_row.html", {"agent": agent_get(actor=request.actor, agent_id=agent_id)}
    )


# --- create -----------------------------------------------------------------------------------------------


def handle_picker(
    *,
    name: str,
    label: str,
    kind: str,
    options: list[Any],
    value: str,
    error: str = "",
    allow_empty: bool = False,
) -> dict[str, Any]:
    """Context for ade/agents/_handle_picker.html: a select of the providers' models plus a free handle."""
    return {
        "id": f"{name}-handle",
        "name": name,
        "label": label,
        "kind": kind,
        "options": options,
        "value": value,
        "known": value in {option.handle for option in options},
        "error": error,
        "allow_empty": allow_empty,
    }


def collection_form_context(
    request: AdeRequest, form: dict[str, str], errors: dict[str, str], *, allow_empty: bool = False
) -> dict[str, Any]:
    """Context of a new folder's or archive's form (name, description, embedding model): the model
    defaults to the first one the providers list, as the agent form's does."""
    embeddings = embedding_model_list(actor=request.actor)
    if not form:
        form = {"name": "", "description": "", "embedding": embeddings[0].handle if embeddings else ""}
    picker = handle_picker(
        name="embedding",
        label="Embedding model",
        kind="embedding",
        options=embeddings,
        value=form["embedding"],
        error=errors.get("embedding", ""),
        allow_empty=allow_empty,
    )
    return {"form": form, "errors": errors, "embedding_picker": picker}


def _create_context(request: AdeRequest, form: dict[str, str], errors: dict[str, str]) -> dict[str, Any]:
    models = model_list(actor=request.actor)
    embeddings = embedding_model_list(actor=request.actor)
    if not form:
        form = {
            "template": DEFAULT_TEMPLATE,
            "name": "",
            "model": models[0].handle if models else "",
            "embedding": embeddings[0].handle if embeddings else "",
            "system": "",
        }
    return {
        "templates": STARTER_TEMPLATES,
        "models": models,
        "form": form,
        "errors": errors,
        "llm_configured": llm_configured(actor=request.actor),
        "model_picker": handle_picker(
            name="model",
            label="Model",
            kind="chat",
            options=models,
            value=form["model"],
            error=errors.get("model", ""),
        ),
        "embedding_picker": handle_picker(
            name="embedding",
            label="Embedding model (archival memory)",
            kind="embedding",
            options=embeddings,
            value=form["embedding"],
            error=errors.get("embedding", ""),
            allow_empty=True,
        ),
    }


@require_http_methods(["GET", "POST"])
@ade_view
def agent_create(request: AdeRequest) -> HttpResponse:
    if request.method != "POST":
        return render(request, "ade/agents/create.html", _create_context(request, {}, {}))
    form = AgentCreateForm(request.POST, actor=request.actor)
    if form.is_valid():
        try:
            agent = agent_services.agent_create_with_settings(
                actor=request.actor,
                name=form.cleaned_data["name"] or None,
                model=form.cleaned_data["model"],
                embedding=form.cleaned_data["embedding"],
                system=form.system_prompt,
                memory_blocks=list(form.starter.blocks),
                enable_sleeptime=form.starter.enable_sleeptime,
            )
        except DomainError as exc:
            form.add_domain_error(exc)
        else:
            return redirect_after_action(request, reverse("ade:workspace", args=[agent.id]))
    context = _create_context(request, form.values(), form.error_map())
    template_name = "ade/agents/_create_form.html" if request.htmx else "ade/agents/create.html"
    return render(request, template_name, context, status=422)


# --- clone, delete ----------------------------------------------------------------------------------------


def _flash(request: AdeRequest, text: str, level: str = "success") -> str:
    return render(request, "ade/agents/_flash_oob.html", {"text": text, "level": level}).content.decode()


@require_http_methods(["GET", "POST"])
@ade_view
def agent_clone(request: AdeRequest, agent_id: str) -> HttpResponse:
    if request.method != "POST":
        return HttpResponse(status=405, headers={"Allow": "POST"})
    source = agent_get(actor=request.actor, agent_id=agent_id)
    try:
        clone = agent_services.agent_clone(actor=request.actor, agent_id=source.id)
    except DomainError as exc:
        return _error(request, exc.message, status=refusal_status(exc))
    if not request.htmx:
        return redirect("ade:workspace", clone.id)
    row = render(request, "ade/agents/_row.html", {"agent": clone, "fresh": True}).content.decode()
    return HttpResponse(row + _flash(request, f"Cloned “{source.name}” as “{clone.name}”."))


@require_http_methods(["GET", "POST"])
@ade_view
def agent_delete(request: AdeRequest, agent_id: str) -> HttpResponse:
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    if request.method != "POST":
        template = "ade/agents/_delete_confirm.html" if request.htmx else "ade/agents/delete.html"
        return render(request, template, {"agent": agent})
    agent_services.agent_delete(actor=request.actor, agent_id=agent.id)
    if not request.htmx:
        messages.success(request, f"Deleted “{agent.name}”.")
        return redirect("ade:agent-list")
    return HttpResponse(_flash(request, f"Deleted “{agent.name}”."))


def _error(request: AdeRequest, message: str, status: int = 422) -> HttpResponse:
    return error_response(request, message, status=status)


# --- Agent Files ------------------------------------------------------------------------------------------


def _file_name(name: str) -> str:
    return (re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "agent") + ".af"


@require_GET
@ade_view
def agent_export(request: AdeRequest, agent_id: str) -> HttpResponse:
    """The agent as a Letta Agent File: secrets leave with their keys only, never their values."""
    agent = agent_get(actor=request.actor, agent_id=agent_id)
    document = agent_services.agent_export(actor=request.actor, agent_id=agent.id)
    response = HttpResponse(
        json.dumps(document, indent=2, ensure_ascii=False), content_type="application/json"
    )
    response["Content-Disposition"] = f'attachment; filename="{_file_name(agent.name)}"'
    return response


@require_http_methods(["GET", "POST"])
@ade_view
def agent_import(request: AdeRequest) -> HttpResponse:
    if request.method != "POST":
        return redirect("ade:agent-list")
    form = AgentImportForm(request.POST, request.FILES)
    status = 422
    imported: list[Agent] = []
    refused: list[agent_services.Refusal] = []
    if form.is_valid():
        try:
            parsed = agent_services.parse_agent_file(form.cleaned_data["file"].read())
            result = agent_services.agent_import(
                actor=request.actor,
                file=parsed,
                override_existing_tools=form.cleaned_data["override_existing_tools"],
            )
        except DomainError as exc:
            form.add_domain_error(exc)
            status = refusal_status(exc)
        else:
            imported = [agent_get(actor=request.actor, agent_id=i) for i in result.agent_ids]
            refused = result.refused
    error = form.first_error
    if not request.htmx:
        if error:
            messages.error(request, error)
        else:
            messages.success(request, f"Imported “{imported[0].name}”.")
            for refusal in refused:
                messages.warning(request, f"Not imported: {refusal.kind} “{refusal.name}”: {refusal.reason}.")
        return redirect("ade:agent-list")
    context = {"import_error": error, "imported": imported, "refused": refused}
    if imported:
        context |= _list_context(request) | {"oob_results": True}
    return render(request, "ade/agents/_import.html", context, status=status if error else 200)


urlpatterns = [
    path("agents/", agent_list, name="agent-list"),
    path("agents/new/", agent_create, name="agent-create"),
    path("agents/import/", agent_import, name="agent-import"),
    path("agents/<str:agent_id>/row/", agent_row, name="agent-row"),
    path("agents/<str:agent_id>/clone/", agent_clone, name="agent-clone"),
    path("agents/<str:agent_id>/delete/", agent_delete, name="agent-delete"),
    path("agents/<str:agent_id>/export/", agent_export, name="agent-export"),
]
