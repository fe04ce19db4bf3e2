"""ADE: an agent's memory as a git repository: the switch (Letta's `git-memory-enabled` tag), the clone URL
and the commits (author and message), newest first. What the repository holds and who may see or change it
is apps.memory.git_memory's business (through apps.memory.services); this view only shows it."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_http_methods

from apps.ade.views.base import AdeRequest, ade_view, error_response, refusal_status
from apps.agents import selectors as agent_selectors
from apps.agents import services as agent_services
from apps.core.errors import DomainError
from apps.memory import services as memory_services

COMMITS_SHOWN = 200


@require_http_methods(["GET", "POST"])
@ade_view
def git_memory_page(request: AdeRequest, agent_id: str) -> HttpResponse:
    actor = request.actor
    agent = agent_selectors.agent_get(actor=actor, agent_id=agent_id)
    if request.method == "POST":
        wanted = request.POST.get("enabled") == "on"
        tags = [t for t in agent.tags if t != memory_services.GIT_MEMORY_TAG]
        if wanted:
            tags.append(memory_services.GIT_MEMORY_TAG)
        try:
            agent = agent_services.agent_update(actor=actor, agent_id=agent.id, tags=tags)
            if wanted:  # build the repository now: Letta moves the blocks under system/ at this point
                memory_services.git_memory_enable(actor=actor, agent=agent)
        except DomainError as exc:
            return error_response(request, exc, status=refusal_status(exc))
        return redirect(reverse("ade:agent-git-memory", args=[agent.id]))
    enabled = memory_services.GIT_MEMORY_TAG in agent.tags
    commits = memory_services.git_commit_log(actor=actor, agent=agent, limit=COMMITS_SHOWN) if enabled else []
    clone_url = request.build_absolute_uri(f"/v1/git/{agent.id}/state.git")
    return render(
        request,
        "ade/git_memory/page.html",
        {"agent": agent, "enabled": enabled, "commits": commits, "clone_url": clone_url},
    )


urlpatterns = [
    path("agents/<str:agent_id>/git/", git_memory_page, name="agent-git-memory"),
]
