from __future__ import annotations

from django.db import models

from apps.core.crypto import EncryptedTextField
from apps.core.ids import ID_MAX_LENGTH, new_id, new_provider_id
from apps.core.models import CompressedTextField, OrgOwnedModel


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


def new_llm_call_id() -> str:
    return new_id("llm_call")


class LlmCall(OrgOwnedModel):
    """One LLM call of a run, as sent and as received (apps.llm.records): never a key or a header.

    The request and response are the JSON text as the provider got and answered it, each cut at
    LLM_RECORD_MAX_BYTES (`truncated` says so). Kept for the organisation's retention (LlmRecordPolicy)."""

    class Status(models.TextChoices):
        SUCCESS = "success"
        ERROR = "error"

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_llm_call_id, editable=False)
    # Ids, not foreign keys: a record outlives nothing it names, and apps.llm sits below apps.agents.
    agent_id = models.CharField(max_length=ID_MAX_LENGTH, blank=True, default="", db_index=True)
    run_id = models.CharField(max_length=ID_MAX_LENGTH, blank=True, default="", db_index=True)
    step_id = models.CharField(max_length=ID_MAX_LENGTH, blank=True, default="", db_index=True)
    model = models.CharField(max_length=300, blank=True, default="")
    model_handle = models.CharField(max_length=300, blank=True, default="")
    endpoint = models.CharField(max_length=500, blank=True, default="", help_text="As a tenant may see it.")
    streamed = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.SUCCESS)
    request_body = CompressedTextField(blank=True, default="")
    response_body = CompressedTextField(blank=True, default="")
    truncated = models.BooleanField(default=False, help_text="A body was longer than LLM_RECORD_MAX_BYTES.")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=1)
    cost_usd = models.FloatField(
        null=True, blank=True, help_text="From litellm's cost map, when it knows the model."
    )
    error_type = models.CharField(max_length=200, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    output_token_ids = models.JSONField(
        null=True, blank=True, help_text="When the send asked (return_token_ids)."
    )
    logprobs = models.JSONField(null=True, blank=True, help_text="When the send asked (return_logprobs).")

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["organization", "created_at"], name="llmcall_org_created_idx")]

    def __str__(self) -> str:
        return self.id


class LlmRecordPolicy(OrgOwnedModel):
    """How long an organisation's LLM call records are kept (default LLM_RECORD_RETENTION_DAYS)."""

    retention_days = models.PositiveIntegerField(
        help_text="Days LLM call records are kept; 0: removed at the next prune."
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organization"], name="llmrecordpolicy_one_per_org")]

    def __str__(self) -> str:
        return f"{self.retention_days} days"
