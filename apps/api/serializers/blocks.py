"""Wire shapes of /v1/health, /v1/ready and the block endpoints' query strings (blocks themselves are in
`common`, shared with the agents' core-memory endpoints)."""

from __future__ import annotations

from django.http import QueryDict
from rest_framework import serializers

from apps.api.serializers.strict import CLOUD_ONLY


class HealthOut(serializers.Serializer):
    """Letta's Health: `version` is the Letta API version this server speaks (clients compare it);
    `server_version` is this server's own."""

    status = serializers.CharField()
    version = serializers.CharField()
    server_version = serializers.CharField()


class ReadyOut(HealthOut):
    """Health, plus each check's state (`server`: ok | shutting_down; `postgres`, `redis`: ok | unavailable;
    `migrations`: ok | pending | unknown) and, when one is not ok, a detail in words."""

    checks = serializers.DictField(child=serializers.CharField())
    detail = serializers.CharField(required=False)


class BlockListQueryIn(serializers.Serializer):
    """Letta's list_blocks / count_blocks filters (cursors and `order` are read by PageParams)."""

    label = serializers.CharField(required=False)
    templates_only = serializers.BooleanField(required=False, default=False)
    name = serializers.CharField(required=False)
    identity_id = serializers.CharField(required=False)
    match_all_tags = serializers.BooleanField(required=False, default=False)
    order_by = serializers.ChoiceField(choices=["created_at"], required=False)
    label_search = serializers.CharField(required=False)
    description_search = serializers.CharField(required=False)
    value_search = serializers.CharField(required=False)
    connected_to_agents_count_gt = serializers.IntegerField(required=False, min_value=0)
    connected_to_agents_count_lt = serializers.IntegerField(required=False, min_value=0)
    show_hidden_blocks = serializers.BooleanField(required=False, allow_null=True, default=None)
    project_id = serializers.CharField(required=False)

    def validate_project_id(self, value: str) -> str:
        if value:
            raise serializers.ValidationError(f"not supported: {CLOUD_ONLY}.")
        return value


def block_filters(request_query: QueryDict) -> dict[str, object]:
    """The validated filters of a blocks list or count request, with the repeatable ones as lists."""
    query = BlockListQueryIn(data=request_query)
    query.is_valid(raise_exception=True)
    params = {
        key: value for key, value in query.validated_data.items() if key not in ("order_by", "project_id")
    }
    try:
        counts = [int(value) for value in request_query.getlist("connected_to_agents_count_eq")]
    except ValueError as exc:
        raise serializers.ValidationError({"connected_to_agents_count_eq": "must be integers"}) from exc
    return {
        **params,
        "tags": request_query.getlist("tags"),
        "identifier_keys": request_query.getlist("identifier_keys"),
        "connected_to_agents_count_eq": counts or None,
    }
