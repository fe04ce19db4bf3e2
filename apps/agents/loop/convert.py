"""Stored messages -> what the LLM reads (OpenAI chat format) and what the API shows (Letta's message types).

Storage conventions (one row per message, as Letta stores them):
- user: content [{type: text, text}]
- assistant: content [{type: reasoning, reasoning}?, {type: text, text}?], tool_calls in OpenAI format
- tool: tool_call_id, name, content [{type: text, text: <packaged return the model saw>}],
  tool_returns [{tool_call_id, status, tool_return, stdout, stderr, sandbox}]
- approval: a request carries tool_calls (the calls awaiting a decision); a response carries approvals
- system: alerts the loop inserts (name says which); summary: the compaction summary
Pure: works on anything with the Message model's attributes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol


class StoredMessage(Protocol):
    id: str
    role: str
    content: list[dict[str, Any]]
    text: str
    name: str
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str
    tool_returns: list[dict[str, Any]] | None
    approvals: list[dict[str, Any]] | None
    approve: bool | None
    approval_request_id: str
    denial_reason: str
    otid: str
    sender_id: str
    created_at: datetime
    run_id: str | None
    step_id: str | None
    is_err: bool
    sequence_id: int


def text_of(content: Iterable[dict[str, Any]]) -> str:
    return "\n".join(part.get("text", "") for part in content if part.get("type") == "text")


def reasoning_of(content: Iterable[dict[str, Any]]) -> str:
    return "\n".join(part.get("reasoning", "") for part in content if part.get("type") == "reasoning")


def to_llm_messages(messages: Iterable[StoredMessage]) -> list[dict[str, Any]]:
    """In-context messages in OpenAI chat format. Alerts and summaries go in as user messages, since not
    every provider accepts a system message mid-conversation; approval responses have no LLM form (the
    tool messages that follow them carry the outcome)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.role
        if role == "user" or role in ("system", "summary"):
            out.append({"role": "user", "content": text_of(message.content)})
        elif role == "assistant" or (role == "approval" and message.tool_calls):
            entry: dict[str, Any] = {"role": "assistant", "content": text_of(message.content) or None}
            if message.tool_calls:
                entry["tool_calls"] = message.tool_calls
            elif entry["content"] is None:
                continue  # reasoning only: providers refuse an assistant message with neither text nor calls
            out.append(entry)
        elif role == "tool":
            out.append(
                {"role": "tool", "tool_call_id": message.tool_call_id, "content": text_of(message.content)}
            )
    return out


def _base(message: StoredMessage, message_type: str) -> dict[str, Any]:
    return {
        "id": message.id,
        "date": message.created_at.isoformat(),
        "message_type": message_type,
        "name": message.name or None,
        "otid": message.otid or None,
        "sender_id": message.sender_id or None,
        "step_id": message.step_id,
        "run_id": message.run_id,
        "is_err": message.is_err or None,
        "seq_id": message.sequence_id if isinstance(message.sequence_id, int) else None,
    }


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function", {})
    return {
        "name": function.get("name"),
        "arguments": function.get("arguments", ""),
        "tool_call_id": call.get("id"),
    }


def to_letta_messages(message: StoredMessage) -> list[dict[str, Any]]:
    """One stored message as the API's LettaMessage dicts (several may share the stored id)."""
    role = message.role
    if role == "user":
        return [{**_base(message, "user_message"), "content": text_of(message.content)}]
    if role == "system":
        return [{**_base(message, "system_message"), "content": text_of(message.content)}]
    if role == "summary":
        return [{**_base(message, "summary_message"), "summary": text_of(message.content)}]
    if role == "assistant":
        out = []
        if reasoning := reasoning_of(message.content):
            out.append(
                {
                    **_base(message, "reasoning_message"),
                    "reasoning": reasoning,
                    "source": "non_reasoner_model",
                }
            )
        for call in message.tool_calls or []:
            if call.get("function", {}).get("name") == "send_message":
                continue  # shown as the assistant_message below, as Letta does
            shaped = _tool_call(call)
            out.append({**_base(message, "tool_call_message"), "tool_call": shaped, "tool_calls": [shaped]})
        if text := (text_of(message.content) or send_message_text(message.tool_calls)):
            out.append({**_base(message, "assistant_message"), "content": text})
        return out
    if role == "tool":
        if message.name == "send_message":
            return []
        returns = message.tool_returns or []
        first = returns[0] if returns else {}
        return [
            {
                **_base(message, "tool_return_message"),
                "tool_return": first.get("tool_return", ""),
                "status": first.get("status", "success"),
                "tool_call_id": message.tool_call_id,
                "stdout": first.get("stdout") or None,
                "stderr": first.get("stderr") or None,
                "tool_returns": [{"type": "tool", **r} for r in returns],
            }
        ]
    if role == "approval" and message.tool_calls:
        calls = [_tool_call(c) for c in message.tool_calls]
        return [{**_base(message, "approval_request_message"), "tool_call": calls[0], "tool_calls": calls}]
    if role == "approval":
        approvals = message.approvals or []
        first = approvals[0] if approvals else {}
        return [
            {
                **_base(message, "approval_response_message"),
                "approvals": approvals,
                "approve": first.get("approve"),
                "approval_request_id": first.get("tool_call_id"),
                "reason": first.get("reason"),
            }
        ]
    return []


def send_message_text(tool_calls: list[dict[str, Any]] | None) -> str:
    """What a legacy agent said through send_message (its `message` argument), or ""."""
    for call in tool_calls or []:
        function = call.get("function", {})
        if function.get("name") == "send_message":
            try:
                return str(json.loads(function.get("arguments") or "{}").get("message", ""))
            except (ValueError, AttributeError):
                return ""
    return ""
