"""Reads of folders and files: lookups that raise not-found for other organisations' rows, listings, the
organisation's storage figures, an agent's folders and files, its file limits and its `<directories>`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Count, F, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.utils.dateparse import parse_datetime

from apps.agents.errors import AgentNotFound
from apps.agents.models import Agent
from apps.core.actor import Actor
from apps.folders import rendering
from apps.folders.errors import FileNotFound, FolderNotFound
from apps.folders.models import (
    AgentFile,
    AgentFileSettings,
    FileChunk,
    FileContent,
    FileMetadata,
    FileStatus,
    Folder,
)
from apps.folders.parsing import file_type
from apps.llm.handles import DEFAULT_CONTEXT_WINDOW

DEFAULT_MAX_FILES_OPEN = 5  # Letta's DEFAULT_MAX_FILES_OPEN
DEFAULT_PER_FILE_CHAR_LIMIT = 50_000  # Letta's DEFAULT_CORE_MEMORY_SOURCE_CHAR_LIMIT
MAX_FILES_OPEN_LIMIT = 1000  # Letta's MAX_FILES_OPEN_LIMIT
MAX_PER_FILE_CHAR_LIMIT = 2**31 - 1  # int32, as Letta


def folder_get(*, actor: Actor, folder_id: str) -> Folder:
    """Raises FolderNotFound, also for another organisation's folder."""
    folder = Folder.objects.for_actor(actor).filter(id=folder_id).first()
    if folder is None:
        raise FolderNotFound(f"Folder with id '{folder_id}' not found")
    return folder


def folder_list(*, actor: Actor, name: str | None = None) -> QuerySet[Folder]:
    queryset = Folder.objects.for_actor(actor)
    return queryset if name is None else queryset.filter(name=name)


def folder_by_name(*, actor: Actor, name: str) -> Folder:
    folder = Folder.objects.for_actor(actor).filter(name=name).first()
    if folder is None:
        raise FolderNotFound(f"Folder with name '{name}' not found")
    return folder


def folder_metadata(*, actor: Actor, detailed: bool = False) -> dict[str, Any]:
    """Letta's OrganizationSourcesStats: folders, files and bytes of the organisation, per folder (by name),
    with each file's name and size when `detailed`. Two queries."""
    folders = list(
        Folder.objects.for_actor(actor)
        .annotate(file_count=Count("files"), total_size=Coalesce(Sum("files__file_size"), 0))
        .order_by("name")
        .values("id", "name", "file_count", "total_size")
    )
    files: dict[str, list[dict[str, Any]]] = {}
    if detailed:
        rows = (
            FileMetadata.objects.for_actor(actor)
            .order_by("created_at")
            .values("id", "folder_id", "file_name", "file_size")
        )
        for row in rows:
            files.setdefault(row["folder_id"], []).append(
                {"file_id": row["id"], "file_name": row["file_name"], "file_size": row["file_size"]}
            )
    return {
        "total_sources": len(folders),
        "total_files": sum(f["file_count"] for f in folders),
        "total_size": sum(f["total_size"] for f in folders),
        "sources": [
            {
                "source_id": f["id"],
                "source_name": f["name"],
                "folder_id": f["id"],
                "folder_name": f["name"],
                "file_count": f["file_count"],
                "total_size": f["total_size"],
                "files": files.get(f["id"], []),
            }
            for f in folders
        ],
    }


def storage_used(*, organization_id: str) -> int:
    """Bytes of every file the organisation holds (the quota counts uploads, whatever their status)."""
    total = FileMetadata.objects.for_org(organization_id).aggregate(total=Sum("file_size"))["total"]
    return int(total or 0)


def file_get(*, actor: Actor, file_id: str, folder_id: str | None = None) -> FileMetadata:
    """Raises FileNotFound, also for another organisation's file or one of another folder than `folder_id`."""
    file = FileMetadata.objects.for_actor(actor).select_related("folder").filter(id=file_id).first()
    if file is None or (folder_id is not None and file.folder_id != folder_id):
        where = f" in folder {folder_id}" if folder_id is not None else ""
        raise FileNotFound(f"File with id={file_id} not found{where}")
    return file


def file_list(*, actor: Actor, folder_id: str) -> QuerySet[FileMetadata]:
    return FileMetadata.objects.for_actor(actor).filter(folder_id=folder_id).select_related("folder")


def folder_chunk_list(*, actor: Actor, folder_id: str) -> QuerySet[FileChunk]:
    """The chunks of the folder's files (Letta's folder passages). Raises FolderNotFound."""
    folder = folder_get(actor=actor, folder_id=folder_id)
    return FileChunk.objects.for_actor(actor).filter(folder_id=folder.id).select_related("file", "folder")


def file_texts(*, actor: Actor, file_ids: Sequence[str]) -> dict[str, str]:
    """The parsed text of each of these files of the actor's organisation."""
    rows = FileContent.objects.for_actor(actor).filter(file_id__in=list(file_ids))
    return dict(rows.values_list("file_id", "text"))


def _require_agent(actor: Actor, agent_id: str) -> Agent:
    agent = Agent.objects.for_actor(actor).filter(id=agent_id).first()
    if agent is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    return agent


def agent_folders(*, actor: Actor, agent_id: str) -> QuerySet[Folder]:
    """The folders attached to the agent, in the order they were attached (AgentNotFound if unseen)."""
    _require_agent(actor, agent_id)
    return attached_folders(actor=actor, agent_id=agent_id)


def attached_folders(*, actor: Actor, agent_id: str) -> QuerySet[Folder]:
    links = Folder.agents.through.objects.filter(agent_id=agent_id, folder_id=OuterRef("pk")).values("id")
    return (
        Folder.objects.for_actor(actor)
        .filter(agents__id=agent_id)
        .annotate(link_id=Subquery(links[:1]))
        .order_by("link_id")
    )


def folder_agent_list(*, actor: Actor, folder_id: str) -> QuerySet[Agent]:
    folder = folder_get(actor=actor, folder_id=folder_id)
    return Agent.objects.for_actor(actor).filter(folders__id=folder.id)


def agent_file_list(*, actor: Actor, agent_id: str, is_open: bool | None = None) -> QuerySet[AgentFile]:
    """The agent's files with their folder (AgentNotFound if unseen)."""
    _require_agent(actor, agent_id)
    queryset = AgentFile.objects.for_actor(actor).filter(agent_id=agent_id).select_related("folder")
    return queryset if is_open is None else queryset.filter(is_open=is_open)


@dataclass(frozen=True, slots=True)
class FileLimits:
    max_files_open: int
    per_file_char_limit: int


def default_file_limits(context_window: int | None) -> FileLimits:
    """Letta's defaults for an agent's file controls, from its context window."""
    if not context_window:
        return FileLimits(DEFAULT_MAX_FILES_OPEN, DEFAULT_PER_FILE_CHAR_LIMIT)
    for ceiling, files, chars in (
        (8_000, 3, 5_000),
        (32_000, 5, 15_000),
        (128_000, 10, 25_000),
        (200_000, 10, 40_000),
    ):
        if context_window <= ceiling:
            return FileLimits(files, chars)
    return FileLimits(15, 40_000)


def agent_file_limits(agent: Agent) -> FileLimits:
    """The agent's max_files_open and per_file_view_window_char_limit: its own, else Letta's defaults for the
    context window the loop gives it (its limit, else DEFAULT_CONTEXT_WINDOW, as apps.llm.handles)."""
    defaults = default_file_limits(agent.context_window_limit or DEFAULT_CONTEXT_WINDOW)
    row = AgentFileSettings.objects.for_org(agent.organization_id).filter(agent_id=agent.id).first()
    return FileLimits(
        (row.max_files_open if row and row.max_files_open else None) or defaults.max_files_open,
        (row.per_file_view_window_char_limit if row and row.per_file_view_window_char_limit else None)
        or defaults.per_file_char_limit,
    )


_READ_LIMITS = {"file_max_open": "file_settings__max_files_open", "file_char_limit": "file_settings__per_file_view_window_char_limit"}  # fmt: skip


def with_file_limits(agents: QuerySet[Agent]) -> QuerySet[Agent]:
    """The agents with their own file limits read in the same query (a LEFT JOIN), so that
    file_limits_by_agent needs none of its own (AgentState list pages)."""
    return agents.annotate(**{name: F(path) for name, path in _READ_LIMITS.items()})


def file_limits_by_agent(agents: Sequence[Agent]) -> dict[str, FileLimits]:
    """agent_file_limits for several agents: in one query, or none for agents read `with_file_limits`."""
    if all(hasattr(agent, "file_max_open") for agent in agents):
        annotated: list[Any] = list(agents)  # by with_file_limits: attributes no type declares
        own = {agent.id: (agent.file_max_open, agent.file_char_limit) for agent in annotated}
    else:
        rows = AgentFileSettings.objects.unscoped().filter(agent_id__in=[a.id for a in agents])
        own = {row.agent_id: (row.max_files_open, row.per_file_view_window_char_limit) for row in rows}
    limits = {}
    for agent in agents:
        defaults = default_file_limits(agent.context_window_limit or DEFAULT_CONTEXT_WINDOW)
        max_open, char_limit = own.get(agent.id, (None, None))
        limits[agent.id] = FileLimits(
            max_open or defaults.max_files_open, char_limit or defaults.per_file_char_limit
        )
    return limits


def agent_directories(*, actor: Actor, agent: Agent) -> str:
    """The `<directories>` section of the agent's system message: every attached folder with its files, the
    open ones with their window (two queries; "" when no folder is attached)."""
    folders = list(attached_folders(actor=actor, agent_id=agent.id))
    if not folders:
        return ""
    limits = agent_file_limits(agent)
    states: dict[str, list[AgentFile]] = {}
    for state in AgentFile.objects.for_actor(actor).filter(agent_id=agent.id).order_by("file_name"):
        states.setdefault(state.folder_id, []).append(state)
    directories = [
        rendering.DirectoryView(
            name=folder.name,
            description=folder.description,
            instructions=folder.instructions,
            files=[
                rendering.FileView(
                    name=state.file_name,
                    is_open=state.is_open,
                    visible=rendering.within_limit(state.visible_content, limits.per_file_char_limit)
                    if state.is_open
                    else "",
                    limit=limits.per_file_char_limit,
                )
                for state in states.get(folder.id, [])
            ],
        )
        for folder in folders
    ]
    return rendering.render_directories(directories, max_files_open=limits.max_files_open)


def line_strategy(file: FileMetadata) -> str:
    return file_type(file.file_type).lines


def completed_file_ids(*, actor: Actor, folder_ids: Sequence[str]) -> list[str]:
    return list(
        FileMetadata.objects.for_actor(actor)
        .filter(folder_id__in=list(folder_ids), processing_status=FileStatus.COMPLETED)
        .values_list("id", flat=True)
    )


@dataclass(frozen=True, slots=True)
class AgentFiles:
    folders: list[Folder]
    limits: FileLimits
    file_blocks: list[dict[str, Any]]  # Letta's memory.file_blocks: every attached file, open or not


def files_of_agents(agents: Sequence[Agent]) -> dict[str, AgentFiles]:
    """Each agent's attached folders (in attachment order) and file limits, in one query (AgentState lists:
    the agents come from a scoped query, so their ids are the caller's)."""
    ids = list(dict.fromkeys(agent.id for agent in agents))
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT agent.id, settings.max_files_open, settings.per_file_view_window_char_limit,
                   COALESCE((SELECT json_agg(row_to_json(folder) ORDER BY link.id)
                             FROM {Folder.agents.through._meta.db_table} AS link
                             JOIN {Folder._meta.db_table} AS folder ON folder.id = link.folder_id
                             WHERE link.agent_id = agent.id), '[]'::json),
                   COALESCE((SELECT json_agg(json_build_object(
                                 'id', state.id, 'file_id', state.file_id, 'folder_id', state.folder_id,
                                 'file_name', state.file_name, 'is_open', state.is_open,
                                 'visible_content', CASE WHEN state.is_open THEN state.visible_content END,
                                 'last_accessed_at', state.last_accessed_at, 'created_at', state.created_at,
                                 'updated_at', state.updated_at) ORDER BY state.file_name)
                             FROM {AgentFile._meta.db_table} AS state
                             WHERE state.agent_id = agent.id), '[]'::json)
            FROM {Agent._meta.db_table} AS agent
            LEFT JOIN {AgentFileSettings._meta.db_table} AS settings ON settings.agent_id = agent.id
            WHERE agent.id = ANY(%s)
            """,
            [ids],
        )
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    by_id = {agent.id: agent for agent in agents}
    found = {}
    for agent_id in ids:
        max_open, per_file, folders, states = rows.get(agent_id, (None, None, [], []))
        defaults = default_file_limits(by_id[agent_id].context_window_limit or DEFAULT_CONTEXT_WINDOW)
        limits = FileLimits(max_open or defaults.max_files_open, per_file or defaults.per_file_char_limit)
        blocks = [_file_block(state, limits.per_file_char_limit) for state in states]
        found[agent_id] = AgentFiles([_folder_from_json(f) for f in folders], limits, blocks)
    return found


def _file_block(state: dict[str, Any], limit: int) -> dict[str, Any]:
    """An attached file as Letta's FileBlock: a read-only block labelled with the file's name whose value
    is the window the prompt shows (cut to the per-file limit), empty while the file is closed."""
    return {
        "id": state["id"],
        "label": state["file_name"],
        "value": rendering.within_limit(state["visible_content"], limit),
        "limit": limit,
        "description": "",
        "read_only": True,
        "is_template": False,
        "template_name": "",
        "hidden": False,
        "metadata": {},
        "tags": [],
        "created_by_id": None,
        "last_updated_by_id": None,
        "created_at": parse_datetime(state["created_at"]),
        "updated_at": parse_datetime(state["updated_at"]),
        "file_id": state["file_id"],
        "source_id": state["folder_id"],
        "is_open": state["is_open"],
        "last_accessed_at": state["last_accessed_at"] and parse_datetime(state["last_accessed_at"]),
    }


def _folder_from_json(row: dict[str, Any]) -> Folder:
    fields = {f.attname: row.get(f.column) for f in Folder._meta.concrete_fields}
    for name in ("created_at", "updated_at"):
        fields[name] = parse_datetime(fields[name]) if isinstance(fields[name], str) else fields[name]
    return Folder(**fields)


def folder_list_with_usage(*, actor: Actor) -> QuerySet[Folder]:
    """The organisation's folders by name, each annotated with `file_count` and `total_size` (bytes of its
    uploads, whatever their status), in one query."""
    return (
        Folder.objects.for_actor(actor)
        .annotate(file_count=Count("files"), total_size=Coalesce(Sum("files__file_size"), 0))
        .order_by("name", "id")
    )


def file_list_for_folders(*, actor: Actor, folder_ids: Sequence[str]) -> QuerySet[FileMetadata]:
    """The files of these folders of the actor's organisation, oldest first, in one query."""
    return (
        FileMetadata.objects.for_actor(actor)
        .filter(folder_id__in=list(folder_ids))
        .order_by("created_at", "id")
    )


def supported_file_types() -> str:
    """The file types an upload may be, in words (for forms that take files)."""
    from apps.folders.parsing import SUPPORTED_SUMMARY

    return SUPPORTED_SUMMARY
