"""Running a user's (custom) tool for an agent: pass the sandbox only what the tool may see.

Which sandbox (Docker, or the local bubblewrap jail) is apps.sandbox.selection's decision.
"""

from __future__ import annotations

from typing import Any

from apps.agents.models import AgentSecret
from apps.sandbox.selection import run_in_sandbox
from apps.tools.execution import ToolContext, ToolResult, output_lines
from apps.tools.models import Tool


def run_custom_tool(tool: Tool, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Execute in the sandbox chosen for the agent's organisation; the result names it.

    The tool sees its arguments, the sandbox config's env vars, the agent's secrets and
    LETTA_AGENT_ID; nothing of the server's own environment. Its pip requirements are installed with
    the sandbox config's (Docker only). Failures are error results, never raised.
    """
    env = {s.key: s.value for s in AgentSecret.objects.for_actor(ctx.actor).filter(agent_id=ctx.agent_id)}
    env["LETTA_AGENT_ID"] = ctx.agent_id
    run = run_in_sandbox(
        actor=ctx.actor,
        source_code=tool.source_code,
        name=tool.name,
        arguments=arguments,
        extra_env=env,
        requirements=tool.pip_requirements or (),
    )
    outcome = run.outcome
    stdout = output_lines(outcome.stdout, tool.return_char_limit)
    stderr = output_lines(outcome.stderr, tool.return_char_limit)
    if run.backend is None:
        return ToolResult.error(outcome.error or f"Tool '{tool.name}' cannot run.")
    if outcome.ok:
        return ToolResult.ok(outcome.return_value, stdout=stdout, stderr=stderr, sandbox=run.backend)
    return ToolResult.error(
        f"Error executing tool {tool.name}: {outcome.error}",
        stdout=stdout,
        stderr=stderr,
        sandbox=run.backend,
    )
