"""ADE: the tool list, the tool editor (live schema from the docstring) and test runs in the sandbox."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.urls import path

from apps.ade.views.base import AdeRequest, ade_view


@ade_view
def tool_list(request: AdeRequest) -> HttpResponse:
    return render(request, "ade/tools/list.html", {})


urlpatterns = [
    path("tools/", tool_list, name="tool-list"),
]
