"""`{% may actor "agent.configure" agent.created_by_id as can_configure %}`: the role matrix in templates,
so a page shows only the controls its viewer may use (the services refuse the rest anyway)."""

from __future__ import annotations

from django import template

from apps.core.actor import Actor
from apps.core.permissions import Action, allows

register = template.Library()


@register.simple_tag
def may(actor: Actor | None, action: str, creator_id: str | None = None) -> bool:
    return actor is not None and allows(actor, Action(action), creator_id=creator_id)
