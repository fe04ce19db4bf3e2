from __future__ import annotations

import re
from typing import Any

from django.db.models import QuerySet

from apps.core.actor import Actor
from apps.core.errors import NotFound
from apps.tools.builtin import BUILTIN_TOOLS
from apps.tools.mcp import (  # noqa: F401 - MCP servers' reads, for the adapters
    RemoteTool,
    mcp_server_get,
    mcp_server_get_by_name,
    mcp_server_list,
    mcp_server_remote_tools,
    mcp_server_tool_get,
    mcp_server_tools,
)
from apps.tools.models import Tool
from apps.tools.rules import (
    ToolRuleError,
    ToolRuleType,  # noqa: F401 - the rule types, for the adapters' forms
    describe_tool_rule,
    parse_tool_rules,
)


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


# --- the /v1/tools API: filtered lists, lookups by name, search ------------------------------------

LETTA_TOOL_TYPE_PREFIX = "letta_"


def tool_list_filtered(
    *,
    actor: Actor,
    names: list[str] | None = None,
    tool_ids: list[str] | None = None,
    search: str | None = None,
    tool_types: list[str] | None = None,
    exclude_tool_types: list[str] | None = None,
    letta_only: bool = False,
) -> QuerySet[Tool]:
    """The organisation's tools filtered as Letta's list endpoint does (every filter optional, all ANDed):
    exact `names`, `tool_ids`, a case-insensitive `search` in the name, (excluded) `tool_types`, and
    `letta_only` for the built-ins (tool types starting with `letta_`)."""
    qs = Tool.objects.for_actor(actor)
    if names:
        qs = qs.filter(name__in=names)
    if tool_ids:
        qs = qs.filter(id__in=tool_ids)
    if search:
        qs = qs.filter(name__icontains=search)
    if tool_types:
        qs = qs.filter(tool_type__in=tool_types)
    if exclude_tool_types:
        qs = qs.exclude(tool_type__in=exclude_tool_types)
    if letta_only:
        qs = qs.filter(tool_type__startswith=LETTA_TOOL_TYPE_PREFIX)
    return qs


def tool_get_by_name(*, actor: Actor, name: str) -> Tool | None:
    """The organisation's tool called `name`, or None."""
    return Tool.objects.for_actor(actor).filter(name=name).first()


_WORD = re.compile(r"[a-z0-9]+")


def tool_search(
    *,
    actor: Actor,
    query: str | None = None,
    tool_types: list[str] | None = None,
    tags: list[str] | None = None,
    limit: int = 50,
) -> list[tuple[Tool, float]]:
    """Tools ranked by how many of the query's words appear in their name, description or tags.

    A keyword ranking, not Letta's vector search (which needs tool embeddings): the score is the share
    of query words found, ties broken by name. Without a query every (filtered) tool scores 0.
    """
    qs = Tool.objects.for_actor(actor)
    if tool_types:
        qs = qs.filter(tool_type__in=tool_types)
    if tags:
        qs = qs.filter(tags__overlap=tags)
    words = set(_WORD.findall((query or "").lower()))
    ranked: list[tuple[Tool, float]] = []
    for tool in qs.order_by("name"):
        if not words:
            ranked.append((tool, 0.0))
            continue
        haystack = set(
            _WORD.findall(f"{tool.name.replace('_', ' ')} {tool.description} {' '.join(tool.tags)}".lower())
        )
        score = len(words & haystack) / len(words)
        if score > 0:
            ranked.append((tool, score))
    ranked.sort(key=lambda pair: (-pair[1], pair[0].name))
    return ranked[:limit]


# --- built-ins and tool rules, for the ADE's configuration column ------------------------------------------


def builtin_tool_names() -> list[str]:
    """Every built-in tool this server defines, whether or not the organisation has its row yet."""
    return list(BUILTIN_TOOLS)


def tool_rule_descriptions(raw_rules: list[Any]) -> list[str]:
    """Each stored rule as the plain-English line the agent's prompt gets, in order; "" for each when the
    rules do not parse (stored before a check they now fail)."""
    try:
        return [describe_tool_rule(rule) for rule in parse_tool_rules(raw_rules)]
    except ToolRuleError:
        return ["" for _ in raw_rules]
