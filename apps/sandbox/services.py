"""Writes of the sandbox app: an organisation's sandbox configs (one per type) and their variables.

Every write is for owners and admins (Action.SANDBOX_MANAGE), checked before anything else, so a member
learns nothing about what is wrong with a refused request.

Limits stay within what the platform gives a tool call: the sandbox runner's maxima
(SANDBOX_RUNNER_MAX_MEMORY_MB, _CPUS, _PIDS, _TIMEOUT, which it clamps every call to) are the ceiling
here too, and Docker's own minima the floor. A value outside is refused, naming the field
(SandboxFieldInvalid), never stored and clamped later: the in-process Docker backend
(apps.sandbox.selection) applies a config's limits as they are. With a sandbox runner, a config's image
must be one the runner allows.

Variable values are write-only: stored encrypted, never returned by a read of this app.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from apps.core import permissions
from apps.core.actor import Actor
from apps.core.errors import Conflict, InvalidInput
from apps.core.permissions import Action
from apps.sandbox.images import BadRequirement, normalize_requirements
from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable
from apps.sandbox.runner_service import MIN_CPUS, MIN_MEMORY_MB
from apps.sandbox.selectors import sandbox_config_get, sandbox_env_var_count, sandbox_env_var_get

CONFIG_FIELDS = frozenset(
    {"image", "pip_requirements", "network_enabled", "memory_mb", "cpus", "pids_limit", "timeout_seconds"}
)
DOCKER_ONLY_FIELDS = frozenset({"image", "network_enabled", "cpus"})
MAX_PIP_REQUIREMENTS = 100
MAX_IMAGE_LENGTH = 300  # the column's
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")
MAX_ENV_VALUE_CHARS = 65_536
"""Far above a real secret; below what the kernel accepts for one environment string (128 KiB)."""
MAX_ENV_DESCRIPTION_CHARS = 10_000
MAX_ENV_VARS_PER_CONFIG = 100
"""A tool's environment must still fit the kernel's argument space when the container or jail starts."""


class SandboxFieldInvalid(InvalidInput):
    """One field of a sandbox config or variable is malformed or outside what the platform allows.
    `field` names it (`memory_mb`, `key`); `reason` says why, with the bound and the setting behind it."""

    code = "sandbox_field_invalid"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def _require_manage(actor: Actor) -> None:
    permissions.require(actor, Action.SANDBOX_MANAGE)


def platform_bounds() -> dict[str, tuple[float, float, str]]:
    """(lowest, highest, what sets the highest) of each limit, from the operator's settings."""
    return {
        "memory_mb": (MIN_MEMORY_MB, settings.SANDBOX_RUNNER_MAX_MEMORY_MB, "SANDBOX_RUNNER_MAX_MEMORY_MB"),
        "cpus": (MIN_CPUS, settings.SANDBOX_RUNNER_MAX_CPUS, "SANDBOX_RUNNER_MAX_CPUS"),
        "pids_limit": (1, settings.SANDBOX_RUNNER_MAX_PIDS, "SANDBOX_RUNNER_MAX_PIDS"),
        "timeout_seconds": (1, math.floor(settings.SANDBOX_RUNNER_MAX_TIMEOUT), "SANDBOX_RUNNER_MAX_TIMEOUT"),
    }


def _bounded_number(field: str, value: Any, *, integer: bool) -> int | float:
    lowest, highest, setting = platform_bounds()[field]
    if integer and isinstance(value, float) and value.is_integer():
        value = int(value)  # 30.0 from a client that writes every number as a float
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        raise SandboxFieldInvalid(field, "must be an integer" if integer else "must be a number")
    if value < lowest:
        raise SandboxFieldInvalid(field, f"must be at least {lowest:g}")
    if value > highest:
        raise SandboxFieldInvalid(field, f"must be at most {highest:g} on this platform ({setting})")
    return int(value) if integer else float(value)


def _image(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > MAX_IMAGE_LENGTH or any(c.isspace() for c in value):
        raise SandboxFieldInvalid(
            "image", f"must be an image reference without spaces, at most {MAX_IMAGE_LENGTH} characters"
        )
    if value and settings.SANDBOX_RUNNER_URL:
        allowed = {settings.SANDBOX_BASE_IMAGE, *settings.SANDBOX_RUNNER_ALLOWED_IMAGES}
        if value not in allowed:
            raise SandboxFieldInvalid(
                "image",
                f"'{value}' is not an image this platform runs (SANDBOX_BASE_IMAGE, "
                f"SANDBOX_RUNNER_ALLOWED_IMAGES: {', '.join(sorted(i for i in allowed if i))})",
            )
    return value


def _requirement_shape(item: Any) -> bool:
    if isinstance(item, str):
        return True
    return (
        isinstance(item, dict)
        and set(item) <= {"name", "version"}
        and isinstance(item.get("name"), str)
        and isinstance(item.get("version"), str | None)
    )


def _requirements(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(_requirement_shape(item) for item in value):
        raise SandboxFieldInvalid(
            "pip_requirements", "must be a list of PEP 508 strings or {name, version} objects"
        )
    if len(value) > MAX_PIP_REQUIREMENTS:
        raise SandboxFieldInvalid("pip_requirements", f"at most {MAX_PIP_REQUIREMENTS} requirements")
    try:
        normalize_requirements(value)
    except BadRequirement as exc:
        raise SandboxFieldInvalid("pip_requirements", str(exc)) from exc
    return value


def validate_config_fields(sandbox_type: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The given fields, checked for a config of `sandbox_type`, as model values. Raises
    SandboxFieldInvalid (an unknown field, a malformed value, a limit outside the platform's)."""
    if sandbox_type not in SandboxConfig.Type.values:
        raise SandboxFieldInvalid("type", f"must be one of {', '.join(SandboxConfig.Type.values)}")
    for field in sorted(fields):
        if field not in CONFIG_FIELDS:
            raise SandboxFieldInvalid(field, "is not a sandbox config setting")
    local = sandbox_type == SandboxConfig.Type.LOCAL
    values: dict[str, Any] = {}
    for field, value in fields.items():
        if local and field in DOCKER_ONLY_FIELDS:
            if field == "network_enabled" and value is False:
                values[field] = False
                continue
            raise SandboxFieldInvalid(
                field, "applies to Docker sandboxes only (the local jail has no image, network or CPU quota)"
            )
        if field in ("memory_mb", "pids_limit", "timeout_seconds"):
            values[field] = _bounded_number(field, value, integer=True)
        elif field == "cpus":
            values[field] = _bounded_number(field, value, integer=False)
        elif field == "network_enabled":
            if not isinstance(value, bool):
                raise SandboxFieldInvalid(field, "must be true or false")
            values[field] = value
        elif field == "image":
            values[field] = _image(value)
        else:
            requirements = _requirements(value)
            if local and requirements:
                raise SandboxFieldInvalid(
                    field, "the local jail installs no packages: use a Docker sandbox config"
                )
            values[field] = requirements
    return values


def _defaults(sandbox_type: str) -> dict[str, Any]:
    """The model's defaults, within the platform's maxima (an operator may set them lower)."""
    blank = SandboxConfig(sandbox_type=sandbox_type)
    bounds = platform_bounds()
    return {
        "image": "",
        "pip_requirements": [],
        "network_enabled": False,
        "memory_mb": min(blank.memory_mb, int(bounds["memory_mb"][1])),
        "cpus": min(blank.cpus, float(bounds["cpus"][1])),
        "pids_limit": min(blank.pids_limit, int(bounds["pids_limit"][1])),
        "timeout_seconds": min(blank.timeout_seconds, int(bounds["timeout_seconds"][1])),
    }


def _locked_for_type(actor: Actor, sandbox_type: str) -> SandboxConfig | None:
    return (
        SandboxConfig.objects.for_actor(actor).select_for_update().filter(sandbox_type=sandbox_type).first()
    )


def _locked(actor: Actor, config: SandboxConfig) -> SandboxConfig:
    """The config's row, locked until the transaction ends (writes to one config, and the count of its
    variables, are serialised on it)."""
    return SandboxConfig.objects.for_actor(actor).select_for_update().get(id=config.id)


@transaction.atomic
def sandbox_config_upsert(*, actor: Actor, sandbox_type: str, fields: Mapping[str, Any]) -> SandboxConfig:
    """Set the organisation's config of `sandbox_type` to `fields` (others: defaults), creating it if
    there is none (Letta's create-or-update: one config per type). Raises PermissionDenied,
    SandboxFieldInvalid."""
    _require_manage(actor)
    values = {**_defaults(sandbox_type), **validate_config_fields(sandbox_type, fields)}
    config = _locked_for_type(actor, sandbox_type)
    if config is None:
        try:
            with transaction.atomic():
                return SandboxConfig.objects.for_actor(actor).create(sandbox_type=sandbox_type, **values)
        except IntegrityError:  # created concurrently: update that one
            config = _locked_for_type(actor, sandbox_type)
            if config is None:
                raise
    for name, value in values.items():
        setattr(config, name, value)
    config.save()
    return config


@transaction.atomic
def sandbox_config_get_or_create_default(*, actor: Actor, sandbox_type: str) -> SandboxConfig:
    """The organisation's config of that type, created with the defaults when there is none.
    Raises PermissionDenied, SandboxFieldInvalid (an unknown type)."""
    _require_manage(actor)
    validate_config_fields(sandbox_type, {})
    config = _locked_for_type(actor, sandbox_type)
    if config is not None:
        return config
    try:
        with transaction.atomic():
            return SandboxConfig.objects.for_actor(actor).create(
                sandbox_type=sandbox_type, **_defaults(sandbox_type)
            )
    except IntegrityError:
        config = _locked_for_type(actor, sandbox_type)
        if config is None:
            raise
        return config


@transaction.atomic
def sandbox_config_update(
    *, actor: Actor, sandbox_config_id: str, fields: Mapping[str, Any]
) -> SandboxConfig:
    """Change the given fields of a config, keep the others. Raises PermissionDenied, NotFound,
    SandboxFieldInvalid."""
    _require_manage(actor)
    config = _locked(actor, sandbox_config_get(actor=actor, sandbox_config_id=sandbox_config_id))
    for name, value in validate_config_fields(config.sandbox_type, fields).items():
        setattr(config, name, value)
    config.save()
    return config


@transaction.atomic
def sandbox_config_delete(*, actor: Actor, sandbox_config_id: str) -> None:
    """Delete a config and its variables; tools then run with the defaults. Raises PermissionDenied,
    NotFound."""
    _require_manage(actor)
    sandbox_config_get(actor=actor, sandbox_config_id=sandbox_config_id).delete()


def _env_key(value: Any) -> str:
    if not isinstance(value, str) or not ENV_KEY.match(value):
        raise SandboxFieldInvalid(
            "key", "must be an environment variable name (letters, digits, '_', not starting with a digit)"
        )
    return value


def _env_value(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_ENV_VALUE_CHARS:
        raise SandboxFieldInvalid("value", f"must be text of at most {MAX_ENV_VALUE_CHARS} characters")
    return value


def _env_description(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > MAX_ENV_DESCRIPTION_CHARS:
        raise SandboxFieldInvalid(
            "description", f"must be text of at most {MAX_ENV_DESCRIPTION_CHARS} characters"
        )
    return value


def _key_taken(key: str) -> Conflict:
    return Conflict(f"This sandbox config already has a variable named '{key}'.")


@transaction.atomic
def sandbox_env_var_create(
    *, actor: Actor, sandbox_config_id: str, key: Any, value: Any, description: Any = None
) -> SandboxEnvironmentVariable:
    """Add a variable to a config (its value stored encrypted). Raises PermissionDenied, NotFound,
    SandboxFieldInvalid, Conflict (the key is taken)."""
    _require_manage(actor)
    config = _locked(actor, sandbox_config_get(actor=actor, sandbox_config_id=sandbox_config_id))
    key, value, description = _env_key(key), _env_value(value), _env_description(description)
    variables = SandboxEnvironmentVariable.objects.for_actor(actor)
    if variables.filter(sandbox_config=config, key=key).exists():
        raise _key_taken(key)
    if sandbox_env_var_count(actor=actor, sandbox_config=config) >= MAX_ENV_VARS_PER_CONFIG:
        raise SandboxFieldInvalid(
            "key", f"a sandbox config holds at most {MAX_ENV_VARS_PER_CONFIG} variables"
        )
    try:
        with transaction.atomic():
            return variables.create(sandbox_config=config, key=key, value=value, description=description)
    except IntegrityError as exc:
        raise _key_taken(key) from exc


@transaction.atomic
def sandbox_env_var_update(
    *, actor: Actor, env_var_id: str, key: Any = None, value: Any = None, description: Any = None
) -> SandboxEnvironmentVariable:
    """Change what is given (None: keep). Raises PermissionDenied, NotFound, SandboxFieldInvalid,
    Conflict."""
    _require_manage(actor)
    variable = sandbox_env_var_get(actor=actor, env_var_id=env_var_id)
    if key is not None:
        key = _env_key(key)
        others = SandboxEnvironmentVariable.objects.for_actor(actor).filter(
            sandbox_config_id=variable.sandbox_config_id, key=key
        )
        if others.exclude(id=variable.id).exists():
            raise _key_taken(key)
        variable.key = key
    if value is not None:
        variable.value = _env_value(value)
    if description is not None:
        variable.description = _env_description(description)
    try:
        with transaction.atomic():
            variable.save()
    except IntegrityError as exc:
        raise _key_taken(variable.key) from exc
    return variable


@transaction.atomic
def sandbox_env_var_delete(*, actor: Actor, env_var_id: str) -> None:
    """Raises PermissionDenied, NotFound."""
    _require_manage(actor)
    sandbox_env_var_get(actor=actor, env_var_id=env_var_id).delete()
