"""ADE: runs pages (to be built)."""

from __future__ import annotations

urlpatterns: list = []
