"""ADE: the agent workspace page, three columns like Letta's ADE.

Left, configuration (views/config.py); centre, the conversation (views/conversation.py); right,
memory (views/memory.py), with the agent's folders and files (views/folders.py, `workspace_context`). Each
column module owns its partials and actions and gives this page its initial context through
`column_context`.
"""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_GET

from apps.ade.views import config, conversation, folders, memory
from apps.ade.views.base import AdeRequest, ade_view
from apps.agents.selectors import agent_state_get
from apps.llm.selectors import llm_configured


@require_GET
@ade_view
def agent_workspace(request: AdeRequest, agent_id: str) -> HttpResponse:
    agent = agent_state_get(actor=request.actor, agent_id=agent_id)
    context = {
        "agent": agent,
        "llm_configured": llm_configured(actor=request.actor),
        **config.column_context(request, agent),
        **conversation.column_context(request, agent),
        **memory.column_context(request, agent),
        **folders.workspace_context(request, agent),
    }
    return render(request, "ade/workspace/page.html", context)


urlpatterns = [
    path("agents/<str:agent_id>/", agent_workspace, name="workspace"),
    *config.urlpatterns,
    *conversation.urlpatterns,
    *memory.urlpatterns,
    *folders.workspace_urlpatterns,
]
