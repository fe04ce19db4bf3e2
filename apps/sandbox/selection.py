"""Which sandbox runs an organisation's tool code, and running it there.

Rule (SANDBOX_BACKEND="auto", the default): Docker whenever an engine answers (cached ping), unless the
organisation's only sandbox config is a local one; else the local jail (bubblewrap) if the organisation
allows it (Organization.allow_local_sandbox); else a clear error. "docker" and "local" force one
backend. A missing sandbox image is an error, never a reason to run the tool elsewhere, and so is a
missing jail tool: nothing runs unisolated. Whatever runs the tool, the result says which sandbox it was.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from django.conf import settings
from docker.errors import DockerException, ImageNotFound

from apps.accounts.models import Organization
from apps.core.actor import Actor
from apps.sandbox import egress, images, remote
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
    *, mode: str, allow_local: bool, local_config_only: bool, docker_answers: bool
) -> tuple[Backend | None, str]:
    """The selection rule as a pure function (unit-tested without an engine); (backend, why not)."""
    if mode == "docker":
        if not docker_answers:
            return None, "the Docker sandbox is required but no Docker engine answers"
        return "docker", ""
    if mode == "auto" and docker_answers and not local_config_only:
        return "docker", ""
    if allow_local:
        return "local", ""
    return None, "this organization does not allow the local sandbox and no Docker sandbox is available"


def choose_sandbox(*, actor: Actor) -> SandboxChoice:
    """Apply the rule for the actor's organisation; reads the org and its sandbox configs (2 queries)."""
    organization = Organization.objects.get(id=actor.organization_id)
    configs = {c.sandbox_type: c for c in SandboxConfig.objects.for_actor(actor)}
    docker_config = configs.get(SandboxConfig.Type.DOCKER)
    mode = settings.SANDBOX_BACKEND
    answers = mode != "local" and _docker_answers()
    backend, reason = decide_backend(
        mode=mode,
        allow_local=organization.allow_local_sandbox,
        local_config_only=SandboxConfig.Type.LOCAL in configs and docker_config is None,
        docker_answers=answers,
    )
    if backend == "docker":
        return SandboxChoice("docker", docker_config)
    if backend == "local":
        return SandboxChoice("local", configs.get(SandboxConfig.Type.LOCAL))
    return SandboxChoice(None, None, reason)


def _docker_answers() -> bool:
    """An engine answers: the sandbox runner's (cached health call) when SANDBOX_RUNNER_URL is set, so
    this process never touches an engine; else this process's own (cached ping)."""
    if settings.SANDBOX_RUNNER_URL:
        return remote.runner_answers(ttl_seconds=settings.SANDBOX_DOCKER_PING_TTL)
    return docker_available(ttl_seconds=settings.SANDBOX_DOCKER_PING_TTL)


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
    *,
    actor: Actor,
    source_code: str,
    name: str,
    arguments: dict[str, object],
    extra_env: dict[str, str],
    requirements: Sequence[object] = (),
) -> SandboxRun:
    """Run `name(**arguments)` from `source_code` in the chosen sandbox; never raises for tool failures.

    The tool's environment is the chosen config's sandbox variables (decrypted), then `extra_env`
    (agent secrets, LETTA_AGENT_ID): nothing of this server's own environment. `requirements` (the
    tool's pip requirements) are installed with the config's, in the image derived for them.
    """
    choice = choose_sandbox(actor=actor)
    if choice.backend is None:
        return SandboxRun(
            None, SandboxOutcome(False, None, "", "", f"Tool '{name}' cannot run: {choice.reason}.")
        )
    env = _config_env(actor, choice.config) | extra_env
    if choice.backend == "local":
        return SandboxRun("local", _run_local(choice.config, source_code, name, arguments, env, requirements))
    return SandboxRun("docker", _run_docker(choice.config, source_code, name, arguments, env, requirements))


def local_limits(config: SandboxConfig | None) -> Limits:
    """The jail's limits from the local sandbox config (the model's defaults when there is none)."""
    config = config or SandboxConfig(sandbox_type=SandboxConfig.Type.LOCAL)
    return Limits(
        timeout_seconds=float(config.timeout_seconds),
        memory_mb=max(config.memory_mb, 256),  # the interpreter alone maps ~100 MB of address space
        max_processes=config.pids_limit,
        tmpfs_mb=settings.SANDBOX_TMPFS_MB,
        max_output_bytes=settings.SANDBOX_MAX_OUTPUT_BYTES,
    )


def _run_local(
    config: SandboxConfig | None,
    source_code: str,
    name: str,
    arguments: dict[str, object],
    env: dict[str, str],
    requirements: Sequence[object] = (),
) -> SandboxOutcome:
    if (config is not None and config.pip_requirements) or requirements:
        whose = "the tool lists" if requirements else "this organization's local sandbox config lists"
        return SandboxOutcome(
            False,
            None,
            "",
            "",
            f"Tool '{name}' cannot run: the local sandbox installs no packages and {whose} pip "
            "requirements; use a Docker sandbox config.",
        )
    return run_tool_locally(
        source_code=source_code,
        name=name,
        arguments=arguments,
        env=env,
        limits=local_limits(config),
        python=settings.SANDBOX_LOCAL_PYTHON,
        hidden=(str(settings.BASE_DIR), str(settings.DATA_DIR)),
    )


def _run_docker(
    config: SandboxConfig | None,
    source_code: str,
    name: str,
    arguments: dict[str, object],
    env: dict[str, str],
    tool_requirements: Sequence[object] = (),
) -> SandboxOutcome:
    """The sandbox runner when SANDBOX_RUNNER_URL is set (the runner picks the network and applies its
    own maxima), else this process's engine; both end in run_docker_tool."""
    timeout = float(config.timeout_seconds) if config else 30.0
    requirements = [*(config.pip_requirements if config else []), *tool_requirements]
    if settings.SANDBOX_RUNNER_URL:
        defaults = config or SandboxConfig(sandbox_type=SandboxConfig.Type.DOCKER)
        return remote.run_in_runner(
            source_code=source_code,
            name=name,
            arguments=arguments,
            env=env,
            image=config.image if config else None,
            requirements=requirements,
            limits=remote.RunLimits(
                memory_mb=defaults.memory_mb,
                cpus=defaults.cpus,
                pids_limit=defaults.pids_limit,
                timeout_seconds=timeout,
                network_enabled=defaults.network_enabled,
            ),
        )
    return run_docker_tool(
        source_code=source_code,
        name=name,
        arguments=arguments,
        env=env,
        limits=container_spec(config, base_image(config)),
        requirements=requirements,
        timeout_seconds=timeout,
    )


def run_docker_tool(
    *,
    source_code: str,
    name: str,
    arguments: dict[str, object],
    env: dict[str, str],
    limits: ContainerSpec,
    requirements: list[object],
    timeout_seconds: float,
) -> SandboxOutcome:
    """Run a tool on this process's engine from plain values (no model, no database): the one Docker
    code path, for the in-process backend and the sandbox runner alike. `limits.image` is the base
    image; the call runs on it, or on the image derived from it with `requirements`. Never raises."""

    def failed(why: str) -> SandboxOutcome:
        return SandboxOutcome(
            False, None, "", "", f"Tool '{name}' could not run in the Docker sandbox: {why}"
        )

    def engine_failed(exc: Exception) -> SandboxOutcome:
        logger.warning("sandbox.docker_failed", extra={"tool": name, "error": str(exc)})
        forget_ping()  # if the engine went away, the next call falls back instead of failing again
        return failed(str(exc))

    try:
        if limits.network:  # fail closed: behind the egress filter or not at all, never unfiltered
            egress.require_egress_filter(limits.network)
        base = limits.image
        plan = images.plan_image(
            base=base,
            base_id=images.ensure_image(base, pull=settings.SANDBOX_PULL_IMAGES),
            requirements=requirements,
            wheelhouse=settings.SANDBOX_WHEELHOUSE or None,
            no_index=settings.SANDBOX_PIP_NO_INDEX,
        )
        image = images.resolve_image(
            plan,
            pull=settings.SANDBOX_PULL_IMAGES,
            wheelhouse=settings.SANDBOX_WHEELHOUSE or None,
            no_index=settings.SANDBOX_PIP_NO_INDEX,
        )
    except (
        images.BadRequirement,
        images.ImageUnavailable,
        images.ImageBuildFailed,
        egress.EgressUnavailable,
    ) as exc:
        return failed(str(exc))
    except (DockerException, DockerUnavailable) as exc:  # the engine failed while looking for images
        return engine_failed(exc)
    try:
        return run_tool_in_docker(
            source_code=source_code,
            name=name,
            arguments=arguments,
            env=env,
            spec=replace(limits, image=image),
            timeout_seconds=timeout_seconds,
            max_output_bytes=settings.SANDBOX_MAX_OUTPUT_BYTES,
        )
    except ImageNotFound as exc:  # removed behind our back: look again next time
        images.forget_images()
        return failed(str(exc))
    except (DockerException, DockerUnavailable) as exc:
        return engine_failed(exc)


def _config_env(actor: Actor, config: SandboxConfig | None) -> dict[str, str]:
    if config is None:
        return {}
    return {
        v.key: v.value
        for v in SandboxEnvironmentVariable.objects.for_actor(actor).filter(sandbox_config=config)
    }
