from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models

from apps.core.ids import ID_MAX_LENGTH, new_tool_id
from apps.core.models import OrgOwnedModel

DEFAULT_RETURN_CHAR_LIMIT = 50_000  # Letta's FUNCTION_RETURN_CHAR_LIMIT


class Tool(OrgOwnedModel):
    class Type(models.TextChoices):
        CUSTOM = "custom"
        LETTA_CORE = "letta_core"
        LETTA_MEMORY_CORE = "letta_memory_core"
        LETTA_MULTI_AGENT_CORE = "letta_multi_agent_core"
        LETTA_SLEEPTIME_CORE = "letta_sleeptime_core"
        LETTA_VOICE_SLEEPTIME_CORE = "letta_voice_sleeptime_core"
        LETTA_BUILTIN = "letta_builtin"
        LETTA_FILES_CORE = "letta_files_core"
        EXTERNAL_MCP = "external_mcp"
        CLIENT = "client", "Client-side (executed by the caller)"

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_tool_id, editable=False)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    tool_type = models.CharField(max_length=32, choices=Type.choices, default=Type.CUSTOM)
    source_type = models.CharField(max_length=32, default="python")
    source_code = models.TextField(blank=True, default="")
    json_schema = models.JSONField(default=dict, blank=True)
    args_json_schema = models.JSONField(null=True, blank=True)
    return_char_limit = models.PositiveIntegerField(default=DEFAULT_RETURN_CHAR_LIMIT)
    tags = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    pip_requirements = models.JSONField(default=list, blank=True)
    npm_requirements = models.JSONField(default=list, blank=True)
    default_requires_approval = models.BooleanField(default=False)
    enable_parallel_execution = models.BooleanField(default=False)
    metadata = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    last_updated_by = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="tool_unique_name_per_org")
        ]

    def __str__(self) -> str:
        return self.name
