"""Wire shapes of /v1/identities (Letta's Identity, IdentityCreate, IdentityUpsert, IdentityUpdate and
IdentityProperty)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.errors import InvalidInput
from apps.identities.models import Identity, IdentityType, PropertyType
from apps.identities.services import MAX_KEY_LENGTH, IdentityProperty

IDENTITY_TYPES = IdentityType.values
PROPERTY_TYPES = PropertyType.values


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string"},
            {"type": "integer"},
            {"type": "number"},
            {"type": "boolean"},
            {"type": "object"},
        ]
    }
)
class PropertyValueField(serializers.Field):
    """Letta's Union[str, int, float, bool, dict]: a list or null is refused."""

    default_error_messages = {"invalid": "Must be a string, a number, a boolean or an object."}

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str | int | float | bool | dict):
            self.fail("invalid")
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class IdentityPropertyIn(serializers.Serializer):
    key = serializers.CharField(allow_blank=False, trim_whitespace=False)
    value = PropertyValueField()
    type = serializers.ChoiceField(choices=PROPERTY_TYPES)

    @staticmethod
    def to_properties(items: list[dict[str, Any]] | None) -> list[IdentityProperty] | None:
        if items is None:
            return None
        try:
            return [IdentityProperty(key=i["key"], value=i["value"], type=i["type"]) for i in items]
        except InvalidInput as exc:
            raise serializers.ValidationError({"properties": exc.message}) from exc


class IdentityPropertyOut(serializers.Serializer):
    key = serializers.CharField()
    value = PropertyValueField()
    type = serializers.CharField()


class IdentityOut(serializers.Serializer):
    """Letta's Identity, from identity_queryset (its agents and blocks prefetched). Letta 0.16.7 leaves
    agent_ids and block_ids empty; here they list the identity's agents and blocks, oldest first."""

    id = serializers.CharField()
    identifier_key = serializers.CharField()
    name = serializers.CharField()
    identity_type = serializers.CharField()
    project_id = serializers.SerializerMethodField()
    agent_ids = serializers.SerializerMethodField()
    block_ids = serializers.SerializerMethodField()
    organization_id = serializers.CharField()
    properties = IdentityPropertyOut(many=True)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_project_id(self, identity: Identity) -> str | None:
        return identity.project_id or None

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_agent_ids(self, identity: Identity) -> list[str]:
        return [agent.id for agent in identity.agents.all()]

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_block_ids(self, identity: Identity) -> list[str]:
        return [block.id for block in identity.blocks.all()]


def _ids() -> serializers.ListField:
    return serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)


class IdentityCreateIn(serializers.Serializer):
    """Letta's IdentityCreate; IdentityUpsert has the same fields."""

    identifier_key = serializers.CharField(max_length=MAX_KEY_LENGTH, trim_whitespace=False)
    name = serializers.CharField(max_length=MAX_KEY_LENGTH)
    identity_type = serializers.ChoiceField(choices=IDENTITY_TYPES)
    project_id = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=255)
    agent_ids = _ids()
    block_ids = _ids()
    properties = IdentityPropertyIn(many=True, required=False, allow_null=True)

    def to_service_kwargs(self) -> dict[str, Any]:
        data = dict(self.validated_data)
        data["properties"] = IdentityPropertyIn.to_properties(data.get("properties"))
        return data


class IdentityUpdateIn(serializers.Serializer):
    """Letta's IdentityUpdate: null (or absent) leaves a field as it is."""

    identifier_key = serializers.CharField(
        required=False, allow_null=True, max_length=MAX_KEY_LENGTH, trim_whitespace=False
    )
    name = serializers.CharField(required=False, allow_null=True, max_length=MAX_KEY_LENGTH)
    identity_type = serializers.ChoiceField(choices=IDENTITY_TYPES, required=False, allow_null=True)
    agent_ids = _ids()
    block_ids = _ids()
    properties = IdentityPropertyIn(many=True, required=False, allow_null=True)

    def to_service_kwargs(self) -> dict[str, Any]:
        data = dict(self.validated_data)
        data["properties"] = IdentityPropertyIn.to_properties(data.get("properties"))
        return data


class IdentityListQueryIn(serializers.Serializer):
    name = serializers.CharField(required=False)
    project_id = serializers.CharField(required=False)
    identifier_key = serializers.CharField(required=False)
    identity_type = serializers.ChoiceField(choices=IDENTITY_TYPES, required=False)
    order_by = serializers.ChoiceField(choices=["created_at"], required=False, default="created_at")
