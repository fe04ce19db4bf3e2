"""Letta's Group, GroupCreate and GroupUpdate (schemas/group.py) for /v1/groups."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.agents.groups import group_agent_ids
from apps.agents.models import Group, ManagerType

MANAGER_FIELDS = (
    "manager_agent_id",
    "termination_token",
    "max_turns",
    "sleeptime_agent_frequency",
    "max_message_buffer_length",
    "min_message_buffer_length",
)


class GroupOut(serializers.Serializer):
    """Letta's Group."""

    id = serializers.CharField()
    manager_type = serializers.CharField()
    agent_ids = serializers.SerializerMethodField()
    description = serializers.CharField()
    project_id = serializers.SerializerMethodField()
    template_id = serializers.SerializerMethodField()
    base_template_id = serializers.SerializerMethodField()
    deployment_id = serializers.SerializerMethodField()
    shared_block_ids = serializers.ListField(child=serializers.CharField())
    manager_agent_id = serializers.CharField(allow_null=True)
    termination_token = serializers.SerializerMethodField()
    max_turns = serializers.IntegerField(allow_null=True)
    sleeptime_agent_frequency = serializers.IntegerField(allow_null=True)
    turns_counter = serializers.IntegerField(allow_null=True)
    last_processed_message_id = serializers.SerializerMethodField()
    max_message_buffer_length = serializers.IntegerField(allow_null=True)
    min_message_buffer_length = serializers.IntegerField(allow_null=True)
    hidden = serializers.BooleanField(allow_null=True)

    def get_agent_ids(self, group: Group) -> list[str]:
        return group_agent_ids(group)

    def get_project_id(self, group: Group) -> str | None:
        return group.project_id or None

    def get_template_id(self, group: Group) -> None:
        return None

    def get_base_template_id(self, group: Group) -> None:
        return None

    def get_deployment_id(self, group: Group) -> None:
        return None

    def get_termination_token(self, group: Group) -> str | None:
        return group.termination_token or None

    def get_last_processed_message_id(self, group: Group) -> str | None:
        return group.last_processed_message_id or None


class ManagerConfigIn(serializers.Serializer):
    manager_type = serializers.ChoiceField(choices=ManagerType.choices, default=ManagerType.ROUND_ROBIN)
    manager_agent_id = serializers.CharField(required=False, allow_null=True)
    termination_token = serializers.CharField(required=False, allow_null=True)
    max_turns = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    sleeptime_agent_frequency = serializers.IntegerField(required=False, allow_null=True, min_value=0)
    max_message_buffer_length = serializers.IntegerField(required=False, allow_null=True)
    min_message_buffer_length = serializers.IntegerField(required=False, allow_null=True)


class GroupCreateIn(serializers.Serializer):
    agent_ids = serializers.ListField(child=serializers.CharField())
    description = serializers.CharField(allow_blank=True)
    manager_config = ManagerConfigIn(required=False)
    project_id = serializers.CharField(required=False, allow_null=True)
    shared_block_ids = serializers.ListField(child=serializers.CharField(), required=False)
    hidden = serializers.BooleanField(required=False, allow_null=True)

    def to_service_kwargs(self) -> dict[str, Any]:
        data = self.validated_data
        config = dict(data.get("manager_config") or {"manager_type": ManagerType.ROUND_ROBIN})
        return {
            "agent_ids": list(data["agent_ids"]),
            "description": data["description"],
            "manager_type": config.pop("manager_type", ManagerType.ROUND_ROBIN),
            "manager_config": {k: v for k, v in config.items() if k in MANAGER_FIELDS and v is not None},
            "shared_block_ids": list(data.get("shared_block_ids") or []),
            "hidden": data.get("hidden"),
            "project_id": data.get("project_id"),
        }


class GroupUpdateIn(serializers.Serializer):
    agent_ids = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)
    description = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    manager_config = ManagerConfigIn(required=False, allow_null=True)
    project_id = serializers.CharField(required=False, allow_null=True)
    shared_block_ids = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)

    def to_service_kwargs(self) -> dict[str, Any]:
        data = self.validated_data
        config = data.get("manager_config")
        return {
            "agent_ids": data.get("agent_ids"),
            "description": data.get("description"),
            "manager_config": {k: v for k, v in dict(config).items() if v is not None} if config else None,
            "shared_block_ids": data.get("shared_block_ids"),
            "project_id": data.get("project_id"),
        }


class GroupListQueryIn(serializers.Serializer):
    manager_type = serializers.ChoiceField(choices=ManagerType.choices, required=False, allow_null=True)
    project_id = serializers.CharField(required=False, allow_null=True)
    show_hidden_groups = serializers.BooleanField(required=False, default=False)
