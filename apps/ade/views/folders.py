"""ADE: folders of documents agents can read (Letta's folders, formerly sources), uploads into them, and the
workspace's panel of an agent's folders and files.

Who may do what is apps.folders.services' rule (the role matrix's archive rows): every member may create a
folder; its creator, owners and admins may upload to it, delete its files or the folder, and attach it to
or detach it from an agent, which, like opening and closing the agent's files by hand, also needs
AGENT_CONFIGURE on the agent. Pages show only the controls their viewer may use; a refused action is a 403
with the service's reason, shown where it happened. Another organisation's folder, file or agent is a 404.

Uploads go one file per request (static/ade/folders.js, for progress events) through `file_upload`
exactly as /v1/folders/{id}/upload calls it; without JavaScript the form posts every picked file at once.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.files.uploadedfile import UploadedFile
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from apps.ade.forms.folders import FolderAttachForm, FolderForm, FolderUploadForm
from apps.ade.views.agents import collection_form_context
from apps.ade.views.base import AdeRequest, ade_view, agent_changed, redirect_after_action, refusal_status
from apps.agents import selectors as agent_selectors
from apps.agents.models import Agent
from apps.core.errors import DomainError, InvalidInput, NotFound, PermissionDenied
from apps.core.permissions import Action, allows
from apps.folders import selectors, services
from apps.folders.errors import FileTooLarge, UnsupportedFileType
from apps.folders.models import AgentFile, FileMetadata, FileStatus, Folder
from apps.memory.errors import EmbeddingModelMissing

FINAL_STATUSES = frozenset({FileStatus.COMPLETED, FileStatus.ERROR})
FORM_ALLOWANCE_BYTES = 1024 * 1024
"""What an upload's body may have besides its file (multipart framing, the CSRF token), as /v1's."""

UPLOAD_STATUS: dict[type[DomainError], int] = {
    FileTooLarge: 413,
    UnsupportedFileType: 415,
    PermissionDenied: 403,
}


def _may_write(request: AdeRequest, folder: Folder) -> bool:
    return allows(request.actor, Action.ARCHIVE_WRITE, creator_id=folder.created_by_id)


def _flash(request: AdeRequest, text: str, level: str = "success") -> str:
    context = {"text": text, "level": level}
    return render(request, "ade/agents/_flash_oob.html", context).content.decode()


# --- the list ----------------------------------------------------------------------------------------------


@require_GET
@ade_view
def folder_list(request: AdeRequest) -> HttpResponse:
    folders = list(selectors.folder_list_with_usage(actor=request.actor))
    return render(request, "ade/folders/list.html", {"folders": folders})


@require_GET
@ade_view
def folder_row(request: AdeRequest, folder_id: str) -> HttpResponse:
    """One row of the list (what a cancelled delete puts back)."""
    folder = selectors.folder_list_with_usage(actor=request.actor).filter(id=folder_id).first()
    if folder is None:
        raise NotFound(f"Folder with id '{folder_id}' not found")
    return render(request, "ade/folders/_row.html", {"folder": folder})


# --- create ------------------------------------------------------------------------------------------------


def _create_context(request: AdeRequest, form: dict[str, str], errors: dict[str, str]) -> dict[str, Any]:
    """A folder needs an embedding model (/v1 answers 400 without), and its files are embedded with it for
    good."""
    return collection_form_context(request, form, errors)


@require_http_methods(["GET", "POST"])
@ade_view
def folder_create(request: AdeRequest) -> HttpResponse:
    if request.method != "POST":
        return render(request, "ade/folders/new.html", _create_context(request, {}, {}))
    form = FolderForm(request.POST)
    status = 422
    if form.is_valid():
        try:
            folder = services.folder_create(
                actor=request.actor,
                name=form.cleaned_data["name"],
                description=form.cleaned_data["description"],
                embedding_handle=form.cleaned_data["embedding"] or None,
            )
        except DomainError as exc:  # a bad or taken name, no or an unknown embedding model
            form.add_domain_error(exc, "embedding" if _about_embedding(exc) else "name")
            status = refusal_status(exc)
        else:
            messages.success(request, f"Folder “{folder.name}” created.")
            return redirect_after_action(request, reverse("ade:folder-detail", args=[folder.id]))
    context = _create_context(request, form.values(), form.error_map())
    return render(request, "ade/folders/new.html", context, status=status)


def _about_embedding(error: DomainError) -> bool:
    return isinstance(error, EmbeddingModelMissing) or error.message == services.NEEDS_EMBEDDING


# --- a folder's page and its files -------------------------------------------------------------------------


def _files_context(request: AdeRequest, folder: Folder, **extra: Any) -> dict[str, Any]:
    files = list(selectors.file_list(actor=request.actor, folder_id=folder.id).order_by("created_at", "id"))
    context = {
        "folder": folder,
        "files": files,
        "ingesting": any(f.processing_status not in FINAL_STATUSES for f in files),
        "total_size": sum(f.file_size for f in files),
        "can_write": _may_write(request, folder),
    }
    return context | extra


@require_GET
@ade_view
def folder_detail(request: AdeRequest, folder_id: str) -> HttpResponse:
    folder = selectors.folder_get(actor=request.actor, folder_id=folder_id)
    context = _files_context(request, folder)
    context |= {
        "agents": list(
            selectors.folder_agent_list(actor=request.actor, folder_id=folder.id).order_by("name")
        ),
        "max_bytes": settings.FOLDER_FILE_MAX_BYTES,
        "supported": selectors.supported_file_types(),
    }
    return render(request, "ade/folders/detail.html", context)


@require_GET
@ade_view
def folder_files(request: AdeRequest, folder_id: str) -> HttpResponse:
    """The files table: the page polls it while a file is still being ingested."""
    folder = selectors.folder_get(actor=request.actor, folder_id=folder_id)
    return render(request, "ade/folders/_files.html", _files_context(request, folder))


@require_POST
@ade_view
def folder_file_delete(request: AdeRequest, folder_id: str, file_id: str) -> HttpResponse:
    folder = selectors.folder_get(actor=request.actor, folder_id=folder_id)
    file = selectors.file_get(actor=request.actor, file_id=file_id, folder_id=folder.id)
    try:
        services.file_delete(actor=request.actor, folder_id=folder.id, file_id=file.id)
    except PermissionDenied as exc:
        context = _files_context(request, folder, error=exc.message)
        return render(request, "ade/folders/_files.html", context, status=403)
    if not request.htmx:
        messages.success(request, f"Deleted “{file.file_name}”.")
        return redirect("ade:folder-detail", folder.id)
    context = _files_context(request, folder, notice=f"Deleted “{file.file_name}”.")
    return render(request, "ade/folders/_files.html", context)


@require_http_methods(["GET", "POST"])
@ade_view
def folder_delete(request: AdeRequest, folder_id: str) -> HttpResponse:
    """GET (HTMX): the list row asks to confirm. POST: delete the folder, its files and their chunks."""
    folder = selectors.folder_get(actor=request.actor, folder_id=folder_id)
    if request.method != "POST":
        if not request.htmx:  # the folder's page has the form that asks
            return redirect("ade:folder-detail", folder.id)
        return render(request, "ade/folders/_delete_confirm.html", {"folder": folder})
    services.folder_delete(actor=request.actor, folder_id=folder.id)  # a refusal: ade_view's 403
    if not request.htmx:
        messages.success(request, f"Deleted folder “{folder.name}”.")
        return redirect("ade:folder-list")
    return HttpResponse(_flash(request, f"Deleted folder “{folder.name}”."))


# --- uploads -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Uploaded:
    """What became of one uploaded file: the stored file, or the service's refusal with its status."""

    name: str
    file: FileMetadata | None = None
    error: str = ""
    status: int = 200


def _upload_status(error: DomainError) -> int:
    return next((code for kind, code in UPLOAD_STATUS.items() if isinstance(error, kind)), 422)


def _upload(request: AdeRequest, folder: Folder, upload: UploadedFile) -> Uploaded:
    """One file through the service, as FolderUploadApi does it (its defaults: duplicates get a suffix)."""
    name = upload.name or "file"
    try:
        services.check_file_size(upload.size or 0)
        result = services.file_upload(
            actor=request.actor,
            folder_id=folder.id,
            filename=upload.name,
            content_type=getattr(upload, "content_type", None),
            data=upload.read(),
        )
    except (FileTooLarge, UnsupportedFileType, PermissionDenied, InvalidInput) as exc:
        return Uploaded(name, error=exc.message, status=_upload_status(exc))
    return Uploaded(name, file=result.file)


def _size_refusal(request: AdeRequest, folder: Folder) -> Uploaded | None:
    """The refusal of a body past the size limit by its Content-Length (as /v1 checks it, before the upload
    is read), or the answer to folders.js asking whether it may send a file of `?size=N` bytes, which it
    does before sending a file it knows is too large: who may not upload hears that first."""
    declared = request.META.get("CONTENT_LENGTH") or ""
    asked = request.GET.get("size", "")
    try:
        if asked.isdigit():
            services.require_folder_writer(request.actor, folder)
            services.check_file_size(int(asked))
        elif declared.isdigit() and int(declared) > settings.FOLDER_FILE_MAX_BYTES + FORM_ALLOWANCE_BYTES:
            services.check_file_size(int(declared) - FORM_ALLOWANCE_BYTES)
    except (FileTooLarge, PermissionDenied) as exc:
        return Uploaded(request.GET.get("name", ""), error=exc.message, status=_upload_status(exc))
    return None


@require_POST
@ade_view
def folder_upload(request: AdeRequest, folder_id: str) -> HttpResponse:
    """POST `file` (one or several). From folders.js (X-Requested-With) or HTMX: the outcome as a fragment,
    with the refusal's status (403, 413, 415, 422); from a plain form: messages and back to the folder.
    `?size=N` with no file only asks whether a file of N bytes may be uploaded."""
    folder = selectors.folder_get(actor=request.actor, folder_id=folder_id)
    fragment = request.htmx or request.headers.get("X-Requested-With") == "XMLHttpRequest"
    refused = _size_refusal(request, folder)
    if refused is not None:
        outcomes = [refused]
    elif request.GET.get("size", "").isdigit():
        return HttpResponse(status=204)  # not too large: send it
    else:
        form = FolderUploadForm(request.POST, request.FILES)
        if form.is_valid():
            outcomes = [_upload(request, folder, upload) for upload in form.cleaned_data["file"]]
        else:
            outcomes = [Uploaded("", error=form.first_error, status=400)]
    if not fragment:
        for outcome in outcomes:
            if outcome.file is not None:
                messages.success(request, f"Uploaded “{outcome.file.file_name}”: ingesting it now.")
            else:
                messages.error(request, f"{outcome.name or 'Upload'}: {outcome.error}")
        return redirect("ade:folder-detail", folder.id)
    status = next((o.status for o in outcomes if o.error), 200)
    return render(request, "ade/folders/_upload_result.html", {"outcomes": outcomes}, status=status)


# --- the workspace's folders panel -------------------------------------------------------------------------


@dataclass(frozen=True)
class PanelFile:
    """A file of an attached folder, with what the agent has of it (None until its ingestion completed)."""

    file: FileMetadata
    state: AgentFile | None


@dataclass(frozen=True)
class PanelFolder:
    folder: Folder
    files: list[PanelFile] = field(default_factory=list)
    can_detach: bool = False


def workspace_context(request: AdeRequest, agent: Agent) -> dict[str, Any]:
    """The workspace page's Folders section: rendered with the page when the agent has folders, else
    loaded when first opened (an agent without folders costs its page nothing more)."""
    if not selectors.attached_folders(actor=request.actor, agent_id=agent.id).exists():
        return {"files_panel_deferred": True}
    return panel_context(request, agent)


def panel_context(request: AdeRequest, agent: Agent, **extra: Any) -> dict[str, Any]:
    """What ade/workspace/_folders.html needs: the agent's folders in attachment order with their files and
    which are open, and the folders the viewer may attach."""
    actor = request.actor
    attached = list(selectors.attached_folders(actor=actor, agent_id=agent.id))
    states = {s.file_id: s for s in selectors.agent_file_list(actor=actor, agent_id=agent.id)}
    files: dict[str, list[PanelFile]] = defaultdict(list)
    if attached:
        for file in selectors.file_list_for_folders(actor=actor, folder_ids=[f.id for f in attached]):
            files[file.folder_id].append(PanelFile(file, states.get(file.id)))
    attached_ids = {f.id for f in attached}
    attachable = [
        folder
        for folder in selectors.folder_list(actor=actor).order_by("name", "id")
        if folder.id not in attached_ids and _may_write(request, folder)
    ]
    panel = {
        "folders": [PanelFolder(f, files[f.id], _may_write(request, f)) for f in attached],
        "attachable": attachable,
        "open_count": sum(s.is_open for s in states.values()),
        "max_files_open": selectors.agent_file_limits(agent).max_files_open,
        "ingesting": any(p.file.processing_status not in FINAL_STATUSES for fs in files.values() for p in fs),
        "error": "",
        "notice": "",
        "tools_changed": False,
    }
    return {"files_panel": panel | extra}


def _render_panel(request: AdeRequest, agent: Agent, *, status: int = 200, **extra: Any) -> HttpResponse:
    context = {"agent": agent, **panel_context(request, agent, **extra)}
    return render(request, "ade/workspace/folders/_panel.html", context, status=status)


@require_GET
@ade_view
def agent_folders_panel(request: AdeRequest, agent_id: str) -> HttpResponse:
    agent = agent_selectors.agent_get(actor=request.actor, agent_id=agent_id)
    return _render_panel(request, agent)


@require_POST
@ade_view
def agent_folder_attach(request: AdeRequest, agent_id: str) -> HttpResponse:
    agent = agent_selectors.agent_get(actor=request.actor, agent_id=agent_id)
    form = FolderAttachForm(request.POST)
    if not form.is_valid():
        return _render_panel(request, agent, status=422, error=form.first_error)
    folder = selectors.folder_get(actor=request.actor, folder_id=form.cleaned_data["folder"])
    try:
        services.agent_attach_folder(actor=request.actor, agent_id=agent.id, folder_id=folder.id)
    except PermissionDenied as exc:
        return _render_panel(request, agent, status=403, error=exc.message)
    notice = f"Attached “{folder.name}”: the agent has its files and the file tools."
    return agent_changed(_render_panel(request, agent, notice=notice, tools_changed=True))


@require_POST
@ade_view
def agent_folder_detach(request: AdeRequest, agent_id: str, folder_id: str) -> HttpResponse:
    agent = agent_selectors.agent_get(actor=request.actor, agent_id=agent_id)
    folder = selectors.folder_get(actor=request.actor, folder_id=folder_id)
    try:
        services.agent_detach_folder(actor=request.actor, agent_id=agent.id, folder_id=folder.id)
    except PermissionDenied as exc:
        return _render_panel(request, agent, status=403, error=exc.message)
    notice = f"Detached “{folder.name}”."
    return agent_changed(_render_panel(request, agent, notice=notice, tools_changed=True))


@require_POST
@ade_view
def agent_file_open(request: AdeRequest, agent_id: str, file_id: str) -> HttpResponse:
    agent = agent_selectors.agent_get(actor=request.actor, agent_id=agent_id)
    try:
        closed = services.agent_file_open(actor=request.actor, agent_id=agent.id, file_id=file_id)
    except PermissionDenied as exc:
        return _render_panel(request, agent, status=403, error=exc.message)
    notice = f"Closed {', '.join(closed)} to make room." if closed else ""
    return agent_changed(_render_panel(request, agent, notice=notice))


@require_POST
@ade_view
def agent_file_close(request: AdeRequest, agent_id: str, file_id: str) -> HttpResponse:
    agent = agent_selectors.agent_get(actor=request.actor, agent_id=agent_id)
    try:
        services.agent_file_close(actor=request.actor, agent_id=agent.id, file_id=file_id)
    except PermissionDenied as exc:
        return _render_panel(request, agent, status=403, error=exc.message)
    return agent_changed(_render_panel(request, agent))


@require_POST
@ade_view
def agent_files_close_all(request: AdeRequest, agent_id: str) -> HttpResponse:
    agent = agent_selectors.agent_get(actor=request.actor, agent_id=agent_id)
    try:
        closed = services.agent_files_close_all(actor=request.actor, agent_id=agent.id)
    except PermissionDenied as exc:
        return _render_panel(request, agent, status=403, error=exc.message)
    notice = f"Closed {len(closed)} file{'s' if len(closed) != 1 else ''}."
    return agent_changed(_render_panel(request, agent, notice=notice))


urlpatterns = [
    path("folders/", folder_list, name="folder-list"),
    path("folders/new/", folder_create, name="folder-create"),
    path("folders/<str:folder_id>/", folder_detail, name="folder-detail"),
    path("folders/<str:folder_id>/row/", folder_row, name="folder-row"),
    path("folders/<str:folder_id>/delete/", folder_delete, name="folder-delete"),
    path("folders/<str:folder_id>/files/", folder_files, name="folder-files"),
    path("folders/<str:folder_id>/upload/", folder_upload, name="folder-upload"),
    path(
        "folders/<str:folder_id>/files/<str:file_id>/delete/", folder_file_delete, name="folder-file-delete"
    ),
]

_agent = "agents/<str:agent_id>/"
workspace_urlpatterns = [
    path(f"{_agent}folders/", agent_folders_panel, name="workspace-folders"),
    path(f"{_agent}folders/attach/", agent_folder_attach, name="workspace-folder-attach"),
    path(f"{_agent}folders/<str:folder_id>/detach/", agent_folder_detach, name="workspace-folder-detach"),
    path(f"{_agent}files/close-all/", agent_files_close_all, name="workspace-files-close-all"),
    path(f"{_agent}files/<str:file_id>/open/", agent_file_open, name="workspace-file-open"),
    path(f"{_agent}files/<str:file_id>/close/", agent_file_close, name="workspace-file-close"),
]
