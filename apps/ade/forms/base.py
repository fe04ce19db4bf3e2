"""What every ADE form shares: errors as the templates show them, posted values to re-render, and the few
widgets the ADE's hand-written markup needs.

The forms check the *shape* of what was posted (present, a number, JSON, within the page's limits) and turn
it into service arguments; whether it makes sense (a valid agent name, a model a provider serves, a rule
that contradicts no other) is the services' to say. A view binds a form, answers its errors when it is not
valid, calls the service with `cleaned_data` otherwise, and puts a DomainError back on the form with
`add_domain_error` to answer it like any other error.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS
from django.core.files.uploadedfile import UploadedFile
from django.utils.datastructures import MultiValueDict

from apps.core.errors import DomainError

FORM_ERROR = "form"
"""The key under which the templates show an error about the whole form (Django's `__all__`)."""


class AdeForm(forms.Form):
    """A form whose markup lives in the ADE's templates: they read `values()` and `error_map()` (plain
    strings), not bound fields."""

    def error_map(self) -> dict[str, str]:
        """Field -> its first message; an error of the whole form under FORM_ERROR."""
        return {
            FORM_ERROR if name == NON_FIELD_ERRORS else name: str(errors[0])
            for name, errors in self.errors.items()
        }

    @property
    def first_error(self) -> str:
        """The message of a form whose template shows one error at a time ("" when valid)."""
        return next(iter(self.error_map().values()), "")

    def add_domain_error(self, error: DomainError, field: str | None = None) -> None:
        """The service's refusal, shown as the form's own error (on `field`, or on the whole form)."""
        self.add_error(field, error.message)

    def posted(self, name: str) -> Any:
        """What was posted for a field, as its widget reads it (for re-rendering a refused form)."""
        return self[name].data

    def values(self) -> dict[str, Any]:
        """Every field's posted value, stripped where the field strips: what a refused form shows again."""
        values: dict[str, Any] = {}
        for name, field in self.fields.items():
            raw = self.posted(name)
            if isinstance(raw, str) and getattr(field, "strip", False):
                raw = raw.strip()
            values[name] = "" if raw is None else raw
        return values


class HandlePicker(forms.TextInput):
    """ade/agents/_handle_picker.html: a select of the providers' models (`<name>`) plus a free handle
    (`<name>_other`); a typed handle wins over the selected one."""

    def value_from_datadict(self, data: Any, files: MultiValueDict[str, UploadedFile], name: str) -> str:
        return (data.get(f"{name}_other", "").strip() or data.get(name, "")).strip()

    def value_omitted_from_data(self, data: Any, files: MultiValueDict[str, UploadedFile], name: str) -> bool:
        return False


def handle_field() -> forms.CharField:
    """A model or embedding handle from a HandlePicker ("" when none was chosen)."""
    return forms.CharField(required=False, widget=HandlePicker)


class OnCheckbox(forms.CheckboxInput):
    """A checkbox the templates post as "on" when ticked: anything else is unticked."""

    def value_from_datadict(self, data: Any, files: MultiValueDict[str, UploadedFile], name: str) -> bool:
        return bool(data.get(name) == "on")


def checkbox_field() -> forms.BooleanField:
    return forms.BooleanField(required=False, widget=OnCheckbox)


def text_field(*, strip: bool = True, **kwargs: Any) -> forms.CharField:
    """Optional text; with `strip=False` kept as typed (prompts, block values, code)."""
    return forms.CharField(required=False, strip=strip, **kwargs)


def unix_newlines(text: str) -> str:
    """Browsers post textareas with CRLF line ends; what is stored has LF."""
    return text.replace("\r\n", "\n")


class FileUpload(forms.FileInput):
    allow_multiple_selected = True


class UploadedFilesField(forms.Field):
    """Every file posted under the field's name, as they came: the services decide what they accept (an
    empty file included), so nothing here refuses one."""

    widget = FileUpload

    def to_python(self, value: Any) -> list[UploadedFile]:
        return list(value or [])


class UploadedFileField(forms.Field):
    """One posted file, as it came (see UploadedFilesField)."""

    widget = forms.FileInput
