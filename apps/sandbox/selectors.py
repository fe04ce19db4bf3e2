"""Reads of the sandbox app: an organisation's sandbox configs and their variables (keys only for people;
values are decrypted by apps.sandbox.selection alone, to run a tool)."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.core.actor import Actor
from apps.core.errors import NotFound
from apps.core.pagination import PageParams, paginate
from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable


def sandbox_config_list(
    *, actor: Actor, page: PageParams, sandbox_type: str | None = None
) -> list[SandboxConfig]:
    """One page of the organisation's sandbox configs (at most one per type), oldest first by default."""
    qs = SandboxConfig.objects.for_actor(actor)
    if sandbox_type:
        qs = qs.filter(sandbox_type=sandbox_type)
    return paginate(qs, page)


def sandbox_config_get(*, actor: Actor, sandbox_config_id: str) -> SandboxConfig:
    """Raises NotFound, also for another organisation's config."""
    config = SandboxConfig.objects.for_actor(actor).filter(id=sandbox_config_id).first()
    if config is None:
        raise NotFound(f"Sandbox config with id '{sandbox_config_id}' not found")
    return config


def sandbox_config_for_type(*, actor: Actor, sandbox_type: str) -> SandboxConfig | None:
    return SandboxConfig.objects.for_actor(actor).filter(sandbox_type=sandbox_type).first()


def sandbox_env_var_list(
    *, actor: Actor, sandbox_config_id: str, page: PageParams
) -> list[SandboxEnvironmentVariable]:
    """One page of a config's variables (raises NotFound for a config the actor cannot see)."""
    config = sandbox_config_get(actor=actor, sandbox_config_id=sandbox_config_id)
    qs: QuerySet[SandboxEnvironmentVariable] = SandboxEnvironmentVariable.objects.for_actor(actor).filter(
        sandbox_config=config
    )
    return paginate(qs, page)


def sandbox_env_var_get(*, actor: Actor, env_var_id: str) -> SandboxEnvironmentVariable:
    """Raises NotFound, also for another organisation's variable."""
    variable = SandboxEnvironmentVariable.objects.for_actor(actor).filter(id=env_var_id).first()
    if variable is None:
        raise NotFound(f"Sandbox environment variable with id '{env_var_id}' not found")
    return variable


def sandbox_env_var_count(*, actor: Actor, sandbox_config: SandboxConfig) -> int:
    return SandboxEnvironmentVariable.objects.for_actor(actor).filter(sandbox_config=sandbox_config).count()
