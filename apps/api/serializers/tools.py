"""Wire shapes of /v1/tools and the tool-approval endpoint (Letta's Tool, ToolCreate, ToolUpdate, ...)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.tools.services import MAX_RETURN_CHAR_LIMIT, SOURCE_TYPES


class PackageRequirement(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    version = serializers.CharField(max_length=100, required=False, allow_null=True, allow_blank=True)


class ToolResponse(serializers.Serializer):
    """Letta's Tool (the JSON key `metadata_` is Letta's spelling, kept by the SDK)."""

    id = serializers.CharField()
    name = serializers.CharField()
    tool_type = serializers.CharField()
    description = serializers.CharField()
    source_type = serializers.CharField()
    source_code = serializers.CharField()
    json_schema = serializers.JSONField()
    args_json_schema = serializers.JSONField(allow_null=True)
    return_char_limit = serializers.IntegerField()
    tags = serializers.ListField(child=serializers.CharField())
    pip_requirements = serializers.JSONField()
    npm_requirements = serializers.JSONField()
    default_requires_approval = serializers.BooleanField()
    enable_parallel_execution = serializers.BooleanField()
    metadata_ = serializers.JSONField(source="metadata")
    project_id = serializers.SerializerMethodField()
    created_by_id = serializers.CharField(allow_null=True)
    last_updated_by_id = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    @extend_schema_field(OpenApiTypes.STR)
    def get_project_id(self, tool: object) -> None:
        return None


class ToolCreateIn(serializers.Serializer):
    """POST and PUT /v1/tools/: the schema comes from `source_code` unless `json_schema` is given."""

    source_code = serializers.CharField(trim_whitespace=False)
    source_type = serializers.ChoiceField(choices=SOURCE_TYPES, required=False, default="python")
    description = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    tags = serializers.ListField(child=serializers.CharField(max_length=100), required=False, allow_null=True)
    json_schema = serializers.DictField(required=False, allow_null=True)
    args_json_schema = serializers.DictField(required=False, allow_null=True)
    return_char_limit = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_RETURN_CHAR_LIMIT
    )
    pip_requirements = PackageRequirement(many=True, required=False, allow_null=True)
    npm_requirements = PackageRequirement(many=True, required=False, allow_null=True)
    default_requires_approval = serializers.BooleanField(required=False, allow_null=True)
    enable_parallel_execution = serializers.BooleanField(required=False, allow_null=True)


class ToolUpdateIn(serializers.Serializer):
    """PATCH /v1/tools/{id}: only the fields sent change (an explicit null keeps the value)."""

    source_code = serializers.CharField(required=False, allow_null=True, trim_whitespace=False)
    source_type = serializers.ChoiceField(choices=SOURCE_TYPES, required=False, allow_null=True)
    description = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    tags = serializers.ListField(child=serializers.CharField(max_length=100), required=False, allow_null=True)
    json_schema = serializers.DictField(required=False, allow_null=True)
    args_json_schema = serializers.DictField(required=False, allow_null=True)
    return_char_limit = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_RETURN_CHAR_LIMIT
    )
    pip_requirements = PackageRequirement(many=True, required=False, allow_null=True)
    npm_requirements = PackageRequirement(many=True, required=False, allow_null=True)
    default_requires_approval = serializers.BooleanField(required=False, allow_null=True)
    enable_parallel_execution = serializers.BooleanField(required=False, allow_null=True)
    # The SDK renames `metadata` to `metadata_` on the wire; plain `metadata` is accepted too.
    metadata_ = serializers.DictField(required=False, allow_null=True)
    metadata = serializers.DictField(required=False, allow_null=True)

    def changes(self) -> dict[str, object]:
        """The validated fields that were sent with a value, keyed as tool_update takes them."""
        data = dict(self.validated_data)
        if "metadata_" in data:
            data["metadata"] = data.pop("metadata_")
        return {key: value for key, value in data.items() if value is not None}


class ToolSearchIn(serializers.Serializer):
    query = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    search_mode = serializers.ChoiceField(
        choices=["vector", "fts", "hybrid"], required=False, default="hybrid"
    )
    tool_types = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)
    tags = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=100)


class ToolSearchResultOut(serializers.Serializer):
    tool = ToolResponse()
    combined_score = serializers.FloatField()
    fts_rank = serializers.IntegerField(allow_null=True)
    vector_rank = serializers.IntegerField(allow_null=True)
    embedded_text = serializers.CharField(allow_null=True)


class ToolRunIn(serializers.Serializer):
    """POST /v1/tools/run: Letta's ToolRunFromSource, plus `tool_id` to run a stored user tool."""

    source_code = serializers.CharField(required=False, allow_null=True, trim_whitespace=False)
    tool_id = serializers.CharField(required=False, allow_null=True)
    name = serializers.CharField(required=False, allow_null=True)
    args = serializers.DictField(required=False, default=dict)
    env_vars = serializers.DictField(
        child=serializers.CharField(allow_blank=True), required=False, allow_null=True
    )
    source_type = serializers.CharField(required=False, allow_null=True)
    json_schema = serializers.DictField(required=False, allow_null=True)
    args_json_schema = serializers.DictField(required=False, allow_null=True)
    pip_requirements = PackageRequirement(many=True, required=False, allow_null=True)
    npm_requirements = PackageRequirement(many=True, required=False, allow_null=True)

    def validate(self, attrs: dict[str, object]) -> dict[str, object]:
        if (attrs.get("source_code") is None) == (attrs.get("tool_id") is None):
            raise serializers.ValidationError({"source_code": "give exactly one of source_code or tool_id"})
        # Letta runs Python and TypeScript sources; this server runs Python only.
        if attrs.get("source_type") not in (None, "python"):
            raise serializers.ValidationError(
                {"source_type": f"only 'python' tools run here, not {attrs['source_type']!r}"}
            )
        if attrs.get("npm_requirements"):
            raise serializers.ValidationError(
                {"npm_requirements": "only Python tools run here: no npm packages"}
            )
        schema_name = (attrs.get("json_schema") or {}).get("name")
        if schema_name is not None and attrs.get("name") not in (None, schema_name):
            raise serializers.ValidationError({"json_schema": "its name differs from `name`"})
        return attrs


class ToolRunOut(serializers.Serializer):
    """Letta's ToolReturnMessage, plus the sandbox that ran it."""

    id = serializers.CharField()
    date = serializers.DateTimeField()
    message_type = serializers.CharField()
    name = serializers.CharField()
    tool_call_id = serializers.CharField()
    tool_return = serializers.CharField()
    status = serializers.CharField()
    stdout = serializers.ListField(child=serializers.CharField())
    stderr = serializers.ListField(child=serializers.CharField())
    sandbox = serializers.CharField()


class ApprovalIn(serializers.Serializer):
    requires_approval = serializers.BooleanField()


class GenerateSchemaIn(serializers.Serializer):
    """POST /v1/tools/generate-schema: Letta's CodeInput."""

    code = serializers.CharField(trim_whitespace=False)
    source_type = serializers.ChoiceField(choices=SOURCE_TYPES, required=False, default="python")


class AgentToolRunIn(serializers.Serializer):
    """POST /v1/agents/{agent_id}/tools/{tool_name}/run: Letta's ToolExecuteRequest."""

    args = serializers.DictField(required=False, default=dict)


class AgentToolRunOut(serializers.Serializer):
    """Letta's ToolExecutionResult (func_return is null when the tool failed; stderr then says why), plus
    the sandbox that ran it."""

    status = serializers.CharField()
    func_return = serializers.CharField(allow_null=True)
    stdout = serializers.ListField(child=serializers.CharField())
    stderr = serializers.ListField(child=serializers.CharField())
    agent_state = serializers.JSONField(allow_null=True)
    sandbox_config_fingerprint = serializers.CharField(allow_null=True)
    sandbox = serializers.CharField()
