"""Forms of the agent pages: creating an agent from a starter template, importing an Agent File."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.files.uploadedfile import UploadedFile

from apps.ade.forms.base import AdeForm, UploadedFileField, checkbox_field, handle_field, text_field
from apps.ade.starter_templates import StarterTemplate, starter_template
from apps.agents import services as agent_services
from apps.core.actor import Actor
from apps.core.errors import DomainError

AGENT_FILE_MAX_BYTES = 20 * 1024 * 1024


class AgentCreateForm(AdeForm):
    """Every field is checked by the service's own validator, so all of a form's mistakes show at once."""

    template = text_field()
    name = text_field()
    model = handle_field()
    embedding = handle_field()
    system = text_field(strip=False)

    def __init__(self, *args: Any, actor: Actor, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actor = actor

    def clean_template(self) -> str:
        key: str = self.cleaned_data["template"]
        if starter_template(key) is None:
            raise forms.ValidationError("Choose one of the starter templates.")
        return key

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        if name:
            _validated(agent_services.validate_agent_name, name)
        return name

    def clean_model(self) -> str:
        model: str = self.cleaned_data["model"]
        _validated(lambda: agent_services.validate_model_available(actor=self.actor, model=model))
        return model

    def clean_embedding(self) -> str:
        embedding: str = self.cleaned_data["embedding"]
        _validated(lambda: agent_services.validate_handle(embedding, kind="embedding"))
        return embedding

    @property
    def starter(self) -> StarterTemplate:
        starter = starter_template(self.cleaned_data["template"])
        assert starter is not None  # clean_template
        return starter

    @property
    def system_prompt(self) -> str:
        """The prompt as typed, or "" (the default prompt) when it is only whitespace."""
        system: str = self.cleaned_data["system"]
        return system if system.strip() else ""


def _validated(check: Any, *args: Any) -> None:
    try:
        check(*args)
    except DomainError as exc:
        raise forms.ValidationError(exc.message) from exc


class AgentImportForm(AdeForm):
    file = UploadedFileField(error_messages={"required": "Choose an Agent File (.af) to import."})
    override_existing_tools = checkbox_field()

    def clean_file(self) -> UploadedFile:
        upload: UploadedFile = self.cleaned_data["file"]
        if upload.size is not None and upload.size > AGENT_FILE_MAX_BYTES:
            raise forms.ValidationError(
                f"This file is too large to import (over {AGENT_FILE_MAX_BYTES // (1024 * 1024)} MB)."
            )
        return upload
