"""Agent files (`.af`, Letta's AgentFileSchema): export an agent with everything it needs, import one back.

Inside a file every id is file-local (`agent-0`, `block-0`, `tool-0`, `message-0`, `source-0`, `file-0`,
`file_agent-0`), numbered in a stable order (blocks by label, tools by name, messages in context order,
folders as attached, files by folder then name), so exporting the same agent twice gives the same document
and an import maps each file id to a new server id.

What never leaves the server: secrets and tool environment variables keep their keys with empty values
(Letta's format wants strings; the importer supplies values through `secrets`), and no provider key, base
URL or sandbox variable appears anywhere. Built-in tools travel by name and are recreated from this
server's definitions (every Letta base tool's name resolves; one not built here answers so when called);
other Letta-typed tools this server does not know are left out on import.

Folders travel as Letta's `sources`, their files as `files` with their parsed text (`content`), and what the
agent has of them as its `files_agents` (open or closed, the window it sees). The folders app builds and
restores them (this app must not import it): it registers a FolderSection here when Django starts. Groups,
MCP servers are not supported yet: import ignores them. Skills are blocks labelled `skills/<name>`: they
travel in `blocks` and also as Letta's `skills`; import turns a file's `skills` it has no block for into
such blocks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from django.conf import settings
from django.db import transaction
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from apps.agents.errors import AgentFileError, AgentFileTooLarge
from apps.agents.loop.convert import text_of
from apps.agents.models import Agent, AgentSecret, AgentType, Conversation, Message
from apps.agents.selectors import agent_get
from apps.agents.system_messages import THREAD_SYSTEM_MESSAGE, thread_system_message_id
from apps.core import permissions
from apps.core.actor import Actor
from apps.core.errors import DomainError, NotFound, PermissionDenied
from apps.core.jsondepth import nesting_exceeds
from apps.core.permissions import Action
from apps.llm.handles import DEFAULT_CONTEXT_WINDOW, resolve_embedding, resolve_model
from apps.memory import services as memory_services
from apps.memory.models import DEFAULT_BLOCK_LIMIT, Block
from apps.tools.builtin import BUILTIN_TOOLS
from apps.tools.models import Tool
from apps.tools.selectors import LETTA_TOOL_TYPE_PREFIX, tool_get_by_name
from apps.tools.services import (
    ToolSourceTooLarge,
    check_source_size,
    is_builtin_tool,
    require_tool_writer,
    tool_upsert,
    tool_upsert_builtins,
)

DEFAULT_EMBEDDING_CHUNK_SIZE = 300  # tokens, Letta's
FILE_REVISION = "letta-django-1"
"""`metadata.revision_id` of files written here (Letta writes its alembic revision; nobody checks it)."""
RECENT_MESSAGES_WHEN_NO_CONTEXT = 50
COPY_SUFFIX = "_copy"
LEGACY_FORMAT_MESSAGE = (
    "Legacy AgentSchema format is deprecated. Please use the new AgentFileSchema format with 'agents' field."
)
MESSAGE_ROLES = {"user", "assistant", "system", "tool", "approval", "summary", "function"}
LETTA_ENDPOINT_TYPES = {"openai", "anthropic", "ollama"}
"""Provider types whose name is also a Letta `model_endpoint_type`; the others are OpenAI-compatible."""


# --- folders and files: built by apps.folders, which registers them here ------------------------------


@dataclass(frozen=True, slots=True)
class ExportedFolder:
    """A folder attached to the agent (Letta's source)."""

    id: str
    name: str
    description: str
    instructions: str
    metadata: dict[str, Any]
    embedding: str
    embedding_dim: int | None
    embedding_chunk_size: int


@dataclass(frozen=True, slots=True)
class ExportedFile:
    """A file the agent has, with its parsed text."""

    id: str
    folder_id: str
    file_name: str  # its name in the folder
    original_file_name: str
    file_type: str
    file_size: int
    processing_status: str
    error_message: str
    total_chunks: int | None
    chunks_embedded: int | None
    text: str


@dataclass(frozen=True, slots=True)
class ExportedFileState:
    """What the agent has of a file (Letta's files_agents row)."""

    file_id: str
    folder_id: str
    file_name: str  # "<folder name>/<file name>"
    is_open: bool
    visible_content: str
    last_accessed_at: datetime
    start_line: int | None
    end_line: int | None


@dataclass(frozen=True, slots=True)
class AgentFolders:
    """An agent's folders, files and file states, in the order the file lists them, and its file limits."""

    folders: list[ExportedFolder]
    files: list[ExportedFile]
    states: list[ExportedFileState]
    max_files_open: int
    per_file_view_window_char_limit: int


class FolderImporter(Protocol):
    def __call__(
        self, *, actor: Actor, file: AgentFile, agents: dict[str, Agent], embedding: str | None
    ) -> None:
        """Create the file's sources and files and give each imported agent (file id -> Agent) its folders,
        file states and file limits, inside agent_import's transaction; raise to refuse the import."""


@dataclass(frozen=True, slots=True)
class FolderSection:
    export: Callable[[Actor, Agent], AgentFolders]
    import_: FolderImporter


_FOLDER_SECTION: list[FolderSection] = []


def register_folders(section: FolderSection) -> None:
    """How agent files carry folders and files; apps.folders registers it from its AppConfig.ready."""
    _FOLDER_SECTION[:] = [section]


def _folder_section() -> FolderSection | None:
    return _FOLDER_SECTION[0] if _FOLDER_SECTION else None


# --- export -------------------------------------------------------------------------------------------


def agent_export(
    *,
    actor: Actor,
    agent_id: str,
    conversation_id: str | None = None,
    scrub_messages: bool = False,
    include_folders: bool = True,
) -> dict[str, Any]:
    """The agent as an AgentFileSchema document (JSON-ready dict) with its blocks, tools, in-context
    messages (the conversation's with `conversation_id`; none with `scrub_messages`) and, unless
    `include_folders` is false, its folders with the files it has (their text) and its state of each.

    Raises AgentNotFound, NotFound (conversation). Writes nothing.
    """
    agent = agent_get(actor=actor, agent_id=agent_id)
    section = _folder_section() if include_folders else None
    folders = section.export(actor, agent) if section is not None else None
    sources, files, files_agents = _folder_docs(actor, folders) if folders is not None else ([], [], [])
    blocks = sorted(agent.blocks.all(), key=lambda b: (b.label, b.id))
    tools = sorted(agent.tools.all(), key=lambda t: (t.name, t.id))
    block_ids = {block.id: f"block-{i}" for i, block in enumerate(blocks)}
    tool_ids = {tool.id: f"tool-{i}" for i, tool in enumerate(tools)}
    in_context, messages = ([], []) if scrub_messages else _messages_for_export(actor, agent, conversation_id)
    message_ids = {message.id: f"message-{i}" for i, message in enumerate(messages)}
    secret_keys = list(AgentSecret.objects.for_actor(actor).filter(agent=agent).values_list("key", flat=True))
    empty_secrets = {key: "" for key in secret_keys} or None
    agent_doc = {
        "id": "agent-0",
        "name": agent.name,
        "agent_type": agent.agent_type,
        "system": agent.system,
        "description": agent.description or None,
        "metadata": agent.metadata or None,
        "tags": list(agent.tags),
        "tool_rules": list(agent.tool_rules) or None,
        "memory_blocks": [],
        "tools": [],
        "tool_ids": [tool_ids[tool.id] for tool in tools],
        "block_ids": [block_ids[block.id] for block in blocks],
        "source_ids": [source["id"] for source in sources],
        "folder_ids": None,
        "identity_ids": None,
        "include_base_tools": False,
        "include_multi_agent_tools": False,
        "include_base_tool_rules": False,
        "include_default_source": False,
        "initial_message_sequence": None,
        "llm_config": _llm_config(actor, agent),
        "embedding_config": _embedding_config(actor, agent.embedding, agent.embedding_dim),
        "model": None,
        "embedding": None,
        "model_settings": agent.model_settings or None,
        "compaction_settings": agent.compaction_settings or None,
        "context_window_limit": None,
        "embedding_chunk_size": None,
        "max_tokens": None,
        "max_reasoning_tokens": None,
        "enable_reasoner": False,
        "reasoning": None,
        "parallel_tool_calls": None,
        "response_format": None,
        "from_template": None,
        "template": False,
        "project": None,
        "project_id": None,
        "template_id": None,
        "base_template_id": None,
        "memory_variables": None,
        "tool_exec_environment_variables": empty_secrets,
        "secrets": empty_secrets,
        "message_buffer_autoclear": agent.message_buffer_autoclear,
        "enable_sleeptime": False,
        "timezone": agent.timezone or "UTC",
        "max_files_open": folders.max_files_open if folders else None,
        "per_file_view_window_char_limit": folders.per_file_view_window_char_limit if folders else None,
        "hidden": agent.hidden or None,
        "in_context_message_ids": [message_ids[m.id] for m in in_context],
        "messages": [_message_doc(m, message_ids[m.id]) for m in messages],
        "files_agents": files_agents,
        "group_ids": [],
    }
    return {
        "agents": [agent_doc],
        "groups": [],
        "blocks": [_block_doc(block, block_ids[block.id]) for block in blocks],
        "files": files,
        "sources": sources,
        "tools": [_tool_doc(tool, tool_ids[tool.id]) for tool in tools],
        "mcp_servers": [],
        "skills": _skill_docs(blocks),
        "metadata": {"revision_id": FILE_REVISION},
        "created_at": datetime.now(UTC).isoformat(),
    }


def _messages_for_export(
    actor: Actor, agent: Agent, conversation_id: str | None
) -> tuple[list[Message], list[Message]]:
    """(in-context messages, messages to write): the thread's stored system message, then the context in
    order, or the 50 most recent of the thread when the context is empty (Letta's rule; they are then
    written but not in context)."""
    conversation = None
    if conversation_id:
        conversation = Conversation.objects.for_actor(actor).filter(id=conversation_id, agent=agent).first()
        if conversation is None:
            raise NotFound(f"Conversation with id '{conversation_id}' not found")
    ids = conversation.message_ids if conversation else agent.message_ids
    system_id = thread_system_message_id(agent.id, conversation_id)
    by_id = {m.id: m for m in Message.objects.for_actor(actor).filter(agent=agent, id__in=[system_id, *ids])}
    system = [by_id[system_id]] if system_id in by_id else []
    if ids:
        in_context = [*system, *(by_id[i] for i in ids if i in by_id)]
        return in_context, in_context
    recent = (
        Message.objects.for_actor(actor)
        .filter(agent=agent, conversation=conversation)
        .exclude(THREAD_SYSTEM_MESSAGE)
        .order_by("-sequence_id")
    )
    return system, [*system, *reversed(recent[:RECENT_MESSAGES_WHEN_NO_CONTEXT])]


def _provider_type(handle: str, provider_type: str | None) -> str:
    if provider_type in LETTA_ENDPOINT_TYPES:
        return provider_type
    if provider_type is not None:
        return "openai"  # OpenAI-compatible servers
    return handle.partition("/")[0]


def _llm_config(actor: Actor, agent: Agent) -> dict[str, Any] | None:
    """Letta's LLMConfig without anything secret: no key and no endpoint URL (it may be internal)."""
    if not agent.model:
        return None
    provider_type = None
    context_window = agent.context_window_limit or DEFAULT_CONTEXT_WINDOW
    try:
        target = resolve_model(
            agent.model,
            organization_id=actor.organization_id,
            context_window_limit=agent.context_window_limit,
        )
        provider_type, context_window = target.provider_type, target.context_window
    except DomainError:  # an unusable handle still exports; the importer picks its own model
        pass
    return {
        "handle": agent.model,
        "model": agent.model.partition("/")[2] or agent.model,
        "model_endpoint_type": _provider_type(agent.model, provider_type),
        "model_endpoint": None,
        "provider_name": agent.model.partition("/")[0],
        "provider_category": "base",
        "context_window": context_window,
        "temperature": agent.temperature,
        "max_tokens": agent.max_tokens,
        "parallel_tool_calls": agent.parallel_tool_calls,
        "put_inner_thoughts_in_kwargs": False,
        "enable_reasoner": False,
    }


def _embedding_config(
    actor: Actor, handle: str, dimension: int | None, chunk_size: int = DEFAULT_EMBEDDING_CHUNK_SIZE
) -> dict[str, Any] | None:
    """Letta's EmbeddingConfig for a model handle, without endpoint or key."""
    if not handle:
        return None
    provider_type = None
    try:
        target = resolve_embedding(handle, organization_id=actor.organization_id)
        provider_type, dimension = target.provider_type, dimension or target.dimension
    except DomainError:
        pass
    return {
        "handle": handle,
        "embedding_model": handle.partition("/")[2] or handle,
        "embedding_endpoint_type": _provider_type(handle, provider_type),
        "embedding_endpoint": None,
        "embedding_dim": dimension,
        "embedding_chunk_size": chunk_size,
        "batch_size": 32,
    }


def _folder_docs(
    actor: Actor, folders: AgentFolders
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(sources, files, the agent's files_agents) in Letta's SourceSchema, FileSchema and FileAgentSchema.
    A file's name is "<folder name>/<file name>", as Letta stores it."""
    source_ids = {folder.id: f"source-{i}" for i, folder in enumerate(folders.folders)}
    file_ids = {file.id: f"file-{i}" for i, file in enumerate(folders.files)}
    folder_names = {folder.id: folder.name for folder in folders.folders}
    sources = [
        {
            "id": source_ids[folder.id],
            "name": folder.name,
            "description": folder.description or None,
            "instructions": folder.instructions or None,
            "metadata": folder.metadata or None,
            "embedding": None,
            "embedding_chunk_size": None,
            "embedding_config": _embedding_config(
                actor, folder.embedding, folder.embedding_dim, folder.embedding_chunk_size
            ),
        }
        for folder in folders.folders
    ]
    files = [
        {
            "id": file_ids[file.id],
            "source_id": source_ids[file.folder_id],
            "file_name": f"{folder_names[file.folder_id]}/{file.file_name}",
            "original_file_name": file.original_file_name,
            "file_path": None,
            "file_type": file.file_type,
            "file_size": file.file_size,
            "file_creation_date": None,
            "file_last_modified_date": None,
            "processing_status": file.processing_status,
            "error_message": file.error_message or None,
            "total_chunks": file.total_chunks,
            "chunks_embedded": file.chunks_embedded,
            "content": file.text,
        }
        for file in folders.files
    ]
    files_agents = [
        {
            "id": f"file_agent-{i}",
            "agent_id": "agent-0",
            "file_id": file_ids[state.file_id],
            "source_id": source_ids[state.folder_id],
            "file_name": state.file_name,
            "is_open": state.is_open,
            "visible_content": state.visible_content or None,
            "last_accessed_at": state.last_accessed_at.isoformat(),
            "start_line": state.start_line,
            "end_line": state.end_line,
        }
        for i, state in enumerate(folders.states)
    ]
    return sources, files, files_agents


def _block_doc(block: Block, file_id: str) -> dict[str, Any]:
    return {
        "id": file_id,
        "label": block.label,
        "value": block.value,
        "limit": block.limit,
        "description": block.description or None,
        "read_only": block.read_only,
        "is_template": block.is_template,
        "template_name": block.template_name or None,
        "preserve_on_migration": False,
        "hidden": block.hidden or None,
        "metadata": block.metadata or {},
        "tags": list(block.tags) or None,
        "project_id": None,
    }


SKILL_PREFIX = "skills/"
SKILL_FILE = "SKILL.md"


def _skill_docs(blocks: list[Block]) -> list[dict[str, Any]]:
    """Letta's `skills` (SkillSchema: a name and its files, `SKILL.md` first) for the agent's skill blocks
    (`skills/<name>`), so a client that reads skills from the file (Letta Code) finds them. The blocks
    travel in `blocks` too; import makes no second copy of a skill whose block the file has."""
    skills = []
    for block in blocks:
        name = block.label.removeprefix(SKILL_PREFIX)
        if not block.label.startswith(SKILL_PREFIX) or not name or "/" in name:
            continue
        front = f"---\nname: {json.dumps(name)}\ndescription: {json.dumps(block.description or '')}\n---\n"
        skills.append({"name": name, "files": {SKILL_FILE: front + block.value}, "source_url": None})
    return skills


def _tool_doc(tool: Tool, file_id: str) -> dict[str, Any]:
    return {
        "id": file_id,
        "name": tool.name,
        "tool_type": tool.tool_type,
        "description": tool.description or None,
        "source_type": tool.source_type,
        "source_code": tool.source_code,
        "json_schema": tool.json_schema,
        "args_json_schema": tool.args_json_schema,
        "return_char_limit": tool.return_char_limit,
        "tags": list(tool.tags),
        "pip_requirements": tool.pip_requirements or None,
        "npm_requirements": tool.npm_requirements or None,
        "default_requires_approval": tool.default_requires_approval,
        "enable_parallel_execution": tool.enable_parallel_execution,
        "metadata_": tool.metadata or {},
        "project_id": None,
        "created_by_id": None,
        "last_updated_by_id": None,
    }


def _export_content(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Content parts in Letta's shapes (its ReasoningContent requires `is_native`)."""
    return [
        {"is_native": False, **part} if part.get("type") == "reasoning" else part for part in content or []
    ]


def _message_doc(message: Message, file_id: str) -> dict[str, Any]:
    """Letta's MessageSchema; tool returns carry `func_response` as Letta's ToolReturn does."""
    tool_returns = [
        {
            "tool_call_id": item.get("tool_call_id"),
            "status": item.get("status", "success"),
            "stdout": item.get("stdout") or None,
            "stderr": item.get("stderr") or None,
            "func_response": item.get("tool_return"),
        }
        for item in message.tool_returns or []
    ]
    return {
        "type": "message",
        "id": file_id,
        "role": message.role,
        "content": _export_content(message.content),
        "name": message.name or None,
        "otid": None,
        "sender_id": None,
        "batch_item_id": None,
        "group_id": None,
        "model": message.model or None,
        "agent_id": "agent-0",
        "tool_calls": message.tool_calls,
        "tool_call_id": message.tool_call_id or None,
        "tool_returns": tool_returns or None,
        "created_at": message.created_at.isoformat(),
        "approve": message.approve,
        "approval_request_id": message.approval_request_id or None,
        "denial_reason": message.denial_reason or None,
        "approvals": message.approvals,
    }


# --- the file, as read on import (lenient: unknown keys are ignored, as Letta's models do) -------------


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FileTool(_Lenient):
    id: str
    name: str | None = None
    tool_type: str | None = None
    description: str | None = None
    source_type: str | None = None
    source_code: str | None = None
    json_schema: dict[str, Any] | None = None
    args_json_schema: dict[str, Any] | None = None
    return_char_limit: int | None = None
    tags: list[str] | None = None
    pip_requirements: list[dict[str, Any]] | None = None
    npm_requirements: list[dict[str, Any]] | None = None
    default_requires_approval: bool | None = None
    enable_parallel_execution: bool | None = None
    metadata_: dict[str, Any] | None = None


class FileBlock(_Lenient):
    id: str | None = None
    label: str
    value: str = ""
    limit: int | None = None
    description: str | None = None
    read_only: bool | None = False
    is_template: bool | None = False
    template_name: str | None = None
    hidden: bool | None = None
    metadata: dict[str, Any] | None = None
    tags: list[str] | None = None


class FileMessage(_Lenient):
    id: str
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    model: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    tool_returns: list[dict[str, Any]] | None = None
    created_at: datetime | None = None
    approve: bool | None = None
    approval_request_id: str | None = None
    denial_reason: str | None = None
    approvals: list[dict[str, Any]] | None = None


class FileLLMConfig(_Lenient):
    handle: str | None = None
    model: str | None = None
    model_endpoint_type: str | None = None
    context_window: int | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    parallel_tool_calls: bool | None = None


class FileEmbeddingConfig(_Lenient):
    handle: str | None = None
    embedding_model: str | None = None
    embedding_endpoint_type: str | None = None
    embedding_dim: int | None = None
    embedding_chunk_size: int | None = None


class FileSource(_Lenient):
    """Letta's SourceSchema: a folder."""

    id: str
    name: str
    description: str | None = None
    instructions: str | None = None
    metadata: dict[str, Any] | None = None
    embedding: str | None = None
    embedding_chunk_size: int | None = None
    embedding_config: FileEmbeddingConfig | None = None

    def embedding_handle(self) -> str | None:
        """The model the file names: `embedding`, else its config's handle or `<endpoint type>/<model>`."""
        config = self.embedding_config or FileEmbeddingConfig()
        return (
            _handle(self.embedding, config.handle, config.embedding_endpoint_type, config.embedding_model)
            or None
        )

    def chunk_size(self) -> int | None:
        return (
            self.embedding_chunk_size or (self.embedding_config or FileEmbeddingConfig()).embedding_chunk_size
        )


class FileDocument(_Lenient):
    """Letta's FileSchema: a file of a source, with its parsed text (`content`)."""

    id: str
    source_id: str
    file_name: str | None = None
    original_file_name: str | None = None
    file_type: str | None = None
    file_size: int | None = None
    content: str | None = None


class FileDocumentState(_Lenient):
    """Letta's FileAgentSchema: an agent's state of a file (open, and the window of lines it sees)."""

    id: str
    agent_id: str | None = None
    file_id: str
    source_id: str | None = None
    file_name: str | None = None
    is_open: bool = True
    visible_content: str | None = None
    last_accessed_at: datetime | None = None
    start_line: int | None = None
    end_line: int | None = None


class FileSkill(_Lenient):
    name: str
    files: dict[str, str] | None = None
    source_url: str | None = None


class FileAgent(_Lenient):
    id: str
    name: str | None = None
    agent_type: str | None = None
    system: str | None = None
    description: str | None = None
    metadata: dict[str, Any] | None = None
    tags: list[str] | None = None
    tool_rules: list[dict[str, Any]] | None = None
    tool_ids: list[str] | None = None
    block_ids: list[str] | None = None
    tools: list[str] | None = None
    memory_blocks: list[FileBlock] | None = None
    include_base_tools: bool = True
    llm_config: FileLLMConfig | None = None
    embedding_config: FileEmbeddingConfig | None = None
    model: str | None = None
    embedding: str | None = None
    context_window_limit: int | None = None
    model_settings: dict[str, Any] | None = None
    compaction_settings: dict[str, Any] | None = None
    timezone: str | None = None
    message_buffer_autoclear: bool | None = False
    hidden: bool | None = None
    secrets: dict[str, str | None] | None = None
    tool_exec_environment_variables: dict[str, str | None] | None = None
    in_context_message_ids: list[str] = Field(default_factory=list)
    messages: list[FileMessage] = Field(default_factory=list)
    source_ids: list[str] | None = None
    folder_ids: list[str] | None = None
    files_agents: list[FileDocumentState] = Field(default_factory=list)
    max_files_open: int | None = None
    per_file_view_window_char_limit: int | None = None

    def folder_refs(self) -> list[str]:
        """The sources the agent has (`source_ids`, and `folder_ids`, which newer clients send), in order."""
        return list(dict.fromkeys([*(self.source_ids or []), *(self.folder_ids or [])]))


class AgentFile(_Lenient):
    agents: list[FileAgent]
    blocks: list[FileBlock] = Field(default_factory=list)
    tools: list[FileTool] = Field(default_factory=list)
    sources: list[FileSource] = Field(default_factory=list)
    files: list[FileDocument] = Field(default_factory=list)
    skills: list[FileSkill] = Field(default_factory=list)


# --- import -------------------------------------------------------------------------------------------


def parse_agent_file(raw: bytes | str) -> AgentFile:
    """Decode and validate an agent file (JSON, possibly double-encoded as Letta's importer allows).

    Raises AgentFileError: corrupt JSON, the legacy single-agent format, or fields of the wrong shape;
    AgentFileTooLarge past AGENT_FILE_MAX_BYTES, and an AgentFileError past JSON_MAX_DEPTH of nesting.
    """
    if len(raw) > settings.AGENT_FILE_MAX_BYTES:  # characters of a str: at most its bytes
        raise AgentFileTooLarge.over_limit()
    too_deep = f"The agent file nests more than {settings.JSON_MAX_DEPTH} deep (the limit, JSON_MAX_DEPTH)"
    try:
        document = json.loads(raw)
        if isinstance(document, str):
            document = json.loads(document)
    except RecursionError as exc:
        raise AgentFileError(too_deep) from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise AgentFileError("Corrupted agent file format.") from exc
    if nesting_exceeds(document, settings.JSON_MAX_DEPTH):
        raise AgentFileError(too_deep)
    if not isinstance(document, dict) or not isinstance(document.get("agents"), list):
        raise AgentFileError(LEGACY_FORMAT_MESSAGE)
    try:
        return AgentFile.model_validate(document)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()[:10]
        )
        raise AgentFileError(f"Invalid agent file: {problems}") from exc


@dataclass(frozen=True, slots=True)
class Refusal:
    """Something in the file the importer may not bring in; the rest of the import goes ahead."""

    kind: str  # "tool", "message" or "skill"
    name: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class ImportResult:
    agent_ids: list[str]
    refused: list[Refusal] = field(default_factory=list)


@transaction.atomic
def agent_import(
    *,
    actor: Actor,
    file: AgentFile,
    append_copy_suffix: bool = True,
    override_existing_tools: bool = True,
    strip_messages: bool = False,
    name: str | None = None,
    model: str | None = None,
    embedding: str | None = None,
    secrets: dict[str, str] | None = None,
) -> ImportResult:
    """Create the file's agents (with new blocks, their tools and in-context messages).

    Tools are matched by name: built-ins are this server's own; a user tool of the same name is reused,
    or overwritten with the file's definition when `override_existing_tools` and the role matrix lets
    the importer change that tool. `name`/`model`/`embedding` override the file's; `secrets` fill the
    values export left empty. Only owners and admins (AGENT_FILE_IMPORT_AS_IS) bring in tools bound to
    MCP servers and a pending approval request; for others they are left out and listed in `refused`,
    with tools kept rather than overwritten. Sources become new folders of the importer's (a name the
    organisation has gets Letta's random suffix), their files are indexed from the text the file carries
    (after commit, never parsed again) and attached to the agents as the file left them; `embedding`
    also embeds those folders. Otherwise all or nothing: raises AgentFileError (dangling references,
    duplicate ids), AgentFileTooLarge (a file past FOLDER_FILE_MAX_BYTES or the storage quota),
    ToolSchemaError, InvalidInput, ...
    """
    _check_references(file)
    refused: list[Refusal] = []
    as_is = permissions.allows(actor, Action.AGENT_FILE_IMPORT_AS_IS)
    tool_map = _import_tools(
        actor, file.tools, override_existing_tools=override_existing_tools, as_is=as_is, refused=refused
    )
    refused_tools = {r.name for r in refused if r.kind == "tool" and not r.reason.startswith(KEPT)}
    block_map = {block.id: _create_block(actor, block).id for block in file.blocks if block.id is not None}
    agents: dict[str, Agent] = {}
    for file_agent in file.agents:
        agent = _create_agent(
            actor,
            file_agent,
            tool_map=tool_map,
            block_map=block_map,
            name=name
            or (f"{file_agent.name}{COPY_SUFFIX}" if append_copy_suffix and file_agent.name else None),
            model=model,
            embedding=embedding,
            secrets=secrets or {},
            leave_out_tools=refused_tools,
        )
        if not strip_messages:
            _import_messages(actor, agent, file_agent, as_is=as_is, refused=refused)
        agents[file_agent.id] = agent
    _import_skills(actor, file, list(agents.values()), refused=refused)
    section = _folder_section()
    if section is not None:
        section.import_(actor=actor, file=file, agents=agents, embedding=embedding)
    return ImportResult(agent_ids=[agent.id for agent in agents.values()], refused=refused)


KEPT = "kept the organisation's tool of this name"


def _check_references(file: AgentFile) -> None:
    problems: list[str] = []
    for kind, ids in (
        ("agents", [a.id for a in file.agents]),
        ("blocks", [b.id for b in file.blocks]),
        ("tools", [t.id for t in file.tools]),
        ("sources", [s.id for s in file.sources]),
        ("files", [f.id for f in file.files]),
    ):
        duplicates = sorted({i for i in ids if i is not None and ids.count(i) > 1})
        if duplicates:
            problems.append(f"duplicate {kind} ids: {', '.join(duplicates)}")
    block_ids = {b.id for b in file.blocks}
    tool_ids = {t.id for t in file.tools}
    source_ids = {s.id for s in file.sources}
    source_of_file = {f.id: f.source_id for f in file.files}
    problems += [
        f"file {f.id} references unknown source {f.source_id}"
        for f in file.files
        if f.source_id not in source_ids
    ]
    for agent in file.agents:
        problems += [
            f"agent {agent.id} references unknown source {i}"
            for i in agent.folder_refs()
            if i not in source_ids
        ]
        problems += _file_state_problems(agent, source_ids, source_of_file)
        problems += [
            f"agent {agent.id} references unknown block {i}"
            for i in agent.block_ids or []
            if i not in block_ids
        ]
        problems += [
            f"agent {agent.id} references unknown tool {i}" for i in agent.tool_ids or [] if i not in tool_ids
        ]
        message_ids = [m.id for m in agent.messages]
        duplicates = sorted({i for i in message_ids if message_ids.count(i) > 1})
        if duplicates:
            problems.append(f"agent {agent.id} has duplicate message ids: {', '.join(duplicates)}")
        problems += [
            f"agent {agent.id} has in-context message {i} that is not in its messages"
            for i in agent.in_context_message_ids
            if i not in message_ids
        ]
        problems += [
            f"agent {agent.id} message {m.id} has unknown role '{m.role}'"
            for m in agent.messages
            if m.role not in MESSAGE_ROLES
        ]
    if problems:
        raise AgentFileError(f"Invalid agent file: {'; '.join(problems)}")


def _file_state_problems(agent: FileAgent, source_ids: set[str], source_of_file: dict[str, str]) -> list[str]:
    """What is wrong with the agent's files_agents: unknown files or sources, another agent's rows, a source
    that is not the file's, the same file twice."""
    problems = []
    seen: set[str] = set()
    for state in agent.files_agents:
        where = f"agent {agent.id} file_agent {state.id}"
        file_source = source_of_file.get(state.file_id)
        if state.agent_id is not None and state.agent_id != agent.id:
            problems.append(f"{where} belongs to agent {state.agent_id}")
        if state.file_id not in source_of_file:
            problems.append(f"{where} references unknown file {state.file_id}")
        elif state.file_id in seen:
            problems.append(f"{where} repeats file {state.file_id}")
        if state.source_id is not None and state.source_id not in source_ids:
            problems.append(f"{where} references unknown source {state.source_id}")
        elif state.source_id is not None and state.source_id != file_source and file_source in source_ids:
            problems.append(
                f"{where} names source {state.source_id}, but file {state.file_id} is in {file_source}"
            )
        seen.add(state.file_id)
    return problems


def _import_tools(
    actor: Actor,
    tools: list[FileTool],
    *,
    override_existing_tools: bool,
    as_is: bool,
    refused: list[Refusal],
) -> dict[str, Tool]:
    """File tool id -> server tool. Letta-typed tools this server does not know are left out, and so are
    (unless `as_is`) tools bound to an MCP server: the importer would mint a callable tool on a server
    someone else registered."""
    builtin_names = [t.name for t in tools if t.name in BUILTIN_TOOLS]
    builtins = tool_upsert_builtins(actor=actor, names=builtin_names) if builtin_names else {}
    mapped: dict[str, Tool] = {}
    for tool in tools:
        if tool.name in builtins:
            mapped[tool.id] = builtins[tool.name]
            continue
        if (tool.tool_type or "").startswith(LETTA_TOOL_TYPE_PREFIX):
            continue
        existing = tool_get_by_name(actor=actor, name=tool.name) if tool.name else None
        if existing is not None and (not override_existing_tools or is_builtin_tool(existing)):
            mapped[tool.id] = existing
            continue
        if existing is not None:
            try:
                require_tool_writer(actor, existing)
            except PermissionDenied as exc:
                refused.append(Refusal("tool", existing.name, f"{KEPT}, not overwritten: {exc.message}"))
                mapped[tool.id] = existing
                continue
        if tool.tool_type == Tool.Type.EXTERNAL_MCP and not as_is:
            refused.append(
                Refusal(
                    "tool",
                    tool.name or tool.id,
                    "left out: only owners and admins bring in tools bound to MCP servers",
                )
            )
            continue
        if not tool.source_code:
            raise AgentFileError(f"Invalid agent file: tool {tool.id} ('{tool.name}') has no source_code")
        try:
            check_source_size(tool.source_code)
        except ToolSourceTooLarge as exc:
            raise ToolSourceTooLarge(
                f"Invalid agent file: tool {tool.id} ('{tool.name}'): {exc.message}"
            ) from exc
        mapped[tool.id] = tool_upsert(
            actor=actor,
            source_code=tool.source_code,
            source_type=tool.source_type or "python",
            json_schema=tool.json_schema,
            args_json_schema=tool.args_json_schema,
            description=tool.description,
            tags=tool.tags,
            return_char_limit=tool.return_char_limit,
            pip_requirements=tool.pip_requirements,
            npm_requirements=tool.npm_requirements,
            default_requires_approval=tool.default_requires_approval,
            enable_parallel_execution=tool.enable_parallel_execution,
            metadata=tool.metadata_,
            tool_type=Tool.Type.EXTERNAL_MCP
            if tool.tool_type == Tool.Type.EXTERNAL_MCP
            else Tool.Type.CUSTOM,
        )
    return mapped


def _import_skills(actor: Actor, file: AgentFile, agents: list[Agent], *, refused: list[Refusal]) -> None:
    """The file's Letta `skills` that it has no block for, as skill blocks (`skills/<name>`, the SKILL.md
    body as value, its front matter's description as the block's) attached to its agents. A skill given
    only by `source_url` is never fetched, and a skill's other files are left out: both listed in
    `refused`."""
    labels = {block.label for block in file.blocks} | {
        block.label for agent in file.agents for block in agent.memory_blocks or []
    }
    for skill in file.skills:
        name = skill.name.strip().strip("/")
        text = (skill.files or {}).get(SKILL_FILE)
        if text is None:
            refused.append(
                Refusal("skill", skill.name, "only skills whose SKILL.md the file carries are imported")
            )
            continue
        if not name or f"{SKILL_PREFIX}{name}" in labels:
            continue
        others = sorted(set(skill.files or {}) - {SKILL_FILE})
        if others:
            refused.append(Refusal("skill", skill.name, f"left out its other files: {', '.join(others)}"))
        description, body = _split_front_matter(text)
        block = memory_services.block_create(
            actor=actor,
            label=f"{SKILL_PREFIX}{name}",
            value=body,
            limit=max(DEFAULT_BLOCK_LIMIT, len(body)),
            description=description,
        )
        labels.add(block.label)
        for agent in agents:
            memory_services.block_attach_to_agent(actor=actor, agent_id=agent.id, block=block)


def _split_front_matter(text: str) -> tuple[str, str]:
    """(description, body) of a SKILL.md: its YAML front matter's `description` line, and what follows."""
    if not text.startswith("---\n"):
        return "", text
    end = text.find("\n---\n", 4)
    if end == -1:
        return "", text
    description = ""
    for line in text[4:end].split("\n"):
        if line.startswith("description:"):
            raw = line.split(":", 1)[1].strip()
            try:
                decoded = json.loads(raw) if raw.startswith('"') else raw
            except ValueError:
                decoded = raw
            description = str(decoded).strip("'")
    return description, text[end + 5 :]


def _create_block(actor: Actor, block: FileBlock) -> Block:
    return memory_services.block_create(
        actor=actor,
        label=block.label,
        value=block.value,
        limit=block.limit,
        description=block.description or "",
        read_only=bool(block.read_only),
        is_template=bool(block.is_template),
        template_name=block.template_name or "",
        hidden=bool(block.hidden),
        metadata=block.metadata or {},
        tags=block.tags or [],
    )


def _handle(explicit: str | None, config_handle: str | None, provider: str | None, name: str | None) -> str:
    if explicit:
        return explicit
    if config_handle:
        return config_handle
    return f"{provider}/{name}" if provider and name else ""


def _create_agent(
    actor: Actor,
    file_agent: FileAgent,
    *,
    tool_map: dict[str, Tool],
    block_map: dict[str, str],
    name: str | None,
    model: str | None,
    embedding: str | None,
    secrets: dict[str, str],
    leave_out_tools: set[str],
) -> Agent:
    from apps.agents.services import BlockSpec, agent_create  # services re-exports this module's operations

    llm = file_agent.llm_config or FileLLMConfig()
    emb = file_agent.embedding_config or FileEmbeddingConfig()
    declared = {**(file_agent.tool_exec_environment_variables or {}), **(file_agent.secrets or {})}
    agent = agent_create(
        actor=actor,
        name=name or file_agent.name,
        description=file_agent.description or "",
        agent_type=file_agent.agent_type or AgentType.LETTA_V1,
        system=file_agent.system or "",
        model=model or _handle(file_agent.model, llm.handle, llm.model_endpoint_type, llm.model),
        embedding=embedding
        or _handle(file_agent.embedding, emb.handle, emb.embedding_endpoint_type, emb.embedding_model),
        context_window_limit=file_agent.context_window_limit or llm.context_window,
        temperature=llm.temperature if llm.temperature is not None else 0.7,
        max_tokens=llm.max_tokens,
        parallel_tool_calls=bool(llm.parallel_tool_calls),
        memory_blocks=[
            BlockSpec(
                label=b.label,
                value=b.value,
                limit=b.limit,
                description=b.description or "",
                read_only=bool(b.read_only),
                metadata=b.metadata or {},
            )
            for b in file_agent.memory_blocks or []
        ],
        block_ids=[block_map[i] for i in file_agent.block_ids or []],
        tool_ids=list(dict.fromkeys(tool_map[i].id for i in file_agent.tool_ids or [] if i in tool_map)),
        tools=[name for name in file_agent.tools or [] if name not in leave_out_tools],
        include_base_tools=file_agent.include_base_tools,
        tool_rules=file_agent.tool_rules or [],
        tags=file_agent.tags or [],
        metadata=file_agent.metadata or {},
        secrets_={**{key: value or "" for key, value in declared.items()}, **secrets},
        timezone_name=file_agent.timezone or "UTC",
    )
    Agent.objects.for_actor(actor).filter(id=agent.id).update(
        model_settings=file_agent.model_settings or {},
        compaction_settings=file_agent.compaction_settings or {},
        message_buffer_autoclear=bool(file_agent.message_buffer_autoclear),
        hidden=bool(file_agent.hidden),
    )
    return agent


def _import_content(content: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return content


def _import_tool_returns(items: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Letta's ToolReturn (`func_response`) -> how the loop stores tool returns (`tool_return`)."""
    if not items:
        return None
    returns = []
    for item in items:
        response = item.get("func_response", item.get("tool_return"))
        if isinstance(response, list):
            response = text_of(response)
        returns.append(
            {
                "tool_call_id": item.get("tool_call_id"),
                "status": item.get("status", "success"),
                "tool_return": "" if response is None else str(response),
                "stdout": list(item.get("stdout") or []),
                "stderr": list(item.get("stderr") or []),
            }
        )
    return returns


def _import_messages(
    actor: Actor, agent: Agent, file_agent: FileAgent, *, as_is: bool, refused: list[Refusal]
) -> None:
    """Store the file's messages under new ids (keeping their timestamps) and set the agent's context.

    Files start the context with the compiled system prompt as a system message; it is not imported:
    the new agent's own was compiled when it was created (and the loop compiles it for every call, from
    this server's memory). Unless `as_is`, a
    pending approval request (the context's last message) is left out: the file's author wrote that
    tool call, and approving it would run their arguments.
    """
    context = file_agent.in_context_message_ids
    first = context[0] if context else None
    pending = _pending_approval_id(file_agent) if not as_is else None
    if pending is not None:
        refused.append(Refusal("message", pending, "left out: a pending approval request is not imported"))
    rows: dict[str, Message] = {}
    for item in file_agent.messages:
        if (item.id == first and item.role == "system" and not item.name) or item.id == pending:
            continue
        content = _import_content(item.content)
        tool_returns = _import_tool_returns(item.tool_returns)
        role = Message.Role.TOOL if item.role == "function" else item.role
        text = (
            tool_returns[0]["tool_return"] if role == Message.Role.TOOL and tool_returns else text_of(content)
        )
        rows[item.id] = Message(
            organization_id=actor.organization_id,
            agent=agent,
            role=role,
            content=content,
            text=text.replace("\x00", ""),
            name=item.name or "",
            model=item.model or "",
            tool_calls=item.tool_calls,
            tool_call_id=item.tool_call_id or "",
            tool_returns=tool_returns,
            approvals=item.approvals,
            approve=item.approve,
            approval_request_id=item.approval_request_id or "",
            denial_reason=item.denial_reason or "",
            is_err=bool(tool_returns and tool_returns[0]["status"] == "error"),
        )
    created = Message.all_objects.bulk_create(list(rows.values()))
    stamped = []
    for item in file_agent.messages:
        if item.id in rows and item.created_at is not None:
            message = rows[item.id]
            message.created_at = (
                item.created_at if item.created_at.tzinfo else item.created_at.replace(tzinfo=UTC)
            )
            stamped.append(message)
    if stamped:  # bulk_create stamps "now" (auto_now_add); keep the file's times
        Message.all_objects.bulk_update(stamped, ["created_at"])
    if created:
        agent.message_ids = [rows[i].id for i in file_agent.in_context_message_ids if i in rows]
        Agent.objects.for_actor(actor).filter(id=agent.id).update(message_ids=agent.message_ids)


def _pending_approval_id(file_agent: FileAgent) -> str | None:
    """The id of the context's last message when it is an approval request awaiting a decision."""
    if not file_agent.in_context_message_ids:
        return None
    last_id = file_agent.in_context_message_ids[-1]
    last = next((m for m in file_agent.messages if m.id == last_id), None)
    if last is not None and last.role == "approval" and last.tool_calls and last.approvals is None:
        return last.id
    return None


# --- clone --------------------------------------------------------------------------------------------

CLONE_SUFFIX = " copy"


@transaction.atomic
def agent_clone(*, actor: Actor, agent_id: str, name: str | None = None) -> Agent:
    """A new agent configured as this one: copies of its blocks (never shared), the same tools, tool rules,
    model settings and secret values, and its sleeptime setting; no messages and no folders. Named "<name> copy" unless
    `name` is given; secret values only for who may configure the source (others get the keys, as an
    export gives them). Raises AgentNotFound, InvalidInput."""
    from apps.agents.services import agent_update  # above this module, as in _create_agent

    source = agent_get(actor=actor, agent_id=agent_id)
    document = agent_export(actor=actor, agent_id=agent_id, scrub_messages=True, include_folders=False)
    may_configure = permissions.allows(actor, Action.AGENT_CONFIGURE, creator_id=source.created_by_id)
    secrets = {
        secret.key: secret.value if may_configure else ""
        for secret in AgentSecret.objects.for_actor(actor).filter(agent=source)
    }
    max_base = 200 - len(CLONE_SUFFIX)
    (new_id,) = agent_import(
        actor=actor,
        file=AgentFile.model_validate(document),
        append_copy_suffix=False,
        override_existing_tools=False,
        strip_messages=True,
        name=name or f"{source.name[:max_base].rstrip()}{CLONE_SUFFIX}",
        secrets=secrets,
    ).agent_ids
    Agent.objects.for_actor(actor).filter(id=new_id).update(
        context_window_limit=source.context_window_limit,
        sleeptime_agent_frequency=source.sleeptime_agent_frequency,
    )
    if source.enable_sleeptime and source.agent_type != AgentType.SLEEPTIME:
        agent_update(actor=actor, agent_id=new_id, enable_sleeptime=True)
    return agent_get(actor=actor, agent_id=new_id)
