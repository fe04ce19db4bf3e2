"""ADE: organisation settings: API keys, LLM provider credentials, members and roles."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.urls import path

from apps.ade.views.base import AdeRequest, ade_view


@ade_view
def settings_home(request: AdeRequest) -> HttpResponse:
    return render(request, "ade/settings/index.html", {})


urlpatterns = [
    path("settings/", settings_home, name="settings"),
]
