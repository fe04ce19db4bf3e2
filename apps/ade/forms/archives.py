"""Forms of the archive pages: a new archive and a passage to add."""

from __future__ import annotations

from django import forms

from apps.ade.forms.base import AdeForm, handle_field, text_field, unix_newlines

TAGS_HELP = "comma-separated"


class ArchiveForm(AdeForm):
    """A new archive: the service refuses a blank or long name and an unknown embedding model. Without a
    model its passages are stored without vectors and found by text match."""

    name = text_field()
    description = text_field(strip=False)
    embedding = handle_field()

    def clean_description(self) -> str:
        return unix_newlines(self.cleaned_data["description"]).strip()


class PassageForm(AdeForm):
    text = forms.CharField(strip=False, error_messages={"required": "Write the passage's text."})
    tags = text_field()

    def clean_text(self) -> str:
        text = unix_newlines(self.cleaned_data["text"])
        if not text.strip():
            raise forms.ValidationError("Write the passage's text.")
        return text

    def clean_tags(self) -> list[str]:
        return [tag.strip() for tag in self.cleaned_data["tags"].split(",") if tag.strip()]


class PassageSearchForm(AdeForm):
    q = text_field()
