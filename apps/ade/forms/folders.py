"""Forms of the folder pages and the workspace's folders panel."""

from __future__ import annotations

from django import forms

from apps.ade.forms.base import AdeForm, UploadedFilesField, handle_field, text_field, unix_newlines


class FolderForm(AdeForm):
    """A new folder: the service refuses a bad or taken name and a missing or unknown embedding model."""

    name = text_field()
    description = text_field(strip=False)
    embedding = handle_field()

    def clean_description(self) -> str:
        return unix_newlines(self.cleaned_data["description"]).strip()

    def values(self) -> dict[str, str]:
        return super().values() | {"description": unix_newlines(self.posted("description") or "").strip()}


class FolderUploadForm(AdeForm):
    """One file (folders.js sends them one by one, for progress) or several (the page without JavaScript);
    each goes through the service on its own."""

    file = UploadedFilesField(error_messages={"required": "Choose one or more files to upload."})


class FolderAttachForm(AdeForm):
    folder = forms.CharField(error_messages={"required": "Choose a folder to attach."})
