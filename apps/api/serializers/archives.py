"""Wire shapes of /v1/archives and /v1/passages/search (Letta's Archive, ArchiveCreateRequest,
ArchiveUpdateRequest, PassageCreateRequest, PassageBatchCreateRequest, PassageSearchRequest and
PassageSearchResult)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.api.serializers.archival import PassageOut, embedding_config
from apps.memory.models import MAX_ARCHIVE_NAME_LENGTH, Archive
from apps.memory.selectors import PassageHit
from apps.memory.services import PassageSpec

DEFAULT_SEARCH_LIMIT = 50  # Letta's PassageSearchRequest.limit
MAX_SEARCH_LIMIT = 100


class ArchiveOut(serializers.Serializer):
    """Letta's Archive. `embedding_config` is null for an archive without an embedding model (text search
    only); `last_updated_by_id` is not recorded, so it is null."""

    id = serializers.CharField()
    name = serializers.CharField()
    description = serializers.SerializerMethodField()
    organization_id = serializers.CharField()
    vector_db_provider = serializers.CharField()
    embedding_config = serializers.SerializerMethodField()
    metadata = serializers.JSONField()
    created_by_id = serializers.CharField(allow_null=True)
    last_updated_by_id = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    @extend_schema_field(OpenApiTypes.STR)
    def get_description(self, archive: Archive) -> str | None:
        return archive.description or None

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_embedding_config(self, archive: Archive) -> dict[str, Any] | None:
        return embedding_config(archive.embedding, archive.embedding_dim)

    @extend_schema_field(OpenApiTypes.STR)
    def get_last_updated_by_id(self, archive: Archive) -> None:
        return None


class ArchiveCreateIn(serializers.Serializer):
    name = serializers.CharField(max_length=MAX_ARCHIVE_NAME_LENGTH)
    description = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    embedding = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    embedding_config = serializers.DictField(required=False, allow_null=True)

    def embedding_handle(self) -> str | None:
        """`embedding`, else the handle of the deprecated `embedding_config` (its `handle`, or
        `<embedding_endpoint_type>/<embedding_model>`)."""
        data = self.validated_data
        if data.get("embedding"):
            return str(data["embedding"])
        config = data.get("embedding_config") or {}
        if config.get("handle"):
            return str(config["handle"])
        if config.get("embedding_endpoint_type") and config.get("embedding_model"):
            return f"{config['embedding_endpoint_type']}/{config['embedding_model']}"
        return None


class ArchiveUpdateIn(serializers.Serializer):
    name = serializers.CharField(required=False, allow_null=True, max_length=MAX_ARCHIVE_NAME_LENGTH)
    description = serializers.CharField(required=False, allow_null=True, allow_blank=True)


class ArchiveListQueryIn(serializers.Serializer):
    name = serializers.CharField(required=False, trim_whitespace=False)
    agent_id = serializers.CharField(required=False)
    order_by = serializers.ChoiceField(choices=["created_at"], required=False, default="created_at")


class ArchivePassageIn(serializers.Serializer):
    text = serializers.CharField(allow_blank=True, trim_whitespace=False)
    metadata = serializers.DictField(required=False, allow_null=True)
    tags = serializers.ListField(
        child=serializers.CharField(allow_blank=True), required=False, allow_null=True
    )
    created_at = serializers.DateTimeField(required=False, allow_null=True)

    @staticmethod
    def spec(data: dict[str, Any]) -> PassageSpec:
        return PassageSpec(
            text=data["text"],
            tags=data.get("tags"),
            metadata=data.get("metadata"),
            created_at=data.get("created_at"),
        )


class ArchivePassageBatchIn(serializers.Serializer):
    passages = ArchivePassageIn(many=True)


class PassageSearchRequestIn(serializers.Serializer):
    query = serializers.CharField(required=False, allow_null=True, allow_blank=True, trim_whitespace=False)
    agent_id = serializers.CharField(required=False, allow_null=True)
    archive_id = serializers.CharField(required=False, allow_null=True)
    tags = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)
    tag_match_mode = serializers.ChoiceField(choices=["any", "all"], required=False, default="any")
    limit = serializers.IntegerField(
        required=False, default=DEFAULT_SEARCH_LIMIT, min_value=1, max_value=MAX_SEARCH_LIMIT
    )
    start_date = serializers.DateTimeField(required=False, allow_null=True)
    end_date = serializers.DateTimeField(required=False, allow_null=True)


class PassageSearchResultOut(serializers.Serializer):
    """Letta's PassageSearchResult. `score`: cosine similarity for a passage found by meaning, 1.0 for one
    found by text match (no embedding model), 0.0 without a query; `metadata.match` says which."""

    passage = serializers.SerializerMethodField()
    score = serializers.FloatField()
    metadata = serializers.SerializerMethodField()

    @extend_schema_field(PassageOut)
    def get_passage(self, hit: PassageHit) -> dict[str, Any]:
        return dict(PassageOut(hit.passage, context=self.context).data)

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_metadata(self, hit: PassageHit) -> dict[str, Any]:
        return {"match": hit.match}
