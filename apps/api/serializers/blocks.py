"""Wire shapes of /v1/health, /v1/ready and the block endpoints' query strings (blocks themselves are in
`common`, shared with the agents' core-memory endpoints)."""

from __future__ import annotations

from rest_framework import serializers


class HealthOut(serializers.Serializer):
    """Letta's Health: `version` is the Letta API version this server speaks (clients compare it);
    `server_version` is this server's own."""

    status = serializers.CharField()
    version = serializers.CharField()
    server_version = serializers.CharField()


class ReadyOut(HealthOut):
    """Health, plus each dependency's state ("ok" or "unavailable") and, when one is down, a detail."""

    checks = serializers.DictField(child=serializers.CharField())
    detail = serializers.CharField(required=False)


class BlockCountQueryIn(serializers.Serializer):
    """GET /v1/blocks/count: Letta's count_blocks filters."""

    label = serializers.CharField(required=False)
    templates_only = serializers.BooleanField(required=False, default=False)
    name = serializers.CharField(required=False)
    match_all_tags = serializers.BooleanField(required=False, default=False)
