from __future__ import annotations

from django.db import IntegrityError, transaction

from apps.core.actor import Actor
from apps.tools.builtin import BUILTIN_TOOLS, builtin_definition
from apps.tools.models import Tool


def tool_upsert_builtins(
    *, actor: Actor, names: list[str] | tuple[str, ...] | None = None
) -> dict[str, Tool]:
    """Make sure the organisation has current rows for these built-in tools (all when None). Idempotent."""
    wanted = list(names) if names is not None else list(BUILTIN_TOOLS)
    existing = {t.name: t for t in Tool.objects.for_actor(actor).filter(name__in=wanted)}
    for name in wanted:
        definition = builtin_definition(name)
        tool = existing.get(name)
        if tool is None:
            try:
                with transaction.atomic():
                    existing[name] = Tool.objects.for_actor(actor).create(name=name, **definition)
            except IntegrityError:  # created concurrently by another request
                existing[name] = Tool.objects.for_actor(actor).get(name=name)
        elif any(getattr(tool, key) != value for key, value in definition.items()):
            for key, value in definition.items():
                setattr(tool, key, value)
            tool.save(update_fields=[*definition, "updated_at"])
    return existing
