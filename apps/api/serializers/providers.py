"""Wire shapes of /v1/providers (Letta's Provider, ProviderCreate, ProviderUpdate, ProviderCheck).

A key is never returned: Letta's `api_key` / `api_key_enc` (and `access_key`) are left out of every
answer. A base URL is shown without a `user:password@` part. Letta's BYOK-only fields that mean nothing
here (`region`, `api_version`) are null; `provider_category` is always "byok" (the deployment's own
providers are settings, not rows).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.outbound import without_credentials
from apps.llm.models import Provider
from apps.llm.selectors import OPENAI_API_BASE
from apps.llm.services import BASE_URL_MAX_LENGTH

KEY_MAX_LENGTH = 10_000


class ProviderOut(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    provider_type = serializers.CharField()
    provider_category = serializers.SerializerMethodField()
    base_url = serializers.SerializerMethodField()
    region = serializers.SerializerMethodField()
    api_version = serializers.SerializerMethodField()
    organization_id = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    last_synced = serializers.SerializerMethodField()

    def get_provider_category(self, provider: Provider) -> str:
        return "byok"

    def get_base_url(self, provider: Provider) -> str | None:
        """Letta shows OpenAI's public URL for an OpenAI provider without one."""
        if provider.base_url:
            return without_credentials(provider.base_url)
        return OPENAI_API_BASE if provider.provider_type == Provider.Type.OPENAI else None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_region(self, provider: Provider) -> None:
        return None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_api_version(self, provider: Provider) -> None:
        return None

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_last_synced(self, provider: Provider) -> None:
        """Model lists are read live (GET /v1/models), never synced into rows."""
        return None


def _blank_to_empty(value: Any) -> str:
    return "" if value is None else str(value)


class ProviderCreateIn(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    provider_type = serializers.ChoiceField(choices=Provider.Type.values)
    api_key = serializers.CharField(
        max_length=KEY_MAX_LENGTH, required=False, allow_blank=True, allow_null=True, default=""
    )
    base_url = serializers.CharField(
        max_length=BASE_URL_MAX_LENGTH, required=False, allow_blank=True, allow_null=True, default=""
    )
    # Letta's fields for Bedrock and Azure; accepted and ignored (no such provider types here).
    access_key = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    region = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    api_version = serializers.CharField(required=False, allow_blank=True, allow_null=True)

    def service_kwargs(self) -> dict[str, str]:
        data = self.validated_data
        return {
            "name": data["name"],
            "provider_type": data["provider_type"],
            "api_key": _blank_to_empty(data.get("api_key")),
            "base_url": _blank_to_empty(data.get("base_url")),
        }


class ProviderUpdateIn(serializers.Serializer):
    """Absent: unchanged. `base_url` null or "": cleared."""

    api_key = serializers.CharField(max_length=KEY_MAX_LENGTH, required=False, allow_blank=True)
    base_url = serializers.CharField(
        max_length=BASE_URL_MAX_LENGTH, required=False, allow_blank=True, allow_null=True
    )
    access_key = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    region = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    api_version = serializers.CharField(required=False, allow_blank=True, allow_null=True)

    def service_kwargs(self) -> dict[str, str]:
        data = self.validated_data
        changes = {}
        if "api_key" in data:
            changes["api_key"] = data["api_key"]
        if "base_url" in data:
            changes["base_url"] = _blank_to_empty(data["base_url"])
        return changes


class ProviderCheckIn(serializers.Serializer):
    provider_type = serializers.ChoiceField(choices=Provider.Type.values)
    api_key = serializers.CharField(
        max_length=KEY_MAX_LENGTH, required=False, allow_blank=True, allow_null=True, default=""
    )
    base_url = serializers.CharField(
        max_length=BASE_URL_MAX_LENGTH, required=False, allow_blank=True, allow_null=True, default=""
    )
    access_key = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    region = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    api_version = serializers.CharField(required=False, allow_blank=True, allow_null=True)

    def service_kwargs(self) -> dict[str, str]:
        data = self.validated_data
        return {
            "provider_type": data["provider_type"],
            "api_key": _blank_to_empty(data.get("api_key")),
            "base_url": _blank_to_empty(data.get("base_url")),
        }


class MessageOut(serializers.Serializer):
    message = serializers.CharField()
