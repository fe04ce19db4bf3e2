"""Forms of the tool editor: a tool's source and settings, a test run's arguments."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from apps.ade.forms.base import AdeForm, text_field, unix_newlines
from apps.tools.models import DEFAULT_RETURN_CHAR_LIMIT


class SourceForm(AdeForm):
    """A tool's Python source, as the editor holds it (the schema preview posts only this)."""

    source_code = text_field(strip=False)

    def clean_source_code(self) -> str:
        return unix_newlines(self.cleaned_data["source_code"])


class ToolForm(SourceForm):
    """The editor's save: the source (its schema comes from the docstring, in the service), comma-separated
    tags, and the return character limit (empty: the default)."""

    tags = text_field()
    return_char_limit = text_field()

    def clean_tags(self) -> list[str]:
        tags = [tag.strip() for tag in self.cleaned_data["tags"].split(",") if tag.strip()]
        return list(dict.fromkeys(tags))

    def clean_return_char_limit(self) -> int:
        text: str = self.cleaned_data["return_char_limit"]
        if not text:
            return DEFAULT_RETURN_CHAR_LIMIT
        try:
            return int(text)
        except ValueError:
            raise forms.ValidationError(
                f"The return character limit must be a whole number, got '{text}'."
            ) from None

    def redisplay(self) -> dict[str, str]:
        """The editor's inputs as posted, for the full page of a refused save."""
        return {
            "source": self.posted("source_code") or "",
            "tags": self.posted("tags") or "",
            "return_char_limit": self.posted("return_char_limit") or "",
        }


class ToolRunForm(SourceForm):
    """A test run: the source and a JSON object of arguments (empty: none)."""

    args = text_field()

    def clean_args(self) -> dict[str, Any]:
        text = self.cleaned_data["args"] or "{}"
        try:
            args = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"The arguments are not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
            ) from None
        if not isinstance(args, dict):
            raise forms.ValidationError(
                'The arguments must be a JSON object of parameter names and values, e.g. {"sides": 6}.'
            )
        return args
