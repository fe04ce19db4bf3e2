"""Which sandbox runs an organisation's tool code, and running it there.

Rule (SANDBOX_BACKEND="auto", the default): Docker whenever an engine answers (cached ping) and the
base image is present or pullable, unless the organisation's only sandbox config is a local one; else
the local subprocess sandbox if the organisation allows it (Organization.allow_local_sandbox); else a
clear error. "docker" and "local" force one backend (a deployment that must never run tools in-host
sets "docker"). Whatever runs the tool, the result says which sandbox it was.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from django.conf import settings
from docker.errors import DockerException, ImageNotFound

from apps.accounts.models import Organization
from apps.core.actor import Actor
from apps.sandbox import images
from apps.sandbox.docker_sandbox import (
    ContainerSpec,
    DockerUnavailable,
    docker_available,
    forget_ping,
    run_tool_in_docker,
)
from apps.sandbox.local import Limits, SandboxOutcome, run_tool_locally
from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable

logger = logging.getLogger(__name__)

Backend = Literal["docker", "local"]


@dataclass(frozen=True)
class SandboxChoice:
    backend: Backend | None  # None: the tool cannot run; `reason` says why
    config: SandboxConfig | None
    reason: str = ""


@dataclass(frozen=True)
class SandboxRun:
    backend: Backend | None
    outcome: SandboxOutcome


def decide_backend(
    *, mode: str, allow_local: bool, local_config_only: bool, docker_ready: bool
) -> tuple[Backend | None, str]:
    """The selection rule as a pure function (unit-tested without an engine); (backend, why not)."""
    if mode == "docker":
        return ("docker", "") if docker_ready else (None, "the Docker sandbox is required but unavailable")
    if mode == "auto" and docker_ready and not local_config_only:
        return "docker", ""
    if allow_local:
        return "local", ""
    return None, "this organization does not allow the local sandbox and no Docker sandbox is available"


def docker_ready(image: str) -> bool:
    """An engine answers and `image` is there (or pullable). Both answers are cached per process."""
    if not docker_available(ttl_seconds=settings.SANDBOX_DOCKER_PING_TTL):
        return False
    return images.image_available(image, pull=settings.SANDBOX_PULL_IMAGES)


def choose_sandbox(*, actor: Actor) -> SandboxChoice:
    """Apply the rule for the actor's organisation; reads the org and its sandbox configs (2 queries)."""
    organization = Organization.objects.get(id=actor.organization_id)
    configs = {c.sandbox_type: c for c in SandboxConfig.objects.for_actor(actor)}
    docker_config = configs.get(SandboxConfig.Type.DOCKER)
    mode = settings.SANDBOX_BACKEND
    ready = mode != "local" and docker_ready(base_image(docker_config))
    backend, reason = decide_backend(
        mode=mode,
        allow_local=organization.allow_local_sandbox,
        local_config_only=SandboxConfig.Type.LOCAL in configs and docker_config is None,
        docker_ready=ready,
    )
    if backend == "docker":
        return SandboxChoice("docker", docker_config)
    if backend == "local":
        return SandboxChoice("local", configs.get(SandboxConfig.Type.LOCAL))
    return SandboxChoice(None, None, reason)


def base_image(config: SandboxConfig | None) -> str:
    return (config.image if config and config.image else "") or settings.SANDBOX_BASE_IMAGE


def container_spec(config: SandboxConfig | None, image: str) -> ContainerSpec:
    """Limits from the sandbox config, or the model's defaults when the organisation has none."""
    config = config or SandboxConfig(sandbox_type=SandboxConfig.Type.DOCKER)
    return ContainerSpec(
        image=image,
        network=settings.SANDBOX_NETWORK if config.network_enabled else None,
        memory_mb=config.memory_mb,
        cpus=config.cpus,
        pids_limit=config.pids_limit,
        tmpfs_mb=settings.SANDBOX_TMPFS_MB,
    )


def run_in_sandbox(
    *, actor: Actor, source_code: str, name: str, arguments: dict[str, object], extra_env: dict[str, str]
) -> SandboxRun:
    """Run `name(**arguments)` from `source_code` in the chosen sandbox; never raises for tool failures.

    The tool's environment is the chosen config's sandbox variables (decrypted), then `extra_env`
    (agent secrets, LETTA_AGENT_ID): nothing of this server's own environment.
    """
    choice = choose_sandbox(actor=actor)
    if choice.backend is None:
        return SandboxRun(
            None, SandboxOutcome(False, None, "", "", f"Tool '{name}' cannot run: {choice.reason}.")
        )
    env = _config_env(actor, choice.config) | extra_env
    if choice.backend == "local":
        config = choice.config
        limits = (
            Limits(timeout_seconds=config.timeout_seconds, memory_mb=max(config.memory_mb, 256))
            if config
            else Limits()
        )
        return SandboxRun(
            "local",
            run_tool_locally(source_code=source_code, name=name, arguments=arguments, env=env, limits=limits),
        )
    return SandboxRun("docker", _run_docker(choice.config, source_code, name, arguments, env))


def _run_docker(
    config: SandboxConfig | None,
    source_code: str,
    name: str,
    arguments: dict[str, object],
    env: dict[str, str],
) -> SandboxOutcome:
    def failed(why: str) -> SandboxOutcome:
        return SandboxOutcome(
            False, None, "", "", f"Tool '{name}' could not run in the Docker sandbox: {why}"
        )

    try:
        base = base_image(config)
        plan = images.plan_image(
            base=base,
            base_id=images.ensure_image(base, pull=settings.SANDBOX_PULL_IMAGES),
            requirements=config.pip_requirements if config else [],
            wheelhouse=settings.SANDBOX_WHEELHOUSE or None,
            no_index=settings.SANDBOX_PIP_NO_INDEX,
        )
        image = images.resolve_image(
            plan,
            pull=settings.SANDBOX_PULL_IMAGES,
            wheelhouse=settings.SANDBOX_WHEELHOUSE or None,
            no_index=settings.SANDBOX_PIP_NO_INDEX,
        )
    except (images.BadRequirement, images.ImageUnavailable, images.ImageBuildFailed) as exc:
        return failed(str(exc))
    timeout = float(config.timeout_seconds) if config else 30.0
    try:
        return run_tool_in_docker(
            source_code=source_code,
            name=name,
            arguments=arguments,
            env=env,
            spec=container_spec(config, image),
            timeout_seconds=timeout,
            max_output_bytes=settings.SANDBOX_MAX_OUTPUT_BYTES,
        )
    except ImageNotFound as exc:  # removed behind our back: look again next time
        images.forget_images()
        return failed(str(exc))
    except (DockerException, DockerUnavailable) as exc:
        logger.warning("sandbox.docker_failed", extra={"tool": name, "error": str(exc)})
        forget_ping()  # if the engine went away, the next call falls back instead of failing again
        return failed(str(exc))


def _config_env(actor: Actor, config: SandboxConfig | None) -> dict[str, str]:
    if config is None:
        return {}
    return {
        v.key: v.value
        for v in SandboxEnvironmentVariable.objects.for_actor(actor).filter(sandbox_config=config)
    }
