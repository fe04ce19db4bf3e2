"""ADE: the workspace's left column: the agent's configuration (model, system prompt, tools, tool rules, sleeptime)."""

from __future__ import annotations

from typing import Any

from apps.ade.views.base import AdeRequest
from apps.agents.models import Agent


def column_context(request: AdeRequest, agent: Agent) -> dict[str, Any]:
    """What ade/workspace/_config.html needs when the workspace page first renders."""
    return {}


urlpatterns: list = []
