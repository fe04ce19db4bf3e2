from __future__ import annotations

from django.db import models

from apps.core.crypto import EncryptedTextField
from apps.core.ids import ID_MAX_LENGTH, new_sandbox_config_id, new_sandbox_env_id
from apps.core.models import OrgOwnedModel


class SandboxConfig(OrgOwnedModel):
    """How an organisation's custom tools run: image, pip requirements, limits, network."""

    class Type(models.TextChoices):
        DOCKER = "docker", "Docker container"
        LOCAL = "local", "Local jail (bubblewrap: no network, own uid and processes)"

    id = models.CharField(
        primary_key=True, max_length=ID_MAX_LENGTH, default=new_sandbox_config_id, editable=False
    )
    sandbox_type = models.CharField(max_length=16, choices=Type.choices, default=Type.DOCKER)
    image = models.CharField(
        max_length=300, blank=True, default="", help_text="Base image; empty = server default."
    )
    pip_requirements = models.JSONField(default=list, blank=True)
    network_enabled = models.BooleanField(default=False)
    memory_mb = models.PositiveIntegerField(default=256)
    cpus = models.FloatField(default=1.0)
    pids_limit = models.PositiveIntegerField(default=64)
    timeout_seconds = models.PositiveIntegerField(default=30)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "sandbox_type"], name="sandbox_config_one_per_type"
            )
        ]

    def __str__(self) -> str:
        return f"{self.get_sandbox_type_display()} sandbox"


class SandboxEnvironmentVariable(OrgOwnedModel):
    """Injected into the sandbox when a tool runs. The value is encrypted and never shown again."""

    id = models.CharField(
        primary_key=True, max_length=ID_MAX_LENGTH, default=new_sandbox_env_id, editable=False
    )
    sandbox_config = models.ForeignKey(SandboxConfig, on_delete=models.CASCADE, related_name="env_vars")
    key = models.CharField(max_length=200)
    value = EncryptedTextField(help_text="Write-only; never shown again after saving.")
    description = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["key"]
        constraints = [
            models.UniqueConstraint(fields=["sandbox_config", "key"], name="sandbox_env_unique_key")
        ]

    def __str__(self) -> str:
        return self.key
