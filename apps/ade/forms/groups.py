"""Forms of the group pages: a message to the group."""

from __future__ import annotations

from django import forms

from apps.ade.forms.base import AdeForm
from apps.ade.forms.conversation import MAX_MESSAGE_CHARS


class GroupMessageForm(AdeForm):
    """A message as the user, to every agent of the group (the group's pattern decides who answers)."""

    text = forms.CharField(
        max_length=MAX_MESSAGE_CHARS,
        error_messages={
            "required": "Write a message first.",
            "max_length": f"A message can have at most {MAX_MESSAGE_CHARS:,} characters.",
        },
    )

    def as_messages(self) -> list[dict[str, str]]:
        """What group_turn_create takes."""
        return [{"role": "user", "content": self.cleaned_data["text"]}]
