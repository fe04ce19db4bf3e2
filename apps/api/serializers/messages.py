"""Wire shapes of message sending (LettaRequest), runs, steps and conversations.

LettaRequest is parsed into a `SendRequest`: the user messages as MessageIn, the approval decisions in
the shape `apps.agents.services.run_create` takes, and the streaming options. Shape errors are 422s
(the ValidationError handler); domain errors (a bad approval) stay 400s from the services.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.agents.models import FEEDBACK_NOTE_MAX_CHARS, Conversation, Run, Step, StopReason
from apps.agents.services import DEFAULT_MAX_STEPS, MessageIn
from apps.agents.wire import with_thread_system_message
from apps.api.serializers.strict import refuse_unsupported
from apps.llm.selectors import endpoint_for_tenants

MAX_OVERRIDE_SYSTEM_CHARS = 200_000  # a system prompt, not a document: the request body cap is larger

MESSAGE_TYPES = [
    "system_message",
    "user_message",
    "assistant_message",
    "reasoning_message",
    "hidden_reasoning_message",
    "tool_call_message",
    "tool_return_message",
    "approval_request_message",
    "approval_response_message",
    "summary_message",
    "event_message",
]
CONTENT_PART_TYPES = frozenset(
    {
        "text",
        "image",
        "tool_call",
        "tool_return",
        "reasoning",
        "redacted_reasoning",
        "omitted_reasoning",
        "summarized_reasoning",
    }
)


# --- LettaRequest ------------------------------------------------------------------------------------------


@dataclass
class SendRequest:
    """A parsed LettaRequest."""

    messages: list[MessageIn] = field(default_factory=list)
    approvals: list[dict[str, Any]] | None = None
    max_steps: int | None = None  # None: DEFAULT_MAX_STEPS, within the organisation's step limit
    include_return_message_types: frozenset[str] | None = None
    streaming: bool = False
    stream_tokens: bool = False
    include_pings: bool = True
    background: bool = False
    client_tools: list[dict[str, Any]] = field(default_factory=list)
    callback_url: str = ""
    override_model: str | None = None
    override_system: str | None = None
    client_skills: list[dict[str, str]] = field(default_factory=list)
    include_compaction_messages: bool = False
    return_logprobs: bool = False
    top_logprobs: int | None = None
    return_token_ids: bool = False

    @property
    def otids(self) -> list[str]:
        return [m.otid for m in self.messages if m.otid]

    def run_inputs(self) -> dict[str, Any]:
        """Keyword arguments for apps.agents.services.run_create."""
        return {
            "messages": self.messages,
            "approvals": self.approvals,
            "max_steps": self.max_steps,
            "client_tools": self.client_tools,
            "stream_tokens": self.stream_tokens,
            "background": self.background,
            "callback_url": self.callback_url,
            "include_return_message_types": sorted(self.include_return_message_types)
            if self.include_return_message_types
            else None,
            "override_model": self.override_model,
            "override_system": self.override_system,
            "client_skills": self.client_skills,
            "include_compaction_messages": self.include_compaction_messages,
            "return_logprobs": self.return_logprobs,
            "top_logprobs": self.top_logprobs,
            "return_token_ids": self.return_token_ids,
        }


class ClientSkillIn(serializers.Serializer):
    """Letta's ClientSkillSchema: a skill the client's environment has, listed in the system prompt."""

    name = serializers.CharField(max_length=200)
    description = serializers.CharField(max_length=4000, allow_blank=True)
    location = serializers.CharField(max_length=1000, allow_blank=True)


SEND_UNSUPPORTED: dict[str, str] = {}


class ClientToolIn(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    parameters = serializers.DictField(required=False, allow_null=True)


class LettaRequestIn(serializers.Serializer):
    """Letta's LettaRequest (letta_api.md 4.3). Its deprecated fields (use_assistant_message,
    assistant_message_tool_name/kwarg, enable_thinking) are accepted and, as on Letta for letta_v1_agent,
    have no effect; the fields of SEND_UNSUPPORTED are refused with a 422 naming them."""

    messages = serializers.ListField(child=serializers.DictField(), required=False, allow_null=True)
    input = serializers.JSONField(required=False, allow_null=True)
    # At most the organisation's step limit (MAX_STEPS_LIMIT, or its own), checked by run_create (422).
    max_steps = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        default=None,
        help_text=f"Default {DEFAULT_MAX_STEPS}; at most the organisation's step limit.",
    )
    include_return_message_types = serializers.ListField(
        child=serializers.ChoiceField(choices=MESSAGE_TYPES), required=False, allow_null=True
    )
    streaming = serializers.BooleanField(required=False, default=False)
    stream_tokens = serializers.BooleanField(required=False, default=False)
    include_pings = serializers.BooleanField(required=False, default=True)
    background = serializers.BooleanField(required=False, default=False)
    client_tools = ClientToolIn(many=True, required=False, allow_null=True)
    callback_url = serializers.URLField(required=False, allow_null=True, allow_blank=True)
    override_model = serializers.CharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        max_length=500,
        help_text="A model handle for this request instead of the agent's (the agent is not changed).",
    )
    override_system = serializers.CharField(
        required=False,
        allow_null=True,
        trim_whitespace=False,
        max_length=MAX_OVERRIDE_SYSTEM_CHARS,
        help_text="This request's system prompt, sent to the model instead of the compiled system message.",
    )
    client_skills = ClientSkillIn(many=True, required=False, allow_null=True, max_length=200)
    include_compaction_messages = serializers.BooleanField(required=False, default=False)
    return_logprobs = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Ask the model for the output tokens' log probabilities; the last call's are in `logprobs`.",
    )
    top_logprobs = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=20)
    return_token_ids = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Ask the model for each call's output token ids (vLLM and SGLang return them); they and the "
        "logprobs of every call are in `turns`, with the tool results.",
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        refuse_unsupported(data, SEND_UNSUPPORTED)
        if isinstance(data, Mapping) and "system" in data and "override_system" not in data:
            data = {**data, "override_system": data["system"]}  # Letta's alias
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        has_messages = attrs.get("messages") is not None
        has_input = attrs.get("input") is not None
        if has_messages == has_input:
            raise serializers.ValidationError({"messages": "Give exactly one of 'messages' or 'input'."})
        if has_messages and not attrs["messages"]:
            raise serializers.ValidationError({"messages": "At least one message is required."})
        if has_input:
            attrs["parsed"] = ([MessageIn(content=_content(attrs["input"], "input"))], None)
        else:
            attrs["parsed"] = _parse_items(attrs["messages"])
        if attrs.get("top_logprobs") is not None and not attrs.get("return_logprobs"):
            raise serializers.ValidationError({"top_logprobs": "Requires return_logprobs=true."})
        otids = [m.otid for m in attrs["parsed"][0] if m.otid]
        if len(otids) != len(set(otids)):  # each otid takes one message (message_otid_once_per_conversation)
            raise serializers.ValidationError({"messages": "Two messages have the same otid."})
        return attrs

    def to_request(self) -> SendRequest:
        data = self.validated_data
        messages, approvals = data["parsed"]
        types = data.get("include_return_message_types")
        return SendRequest(
            messages=messages,
            approvals=approvals,
            max_steps=data["max_steps"],
            include_return_message_types=frozenset(types) if types is not None else None,
            streaming=data["streaming"],
            stream_tokens=data["stream_tokens"],
            include_pings=data["include_pings"],
            background=data["background"],
            client_tools=[
                {k: v for k, v in dict(t).items() if v is not None} for t in data.get("client_tools") or []
            ],
            callback_url=data.get("callback_url") or "",
            override_model=(data.get("override_model") or "").strip() or None,
            override_system=data.get("override_system"),
            client_skills=[dict(skill) for skill in data.get("client_skills") or []],
            include_compaction_messages=data["include_compaction_messages"],
            return_logprobs=data["return_logprobs"],
            top_logprobs=data.get("top_logprobs"),
            return_token_ids=data["return_token_ids"],
        )


def _content(value: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        for index, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") not in CONTENT_PART_TYPES:
                raise serializers.ValidationError(
                    {
                        where: f"Part {index} must be an object whose type is one of {sorted(CONTENT_PART_TYPES)}."
                    }
                )
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise serializers.ValidationError({where: f"Text part {index} needs a string 'text'."})
        return [dict(part) for part in value]
    raise serializers.ValidationError(
        {where: "Content must be a string or a non-empty list of content parts."}
    )


def _parse_items(items: list[dict[str, Any]]) -> tuple[list[MessageIn], list[dict[str, Any]] | None]:
    """MessageCreate, ApprovalCreate and ToolReturnCreate items; `type` is inferred as Letta does."""
    messages: list[MessageIn] = []
    approvals: list[dict[str, Any]] | None = None
    for index, item in enumerate(items):
        where = f"messages.{index}"
        kind = item.get("type") or (
            "approval" if {"approve", "approval_request_id", "approvals"} & set(item) else "message"
        )
        if kind == "message":
            messages.append(_message_create(item, where))
        elif kind == "approval":
            approvals = [*(approvals or []), *_approval_create(item, where)]
        elif kind == "tool_return":
            returns = item.get("tool_returns")
            if not isinstance(returns, list) or not returns:
                raise serializers.ValidationError(
                    {where: "A tool_return item needs a non-empty 'tool_returns'."}
                )
            approvals = [*(approvals or []), *(_decision({"type": "tool", **r}, where) for r in returns)]
        else:
            raise serializers.ValidationError(
                {where: f"Unknown item type {kind!r}; expected message, approval or tool_return."}
            )
    return messages, approvals


def _message_create(item: dict[str, Any], where: str) -> MessageIn:
    role = item.get("role")
    if role not in ("user", "system", "assistant"):
        raise serializers.ValidationError({where: "role must be one of user, system, assistant."})
    if "content" not in item:
        raise serializers.ValidationError({where: "content is required."})
    return MessageIn(
        content=_content(item["content"], f"{where}.content"),
        role=role,
        otid=_text(item.get("otid")),
        name=_text(item.get("name")),
        sender_id=_text(item.get("sender_id")),
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _approval_create(item: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """ApprovalCreate: an `approvals` list, or the legacy {approve, approval_request_id, reason} form."""
    if item.get("approvals") is not None:
        if not isinstance(item["approvals"], list) or not item["approvals"]:
            raise serializers.ValidationError({where: "approvals must be a non-empty list."})
        return [_decision(decision, where) for decision in item["approvals"]]
    if "approve" not in item or not item.get("approval_request_id"):
        raise serializers.ValidationError(
            {where: "An approval needs 'approvals', or 'approve' with 'approval_request_id'."}
        )
    legacy = {
        "type": "approval",
        "tool_call_id": item["approval_request_id"],
        "approve": item["approve"],
        "reason": item.get("reason"),
    }
    return [_decision(legacy, where)]


def _decision(decision: Any, where: str) -> dict[str, Any]:
    """ApprovalReturn {type: approval, tool_call_id, approve, reason?} or ToolReturn {type: tool,
    tool_call_id, status, tool_return, stdout?, stderr?}."""
    if not isinstance(decision, dict) or not isinstance(decision.get("tool_call_id"), str):
        raise serializers.ValidationError({where: "Each approval needs a string 'tool_call_id'."})
    kind = decision.get("type") or ("tool" if "tool_return" in decision else "approval")
    if kind == "approval":
        if not isinstance(decision.get("approve"), bool):
            raise serializers.ValidationError({where: "An approval needs 'approve': true or false."})
        out = {"type": "approval", "tool_call_id": decision["tool_call_id"], "approve": decision["approve"]}
        if decision.get("reason") is not None:
            out["reason"] = str(decision["reason"])
        return out
    if kind == "tool":
        if decision.get("status", "success") not in ("success", "error") or "tool_return" not in decision:
            raise serializers.ValidationError(
                {where: "A tool return needs 'tool_return' and a status of 'success' or 'error'."}
            )
        return {
            "type": "tool",
            "tool_call_id": decision["tool_call_id"],
            "status": decision.get("status", "success"),
            "tool_return": decision["tool_return"],
            "stdout": decision.get("stdout") or [],
            "stderr": decision.get("stderr") or [],
        }
    raise serializers.ValidationError({where: f"Unknown approval type {kind!r}; expected approval or tool."})


class CancelIn(serializers.Serializer):
    run_ids = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)


class ResetMessagesIn(serializers.Serializer):
    add_default_initial_messages = serializers.BooleanField(required=False, default=False)


class RunStreamIn(serializers.Serializer):
    """Body of POST /v1/runs/{run_id}/stream (also read from the query string of GET)."""

    starting_after = serializers.IntegerField(required=False, min_value=0, default=0, allow_null=True)
    include_pings = serializers.BooleanField(required=False, default=True, allow_null=True)
    poll_interval = serializers.FloatField(required=False, allow_null=True)
    batch_size = serializers.IntegerField(required=False, allow_null=True)
    agent_id = serializers.CharField(required=False, allow_null=True)
    run_id = serializers.CharField(required=False, allow_null=True)
    otid = serializers.CharField(required=False, allow_null=True)


class StepFeedbackIn(serializers.Serializer):
    feedback = serializers.ChoiceField(
        choices=[c.value for c in Step.Feedback], required=False, allow_null=True
    )
    tags = serializers.ListField(child=serializers.CharField(max_length=100), required=False, allow_null=True)
    # An extension (Letta's ModifyFeedbackRequest has feedback and tags only): a person's words with it.
    note = serializers.CharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        max_length=FEEDBACK_NOTE_MAX_CHARS,
        trim_whitespace=False,
    )


CONVERSATION_CREATE_UNSUPPORTED = {
    "isolated_block_labels": "a conversation shares its agent's blocks on this server",
    "model": "a conversation runs with its agent's model on this server",
    "model_settings": "a conversation runs with its agent's model settings on this server",
}


class ConversationCreateIn(serializers.Serializer):
    """Letta's CreateConversation: `summary` is kept; what this server does not do is refused by name."""

    summary = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=500)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        refuse_unsupported(self.initial_data, CONVERSATION_CREATE_UNSUPPORTED)
        return attrs


# --- Output ------------------------------------------------------------------------------------------------


def _blank_to_none(value: str) -> str | None:
    return value or None


class RunOut(serializers.Serializer):
    """Letta's Run (letta_api.md 5.4)."""

    id = serializers.CharField()
    agent_id = serializers.CharField()
    status = serializers.CharField()
    stop_reason = serializers.SerializerMethodField()
    background = serializers.BooleanField()
    conversation_id = serializers.CharField(allow_null=True)
    callback_url = serializers.SerializerMethodField()
    callback_sent_at = serializers.SerializerMethodField()
    callback_status_code = serializers.SerializerMethodField()
    callback_error = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    completed_at = serializers.DateTimeField(allow_null=True)
    metadata = serializers.SerializerMethodField()
    request_config = serializers.SerializerMethodField()
    total_duration_ns = serializers.IntegerField(allow_null=True)
    ttft_ns = serializers.IntegerField(allow_null=True)
    base_template_id = serializers.SerializerMethodField()

    def get_stop_reason(self, run: Run) -> str | None:
        return _blank_to_none(run.stop_reason)

    def get_callback_url(self, run: Run) -> str | None:
        return _blank_to_none(run.callback_url)

    def get_callback_sent_at(self, run: Run) -> datetime | None:
        return None

    def get_callback_status_code(self, run: Run) -> int | None:
        return None

    def get_callback_error(self, run: Run) -> str | None:
        return None

    def get_metadata(self, run: Run) -> dict[str, Any]:
        metadata = dict(run.metadata or {})
        if run.error:
            metadata.setdefault("error", run.error)
        return metadata

    def get_request_config(self, run: Run) -> dict[str, Any]:
        config = run.request_config or {}
        return {
            "use_assistant_message": True,
            "assistant_message_tool_name": "send_message",
            "assistant_message_tool_kwarg": "message",
            "include_return_message_types": config.get("include_return_message_types"),
            "max_steps": config.get("max_steps"),
            "stream_tokens": bool(config.get("stream_tokens")),
        }

    def get_base_template_id(self, run: Run) -> str | None:
        return None


class StepOut(serializers.Serializer):
    """Letta's Step (letta_api.md 5.9); the deprecated `messages` field is left out."""

    id = serializers.CharField()
    agent_id = serializers.CharField()
    run_id = serializers.CharField(allow_null=True)
    status = serializers.CharField()
    stop_reason = serializers.SerializerMethodField()
    model = serializers.CharField()
    model_endpoint = serializers.SerializerMethodField()
    model_handle = serializers.SerializerMethodField()
    provider_name = serializers.SerializerMethodField()
    provider_category = serializers.SerializerMethodField()
    context_window_limit = serializers.IntegerField(allow_null=True)
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()
    cached_input_tokens = serializers.IntegerField(allow_null=True)
    reasoning_tokens = serializers.IntegerField(allow_null=True)
    completion_tokens_details = serializers.SerializerMethodField()
    feedback = serializers.SerializerMethodField()
    feedback_note = serializers.SerializerMethodField()
    tags = serializers.ListField(child=serializers.CharField())
    error_type = serializers.SerializerMethodField()
    error_data = serializers.JSONField(allow_null=True)
    trace_id = serializers.SerializerMethodField()
    origin = serializers.SerializerMethodField()
    project_id = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    def get_stop_reason(self, step: Step) -> str | None:
        return _blank_to_none(step.stop_reason)

    def get_model_endpoint(self, step: Step) -> str | None:
        return endpoint_for_tenants(step.model_endpoint)  # never a deployment-configured host

    def get_model_handle(self, step: Step) -> str | None:
        return _blank_to_none(step.model_handle)

    def get_provider_name(self, step: Step) -> str | None:
        return _blank_to_none(step.provider_name)

    def get_provider_category(self, step: Step) -> str | None:
        return None

    def get_completion_tokens_details(self, step: Step) -> dict[str, Any] | None:
        return {"reasoning_tokens": step.reasoning_tokens} if step.reasoning_tokens is not None else None

    def get_feedback(self, step: Step) -> str | None:
        return _blank_to_none(step.feedback)

    def get_feedback_note(self, step: Step) -> str | None:
        return _blank_to_none(step.feedback_note)

    def get_error_type(self, step: Step) -> str | None:
        return _blank_to_none(step.error_type)

    def get_trace_id(self, step: Step) -> str | None:
        return None

    def get_origin(self, step: Step) -> str | None:
        return None

    def get_project_id(self, step: Step) -> str | None:
        return None


class ConversationOut(serializers.Serializer):
    """Letta's Conversation (letta_api.md 3.9)."""

    id = serializers.CharField()
    agent_id = serializers.CharField()
    summary = serializers.CharField(allow_blank=True)
    description = serializers.SerializerMethodField()
    archived = serializers.SerializerMethodField()
    archived_at = serializers.SerializerMethodField()
    in_context_message_ids = serializers.SerializerMethodField()
    created_by_id = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_in_context_message_ids(self, conversation: Conversation) -> list[str]:
        """The context as Letta lists it: the conversation's stored system message first."""
        return with_thread_system_message(conversation.agent_id, conversation.id, conversation.message_ids)

    def get_description(self, conversation: Conversation) -> str | None:
        return None

    def get_archived(self, conversation: Conversation) -> bool:
        return False

    def get_archived_at(self, conversation: Conversation) -> datetime | None:
        return None


class UsageOut(serializers.Serializer):
    """GET /v1/runs/{run_id}/usage."""

    completion_tokens = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()
    completion_tokens_details = serializers.DictField()
    prompt_tokens_details = serializers.DictField()


def usage_out(totals: dict[str, int | None]) -> dict[str, Any]:
    return {
        "completion_tokens": totals["completion_tokens"],
        "prompt_tokens": totals["prompt_tokens"],
        "total_tokens": totals["total_tokens"],
        "completion_tokens_details": {"reasoning_tokens": totals["reasoning_tokens"]},
        "prompt_tokens_details": {
            "cached_tokens": totals["cached_input_tokens"],
            "cache_read_tokens": totals["cached_input_tokens"],
            "cache_creation_tokens": None,
        },
    }


STOP_REASONS = [r.value for r in StopReason]
