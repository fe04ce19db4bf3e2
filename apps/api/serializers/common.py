"""Wire shapes of the Letta API. Plain Serializers, so the wire format never moves with a model field."""

from __future__ import annotations

import functools
from typing import Any

from rest_framework import serializers

MAX_BLOCK_LIMIT = 2**31 - 1  # the column's range (PositiveIntegerField)


def validated_query(shape: type[serializers.Serializer], query: Any) -> dict[str, Any]:
    """`shape`'s validated data for a request's query string (a 422 for bad input). A query that names
    none of its fields (the SDK's plain list, or one with only cursors) gets the defaults, validated once
    per shape: a serializer copies all its fields each time it validates (about 30 us a field)."""
    if not any(name in query for name in shape._declared_fields):
        return dict(_defaults(shape))
    data = shape(data=query)
    data.is_valid(raise_exception=True)
    return dict(data.validated_data)


@functools.cache
def _defaults(shape: type[serializers.Serializer]) -> dict[str, Any]:
    data = shape(data={})
    data.is_valid(raise_exception=True)
    return dict(data.validated_data)


class BlockOut(serializers.Serializer):
    id = serializers.CharField()
    label = serializers.CharField()
    value = serializers.CharField()
    limit = serializers.IntegerField()
    description = serializers.CharField()
    read_only = serializers.BooleanField()
    is_template = serializers.BooleanField()
    template_name = serializers.CharField(allow_blank=True)
    hidden = serializers.BooleanField()
    metadata = serializers.JSONField()
    tags = serializers.ListField(child=serializers.CharField())
    created_by_id = serializers.CharField(allow_null=True)
    last_updated_by_id = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class BlockCreateIn(serializers.Serializer):
    label = serializers.CharField(max_length=200)
    value = serializers.CharField(allow_blank=True, trim_whitespace=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_BLOCK_LIMIT)
    description = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    read_only = serializers.BooleanField(required=False, default=False)
    is_template = serializers.BooleanField(required=False, default=False)
    template_name = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    hidden = serializers.BooleanField(required=False, allow_null=True, default=False)
    metadata = serializers.DictField(required=False, allow_null=True)
    tags = serializers.ListField(child=serializers.CharField(max_length=100), required=False, allow_null=True)


class BlockUpdateIn(serializers.Serializer):
    label = serializers.CharField(max_length=200, required=False)
    value = serializers.CharField(allow_blank=True, required=False, trim_whitespace=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_BLOCK_LIMIT)
    description = serializers.CharField(required=False, allow_blank=True)
    read_only = serializers.BooleanField(required=False)
    is_template = serializers.BooleanField(required=False)
    template_name = serializers.CharField(required=False, allow_blank=True)
    hidden = serializers.BooleanField(required=False)
    metadata = serializers.DictField(required=False)
    tags = serializers.ListField(child=serializers.CharField(max_length=100), required=False)


class HealthOut(serializers.Serializer):
    status = serializers.CharField()
    version = serializers.CharField()
