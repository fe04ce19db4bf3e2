"""ADE: archives, the shared collections of passages behind agents' archival memory (Letta's archives).

The list shows each archive's passages and agents; an archive's page lists its newest passages, searches
them as the agents' archival_memory_search does (by meaning with the archive's embedding model, by text
match without one), adds and deletes passages, and deletes the archive. Attaching an archive to an agent
is /v1's (`agents.archives.attach`).

Who may do what is apps.memory.archival's rule (the role matrix's archive rows, shared with folders): every
member may create an archive; its creator, owners and admins may add or delete passages and delete it.
Pages show only the controls their viewer may use; a refused action is a 403 with the service's reason.
Another organisation's archive or passage is a 404.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from apps.ade.forms.archives import ArchiveForm, PassageForm, PassageSearchForm
from apps.ade.views.agents import collection_form_context
from apps.ade.views.base import AdeRequest, ade_view, error_response, redirect_after_action, refusal_status
from apps.agents import selectors as agent_selectors
from apps.core.errors import DomainError, InvalidInput, PermissionDenied
from apps.core.permissions import Action, allows
from apps.memory import selectors, services
from apps.memory.errors import EmbeddingModelMissing
from apps.memory.models import Archive

NEWEST_PASSAGES = 50
"""Passages an archive's page lists (newest first); the search reaches all of them."""
SEARCH_TOP_K = 20


def _may_write(request: AdeRequest, archive: Archive) -> bool:
    return allows(request.actor, Action.ARCHIVE_WRITE, creator_id=archive.created_by_id)


# --- the list ----------------------------------------------------------------------------------------------


@require_GET
@ade_view
def archive_list(request: AdeRequest) -> HttpResponse:
    archives = list(selectors.archive_list_with_usage(actor=request.actor))
    return render(request, "ade/archives/list.html", {"archives": archives})


# --- create ------------------------------------------------------------------------------------------------


def _create_context(request: AdeRequest, form: dict[str, str], errors: dict[str, str]) -> dict[str, Any]:
    """An archive may have no embedding model: its passages are then found by text match."""
    return collection_form_context(request, form, errors, allow_empty=True)


@require_http_methods(["GET", "POST"])
@ade_view
def archive_create(request: AdeRequest) -> HttpResponse:
    if request.method != "POST":
        return render(request, "ade/archives/new.html", _create_context(request, {}, {}))
    form = ArchiveForm(request.POST)
    status = 422
    if form.is_valid():
        try:
            archive = services.archive_create(
                actor=request.actor,
                name=form.cleaned_data["name"],
                description=form.cleaned_data["description"],
                embedding_handle=form.cleaned_data["embedding"] or None,
            )
        except DomainError as exc:  # a blank or long name, an unknown embedding model, the role
            form.add_domain_error(exc, "embedding" if isinstance(exc, EmbeddingModelMissing) else "name")
            status = refusal_status(exc)
        else:
            messages.success(request, f"Archive “{archive.name}” created.")
            return redirect_after_action(request, reverse("ade:archive-detail", args=[archive.id]))
    context = _create_context(request, form.values(), form.error_map())
    return render(request, "ade/archives/new.html", context, status=status)


# --- an archive's page and its passages ----------------------------------------------------------------------


def _passages_context(request: AdeRequest, archive: Archive, **extra: Any) -> dict[str, Any]:
    passages = selectors.passage_list(actor=request.actor, archive_ids=[archive.id])
    return {
        "archive": archive,
        "passages": list(passages[:NEWEST_PASSAGES]),
        "total": passages.count(),
        "can_write": _may_write(request, archive),
        "form": {"text": "", "tags": ""},
        "errors": {},
    } | extra


def _passages_changed(request: AdeRequest, archive: Archive, notice: str) -> HttpResponse:
    """After a passage was added or deleted: the passages again (HTMX), or the archive's page."""
    if not request.htmx:
        messages.success(request, notice)
        return redirect("ade:archive-detail", archive.id)
    context = _passages_context(request, archive, notice=notice)
    return render(request, "ade/archives/_passages.html", context)


@require_GET
@ade_view
def archive_detail(request: AdeRequest, archive_id: str) -> HttpResponse:
    archive = selectors.archive_get(actor=request.actor, archive_id=archive_id)
    context = _passages_context(request, archive)
    context["agents"] = list(
        agent_selectors.agent_list(actor=request.actor).filter(archives__id=archive.id).order_by("name")
    )
    return render(request, "ade/archives/detail.html", context)


@require_POST
@ade_view
def archive_passage_add(request: AdeRequest, archive_id: str) -> HttpResponse:
    archive = selectors.archive_get(actor=request.actor, archive_id=archive_id)
    form = PassageForm(request.POST)
    status = 422
    if form.is_valid():
        spec = services.PassageSpec(text=form.cleaned_data["text"], tags=form.cleaned_data["tags"])
        try:
            services.archive_passages_create(actor=request.actor, archive_id=archive.id, passages=[spec])
        except PermissionDenied:
            raise  # ade_view's 403 page or partial
        except DomainError as exc:  # a bad tag, the embedding provider failed
            form.add_domain_error(exc, "text")
            status = refusal_status(exc)
        else:
            return _passages_changed(request, archive, "Passage added.")
    context = _passages_context(request, archive, form=form.values(), errors=form.error_map())
    return render(request, "ade/archives/_passages.html", context, status=status)


@require_POST
@ade_view
def archive_passage_delete(request: AdeRequest, archive_id: str, passage_id: str) -> HttpResponse:
    archive = selectors.archive_get(actor=request.actor, archive_id=archive_id)
    try:  # a refusal: ade_view's 403; an unknown passage: its 404
        services.archive_passage_delete(actor=request.actor, archive_id=archive.id, passage_id=passage_id)
    except InvalidInput as exc:  # another archive's passage
        return error_response(request, exc, status=400)
    return _passages_changed(request, archive, "Passage deleted.")


@require_GET
@ade_view
def archive_search(request: AdeRequest, archive_id: str) -> HttpResponse:
    """The archive's passages best matching the query, as an agent's archival_memory_search ranks them."""
    archive = selectors.archive_get(actor=request.actor, archive_id=archive_id)
    form = PassageSearchForm(request.GET)
    query = form.cleaned_data["q"] if form.is_valid() else ""
    context: dict[str, Any] = {"archive": archive, "query": query, "hits": [], "error": ""}
    status = 200
    if query:
        try:
            context["hits"] = selectors.archive_search(
                actor=request.actor, archives=[archive], query=query, top_k=SEARCH_TOP_K
            )
        except DomainError as exc:  # the archive's embedding model is gone, the provider failed
            context["error"], status = exc.message, 422
    return render(request, "ade/archives/_search.html", context, status=status)


@require_http_methods(["GET", "POST"])
@ade_view
def archive_delete(request: AdeRequest, archive_id: str) -> HttpResponse:
    """POST: delete the archive and its passages (agents it was attached to keep working without it)."""
    archive = selectors.archive_get(actor=request.actor, archive_id=archive_id)
    if request.method != "POST":
        return redirect("ade:archive-detail", archive.id)
    services.archive_delete(actor=request.actor, archive_id=archive.id)  # a refusal: ade_view's 403
    messages.success(request, f"Deleted archive “{archive.name}”.")
    return redirect_after_action(request, reverse("ade:archive-list"))


urlpatterns = [
    path("archives/", archive_list, name="archive-list"),
    path("archives/new/", archive_create, name="archive-create"),
    path("archives/<str:archive_id>/", archive_detail, name="archive-detail"),
    path("archives/<str:archive_id>/delete/", archive_delete, name="archive-delete"),
    path("archives/<str:archive_id>/search/", archive_search, name="archive-search"),
    path("archives/<str:archive_id>/passages/", archive_passage_add, name="archive-passage-add"),
    path(
        "archives/<str:archive_id>/passages/<str:passage_id>/delete/",
        archive_passage_delete,
        name="archive-passage-delete",
    ),
]
