"""Core memory (blocks, with history) and archival memory (archives of passages with pgvector embeddings).

Embedding dimensions: one `passage.embedding` column of pgvector's dimensionless `vector` type holds
vectors of any size, with `embedding_dim` beside it. For each common dimension a partial HNSW index is
built over `embedding::vector(N)` WHERE embedding_dim = N, and searches use the same cast and filter,
so agents with different embedding models share one table and each still gets an index (no padding,
which would waste space and distort nothing but cost IO; no table per model). A dimension without an
index still works, by exact scan; adding one is a migration with one more index.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex, OpClass
from django.db import models
from django.db.models import Q
from django.db.models.functions import Cast, Length
from pgvector.django import HalfVectorField, HnswIndex, VectorField

from apps.core.ids import ID_MAX_LENGTH, new_archive_id, new_block_history_id, new_block_id, new_passage_id
from apps.core.models import OrgOwnedModel

DEFAULT_BLOCK_LIMIT = 100_000  # characters, Letta's CORE_MEMORY_BLOCK_CHAR_LIMIT
INDEXED_VECTOR_DIMENSIONS = (384, 768, 1024, 1536)  # pgvector's HNSW on `vector` stops at 2,000 dims
INDEXED_HALFVEC_DIMENSIONS = (3072,)  # larger models go through halfvec (up to 4,000 dims)
MAX_ARCHIVE_NAME_LENGTH = 200  # Archive.name


def vector_index_expression(dimension: int) -> Cast:
    """The expression each per-dimension index is built on; searches must use the very same one."""
    if dimension in INDEXED_HALFVEC_DIMENSIONS:
        return Cast("embedding", HalfVectorField(dimensions=dimension))
    return Cast("embedding", VectorField(dimensions=dimension))


class Block(OrgOwnedModel):
    """A core-memory block: rendered into every prompt of each agent it is attached to."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_block_id, editable=False)
    label = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    value = models.TextField(blank=True, default="")
    limit = models.PositiveIntegerField(
        default=DEFAULT_BLOCK_LIMIT, help_text="Maximum length of value, in characters."
    )
    read_only = models.BooleanField(default=False, help_text="The agent may not edit it (people still can).")
    is_template = models.BooleanField(default=False)
    template_name = models.CharField(max_length=200, blank=True, default="")
    hidden = models.BooleanField(default=False)
    metadata = models.JSONField(default=dict, blank=True)
    tags = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    version = models.PositiveIntegerField(default=1, help_text="Bumped on every write (optimistic locking).")
    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    last_updated_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(limit__gte=Length("value")),
                name="block_value_within_limit",
                violation_error_message="The block's value is longer than its limit; shorten it or raise the limit.",
            ),
            models.CheckConstraint(condition=~Q(label=""), name="block_label_not_empty"),
        ]
        indexes = [models.Index(fields=["organization", "label"], name="block_org_label_idx")]

    def __str__(self) -> str:
        return f"{self.label} ({self.id})"


class AgentBlock(models.Model):
    """Attachment of a (possibly shared) block. The label is copied here so that the database itself
    refuses two blocks with one label on one agent; services keep it in step with Block.label."""

    agent = models.ForeignKey("agents.Agent", on_delete=models.CASCADE, related_name="block_attachments")
    block = models.ForeignKey(Block, on_delete=models.CASCADE, related_name="agent_attachments")
    block_label = models.CharField(max_length=200)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent", "block"], name="agent_block_unique"),
            models.UniqueConstraint(fields=["agent", "block_label"], name="agent_block_unique_label"),
        ]

    def __str__(self) -> str:
        return f"{self.block_label} on {self.agent_id}"


class BlockHistory(OrgOwnedModel):
    """One change to a block: who made it and the value before and after, so edits can be reverted."""

    class ActorType(models.TextChoices):
        USER = "user", "User"
        AGENT = "agent", "Agent"
        SYSTEM = "system", "System"

    id = models.CharField(
        primary_key=True, max_length=ID_MAX_LENGTH, default=new_block_history_id, editable=False
    )
    block = models.ForeignKey(Block, on_delete=models.CASCADE, related_name="history")
    version = models.PositiveIntegerField(help_text="The block's version after this change.")
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor_id = models.CharField(max_length=ID_MAX_LENGTH, blank=True, default="")
    label = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    limit = models.PositiveIntegerField()
    value_before = models.TextField(blank=True, default="")
    value_after = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["block", "version"]
        verbose_name_plural = "block history"
        constraints = [
            models.UniqueConstraint(fields=["block", "version"], name="block_history_unique_version")
        ]

    def __str__(self) -> str:
        return f"{self.label} v{self.version} by {self.actor_type}"


class Archive(OrgOwnedModel):
    """A collection of passages (archival memory), attachable to several agents. `created_by` decides who
    may change it (the role matrix's ARCHIVE_WRITE); an agent's own archive is its agent's creator's."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_archive_id, editable=False)
    name = models.CharField(max_length=MAX_ARCHIVE_NAME_LENGTH)
    description = models.TextField(blank=True, default="")
    embedding = models.CharField(max_length=200, blank=True, default="", help_text="Embedding model handle.")
    embedding_dim = models.PositiveIntegerField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    vector_db_provider = models.CharField(max_length=32, default="native")
    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return self.name


class Passage(OrgOwnedModel):
    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_passage_id, editable=False)
    archive = models.ForeignKey(Archive, on_delete=models.CASCADE, related_name="passages")
    text = models.TextField()
    embedding = VectorField(null=True, blank=True)
    embedding_dim = models.PositiveIntegerField(null=True, blank=True)
    tags = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(embedding__isnull=True, embedding_dim__isnull=True)
                | Q(embedding__isnull=False, embedding_dim__isnull=False),
                name="passage_embedding_has_dim",
            )
        ]
        indexes = [
            models.Index(fields=["archive", "created_at"], name="passage_archive_created_idx"),
            GinIndex(fields=["tags"], name="passage_tags_gin"),
            *[
                HnswIndex(
                    OpClass(vector_index_expression(dim), name="vector_cosine_ops"),
                    name=f"passage_emb_{dim}_hnsw",
                    condition=Q(embedding_dim=dim),
                    m=16,
                    ef_construction=64,
                )
                for dim in INDEXED_VECTOR_DIMENSIONS
            ],
            *[
                HnswIndex(
                    OpClass(vector_index_expression(dim), name="halfvec_cosine_ops"),
                    name=f"passage_emb_{dim}_hnsw",
                    condition=Q(embedding_dim=dim),
                    m=16,
                    ef_construction=64,
                )
                for dim in INDEXED_HALFVEC_DIMENSIONS
            ],
        ]

    def __str__(self) -> str:
        return self.text[:60]


class ArchiveStats(models.Model):
    """How many passages an archive holds: read for every run's memory metadata, where counting 100k
    passages took ~100 ms. Written only by triggers on memory_passage (migration 0002), in the transaction
    of the insert or delete, whoever writes (services, admin, bulk COPY); never save it from Python.
    Reached through an archive the actor may see (no organisation of its own)."""

    archive = models.OneToOneField(Archive, primary_key=True, on_delete=models.CASCADE, related_name="stats")
    passage_count = models.BigIntegerField(default=0)

    class Meta:
        verbose_name_plural = "archive stats"

    def __str__(self) -> str:
        return f"{self.archive_id}: {self.passage_count} passages"


class ArchiveTag(models.Model):
    """A tag used by an archive's passages and how many of them carry it (a passage listing a tag twice
    counts twice), maintained like ArchiveStats; a tag leaves when its last passage does."""

    archive = models.ForeignKey(Archive, on_delete=models.CASCADE, related_name="tag_counts")
    tag = models.CharField(max_length=100)
    passage_count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["archive", "tag"], name="archive_tag_unique")]

    def __str__(self) -> str:
        return f"{self.tag} ({self.passage_count})"


class GitMemoryRepo(OrgOwnedModel):
    """An agent's memory as a git repository (apps/memory/git_memory.py): the branch head and, for each
    attached block, the label its file had at that head. Its row is the lock every sync and push of the
    agent's repository takes, so several web processes agree on one history."""

    agent = models.OneToOneField(
        "agents.Agent", primary_key=True, on_delete=models.CASCADE, related_name="git_memory"
    )
    head = models.CharField(max_length=40, blank=True, default="", help_text="Commit id of refs/heads/main.")
    head_labels = models.JSONField(default=dict, blank=True, help_text="Block id -> label at the head.")

    class Meta:
        verbose_name = "git memory repository"
        verbose_name_plural = "git memory repositories"

    def __str__(self) -> str:
        return f"{self.agent_id} @ {self.head[:12]}"


class GitMemoryObject(OrgOwnedModel):
    """One git object (blob, tree or commit) of an agent's repository, as git stores it (type and raw
    content, uncompressed), so commit ids are the same on every web process and across restarts."""

    repo = models.ForeignKey(GitMemoryRepo, on_delete=models.CASCADE, related_name="objects_stored")
    sha = models.CharField(max_length=40)
    type_num = models.PositiveSmallIntegerField()
    data = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["repo", "sha"], name="git_memory_object_unique")]

    def __str__(self) -> str:
        return self.sha


class GitMemoryCommit(OrgOwnedModel):
    """A commit on the repository's branch, oldest first (`seq`): built from block history (`history_ids`
    names the BlockHistory rows it stands for) or pushed by a person (`source` push)."""

    class Source(models.TextChoices):
        HISTORY = "history", "Block history"
        PUSH = "push", "git push"
        SYNC = "sync", "Sync"

    repo = models.ForeignKey(GitMemoryRepo, on_delete=models.CASCADE, related_name="commits")
    seq = models.PositiveIntegerField()
    sha = models.CharField(max_length=40)
    source = models.CharField(max_length=16, choices=Source.choices)
    author_name = models.CharField(max_length=300)
    author_email = models.CharField(max_length=300)
    message = models.TextField()
    committed_at = models.DateTimeField()
    history_ids = ArrayField(models.CharField(max_length=ID_MAX_LENGTH), default=list, blank=True)

    class Meta:
        ordering = ["repo", "seq"]
        constraints = [models.UniqueConstraint(fields=["repo", "seq"], name="git_memory_commit_unique_seq")]

    def __str__(self) -> str:
        return f"{self.sha[:12]} {self.message.splitlines()[0] if self.message else ''}"
