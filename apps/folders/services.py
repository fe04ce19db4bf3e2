"""Writes to folders and files: folders, uploads (duplicate handling, size limit, storage quota), deleting
files, attaching folders to agents (with the file tools), and opening and closing files for an agent.

Who may (the role matrix's archive rows, which folders share): ARCHIVE_CREATE to create a folder (every
member), ARCHIVE_WRITE on the folder (its creator, owners, admins) to modify or delete it, upload to it,
delete its files, or attach it to or detach it from an agent, which also needs AGENT_CONFIGURE on the
agent, as does opening and closing an agent's files by hand. Another organisation's folder, file or agent
is not found (404), never refused.
"""

from __future__ import annotations

import logging
import unicodedata
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.agents import agent_file
from apps.agents.errors import AgentNotFound
from apps.agents.models import Agent, AgentTool
from apps.agents.services import require_agent_permission
from apps.core import permissions
from apps.core.actor import Actor
from apps.core.errors import InvalidInput, NotFound
from apps.core.permissions import Action
from apps.folders import parsing, rendering, selectors
from apps.folders.errors import (
    DuplicateFile,
    DuplicateFolderName,
    FileTooLarge,
    FolderNotFound,
    UnsupportedFileType,
)
from apps.folders.models import (
    DEFAULT_CHUNK_SIZE,
    MAX_NAME_LENGTH,
    AgentFile,
    AgentFileSettings,
    FileContent,
    FileMetadata,
    FileStatus,
    Folder,
)
from apps.memory.archival import embedding_target
from apps.tools.models import Tool
from apps.tools.services import tool_upsert_builtins

logger = logging.getLogger(__name__)

FILE_TOOLS = ("open_files", "grep_files", "semantic_search_files")  # Letta's FILES_TOOLS
FILES_TOOL_TYPE = "letta_files_core"
DUPLICATE_HANDLING = ("skip", "error", "suffix", "replace")
MAX_CHUNK_SIZE = 8191  # tokens: what OpenAI's embedding models take in one input
NEEDS_EMBEDDING = "Must specify either embedding or embedding_config in request"


# --- folders ---------------------------------------------------------------------------------------------


def require_folder_writer(actor: Actor, folder: Folder) -> None:
    """ARCHIVE_WRITE on the folder: its creator, owners and admins. Raises PermissionDenied."""
    permissions.require(
        actor, Action.ARCHIVE_WRITE, creator_id=folder.created_by_id, subject=f"folder '{folder.name}'"
    )


def _clean_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("A folder needs a name.")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidInput(f"A folder name may be at most {MAX_NAME_LENGTH} characters.")
    if "/" in name:
        raise InvalidInput("A folder name may not contain '/': files are named <folder name>/<file name>.")
    return name.strip()


def _save_folder(folder: Folder, **kwargs: Any) -> None:
    try:
        with transaction.atomic():
            folder.save(**kwargs)
    except IntegrityError as exc:
        if "folder_unique_name_per_organization" not in str(exc):
            raise
        raise DuplicateFolderName(
            f"A folder named '{folder.name}' already exists in this organization"
        ) from exc


def folder_create(
    *,
    actor: Actor,
    name: str,
    embedding_handle: str | None,
    description: str | None = None,
    instructions: str | None = None,
    metadata: dict[str, Any] | None = None,
    embedding_chunk_size: int | None = None,
) -> Folder:
    """Create a folder owned by the actor, its chunks to be embedded with this model. Raises
    PermissionDenied (ARCHIVE_CREATE), InvalidInput (a bad name or chunk size, no embedding handle: Letta's
    400), EmbeddingModelMissing (a handle that does not resolve), DuplicateFolderName (409)."""
    permissions.require(actor, Action.ARCHIVE_CREATE)
    clean = _clean_name(name)
    handle = (embedding_handle or "").strip()
    if not handle:
        raise InvalidInput(NEEDS_EMBEDDING)
    target = embedding_target(actor=actor, embedding_handle=handle)
    size = DEFAULT_CHUNK_SIZE if embedding_chunk_size is None else embedding_chunk_size
    if not 1 <= size <= MAX_CHUNK_SIZE:
        raise InvalidInput(f"embedding_chunk_size must be between 1 and {MAX_CHUNK_SIZE} tokens, got {size}")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidInput("metadata must be a JSON object")
    folder = Folder(
        organization_id=actor.organization_id,
        name=clean,
        description=description or "",
        instructions=instructions or "",
        metadata=metadata or {},
        embedding=handle,
        embedding_dim=target.dimension,
        embedding_chunk_size=size,
        created_by_id=actor.user_id,
        last_updated_by_id=actor.user_id,
    )
    _save_folder(folder, force_insert=True)
    return folder


def _lock_folder(*, actor: Actor, folder_id: str) -> Folder:
    folder = Folder.objects.for_actor(actor).select_for_update().filter(id=folder_id).first()
    if folder is None:
        raise FolderNotFound(f"Folder with id '{folder_id}' not found")
    return folder


@transaction.atomic
def folder_update(
    *,
    actor: Actor,
    folder_id: str,
    name: str | None = None,
    description: str | None = None,
    instructions: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Folder:
    """Rename or redescribe a folder (None keeps a field); a rename renames its files for the agents that
    have them. Raises FolderNotFound, PermissionDenied (ARCHIVE_WRITE), InvalidInput, DuplicateFolderName."""
    folder = _lock_folder(actor=actor, folder_id=folder_id)
    require_folder_writer(actor, folder)
    old_name = folder.name
    if name is not None:
        folder.name = _clean_name(name)
    if description is not None:
        folder.description = description
    if instructions is not None:
        folder.instructions = instructions
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise InvalidInput("metadata must be a JSON object")
        folder.metadata = metadata
    folder.last_updated_by_id = actor.user_id
    _save_folder(folder)
    if folder.name != old_name:
        for state in AgentFile.objects.for_actor(actor).filter(folder_id=folder.id).select_related("file"):
            state.file_name = f"{folder.name}/{state.file.file_name}"
            state.save(update_fields=["file_name", "updated_at"])
    return folder


@transaction.atomic
def folder_delete(*, actor: Actor, folder_id: str) -> None:
    """Delete a folder with its files and chunks; its agents lose its files, and the file tools with their
    last folder. Raises FolderNotFound, PermissionDenied (ARCHIVE_WRITE)."""
    folder = _lock_folder(actor=actor, folder_id=folder_id)
    require_folder_writer(actor, folder)
    agent_ids = list(folder.agents.values_list("id", flat=True))
    folder.delete()
    for agent_id in agent_ids:
        _detach_file_tools_if_no_folder(actor, agent_id)


# --- uploads -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UploadResult:
    file: FileMetadata
    skipped: bool = False  # duplicate_handling=skip found the file: `file` is the existing one


def sanitize_filename(filename: str | None) -> str:
    """The uploaded name without any directory part, control characters or leading dots, at most
    MAX_NAME_LENGTH characters (the extension kept)."""
    base = PureWindowsPath(PurePosixPath(filename or "").name).name
    clean = "".join(ch for ch in base if unicodedata.category(ch)[0] != "C").strip().lstrip(".")
    clean = clean or "file"
    if len(clean) > MAX_NAME_LENGTH:
        stem, dot, ext = clean.rpartition(".")
        ext = ext if dot and len(ext) < 16 else ""
        clean = (stem if ext else clean)[: MAX_NAME_LENGTH - len(ext) - 1] + ("." + ext if ext else "")
    return clean


def _clean_custom_name(name: str) -> str:
    clean = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C").strip()
    if not clean:
        raise InvalidInput("name must not be empty")
    if len(clean) > MAX_NAME_LENGTH:
        raise InvalidInput(f"name may be at most {MAX_NAME_LENGTH} characters")
    return clean.replace("/", "_")


def _mib(size: int) -> str:
    return f"{size / 1024**2:.1f} MiB"


def check_file_size(size: int) -> None:
    """Raises FileTooLarge past FOLDER_FILE_MAX_BYTES (before the upload is read)."""
    limit = settings.FOLDER_FILE_MAX_BYTES
    if size > limit:
        raise FileTooLarge(
            f"The file is {size:,} bytes; files may be at most {limit:,} bytes ({_mib(limit)}, the limit "
            "FOLDER_FILE_MAX_BYTES)"
        )


def _check_quota(actor: Actor, size: int, *, freed: int = 0) -> None:
    """Under the organisation's quota lock (held until commit): raises FileTooLarge when this upload would
    take it past FOLDER_STORAGE_QUOTA_BYTES. `freed`: bytes of a file this upload replaces."""
    quota = settings.FOLDER_STORAGE_QUOTA_BYTES
    if quota <= 0:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", [f"folders.quota:{actor.organization_id}"]
        )
    used = selectors.storage_used(organization_id=actor.organization_id) - freed
    if used + size > quota:
        raise FileTooLarge(
            f"Storing this file ({size:,} bytes) would take the organization past its storage quota of "
            f"{quota:,} bytes ({_mib(quota)}, FOLDER_STORAGE_QUOTA_BYTES); {used:,} bytes are used. "
            "Delete files or folders to make room."
        )


def _unique_name(folder: Folder, original: str) -> str:
    """Letta's suffix: "<base>_(N)<ext>" with N the number of files of this original name, or the next free."""
    taken = set(
        FileMetadata.all_objects.filter(folder_id=folder.id, replaces__isnull=True).values_list(
            "file_name", flat=True
        )
    )
    if original not in taken:
        return original
    stem, ext = (
        (original.rsplit(".", 1)[0], "." + original.rsplit(".", 1)[1]) if "." in original else (original, "")
    )
    count = FileMetadata.all_objects.filter(folder_id=folder.id, original_file_name=original).count()
    stem = stem[: MAX_NAME_LENGTH - len(ext) - 8]
    while f"{stem}_({count}){ext}" in taken:
        count += 1
    return f"{stem}_({count}){ext}"


def file_upload(
    *,
    actor: Actor,
    folder_id: str,
    filename: str | None,
    content_type: str | None,
    data: bytes,
    duplicate_handling: str = "suffix",
    name: str | None = None,
) -> UploadResult:
    """Store an upload in the folder and queue its ingestion (status `pending`). A file of the same name:
    `skip` answers the existing one, `error` refuses (DuplicateFile, 400), `suffix` names it "<base>_(N)<ext>",
    `replace` stores it as that file's replacement, which takes its place once ingested (the old file serves
    until then). Raises FolderNotFound, PermissionDenied (ARCHIVE_WRITE), UnsupportedFileType (415),
    FileTooLarge (413: FOLDER_FILE_MAX_BYTES, FOLDER_STORAGE_QUOTA_BYTES), InvalidInput."""
    if duplicate_handling not in DUPLICATE_HANDLING:
        raise InvalidInput(f"duplicate_handling must be one of {', '.join(DUPLICATE_HANDLING)}")
    folder = selectors.folder_get(actor=actor, folder_id=folder_id)
    require_folder_writer(actor, folder)
    media_type = parsing.media_type_for(filename, content_type)
    if media_type is None:
        declared = (content_type or "").split(";", 1)[0].strip() or "unknown"
        raise UnsupportedFileType(
            f"Unsupported file type: {declared} (filename: {filename}). Supported types: {parsing.SUPPORTED_SUMMARY}."
        )
    check_file_size(len(data))
    original = _clean_custom_name(name) if name else sanitize_filename(filename)
    with transaction.atomic():
        folder = _lock_folder(actor=actor, folder_id=folder.id)
        existing = (
            FileMetadata.objects.for_actor(actor)
            .filter(folder_id=folder.id, original_file_name=original, replaces__isnull=True)
            .order_by("created_at", "id")
            .first()
        )
        replaces = None
        if existing is not None and duplicate_handling == "skip":
            return UploadResult(existing, skipped=True)
        if existing is not None and duplicate_handling == "error":
            raise DuplicateFile(f"File '{original}' already exists in folder '{folder.name}'")
        if existing is not None and duplicate_handling == "replace":
            replaces = existing
            file_name = existing.file_name
            superseded = FileMetadata.objects.for_actor(actor).filter(replaces_id=existing.id)
            superseded.delete()  # an earlier replacement still pending or failed: the latest upload wins
        else:
            file_name = _unique_name(folder, original)
        _check_quota(actor, len(data), freed=replaces.file_size if replaces else 0)
        file = FileMetadata.objects.for_actor(actor).create(
            folder=folder,
            file_name=file_name,
            original_file_name=original,
            file_type=media_type,
            file_size=len(data),
            processing_status=FileStatus.PENDING,
            replaces=replaces,
            created_by_id=actor.user_id,
        )
        FileContent.objects.for_actor(actor).create(file=file, raw=data)
        transaction.on_commit(lambda: enqueue_ingestion(file.id))
    return UploadResult(file)


def enqueue_ingestion(file_id: str) -> None:
    """Queue `folders.ingest_file` (or, with RUN_EXECUTOR=in_process, ingest now in this process)."""
    if settings.RUN_EXECUTOR == "in_process":
        from apps.folders.ingest import ingest_file

        ingest_file(file_id)
        return
    current_app.send_task("folders.ingest_file", args=[file_id])


@transaction.atomic
def file_delete(*, actor: Actor, folder_id: str, file_id: str) -> None:
    """Delete a file of the folder with its chunks (and any pending replacement); agents lose it at once.
    Raises FolderNotFound, FileNotFound, PermissionDenied (ARCHIVE_WRITE)."""
    folder = _lock_folder(actor=actor, folder_id=folder_id)
    require_folder_writer(actor, folder)
    file = selectors.file_get(actor=actor, file_id=file_id, folder_id=folder.id)
    FileMetadata.objects.for_actor(actor).filter(id=file.id).delete()  # its pending replacement goes too


# --- agents and folders --------------------------------------------------------------------------------------


def _lock_agent(actor: Actor, agent_id: str) -> Agent:
    agent = Agent.objects.for_actor(actor).select_for_update().filter(id=agent_id).first()
    if agent is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    return agent


def _attach_file_tools(actor: Actor, agent: Agent) -> None:
    tools = tool_upsert_builtins(actor=actor, names=FILE_TOOLS)
    for name in FILE_TOOLS:
        AgentTool.objects.get_or_create(agent=agent, tool=tools[name])


def _detach_file_tools_if_no_folder(actor: Actor, agent_id: str) -> None:
    if Folder.objects.for_actor(actor).filter(agents__id=agent_id).exists():
        return
    tool_ids = (
        Tool.objects.for_actor(actor).filter(name__in=FILE_TOOLS, tool_type=FILES_TOOL_TYPE).values("id")
    )
    AgentTool.objects.filter(agent_id=agent_id, tool_id__in=tool_ids).delete()


@transaction.atomic
def agent_attach_folder(*, actor: Actor, agent_id: str, folder_id: str) -> Agent:
    """Attach the folder to the agent: its completed files join the agent's files (the newest open, up to
    max_files_open, least recently used ones closing), and the agent gets the file tools. Attaching twice
    only refreshes its files. Raises AgentNotFound, FolderNotFound, PermissionDenied (AGENT_CONFIGURE on
    the agent, ARCHIVE_WRITE on the folder)."""
    agent = _lock_agent(actor, agent_id)
    require_agent_permission(actor, agent)
    folder = selectors.folder_get(actor=actor, folder_id=folder_id)
    require_folder_writer(actor, folder)
    Folder.agents.through.objects.get_or_create(folder_id=folder.id, agent_id=agent.id)
    _attach_file_tools(actor, agent)
    files = list(
        selectors.file_list(actor=actor, folder_id=folder.id)
        .filter(processing_status=FileStatus.COMPLETED, replaces__isnull=True)
        .order_by("-created_at", "-id")
    )
    attach_files(actor=actor, agent=agent, files=files)
    return agent


@transaction.atomic
def agent_detach_folder(*, actor: Actor, agent_id: str, folder_id: str) -> Agent:
    """Detach the folder: its files leave the agent's context; with the last folder the file tools go too.
    Detaching a folder that is not attached is a no-op. Raises AgentNotFound, FolderNotFound,
    PermissionDenied (AGENT_CONFIGURE on the agent, ARCHIVE_WRITE on the folder)."""
    agent = _lock_agent(actor, agent_id)
    require_agent_permission(actor, agent)
    folder = selectors.folder_get(actor=actor, folder_id=folder_id)
    require_folder_writer(actor, folder)
    Folder.agents.through.objects.filter(folder_id=folder.id, agent_id=agent.id).delete()
    AgentFile.objects.for_actor(actor).filter(agent_id=agent.id, folder_id=folder.id).delete()
    _detach_file_tools_if_no_folder(actor, agent.id)
    return agent


def attach_files(*, actor: Actor, agent: Agent, files: Sequence[FileMetadata]) -> list[str]:
    """Give the agent these files (Letta's attach_files_bulk): as many as max_files_open are opened at their
    start, in the given order, keeping the most recently used of the files already open in the room left;
    the rest are attached closed. Returns the names of the files that were open and are now closed. Call in
    a transaction."""
    if not files:
        return []
    limits = selectors.agent_file_limits(agent)
    texts = selectors.file_texts(actor=actor, file_ids=[file.id for file in files])
    wanted = list({file.id: file for file in files}.values())
    ids = [file.id for file in wanted]
    existing = {
        s.file_id: s
        for s in AgentFile.objects.for_actor(actor)
        .select_for_update()
        .filter(agent_id=agent.id, file_id__in=ids)
    }
    still_open = list(
        AgentFile.objects.for_actor(actor)
        .select_for_update()
        .filter(agent_id=agent.id, is_open=True)
        .exclude(file_id__in=ids)
        .order_by("last_accessed_at", "id")
    )
    opening = ids[: limits.max_files_open]
    room = max(0, limits.max_files_open - len(opening))
    keep = {s.id for s in still_open[len(still_open) - room :]} if room else set()
    evicted = [s for s in still_open if s.id not in keep]
    AgentFile.objects.for_actor(actor).filter(id__in=[s.id for s in evicted]).update(
        is_open=False, visible_content="", start_line=None, end_line=None
    )
    now = timezone.now()
    for file in wanted:
        is_open = file.id in opening
        name = f"{file.folder.name}/{file.file_name}"
        visible = (
            rendering.within_limit(
                rendering.view(texts.get(file.id, ""), selectors.line_strategy(file), file_name=name),
                limits.per_file_char_limit,
            )
            if is_open
            else ""
        )
        state = existing.get(file.id)
        if state is None:
            AgentFile.objects.for_actor(actor).create(
                agent=agent,
                file=file,
                folder_id=file.folder_id,
                file_name=name,
                is_open=is_open,
                visible_content=visible,
                last_accessed_at=now,
            )
            continue
        state.file_name, state.is_open, state.visible_content = name, is_open, visible
        state.start_line = state.end_line = None
        state.last_accessed_at = now
        state.save(
            update_fields=[
                "file_name",
                "is_open",
                "visible_content",
                "start_line",
                "end_line",
                "last_accessed_at",
                "updated_at",
            ]
        )
    return [s.file_name for s in evicted]


def agent_set_folders(*, actor: Actor, agent_id: str, folder_ids: Sequence[str]) -> None:
    """Make these the agent's folders (CreateAgent/UpdateAgent `folder_ids`, `source_ids`): attach the new
    ones, detach the others. Raises what agent_attach_folder and agent_detach_folder raise."""
    wanted = list(dict.fromkeys(folder_ids))
    for folder_id in wanted:
        selectors.folder_get(actor=actor, folder_id=folder_id)
    current = list(selectors.attached_folders(actor=actor, agent_id=agent_id).values_list("id", flat=True))
    for folder_id in current:
        if folder_id not in wanted:
            agent_detach_folder(actor=actor, agent_id=agent_id, folder_id=folder_id)
    for folder_id in wanted:
        if folder_id not in current:
            agent_attach_folder(actor=actor, agent_id=agent_id, folder_id=folder_id)


@transaction.atomic
def agent_set_file_limits(
    *,
    actor: Actor,
    agent_id: str,
    max_files_open: int | None = None,
    per_file_view_window_char_limit: int | None = None,
) -> None:
    """Set the agent's file controls (None keeps one). Raises AgentNotFound, PermissionDenied
    (AGENT_CONFIGURE), InvalidInput for values out of Letta's ranges."""
    agent = _lock_agent(actor, agent_id)
    require_agent_permission(actor, agent)
    if max_files_open is not None and not 1 <= max_files_open <= selectors.MAX_FILES_OPEN_LIMIT:
        raise InvalidInput(
            f"max_files_open must be between 1 and {selectors.MAX_FILES_OPEN_LIMIT}. Got: {max_files_open}"
        )
    if per_file_view_window_char_limit is not None and not (
        1 <= per_file_view_window_char_limit <= selectors.MAX_PER_FILE_CHAR_LIMIT
    ):
        raise InvalidInput(
            f"per_file_view_window_char_limit must be between 1 and {selectors.MAX_PER_FILE_CHAR_LIMIT}. "
            f"Got: {per_file_view_window_char_limit}"
        )
    row, _ = AgentFileSettings.objects.for_actor(actor).get_or_create(agent_id=agent.id)
    if max_files_open is not None:
        row.max_files_open = max_files_open
    if per_file_view_window_char_limit is not None:
        row.per_file_view_window_char_limit = per_file_view_window_char_limit
    row.save()


def agent_configure_files(
    *,
    actor: Actor,
    agent_id: str,
    folder_ids: Sequence[str] | None = None,
    max_files_open: int | None = None,
    per_file_view_window_char_limit: int | None = None,
    include_default_source: bool = False,
) -> None:
    """What CreateAgent/UpdateAgent say about files, for an agent just created or updated: its limits, its
    folders (None: unchanged), and with `include_default_source` a new folder "<agent name> External Data
    Source" embedded with the agent's model (Letta's). Raises what the services it calls raise."""
    if max_files_open is not None or per_file_view_window_char_limit is not None:
        agent_set_file_limits(
            actor=actor,
            agent_id=agent_id,
            max_files_open=max_files_open,
            per_file_view_window_char_limit=per_file_view_window_char_limit,
        )
    wanted = list(folder_ids) if folder_ids is not None else None
    if include_default_source:
        agent = Agent.objects.for_actor(actor).filter(id=agent_id).first()
        if agent is None:
            raise AgentNotFound(f"Agent with id '{agent_id}' not found")
        folder = folder_create(
            actor=actor, name=f"{agent.name} External Data Source", embedding_handle=agent.embedding or None
        )
        wanted = [*(wanted if wanted is not None else _current_folder_ids(actor, agent_id)), folder.id]
    if wanted is not None:
        agent_set_folders(actor=actor, agent_id=agent_id, folder_ids=wanted)


def _current_folder_ids(actor: Actor, agent_id: str) -> list[str]:
    return list(selectors.attached_folders(actor=actor, agent_id=agent_id).values_list("id", flat=True))


# --- an agent's open files ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Opened:
    closed: list[str]  # files closed to make room (least recently used first)
    previous: tuple[int | None, int | None] | None  # the range shown before, when it changed


def open_file(
    *,
    actor: Actor,
    agent: Agent,
    state: AgentFile,
    start: int | None = None,
    end: int | None = None,
    text: str | None = None,
) -> Opened:
    """Open the agent's file at lines start..end (0-indexed, end exclusive; None: whole file), closing the
    least recently used open files past max_files_open (Letta's enforce_max_open_files_and_open). Raises
    rendering.RangeError. Call in a transaction; the caller checked the agent may be changed."""
    limits = selectors.agent_file_limits(agent)
    file = state.file
    if text is None:
        text = selectors.file_texts(actor=actor, file_ids=[file.id]).get(file.id, "")
    visible = rendering.view(
        text, selectors.line_strategy(file), file_name=state.file_name, start=start, end=end
    )
    others = list(
        AgentFile.objects.for_actor(actor)
        .select_for_update()
        .filter(agent_id=agent.id, is_open=True)
        .exclude(id=state.id)
        .order_by("last_accessed_at", "id")
    )
    excess = len(others) - (limits.max_files_open - 1)
    closing = others[:excess] if excess > 0 else []
    AgentFile.objects.for_actor(actor).filter(id__in=[s.id for s in closing]).update(
        is_open=False, visible_content="", start_line=None, end_line=None
    )
    new_range = (start + 1 if start is not None else None, end)
    previous = (state.start_line, state.end_line)
    changed = (
        state.is_open and previous != new_range and (previous != (None, None) or new_range != (None, None))
    )
    state.is_open = True
    state.visible_content = rendering.within_limit(visible, limits.per_file_char_limit)
    state.start_line, state.end_line = new_range
    state.last_accessed_at = timezone.now()
    state.save(
        update_fields=[
            "is_open",
            "visible_content",
            "start_line",
            "end_line",
            "last_accessed_at",
            "updated_at",
        ]
    )
    return Opened(closed=[s.file_name for s in closing], previous=previous if changed else None)


def _agent_state_for_file(actor: Actor, agent: Agent, file_id: str) -> AgentFile:
    state = (
        AgentFile.objects.for_actor(actor)
        .select_related("file", "folder")
        .filter(agent_id=agent.id, file_id=file_id)
        .first()
    )
    if state is None:
        raise NotFound(f"File with id={file_id} is not attached to agent {agent.id}")
    return state


@transaction.atomic
def agent_file_open(*, actor: Actor, agent_id: str, file_id: str) -> list[str]:
    """Open one of the agent's files (whole, cut to its per-file limit). Returns the names of the files
    closed to make room. Raises AgentNotFound, NotFound (not the agent's file), PermissionDenied
    (AGENT_CONFIGURE)."""
    agent = _lock_agent(actor, agent_id)
    require_agent_permission(actor, agent)
    state = _agent_state_for_file(actor, agent, file_id)
    return open_file(actor=actor, agent=agent, state=state).closed


@transaction.atomic
def agent_file_close(*, actor: Actor, agent_id: str, file_id: str) -> None:
    """Close one of the agent's files (closing a closed one is a no-op). Raises AgentNotFound, NotFound,
    PermissionDenied (AGENT_CONFIGURE)."""
    agent = _lock_agent(actor, agent_id)
    require_agent_permission(actor, agent)
    state = _agent_state_for_file(actor, agent, file_id)
    AgentFile.objects.for_actor(actor).filter(id=state.id).update(
        is_open=False, visible_content="", start_line=None, end_line=None, last_accessed_at=timezone.now()
    )


def close_files(*, actor: Actor, agent_id: str, keep: Sequence[str] = ()) -> list[str]:
    """Close the agent's open files except those named in `keep`; returns the names closed."""
    states = (
        AgentFile.objects.for_actor(actor)
        .filter(agent_id=agent_id, is_open=True)
        .exclude(file_name__in=list(keep))
    )
    names = list(states.order_by("file_name").values_list("file_name", flat=True))
    states.update(is_open=False, visible_content="", start_line=None, end_line=None)
    return names


@transaction.atomic
def agent_files_close_all(*, actor: Actor, agent_id: str) -> list[str]:
    """Close every open file of the agent; returns their names. Raises AgentNotFound, PermissionDenied."""
    agent = _lock_agent(actor, agent_id)
    require_agent_permission(actor, agent)
    return close_files(actor=actor, agent_id=agent.id)


# --- agent files (.af): an agent's folders and files, out and back in (apps.agents.agent_file) -------------

NO_TEXT_IN_AGENT_FILE = "The agent file carried no text for this file; upload it again"


def agent_file_export_folders(actor: Actor, agent: Agent) -> agent_file.AgentFolders:
    """What an agent file carries of the agent's folders: the attached folders (in attachment order), the
    files the agent has with their parsed text, its state of each (open or closed, its window), and its
    file limits. Reads only."""
    folders = list(selectors.attached_folders(actor=actor, agent_id=agent.id))
    order = {folder.id: i for i, folder in enumerate(folders)}
    states = sorted(
        AgentFile.objects.for_actor(actor)
        .filter(agent_id=agent.id, folder_id__in=list(order))
        .select_related("file"),
        key=lambda s: (order[s.folder_id], s.file.file_name, s.file_id),
    )
    files = [state.file for state in states]
    texts = selectors.file_texts(actor=actor, file_ids=[file.id for file in files])
    limits = selectors.agent_file_limits(agent)
    return agent_file.AgentFolders(
        folders=[
            agent_file.ExportedFolder(
                id=folder.id,
                name=folder.name,
                description=folder.description,
                instructions=folder.instructions,
                metadata=folder.metadata,
                embedding=folder.embedding,
                embedding_dim=folder.embedding_dim,
                embedding_chunk_size=folder.embedding_chunk_size,
            )
            for folder in folders
        ],
        files=[
            agent_file.ExportedFile(
                id=file.id,
                folder_id=file.folder_id,
                file_name=file.file_name,
                original_file_name=file.original_file_name,
                file_type=file.file_type,
                file_size=file.file_size,
                processing_status=file.processing_status,
                error_message=file.error_message,
                total_chunks=file.total_chunks,
                chunks_embedded=file.chunks_embedded,
                text=texts.get(file.id, ""),
            )
            for file in files
        ],
        states=[
            agent_file.ExportedFileState(
                file_id=state.file_id,
                folder_id=state.folder_id,
                file_name=state.file_name,
                is_open=state.is_open,
                visible_content=state.visible_content if state.is_open else "",
                last_accessed_at=state.last_accessed_at,
                start_line=state.start_line,
                end_line=state.end_line,
            )
            for state in states
        ],
        max_files_open=limits.max_files_open,
        per_file_view_window_char_limit=limits.per_file_char_limit,
    )


@dataclass(frozen=True, slots=True)
class _Imported:
    file: FileMetadata
    text: str


def agent_file_import_folders(
    *, actor: Actor, file: agent_file.AgentFile, agents: dict[str, Agent], embedding: str | None
) -> None:
    """Bring an agent file's sources and files in (agent_import calls this in its transaction, after the
    agents exist): each source becomes a new folder of the actor's, named as in the file unless the
    organisation has that name (then Letta's "<name>_<8 hex>"), embedded with `embedding`, else its own
    model, else the first agent's; each file is stored with the text the file carries and indexed after
    commit without being parsed again; each agent gets its folders (and the file tools), its file limits,
    and its files open or closed as the file left them, within max_files_open. Raises AgentFileTooLarge
    (413) for a file past FOLDER_FILE_MAX_BYTES or the storage quota, before anything of it is stored;
    InvalidInput, EmbeddingModelMissing, PermissionDenied, DuplicateFolderName from the services."""
    for document in file.files:
        _check_imported_size(document)
    fallback = next((agent.embedding for agent in agents.values() if agent.embedding), None)
    folders = {}
    for source in file.sources:
        handle = embedding or source.embedding_handle() or fallback
        if not handle:
            raise agent_file.AgentFileError(
                f"Invalid agent file: source {source.id} ('{source.name}') names no embedding model; "
                "give one with `embedding`"
            )
        folders[source.id] = folder_create(
            actor=actor,
            name=_free_folder_name(actor, source.name),
            embedding_handle=handle,
            description=source.description,
            instructions=source.instructions,
            metadata=source.metadata,
            embedding_chunk_size=source.chunk_size(),
        )
    imported = {
        document.id: _import_file(actor, folders[document.source_id], document) for document in file.files
    }
    for file_agent in file.agents:
        agent = agents.get(file_agent.id)
        if agent is not None:
            _import_agent_files(actor, agent, file_agent, folders, imported)


def _imported_size(document: agent_file.FileDocument) -> int:
    """What the file counts for: its upload's size as the file says, or its text's if that is larger."""
    return max(document.file_size or 0, len((document.content or "").encode()))


def _check_imported_size(document: agent_file.FileDocument) -> None:
    try:
        check_file_size(_imported_size(document))
    except FileTooLarge as exc:
        raise agent_file.AgentFileTooLarge(
            f"Cannot import file {document.id} ('{document.file_name}') of the agent file: {exc.message}"
        ) from exc


def _free_folder_name(actor: Actor, name: str) -> str:
    """The source's name if the organisation has no folder of that name, else Letta's "<name>_<8 hex>"."""
    clean = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C").replace("/", "_").strip()
    clean = (clean or "folder")[:MAX_NAME_LENGTH]
    if not Folder.objects.for_actor(actor).filter(name=clean).exists():
        return clean
    return f"{clean[: MAX_NAME_LENGTH - 9]}_{uuid.uuid4().hex[:8]}"


def _import_file(actor: Actor, folder: Folder, document: agent_file.FileDocument) -> _Imported:
    """Store the file with its text, `parsing` until indexing (enqueued on commit) takes it on; a file
    without text is stored as failed. Raises AgentFileTooLarge past the storage quota."""
    text = (document.content or "").replace("\x00", "")
    name = sanitize_filename(document.file_name or document.original_file_name)
    size = _imported_size(document)
    try:
        _check_quota(actor, size)
    except FileTooLarge as exc:
        raise agent_file.AgentFileTooLarge(
            f"Cannot import file {document.id} ('{document.file_name}') of the agent file: {exc.message}"
        ) from exc
    has_text = bool(text.strip())
    stored = FileMetadata.objects.for_actor(actor).create(
        folder=folder,
        file_name=_unique_name(folder, name),
        original_file_name=sanitize_filename(document.original_file_name or name),
        file_type=parsing.media_type_for(name, document.file_type) or "text/plain",
        file_size=size,
        processing_status=FileStatus.PARSING if has_text else FileStatus.ERROR,
        error_message="" if has_text else NO_TEXT_IN_AGENT_FILE,
        created_by_id=actor.user_id,
    )
    FileContent.objects.for_actor(actor).create(file=stored, text=text)
    if has_text:
        transaction.on_commit(lambda: enqueue_indexing(stored.id))
    return _Imported(stored, text)


def enqueue_indexing(file_id: str) -> None:
    """Queue `folders.index_file` (or, with RUN_EXECUTOR=in_process, index now in this process)."""
    if settings.RUN_EXECUTOR == "in_process":
        from apps.folders.ingest import index_file

        index_file(file_id)
        return
    current_app.send_task("folders.index_file", args=[file_id])


def _import_agent_files(
    actor: Actor,
    agent: Agent,
    file_agent: agent_file.FileAgent,
    folders: dict[str, Folder],
    imported: dict[str, _Imported],
) -> None:
    """The agent's file limits (where they differ from its defaults), its folders (those it names and those
    of its files_agents), and a state for every file of them that has text: the ones the file has open
    open again at their window (the most recently used first, up to max_files_open), the others closed."""
    limits = selectors.agent_file_limits(agent)
    max_open = file_agent.max_files_open
    per_file = file_agent.per_file_view_window_char_limit
    max_open = max_open if max_open is not None and max_open != limits.max_files_open else None
    per_file = per_file if per_file is not None and per_file != limits.per_file_char_limit else None
    if max_open is not None or per_file is not None:
        agent_set_file_limits(
            actor=actor, agent_id=agent.id, max_files_open=max_open, per_file_view_window_char_limit=per_file
        )
        limits = selectors.agent_file_limits(agent)
    folder_ids = [folders[source_id].id for source_id in file_agent.folder_refs()]
    folder_ids += [imported[state.file_id].file.folder_id for state in file_agent.files_agents]
    attached = list(dict.fromkeys(folder_ids))
    for folder_id in attached:
        agent_attach_folder(actor=actor, agent_id=agent.id, folder_id=folder_id)
    states = {imported[state.file_id].file.id: state for state in file_agent.files_agents}
    texts = {item.file.id: item.text for item in imported.values()}
    now = timezone.now()
    opening = sorted(
        (file_id for file_id, state in states.items() if state.is_open and texts[file_id].strip()),
        key=lambda file_id: _aware(states[file_id].last_accessed_at) or now,
        reverse=True,
    )[: limits.max_files_open]
    for item in imported.values():
        if item.file.folder_id not in attached or item.file.processing_status == FileStatus.ERROR:
            continue
        state = states.get(item.file.id)
        row = AgentFile(
            organization_id=actor.organization_id,
            agent=agent,
            file=item.file,
            folder_id=item.file.folder_id,
            file_name=f"{item.file.folder.name}/{item.file.file_name}",
            last_accessed_at=(_aware(state.last_accessed_at) if state else None) or now,
        )
        if state is not None and item.file.id in opening:
            _reopen(row, item, state, limits.per_file_char_limit)
        row.save(force_insert=True)


def _aware(moment: datetime | None) -> datetime | None:
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


def _reopen(row: AgentFile, item: _Imported, state: agent_file.FileDocumentState, limit: int) -> None:
    """Open the row at the lines the file had open (1-indexed start, exclusive end), or at the start when
    that range is not in this text, cut to the agent's per-file limit."""
    start = state.start_line - 1 if state.start_line is not None and state.start_line >= 1 else None
    end = state.end_line if state.end_line is not None and state.end_line >= 1 else None
    strategy = selectors.line_strategy(item.file)
    try:
        window = rendering.view(item.text, strategy, file_name=row.file_name, start=start, end=end)
    except rendering.RangeError:
        window = rendering.view(item.text, strategy, file_name=row.file_name)
        start = end = None
    row.is_open = True
    row.visible_content = rendering.within_limit(window, limit)
    row.start_line = start + 1 if start is not None else None
    row.end_line = end
