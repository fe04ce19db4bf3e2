from __future__ import annotations

from django.db.models import QuerySet

from apps.core.actor import Actor
from apps.core.errors import NotFound
from apps.tools.models import Tool


def tool_list(*, actor: Actor, name: str | None = None) -> QuerySet[Tool]:
    qs = Tool.objects.for_actor(actor)
    return qs.filter(name=name) if name else qs


def tool_get(*, actor: Actor, tool_id: str) -> Tool:
    tool = Tool.objects.for_actor(actor).filter(id=tool_id).first()
    if tool is None:
        raise NotFound(f"Tool with id '{tool_id}' not found")
    return tool


def tools_by_name(*, actor: Actor, names: list[str]) -> dict[str, Tool]:
    return {t.name: t for t in Tool.objects.for_actor(actor).filter(name__in=names)}
