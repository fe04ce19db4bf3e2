from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.accounts.admin_base import OrgScopedAdmin, admin_actor
from apps.core.permissions import Action
from apps.folders import services
from apps.folders.models import AgentFile, AgentFileSettings, FileChunk, FileContent, FileMetadata, Folder


class _ReadOnly(OrgScopedAdmin):
    """Written by ingestion and the services only: shown, never added or edited here."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Folder)
class FolderAdmin(OrgScopedAdmin):
    """Saves and deletes go through the folders' services: a member changes the folders they created
    (owners and admins every one). Uploads are the API's and the ADE's."""

    add_action = Action.ARCHIVE_CREATE
    change_action = Action.ARCHIVE_WRITE
    list_display = ["name", "id", "embedding", "embedding_chunk_size", "organization", "created_at"]
    search_fields = ["name", "description", "id"]
    fields = [
        "organization",
        "name",
        "description",
        "instructions",
        "embedding",
        "embedding_chunk_size",
        "metadata",
    ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "embedding", "embedding_chunk_size"] if obj is not None else fields

    def save_model(self, request: HttpRequest, obj: Folder, form: Any, change: bool) -> None:
        actor = admin_actor(request, obj.organization_id)
        data = form.cleaned_data
        with self.refusal_shown(request):
            if change:
                services.folder_update(
                    actor=actor,
                    folder_id=obj.pk,
                    name=data["name"],
                    description=data.get("description") or "",
                    instructions=data.get("instructions") or "",
                    metadata=data.get("metadata") or {},
                )
                return
            created = services.folder_create(
                actor=actor,
                name=data["name"],
                description=data.get("description"),
                instructions=data.get("instructions"),
                metadata=data.get("metadata") or {},
                embedding_handle=data["embedding"],
                embedding_chunk_size=data.get("embedding_chunk_size"),
            )
            obj.pk = created.pk
            obj._state.adding = False

    def delete_model(self, request: HttpRequest, obj: Folder) -> None:
        with self.refusal_shown(request):
            services.folder_delete(actor=admin_actor(request, obj.organization_id), folder_id=obj.pk)


@admin.register(FileMetadata)
class FileMetadataAdmin(OrgScopedAdmin):
    change_action = Action.ARCHIVE_WRITE
    via = "folder"
    list_display = ["file_name", "folder", "processing_status", "total_chunks", "file_size", "organization"]
    list_filter = ["processing_status", "file_type"]
    search_fields = ["file_name", "original_file_name", "id"]
    list_select_related = ["folder"]
    readonly_fields = [f.name for f in FileMetadata._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: FileMetadata) -> None:
        with self.refusal_shown(request):
            services.file_delete(
                actor=admin_actor(request, obj.organization_id), folder_id=obj.folder_id, file_id=obj.pk
            )


@admin.register(FileContent)
class FileContentAdmin(_ReadOnly):
    change_action = Action.ARCHIVE_WRITE
    list_display = ["file", "organization"]
    exclude = ["raw"]
    search_fields = ["file__file_name"]


@admin.register(FileChunk)
class FileChunkAdmin(_ReadOnly):
    change_action = Action.ARCHIVE_WRITE
    list_display = ["short_text", "file", "chunk_index", "embedding_dim", "organization"]
    exclude = ["embedding"]
    list_select_related = ["file"]
    search_fields = ["text"]

    @admin.display(description="Text")
    def short_text(self, obj: FileChunk) -> str:
        return obj.text[:80]


@admin.register(AgentFile)
class AgentFileAdmin(_ReadOnly):
    change_action = Action.AGENT_CONFIGURE
    via = "agent"
    list_display = ["file_name", "agent", "is_open", "last_accessed_at", "organization"]
    list_filter = ["is_open"]
    list_select_related = ["agent"]


@admin.register(AgentFileSettings)
class AgentFileSettingsAdmin(_ReadOnly):
    change_action = Action.AGENT_CONFIGURE
    via = "agent"
    list_display = ["agent", "max_files_open", "per_file_view_window_char_limit", "organization"]
