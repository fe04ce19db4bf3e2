"""Folders (Letta's folders, formerly sources), their files, the files' embedded chunks, and what each agent
has of them (Letta's files_agents: which files are open, and the window of lines it sees).

A file's parsed text lives in FileContent (one row per file, loaded only when a caller needs the text); the
upload itself waits there (`raw`) until ingestion has finished with it. Chunks follow archival passages'
layout (apps.memory.models): a dimensionless `vector` with `embedding_dim`, one partial HNSW index per common
dimension. Only chunks of files whose processing completed are ever searched, so a file being ingested, or
one that failed, is never half visible.
"""

from __future__ import annotations

from django.contrib.postgres.indexes import OpClass
from django.db import models
from django.db.models import Q
from django.utils import timezone
from pgvector.django import HnswIndex, VectorField

from apps.core.ids import ID_MAX_LENGTH, new_id, new_passage_id
from apps.core.models import OrgOwnedModel
from apps.memory.models import INDEXED_HALFVEC_DIMENSIONS, INDEXED_VECTOR_DIMENSIONS, vector_index_expression

DEFAULT_CHUNK_SIZE = 300  # tokens, Letta's DEFAULT_EMBEDDING_CHUNK_SIZE
MAX_NAME_LENGTH = 255  # Letta's MAX_FILENAME_LENGTH; folder names share it


def new_source_id() -> str:
    """Letta keeps the `source-` prefix for folders."""
    return new_id("source")


def new_file_id() -> str:
    return new_id("file")


def new_file_agent_id() -> str:
    return new_id("file_agent")


class FileStatus(models.TextChoices):
    PENDING = "pending"
    PARSING = "parsing"
    EMBEDDING = "embedding"
    COMPLETED = "completed"
    ERROR = "error"


class Folder(OrgOwnedModel):
    """A collection of files an agent can be given. Its embedding model (and chunk size) is chosen at
    creation and embeds every chunk of its files. `created_by` decides who may change it (the role matrix's
    ARCHIVE_WRITE, shared with archives). The agent links are refused across organisations (migration 0002)."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_source_id, editable=False)
    name = models.CharField(max_length=MAX_NAME_LENGTH)
    description = models.TextField(blank=True, default="")
    instructions = models.TextField(blank=True, default="", help_text="How an agent should use the folder.")
    embedding = models.CharField(max_length=300, help_text="Embedding model handle.")
    embedding_dim = models.PositiveIntegerField(null=True, blank=True)
    embedding_chunk_size = models.PositiveIntegerField(
        default=DEFAULT_CHUNK_SIZE, help_text="Tokens per chunk."
    )
    metadata = models.JSONField(default=dict, blank=True)
    vector_db_provider = models.CharField(max_length=32, default="native")
    agents = models.ManyToManyField("agents.Agent", related_name="folders", blank=True)
    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    last_updated_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "name"],
                name="folder_unique_name_per_organization",
                violation_error_message="Another folder of this organization has this name.",
            ),
            models.CheckConstraint(condition=~Q(name=""), name="folder_name_not_empty"),
            models.CheckConstraint(
                condition=Q(embedding_chunk_size__gte=1), name="folder_chunk_size_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class FileMetadata(OrgOwnedModel):
    """One uploaded file and where its ingestion stands. `file_name` is unique in the folder among live
    files; a pending replacement (`replaces`, duplicate_handling=replace) carries the name of the file it
    replaces, which stays in service until the replacement completes and takes its place in one transaction."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_file_id, editable=False)
    folder = models.ForeignKey(Folder, on_delete=models.CASCADE, related_name="files")
    file_name = models.CharField(max_length=MAX_NAME_LENGTH)
    original_file_name = models.CharField(max_length=MAX_NAME_LENGTH)
    file_type = models.CharField(max_length=100, help_text="MIME type.")
    file_size = models.BigIntegerField(help_text="Bytes uploaded.")
    processing_status = models.CharField(
        max_length=16, choices=FileStatus.choices, default=FileStatus.PENDING
    )
    error_message = models.TextField(blank=True, default="")
    total_chunks = models.PositiveIntegerField(null=True, blank=True)
    chunks_embedded = models.PositiveIntegerField(null=True, blank=True)
    replaces = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="replacements"
    )
    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]
        verbose_name = "file"
        constraints = [
            models.UniqueConstraint(
                fields=["folder", "file_name"],
                condition=Q(replaces__isnull=True),
                name="file_unique_name_per_folder",
                violation_error_message="Another file of this folder has this name.",
            ),
            models.CheckConstraint(
                condition=Q(processing_status__in=FileStatus.values), name="file_status_known"
            ),
        ]
        indexes = [models.Index(fields=["folder", "original_file_name"], name="file_folder_original_idx")]

    def __str__(self) -> str:
        return self.file_name


class FileContent(OrgOwnedModel):
    """A file's text as parsed (what open_files and grep_files read), and its upload until ingestion has
    finished with it."""

    file = models.OneToOneField(
        FileMetadata, primary_key=True, on_delete=models.CASCADE, related_name="content"
    )
    text = models.TextField(blank=True, default="")
    raw = models.BinaryField(null=True, blank=True, help_text="The upload, kept until it is ingested.")

    class Meta:
        verbose_name_plural = "file contents"

    def __str__(self) -> str:
        return f"content of {self.file_id}"


class FileChunk(OrgOwnedModel):
    """One chunk of a file's text with its embedding (Letta's source passage)."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_passage_id, editable=False)
    file = models.ForeignKey(FileMetadata, on_delete=models.CASCADE, related_name="chunks")
    folder = models.ForeignKey(Folder, on_delete=models.CASCADE, related_name="chunks")
    chunk_index = models.PositiveIntegerField()
    text = models.TextField()
    embedding = VectorField(null=True, blank=True)
    embedding_dim = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["file", "chunk_index"]
        constraints = [
            models.UniqueConstraint(fields=["file", "chunk_index"], name="file_chunk_unique_index"),
            models.CheckConstraint(
                condition=Q(embedding__isnull=True, embedding_dim__isnull=True)
                | Q(embedding__isnull=False, embedding_dim__isnull=False),
                name="file_chunk_embedding_has_dim",
            ),
        ]
        indexes = [
            *[
                HnswIndex(
                    OpClass(vector_index_expression(dim), name="vector_cosine_ops"),
                    name=f"file_chunk_emb_{dim}_hnsw",
                    condition=Q(embedding_dim=dim),
                    m=16,
                    ef_construction=64,
                )
                for dim in INDEXED_VECTOR_DIMENSIONS
            ],
            *[
                HnswIndex(
                    OpClass(vector_index_expression(dim), name="halfvec_cosine_ops"),
                    name=f"file_chunk_emb_{dim}_hnsw",
                    condition=Q(embedding_dim=dim),
                    m=16,
                    ef_construction=64,
                )
                for dim in INDEXED_HALFVEC_DIMENSIONS
            ],
        ]

    def __str__(self) -> str:
        return self.text[:60]


class AgentFile(OrgOwnedModel):
    """A file of a folder attached to the agent, and what the agent sees of it (Letta's files_agents).
    `file_name` is "<folder name>/<file name>", what the file tools call it; `visible_content` is the window
    of numbered lines shown while the file is open. The database refuses a row whose agent and file belong
    to different organisations (migration 0002)."""

    id = models.CharField(
        primary_key=True, max_length=ID_MAX_LENGTH, default=new_file_agent_id, editable=False
    )
    agent = models.ForeignKey("agents.Agent", on_delete=models.CASCADE, related_name="file_states")
    file = models.ForeignKey(FileMetadata, on_delete=models.CASCADE, related_name="agent_states")
    folder = models.ForeignKey(Folder, on_delete=models.CASCADE, related_name="agent_files")
    file_name = models.CharField(max_length=2 * MAX_NAME_LENGTH + 1)
    is_open = models.BooleanField(default=False)
    visible_content = models.TextField(blank=True, default="")
    last_accessed_at = models.DateTimeField(default=timezone.now)
    start_line = models.PositiveIntegerField(null=True, blank=True, help_text="First line shown (1-indexed).")
    end_line = models.PositiveIntegerField(null=True, blank=True, help_text="Line after the last one shown.")

    class Meta:
        ordering = ["created_at"]
        verbose_name = "agent's file"
        constraints = [
            models.UniqueConstraint(fields=["agent", "file"], name="agent_file_unique"),
            models.UniqueConstraint(fields=["agent", "file_name"], name="agent_file_unique_name"),
        ]
        indexes = [models.Index(fields=["agent", "is_open", "last_accessed_at"], name="agent_file_open_idx")]

    def __str__(self) -> str:
        return f"{self.file_name} on {self.agent_id}"


class AgentFileSettings(OrgOwnedModel):
    """Letta's per-agent file controls. Null: the default for the agent's context window (see
    apps.folders.selectors.agent_file_limits)."""

    agent = models.OneToOneField(
        "agents.Agent", primary_key=True, on_delete=models.CASCADE, related_name="file_settings"
    )
    max_files_open = models.PositiveIntegerField(null=True, blank=True)
    per_file_view_window_char_limit = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "agent file settings"

    def __str__(self) -> str:
        return f"file settings of {self.agent_id}"
