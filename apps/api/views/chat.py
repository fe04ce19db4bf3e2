"""Placeholder: filled in by issue 18's work on this resource."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
