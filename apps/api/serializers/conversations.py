"""Wire shapes of the conversation and agent operations of issue 18: updating a conversation, compaction
(Letta's CompactionRequest / CompactionResponse), recompiling and one-shot generation.

The Conversation itself is `apps.api.serializers.messages.ConversationOut`. Request fields Letta
declares but this server does not use are accepted and ignored, as Letta ignores unknown ones.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.agents.services import Compaction, Generation
from apps.agents.wire import UsageStatistics

COMPACTION_MODES = ["all", "sliding_window", "self_compact_all", "self_compact_sliding_window"]


class ConversationUpdateIn(serializers.Serializer):
    """Letta's UpdateConversation. `model`, `model_settings` and `last_message_at` are passed on to the
    service, which refuses values it cannot store; `description`, `archived` and `context_window_limit`
    (SDK fields Letta 0.16.7 does not know) are ignored, as there."""

    summary = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=500)
    model = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    model_settings = serializers.DictField(required=False, allow_null=True)
    last_message_at = serializers.DateTimeField(required=False, allow_null=True)


class CompactionSettingsIn(serializers.Serializer):
    """Letta's CompactionSettings: `mode` and `prompt` are used (merged over the agent's settings); the
    summariser model, its settings, clipping and the window share are accepted and not used."""

    mode = serializers.ChoiceField(choices=COMPACTION_MODES, required=False)
    prompt = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    model = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    model_settings = serializers.DictField(required=False, allow_null=True)
    prompt_acknowledgement = serializers.BooleanField(required=False)
    clip_chars = serializers.IntegerField(required=False, allow_null=True)
    sliding_window_percentage = serializers.FloatField(required=False)


class CompactionRequestIn(serializers.Serializer):
    """Letta's CompactionRequest (body of .../compact, .../summarize and, optionally, .../recompile)."""

    agent_id = serializers.CharField(required=False, allow_null=True)
    compaction_settings = CompactionSettingsIn(required=False, allow_null=True)

    def settings(self) -> dict[str, Any] | None:
        """The fields of compaction_settings the request gave (Letta's model_fields_set)."""
        given = self.validated_data.get("compaction_settings")
        return dict(given) if given is not None else None


class CompactionOut(serializers.Serializer):
    """Letta's CompactionResponse."""

    summary = serializers.CharField(allow_blank=True)
    num_messages_before = serializers.IntegerField(source="messages_before")
    num_messages_after = serializers.IntegerField(source="messages_after")


def compaction_out(compaction: Compaction) -> dict[str, Any]:
    return dict(CompactionOut(compaction).data)


class RecompileQueryIn(serializers.Serializer):
    """Query of the recompile endpoints: `dry_run` answers the compiled system message without storing
    it; `update_timestamp` changes nothing (the loop compiles the message for every call)."""

    dry_run = serializers.BooleanField(required=False, default=False)
    update_timestamp = serializers.BooleanField(required=False, default=False)


class ForkQueryIn(serializers.Serializer):
    """Query of POST .../fork. `message_id` and `hidden` (SDK 1.12.1, unknown to Letta 0.16.7) are
    accepted and ignored, as there."""

    agent_id = serializers.CharField(required=False, allow_blank=True)
    message_id = serializers.CharField(required=False, allow_blank=True)
    hidden = serializers.BooleanField(required=False)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise serializers.ValidationError("prompt cannot be empty or whitespace-only")
    return value


class GenerateIn(serializers.Serializer):
    """Letta's GenerateRequest."""

    prompt = serializers.CharField(
        trim_whitespace=False,
        validators=[_not_blank],
        error_messages={"blank": "prompt cannot be empty or whitespace-only"},
    )
    system_prompt = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    override_model = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    response_schema = serializers.DictField(required=False, allow_null=True)


class GenerateOut(serializers.Serializer):
    """Letta's GenerateResponse: the text, the model's name and the call's usage."""

    content = serializers.CharField(allow_blank=True)
    model = serializers.CharField()
    usage = serializers.SerializerMethodField()

    def get_usage(self, generation: Generation) -> dict[str, Any]:
        # Letta counts no agent step and no run for it.
        return UsageStatistics(generation.prompt_tokens, generation.completion_tokens).event(details=True)
