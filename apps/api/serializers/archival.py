"""Wire shapes of an agent's archival memory (Letta's Passage, CreateArchivalMemory, search results)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.memory.models import Archive, Passage

EMBEDDING_CHUNK_SIZE = 300  # Letta's DEFAULT_EMBEDDING_CHUNK_SIZE, reported in embedding_config


def embedding_config(handle: str, dimension: int | None) -> dict[str, Any] | None:
    """Letta's EmbeddingConfig for a handle, from the handle alone (no provider lookup, no secrets)."""
    if not handle:
        return None
    provider, _, model = handle.partition("/")
    return {
        "handle": handle,
        "embedding_model": model or handle,
        "embedding_endpoint_type": provider,
        "embedding_endpoint": None,
        "embedding_dim": dimension,
        "embedding_chunk_size": EMBEDDING_CHUNK_SIZE,
        "batch_size": 32,
    }


class PassageOut(serializers.Serializer):
    """Letta's Passage. The vector is included, as Letta does, but at its own dimension (Letta pads it
    with zeros to 4096) and as pgvector reads it back (shortest float4 text), so a page stays cheap.

    Context: `archives` maps archive id -> Archive, so no query per passage.
    """

    id = serializers.CharField()
    text = serializers.CharField()
    archive_id = serializers.CharField()
    source_id = serializers.SerializerMethodField()
    file_id = serializers.SerializerMethodField()
    file_name = serializers.SerializerMethodField()
    tags = serializers.ListField(child=serializers.CharField())
    metadata = serializers.JSONField()
    embedding = serializers.SerializerMethodField()
    embedding_config = serializers.SerializerMethodField()
    is_deleted = serializers.SerializerMethodField()
    organization_id = serializers.CharField()
    created_by_id = serializers.CharField(allow_null=True)
    last_updated_by_id = serializers.CharField(source="created_by_id", allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    @extend_schema_field(OpenApiTypes.STR)
    def get_source_id(self, passage: Passage) -> None:
        return None

    @extend_schema_field(OpenApiTypes.STR)
    def get_file_id(self, passage: Passage) -> None:
        return None

    @extend_schema_field(OpenApiTypes.STR)
    def get_file_name(self, passage: Passage) -> None:
        return None

    def get_is_deleted(self, passage: Passage) -> bool:
        return False

    def get_embedding(self, passage: Passage) -> list[float] | None:
        vector = passage.embedding
        return None if vector is None else list(vector)

    def get_embedding_config(self, passage: Passage) -> dict[str, Any] | None:
        archives: dict[str, Archive] = self.context.get("archives", {})
        archive = archives.get(passage.archive_id)
        return embedding_config(archive.embedding if archive else "", passage.embedding_dim)


class PassageCreateIn(serializers.Serializer):
    text = serializers.CharField(allow_blank=True, trim_whitespace=False)
    tags = serializers.ListField(
        child=serializers.CharField(allow_blank=True), required=False, allow_null=True
    )
    created_at = serializers.DateTimeField(required=False, allow_null=True)


class PassageSearchIn(serializers.Serializer):
    """Query string of GET .../archival-memory/search (tags repeated: ?tags=a&tags=b)."""

    query = serializers.CharField()
    tags = serializers.ListField(child=serializers.CharField(), required=False)
    tag_match_mode = serializers.ChoiceField(choices=["any", "all"], required=False, default="any")
    top_k = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    start_datetime = serializers.CharField(required=False, allow_blank=True)
    end_datetime = serializers.CharField(required=False, allow_blank=True)


class PassageSearchResultOut(serializers.Serializer):
    id = serializers.CharField()
    timestamp = serializers.CharField()
    content = serializers.CharField()
    tags = serializers.ListField(child=serializers.CharField())


class PassageSearchOut(serializers.Serializer):
    results = PassageSearchResultOut(many=True)
    count = serializers.IntegerField()
