"""Forms of the workspace's memory column: a block's edit, a new archival passage."""

from __future__ import annotations

from django import forms

from apps.ade.forms.base import AdeForm, text_field, unix_newlines


class BlockEditForm(AdeForm):
    """A person's edit of a block: the new value, and the version the editor showed (compare-and-set)."""

    value = text_field(strip=False)
    version = forms.IntegerField(
        error_messages={
            "required": "Reload the page: the edit form is stale.",
            "invalid": "Reload the page: the edit form is stale.",
        }
    )

    def clean_value(self) -> str:
        return unix_newlines(self.cleaned_data["value"])

    @property
    def draft(self) -> str:
        """The value as typed, kept in the editor when the edit is refused."""
        return unix_newlines(self.posted("value") or "")


class PassageForm(AdeForm):
    """A passage for archival memory; comma-separated tags. The service refuses empty text and bad tags."""

    text = text_field(strip=False)
    tags = text_field(strip=False)

    def clean_text(self) -> str:
        return unix_newlines(self.cleaned_data["text"])

    def clean_tags(self) -> list[str]:
        return [tag.strip() for tag in self.cleaned_data["tags"].split(",") if tag.strip()]

    def values(self) -> dict[str, str]:
        return super().values() | {"text": unix_newlines(self.posted("text") or "")}
