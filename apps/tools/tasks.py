"""Celery entry points of the tools app: thin, the work is apps.tools.mcp's."""

from __future__ import annotations

from celery import shared_task

from apps.core.actor import Actor
from apps.tools import mcp
from apps.tools.models import MCPServer


@shared_task(name="tools.sync_mcp_server_tools", ignore_result=True)
def sync_mcp_server_tools(organization_id: str, server_id: str) -> None:
    """Register a slow MCP server's tools with the full MCP_LIST_TOOLS_TIMEOUT (the request that added it
    waited only MCP_REGISTER_INLINE_SECONDS); the outcome is the server's sync_status."""
    actor = Actor.system(organization_id)
    server = MCPServer.objects.for_actor(actor).filter(id=server_id).first()
    if server is None:  # deleted meanwhile
        return
    mcp.mcp_server_sync_tools(actor=actor, server=server, prune=False, raise_errors=False)
