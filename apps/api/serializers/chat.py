"""Wire shapes of POST /v1/chat/completions: OpenAI's chat completion request, `chat.completion` and
`chat.completion.chunk` (what the official `openai` client parses), built from an agent run.

`model` names the agent. Only the last user message is sent: the agent keeps the conversation itself
(Letta's rule); earlier messages of the request are ignored. Sampling parameters are validated as
Letta does and otherwise ignored: the agent's own model settings apply. The answer is the text of the
agent's assistant messages in the run, in order, separated by a blank line; tool calls, their returns
and reasoning stay inside the agent.
"""

from __future__ import annotations

import json
from typing import Any

from rest_framework import serializers

from apps.core.errors import InvalidInput

MESSAGE_SEPARATOR = "\n\n"
"""Between two assistant messages of one run (a model may speak in a step that also calls a tool)."""
FINISH_REASONS = {"max_steps": "length", "max_tokens_exceeded": "length"}
"""Run stop reasons that are not OpenAI's "stop"."""


class ChatCompletionIn(serializers.Serializer):
    model = serializers.CharField(max_length=200, help_text="The id of the agent (agent-...)")
    messages = serializers.ListField(child=serializers.DictField(), min_length=1)
    stream = serializers.BooleanField(required=False, allow_null=True, default=False)
    stream_options = serializers.DictField(required=False, allow_null=True)
    n = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=1, help_text="One choice only"
    )
    temperature = serializers.FloatField(required=False, allow_null=True, min_value=0, max_value=2)
    top_p = serializers.FloatField(required=False, allow_null=True, min_value=0, max_value=1)
    presence_penalty = serializers.FloatField(required=False, allow_null=True, min_value=-2, max_value=2)
    frequency_penalty = serializers.FloatField(required=False, allow_null=True, min_value=-2, max_value=2)
    max_tokens = serializers.IntegerField(required=False, allow_null=True)
    stop = serializers.JSONField(required=False, allow_null=True)
    user = serializers.CharField(required=False, allow_null=True, allow_blank=True)

    def agent_id(self) -> str:
        """Raises InvalidInput (400, Letta's answer) for a model that is not an agent id."""
        model = self.validated_data["model"]
        if not model.startswith("agent-"):
            raise InvalidInput(
                "For this endpoint, the 'model' field should contain an agent ID (format: 'agent-...'). "
                f"Received: '{model}'"
            )
        return str(model)

    def user_content(self) -> str | list[dict[str, str]]:
        """The content of the last user message, as a string or text parts. Raises InvalidInput (400, as
        Letta) when there is no user message, a ValidationError (422) for content that is not text."""
        last = next((m for m in reversed(self.validated_data["messages"]) if m.get("role") == "user"), None)
        if last is None:
            raise InvalidInput(
                "No user message found in the request. Please include at least one message with role='user'."
            )
        content = last.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list) and content:
            parts = []
            for part in content:
                if (
                    not isinstance(part, dict)
                    or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                ):
                    raise serializers.ValidationError(
                        {"messages": "Only text content parts ({'type': 'text', 'text': ...}) are supported."}
                    )
                parts.append({"type": "text", "text": part["text"]})
            return parts
        raise serializers.ValidationError({"messages": "The last user message needs text content."})

    def include_usage(self) -> bool:
        options = self.validated_data.get("stream_options") or {}
        return bool(options.get("include_usage"))


def message_text(message: dict[str, Any]) -> str:
    """The text of an assistant_message (its content is a string or a list of text parts)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def finish_reason(stop_reason: str | None) -> str:
    return FINISH_REASONS.get(stop_reason or "", "stop")


def usage(statistics: dict[str, Any] | None) -> dict[str, int]:
    statistics = statistics or {}
    prompt = int(statistics.get("prompt_tokens") or 0)
    completion = int(statistics.get("completion_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": int(statistics.get("total_tokens") or prompt + completion),
    }


def chat_completion(
    letta_response: dict[str, Any], *, completion_id: str, model: str, created: int
) -> dict[str, Any]:
    """A `chat.completion` from a LettaResponse holding only the run's assistant messages."""
    texts = [message_text(m) for m in letta_response.get("messages") or []]
    stop_reason = (letta_response.get("stop_reason") or {}).get("stop_reason")
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": MESSAGE_SEPARATOR.join(t for t in texts if t),
                    "refusal": None,
                },
                "finish_reason": finish_reason(stop_reason),
                "logprobs": None,
            }
        ],
        "usage": usage(letta_response.get("usage")),
        "system_fingerprint": None,
    }


def chunk(
    *,
    completion_id: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    usage_: dict[str, int] | None = None,
) -> bytes:
    """One `chat.completion.chunk` as an SSE event. With `usage_`: the usage chunk (no choices)."""
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
    }
    if usage_ is not None:
        body |= {"choices": [], "usage": usage_}
    else:
        body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": None}]
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


def error_event(message: str, kind: str) -> bytes:
    """An error inside a stream, in OpenAI's shape (the `openai` client raises APIError for it)."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n".encode()
