"""ADE: the agent list, creating agents (templates or from scratch), cloning, deleting, Agent Files."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.urls import path

from apps.ade.views.base import AdeRequest, ade_view
from apps.agents.selectors import agent_list as select_agents


@ade_view
def agent_list(request: AdeRequest) -> HttpResponse:
    agents = select_agents(actor=request.actor)[:100]
    return render(request, "ade/agents/list.html", {"agents": agents})


urlpatterns = [
    path("agents/", agent_list, name="agent-list"),
]
