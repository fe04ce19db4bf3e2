"""`{{ blocks|core_blocks }}` / `{{ blocks|skill_blocks }}`: the memory column shows an agent's skills (blocks
labelled `skills/<name>`) apart from its core blocks, as the prompt does (skills are listed, not shown)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import template

register = template.Library()

SKILL_PREFIX = "skills/"


@register.filter
def core_blocks(blocks: Iterable[Any]) -> list[Any]:
    return [block for block in blocks if not block.label.startswith(SKILL_PREFIX)]


@register.filter
def skill_blocks(blocks: Iterable[Any]) -> list[Any]:
    return [block for block in blocks if block.label.startswith(SKILL_PREFIX)]


@register.filter
def skill_name(label: str) -> str:
    """`skills/pdf` and Letta's older `skills/pdf/SKILL` are the skill `pdf`."""
    return label.removeprefix(SKILL_PREFIX).removesuffix("/SKILL")


@register.filter
def first_line(text: str | None) -> str:
    return (text or "").strip().split("\n", 1)[0].strip()
