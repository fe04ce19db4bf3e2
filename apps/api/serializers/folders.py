"""Wire shapes of /v1/folders (and the deprecated /v1/sources), their files, and an agent's folders and files:
Letta's Folder / Source, FolderCreate, FolderUpdate, FileMetadata, OrganizationSourcesStats, AgentFileAttachment
and PaginatedAgentFiles."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.api.serializers.archival import embedding_config
from apps.folders.models import MAX_NAME_LENGTH, AgentFile, FileChunk, FileMetadata, Folder


class QueryBooleanField(serializers.BooleanField):
    """A query-string boolean whose absence means its default (DRF reads an absent form boolean as False)."""

    default_empty_html = serializers.empty


def _none_if_blank(value: str) -> str | None:
    return value or None


class FolderOut(serializers.Serializer):
    """Letta's Folder (and Source, which adds vector_db_provider: both are answered)."""

    id = serializers.CharField()
    name = serializers.CharField()
    description = serializers.SerializerMethodField()
    instructions = serializers.SerializerMethodField()
    metadata = serializers.JSONField()
    embedding_config = serializers.SerializerMethodField()
    organization_id = serializers.CharField()
    vector_db_provider = serializers.CharField()
    created_by_id = serializers.CharField(allow_null=True)
    last_updated_by_id = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    @extend_schema_field(OpenApiTypes.STR)
    def get_description(self, folder: Folder) -> str | None:
        return _none_if_blank(folder.description)

    @extend_schema_field(OpenApiTypes.STR)
    def get_instructions(self, folder: Folder) -> str | None:
        return _none_if_blank(folder.instructions)

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_embedding_config(self, folder: Folder) -> dict[str, Any] | None:
        config = embedding_config(folder.embedding, folder.embedding_dim)
        if config is not None:
            config["embedding_chunk_size"] = folder.embedding_chunk_size
        return config


def _config_handle(config: dict[str, Any] | None) -> str | None:
    """The handle a legacy `embedding_config` names: its own, else `<endpoint type>/<model>`."""
    config = config or {}
    if config.get("handle"):
        return str(config["handle"])
    if config.get("embedding_endpoint_type") and config.get("embedding_model"):
        return f"{config['embedding_endpoint_type']}/{config['embedding_model']}"
    return None


class FolderCreateIn(serializers.Serializer):
    name = serializers.CharField(max_length=MAX_NAME_LENGTH)
    description = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    instructions = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    metadata = serializers.DictField(required=False, allow_null=True)
    embedding = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    embedding_chunk_size = serializers.IntegerField(required=False, allow_null=True)
    embedding_config = serializers.DictField(required=False, allow_null=True)

    def service_kwargs(self) -> dict[str, Any]:
        data = self.validated_data
        config = data.get("embedding_config") or {}
        return {
            "name": data["name"],
            "description": data.get("description"),
            "instructions": data.get("instructions"),
            "metadata": data.get("metadata"),
            "embedding_handle": data.get("embedding") or _config_handle(config),
            "embedding_chunk_size": data.get("embedding_chunk_size") or config.get("embedding_chunk_size"),
        }


class FolderUpdateIn(serializers.Serializer):
    name = serializers.CharField(required=False, allow_null=True, max_length=MAX_NAME_LENGTH)
    description = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    instructions = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    metadata = serializers.DictField(required=False, allow_null=True)
    embedding_config = serializers.DictField(required=False, allow_null=True)

    def service_kwargs(self) -> dict[str, Any]:
        data = self.validated_data
        return {key: data.get(key) for key in ("name", "description", "instructions", "metadata")}

    def embedding_handle(self) -> str | None:
        return _config_handle(self.validated_data.get("embedding_config"))


class FolderListQueryIn(serializers.Serializer):
    name = serializers.CharField(required=False, trim_whitespace=False)
    order_by = serializers.ChoiceField(choices=["created_at"], required=False, default="created_at")


class FileMetadataOut(serializers.Serializer):
    """Letta's FileMetadata. `file_name` is the name in the folder; the upload's answer, as Letta's, gives it
    as "<folder name>/<file name>" (context `prefixed`). `content` only with include_content (context
    `contents`: file id -> text)."""

    id = serializers.CharField()
    source_id = serializers.CharField(source="folder_id")
    folder_id = serializers.CharField()
    organization_id = serializers.CharField()
    file_name = serializers.SerializerMethodField()
    original_file_name = serializers.CharField()
    file_path = serializers.SerializerMethodField()
    file_type = serializers.CharField()
    file_size = serializers.IntegerField()
    file_creation_date = serializers.SerializerMethodField()
    file_last_modified_date = serializers.SerializerMethodField()
    processing_status = serializers.CharField()
    error_message = serializers.SerializerMethodField()
    total_chunks = serializers.IntegerField(allow_null=True)
    chunks_embedded = serializers.IntegerField(allow_null=True)
    content = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    @extend_schema_field(OpenApiTypes.STR)
    def get_file_name(self, file: FileMetadata) -> str:
        return f"{file.folder.name}/{file.file_name}" if self.context.get("prefixed") else file.file_name

    @extend_schema_field(OpenApiTypes.STR)
    def get_file_path(self, file: FileMetadata) -> None:
        return None

    @extend_schema_field(OpenApiTypes.STR)
    def get_file_creation_date(self, file: FileMetadata) -> None:
        return None

    @extend_schema_field(OpenApiTypes.STR)
    def get_file_last_modified_date(self, file: FileMetadata) -> None:
        return None

    @extend_schema_field(OpenApiTypes.STR)
    def get_error_message(self, file: FileMetadata) -> str | None:
        return _none_if_blank(file.error_message)

    @extend_schema_field(OpenApiTypes.STR)
    def get_content(self, file: FileMetadata) -> str | None:
        contents = self.context.get("contents")
        return None if contents is None else contents.get(file.id, "")


class FileListQueryIn(serializers.Serializer):
    include_content = QueryBooleanField(required=False, default=False)
    order_by = serializers.ChoiceField(choices=["created_at"], required=False, default="created_at")


class UploadQueryIn(serializers.Serializer):
    duplicate_handling = serializers.ChoiceField(
        choices=["skip", "error", "suffix", "replace"], required=False, default="suffix"
    )
    name = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, max_length=MAX_NAME_LENGTH
    )


class UploadIn(serializers.Serializer):
    file = serializers.FileField()


class FileStatsOut(serializers.Serializer):
    file_id = serializers.CharField()
    file_name = serializers.CharField()
    file_size = serializers.IntegerField(allow_null=True)


class SourceStatsOut(serializers.Serializer):
    source_id = serializers.CharField()
    source_name = serializers.CharField()
    folder_id = serializers.CharField()
    folder_name = serializers.CharField()
    file_count = serializers.IntegerField()
    total_size = serializers.IntegerField()
    files = FileStatsOut(many=True)


class OrganizationSourcesStatsOut(serializers.Serializer):
    """Letta's OrganizationSourcesStats (each source also as folder_id / folder_name)."""

    total_sources = serializers.IntegerField()
    total_files = serializers.IntegerField()
    total_size = serializers.IntegerField()
    sources = SourceStatsOut(many=True)


class FolderPassageOut(serializers.Serializer):
    """A chunk of a folder's file as Letta's Passage (the vector is left out: null)."""

    id = serializers.CharField()
    text = serializers.CharField()
    file_id = serializers.CharField()
    file_name = serializers.CharField(source="file.file_name")
    source_id = serializers.CharField(source="folder_id")
    archive_id = serializers.SerializerMethodField()
    organization_id = serializers.CharField()
    embedding = serializers.SerializerMethodField()
    embedding_config = serializers.SerializerMethodField()
    metadata = serializers.SerializerMethodField()
    tags = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_archive_id(self, chunk: FileChunk) -> None:
        return None

    def get_embedding(self, chunk: FileChunk) -> None:
        return None

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_embedding_config(self, chunk: FileChunk) -> dict[str, Any] | None:
        return embedding_config(chunk.folder.embedding, chunk.embedding_dim)

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_metadata(self, chunk: FileChunk) -> dict[str, Any]:
        return {"chunk_index": chunk.chunk_index}

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_tags(self, chunk: FileChunk) -> list[str]:
        return []


class AgentFileOut(serializers.Serializer):
    """Letta's AgentFileAttachment: one of an agent's files, open or closed."""

    id = serializers.CharField()
    file_id = serializers.CharField()
    file_name = serializers.CharField()
    folder_id = serializers.CharField()
    folder_name = serializers.CharField(source="folder.name")
    is_open = serializers.BooleanField()
    last_accessed_at = serializers.DateTimeField(allow_null=True)
    visible_content = serializers.SerializerMethodField()
    start_line = serializers.IntegerField(allow_null=True)
    end_line = serializers.IntegerField(allow_null=True)

    @extend_schema_field(OpenApiTypes.STR)
    def get_visible_content(self, state: AgentFile) -> str | None:
        return state.visible_content if state.is_open and state.visible_content else None


class AgentFilesPageOut(serializers.Serializer):
    files = AgentFileOut(many=True)
    next_cursor = serializers.CharField(allow_null=True)
    has_more = serializers.BooleanField()


class AgentFileListQueryIn(serializers.Serializer):
    is_open = QueryBooleanField(required=False, allow_null=True, default=None)
    cursor = serializers.CharField(required=False, allow_null=True)
    order_by = serializers.ChoiceField(choices=["created_at"], required=False, default="created_at")
