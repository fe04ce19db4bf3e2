"""ADE: the workspace's centre column: the conversation (send, stream over the WebSocket, approvals, cancel, conversations)."""

from __future__ import annotations

from typing import Any

from apps.ade.views.base import AdeRequest
from apps.agents.models import Agent


def column_context(request: AdeRequest, agent: Agent) -> dict[str, Any]:
    """What ade/workspace/_conversation.html needs when the workspace page first renders."""
    return {}


urlpatterns: list = []
