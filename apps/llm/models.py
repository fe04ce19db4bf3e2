from __future__ import annotations

from django.db import models

from apps.core.crypto import EncryptedTextField
from apps.core.ids import ID_MAX_LENGTH, new_provider_id
from apps.core.models import OrgOwnedModel


class Provider(OrgOwnedModel):
    """An organisation's LLM provider credential (Letta's BYOK provider). The key is encrypted at rest."""

    class Type(models.TextChoices):
        OPENAI = "openai", "OpenAI"
        ANTHROPIC = "anthropic", "Anthropic"
        OLLAMA = "ollama", "Ollama"
        OPENAI_COMPATIBLE = "openai_compatible", "OpenAI-compatible (vLLM, LM Studio, ...)"

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_provider_id, editable=False)
    name = models.CharField(
        max_length=100, help_text="Used as the handle prefix, e.g. 'openai' in openai/gpt-4o."
    )
    provider_type = models.CharField(max_length=32, choices=Type.choices)
    api_key = EncryptedTextField(
        blank=True, default="", help_text="Write-only; never shown again after saving."
    )
    base_url = models.URLField(blank=True, default="")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="provider_unique_name_per_org")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.provider_type})"
