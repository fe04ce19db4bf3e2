"""Running a user's (custom) tool for an agent: pick the sandbox and pass it only what the tool may see."""

from __future__ import annotations

from typing import Any

from apps.accounts.models import Organization
from apps.agents.models import AgentSecret
from apps.sandbox.local import Limits, run_tool_locally
from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable
from apps.tools.execution import ToolContext, ToolResult
from apps.tools.models import Tool


def run_custom_tool(tool: Tool, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Execute in the local sandbox (the Docker sandbox arrives with the sandbox issue).

    The tool sees its arguments, the organisation's sandbox env vars, the agent's secrets and
    LETTA_AGENT_ID; nothing of the server's own environment.
    """
    organization = Organization.objects.get(id=ctx.actor.organization_id)
    if not organization.allow_local_sandbox:
        return ToolResult.error(
            f"Tool '{tool.name}' cannot run: this organization does not allow the local sandbox and no "
            "container sandbox is available."
        )
    config = SandboxConfig.objects.for_actor(ctx.actor).filter(sandbox_type=SandboxConfig.Type.LOCAL).first()
    env = (
        {
            v.key: v.value
            for v in SandboxEnvironmentVariable.objects.for_actor(ctx.actor).filter(sandbox_config=config)
        }
        if config
        else {}
    )
    env |= {s.key: s.value for s in AgentSecret.objects.for_actor(ctx.actor).filter(agent_id=ctx.agent_id)}
    env["LETTA_AGENT_ID"] = ctx.agent_id
    limits = (
        Limits(timeout_seconds=config.timeout_seconds, memory_mb=max(config.memory_mb, 256))
        if config
        else Limits()
    )
    outcome = run_tool_locally(
        source_code=tool.source_code, name=tool.name, arguments=arguments, env=env, limits=limits
    )
    stdout = tuple(outcome.stdout.splitlines())
    stderr = tuple(outcome.stderr.splitlines())
    if outcome.ok:
        return ToolResult.ok(outcome.return_value, stdout=stdout, stderr=stderr, sandbox="local")
    return ToolResult.error(
        f"Error executing tool {tool.name}: {outcome.error}", stdout=stdout, stderr=stderr, sandbox="local"
    )
