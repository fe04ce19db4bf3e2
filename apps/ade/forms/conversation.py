"""Forms of the workspace's conversation column: a message to send, a new conversation, approval decisions."""

from __future__ import annotations

from typing import Any

from django import forms

from apps.ade.forms.base import AdeForm, text_field

MAX_MESSAGE_CHARS = 100_000
MAX_SUMMARY_CHARS = 500
MAX_REASON_CHARS = 2000
DECISIONS = ("approve", "deny")


class MessageForm(AdeForm):
    """A message as the user, or as a system event (`role=system`)."""

    text = forms.CharField(
        max_length=MAX_MESSAGE_CHARS,
        error_messages={
            "required": "Write a message first.",
            "max_length": f"A message can have at most {MAX_MESSAGE_CHARS:,} characters.",
        },
    )
    role = text_field()

    def clean_role(self) -> str:
        return "system" if self.cleaned_data["role"] == "system" else "user"


class ConversationForm(AdeForm):
    summary = text_field()

    def clean_summary(self) -> str:
        summary: str = self.cleaned_data["summary"]
        return summary[:MAX_SUMMARY_CHARS]


class ApprovalForm(AdeForm):
    """One decision per pending tool call. "Approve all" / "Deny all" post `decision` (and `reason`) for
    every call; "Submit decisions" posts `decision_<call id>` and `reason_<call id>` per call. The cleaned
    `approvals` are what run_create takes (for the request pending_approval_for found)."""

    decision = text_field()
    reason = text_field()

    def __init__(self, *args: Any, calls: list[dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = calls
        for call in calls:
            self.fields[f"decision_{call['id']}"] = text_field()
            self.fields[f"reason_{call['id']}"] = text_field()

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        overall = data.get("decision") if data.get("decision") in DECISIONS else None
        approvals = []
        for call in self.calls:
            choice = overall or data.get(f"decision_{call['id']}")
            if choice not in DECISIONS:
                raise forms.ValidationError("Choose approve or deny for every tool call.")
            reason = (data.get("reason") if overall else data.get(f"reason_{call['id']}")) or ""
            approve = choice == "approve"
            approvals.append(
                {
                    "type": "approval",
                    "tool_call_id": call["id"],
                    "approve": approve,
                    "reason": None if approve else (reason[:MAX_REASON_CHARS] or None),
                }
            )
        data["approvals"] = approvals
        return data
