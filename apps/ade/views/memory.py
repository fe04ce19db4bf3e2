"""ADE: the workspace's right column: the context window viewer, core memory blocks (edit, history, restore), archival and recall memory."""

from __future__ import annotations

from typing import Any

from apps.ade.views.base import AdeRequest
from apps.agents.models import Agent


def column_context(request: AdeRequest, agent: Agent) -> dict[str, Any]:
    """What ade/workspace/_memory.html needs when the workspace page first renders."""
    return {}


urlpatterns: list = []
