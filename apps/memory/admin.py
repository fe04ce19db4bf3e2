from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.accounts.admin_base import OrgScopedAdmin, admin_actor
from apps.core.permissions import Action
from apps.memory import services
from apps.memory.models import (
    Archive,
    ArchiveStats,
    ArchiveTag,
    Block,
    BlockHistory,
    GitMemoryCommit,
    GitMemoryObject,
    GitMemoryRepo,
    Passage,
)

BLOCK_EDITABLE = [
    "label",
    "value",
    "limit",
    "description",
    "read_only",
    "is_template",
    "template_name",
    "hidden",
    "metadata",
    "tags",
]


class BlockHistoryInline(admin.TabularInline):
    model = BlockHistory
    extra = 0
    can_delete = False
    fields = ["version", "actor_type", "actor_id", "value_before", "value_after", "created_at"]
    readonly_fields = fields
    ordering = ["-version"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Block)
class BlockAdmin(OrgScopedAdmin):
    """Saves and deletes go through the memory services, so admin edits are checked and recorded in block
    history. A member changes the blocks they created; owners and admins every block."""

    add_action = Action.BLOCK_CREATE
    change_action = Action.BLOCK_WRITE

    list_display = [
        "label",
        "id",
        "value_size",
        "limit",
        "read_only",
        "is_template",
        "organization",
        "updated_at",
    ]
    list_filter = ["read_only", "is_template", "label"]
    search_fields = ["label", "value", "description", "id"]
    readonly_fields = ["version", "created_by", "last_updated_by"]
    fields = ["organization", *BLOCK_EDITABLE, "version", "created_by", "last_updated_by"]
    inlines = [BlockHistoryInline]

    @admin.display(description="Size")
    def value_size(self, obj: Block) -> str:
        return f"{len(obj.value)}/{obj.limit}"

    def save_model(self, request: HttpRequest, obj: Block, form: Any, change: bool) -> None:
        actor = admin_actor(request, obj.organization_id)
        with self.refusal_shown(request):
            if change:
                changed = {
                    name: form.cleaned_data[name] for name in form.changed_data if name in BLOCK_EDITABLE
                }
                if changed:
                    services.block_update(actor=actor, block_id=obj.pk, **changed)
                return
            fields = {name: form.cleaned_data[name] for name in BLOCK_EDITABLE}
            created = services.block_create(actor=actor, **fields)
            obj.pk = created.pk
            obj._state.adding = False

    def delete_model(self, request: HttpRequest, obj: Block) -> None:
        with self.refusal_shown(request):
            services.block_delete(actor=admin_actor(request, obj.organization_id), block_id=obj.pk)


@admin.register(BlockHistory)
class BlockHistoryAdmin(OrgScopedAdmin):
    list_display = ["block", "version", "actor_type", "actor_id", "created_at"]
    list_filter = ["actor_type"]
    search_fields = ["block__id", "label", "actor_id"]
    readonly_fields = [f.name for f in BlockHistory._meta.fields]
    change_action = Action.BLOCK_WRITE
    via = "block"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class _TriggerKeptInline(admin.TabularInline):
    """Counts the passage triggers keep (apps/memory/models.py): shown, never edited."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ArchiveStatsInline(_TriggerKeptInline):
    model = ArchiveStats
    fields = ["passage_count"]


class ArchiveTagInline(_TriggerKeptInline):
    model = ArchiveTag
    fields = ["tag", "passage_count"]


@admin.register(Archive)
class ArchiveAdmin(OrgScopedAdmin):
    """Archival memory is the agents': changing it is configuring them (an archive has no recorded creator,
    so owners and admins only)."""

    add_action = change_action = Action.AGENT_CONFIGURE
    inlines = [ArchiveStatsInline, ArchiveTagInline]
    list_display = [
        "name",
        "id",
        "embedding",
        "embedding_dim",
        "vector_db_provider",
        "organization",
        "created_at",
    ]
    list_filter = ["vector_db_provider", "embedding"]
    search_fields = ["name", "description", "id"]


@admin.register(Passage)
class PassageAdmin(OrgScopedAdmin):
    """A member changes the passages they inserted; owners and admins every passage and add new ones."""

    add_action = change_action = Action.AGENT_CONFIGURE
    list_display = ["short_text", "archive", "embedding_dim", "tags", "organization", "created_at"]
    list_filter = ["embedding_dim"]
    search_fields = ["text", "id"]
    exclude = ["embedding"]
    list_select_related = ["archive"]

    @admin.display(description="Text")
    def short_text(self, obj: Passage) -> str:
        return obj.text[:80]


class _GitMemoryReadOnlyAdmin(OrgScopedAdmin):
    """Git memory is derived from the blocks and their history (and pushes): shown, never edited here.
    Deleting the repository row is allowed: the next git request rebuilds it from block history (with new
    commit ids, so clones must be made afresh)."""

    change_action = Action.AGENT_CONFIGURE

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(GitMemoryRepo)
class GitMemoryRepoAdmin(_GitMemoryReadOnlyAdmin):
    via = "agent"
    list_display = ["agent", "head", "organization", "updated_at"]
    search_fields = ["agent__id", "agent__name", "head"]
    readonly_fields = ["agent", "organization", "head", "head_labels", "created_at", "updated_at"]


@admin.register(GitMemoryCommit)
class GitMemoryCommitAdmin(_GitMemoryReadOnlyAdmin):
    list_display = ["sha", "repo", "seq", "source", "author_name", "committed_at"]
    list_filter = ["source"]
    search_fields = ["sha", "repo__agent__id", "author_name", "message"]
    readonly_fields = [f.name for f in GitMemoryCommit._meta.fields]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(GitMemoryObject)
class GitMemoryObjectAdmin(_GitMemoryReadOnlyAdmin):
    list_display = ["sha", "repo", "type_num", "organization"]
    search_fields = ["sha", "repo__agent__id"]
    fields = ["sha", "repo", "type_num", "organization", "created_at"]
    readonly_fields = ["sha", "repo", "type_num", "organization", "created_at"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
