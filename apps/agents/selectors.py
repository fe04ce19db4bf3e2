from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.postgres.aggregates import ArrayAgg
from django.db import connection
from django.db.models import Count, Prefetch, Q, QuerySet, Subquery, Sum

from apps.accounts.models import User
from apps.accounts.selectors import staff_organization_ids
from apps.agents.errors import AgentNotFound
from apps.agents.loop.budget import ContextBreakdown, ContextBudget, MessageInfo, context_breakdown
from apps.agents.loop.events import NullSink, UsageStatistics
from apps.agents.models import Agent, AgentSecret, AgentTool, Conversation, Message, Run, Step, StopReason
from apps.agents.prompts import DEFAULT_SYSTEM_PROMPT
from apps.agents.recall import MAX_LIMIT as RECALL_MAX_LIMIT  # noqa: F401 - recall search, for the adapters
from apps.agents.recall import SEARCH_MODES as RECALL_SEARCH_MODES  # noqa: F401
from apps.agents.recall import (  # noqa: F401
    agent_zone,
    conversation_search,
    organization_search,
    parse_time_bound,
)
from apps.agents.system_messages import THREAD_SYSTEM_MESSAGE
from apps.core.actor import Actor
from apps.core.db import prepared_cursor
from apps.core.errors import InvalidInput, NotFound
from apps.llm.errors import UnknownModelHandle
from apps.llm.handles import (
    DEFAULT_CONTEXT_WINDOW,
    EMBEDDING_DIMENSIONS,
    EmbeddingTarget,
    ModelTarget,
    resolve_embedding,
    resolve_model,
)
from apps.llm.models import Provider
from apps.llm.selectors import fetch_model_ids
from apps.llm.tokens import count_text_tokens
from apps.llm.tokens import count_tokens as count_request_tokens
from apps.memory.errors import BlockNotFound
from apps.memory.models import Block
from apps.tools.models import Tool

logger = logging.getLogger(__name__)


# --- Agents ---------------------------------------------------------------------------------------------


def _blocks_prefetch() -> Prefetch:
    return Prefetch("blocks", queryset=Block.all_objects.order_by("created_at"))


def agent_queryset(*, actor: Actor) -> QuerySet[Agent]:
    """Agents with what AgentState needs, prefetched: a list costs a fixed number of queries."""
    return Agent.objects.for_actor(actor).prefetch_related(
        _blocks_prefetch(), Prefetch("tools", queryset=Tool.all_objects.order_by("name"))
    )


def agent_get(*, actor: Actor, agent_id: str) -> Agent:
    """Raises AgentNotFound, also for another organisation's agent (existence is not leaked)."""
    agent = agent_queryset(actor=actor).filter(id=agent_id).first()
    if agent is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    return agent


def agent_list(
    *, actor: Actor, name: str | None = None, tags: list[str] | None = None, match_all_tags: bool = False
) -> QuerySet[Agent]:
    qs = agent_queryset(actor=actor)
    if name:
        qs = qs.filter(name=name)
    if tags:
        qs = qs.filter(tags__contains=tags) if match_all_tags else qs.filter(tags__overlap=tags)
    return qs


SECRET_LIST_FIELDS = ("id", "agent_id", "key", "description", "created_at", "updated_at")


AGENT_RELATIONSHIPS = frozenset(
    {"blocks", "identities", "managed_group", "pending_approval", "secrets", "sources", "tags", "tools"}
)
"""What an AgentState carries beyond the agent's own columns: Letta's `include` values, without `agent.`."""


def agent_state_queryset(
    *, actor: Actor, tools: bool = True, include: frozenset[str] = AGENT_RELATIONSHIPS
) -> QuerySet[Agent]:
    """Agents with the relationships in `include` prefetched (an AgentState leaves the others empty), the
    secrets' keys only (never their values). Without `tools`, the tools are left for `attach_shared_tools`
    (lists)."""
    qs = Agent.objects.for_actor(actor)
    if "blocks" in include:
        qs = qs.prefetch_related(_blocks_prefetch())
    if tools and "tools" in include:
        qs = qs.prefetch_related(Prefetch("tools", queryset=Tool.all_objects.order_by("name")))
    if "secrets" in include:
        qs = qs.prefetch_related(
            Prefetch("secrets", queryset=AgentSecret.all_objects.only(*SECRET_LIST_FIELDS).order_by("key"))
        )
    return qs


def pending_approvals_by_agent(agents: Sequence[Agent]) -> dict[str, Message]:
    """Each agent's approval request awaiting a decision in its default conversation (its last in-context
    message, when it is one: apps.agents.services.pending_approval), in one query for all of them."""
    last = {agent.message_ids[-1]: agent.id for agent in agents if agent.message_ids}
    if not last:
        return {}
    found = Message.all_objects.filter(id__in=list(last), role=Message.Role.APPROVAL)
    return {last[message.id]: message for message in found if message.is_approval_request}


def attach_shared_tools(agents: Sequence[Agent]) -> None:
    """Give agents loaded without their tools (`agent_state_queryset(tools=False)`) their tools, as the
    prefetch would (`agent.tools.all()`, by name), in one query for the whole list and one instance per
    tool however many agents hold it. Most agents hold the same base tools: a page of 50 prefetched them as
    1,350 rows, each a model instance with its JSON decoded (bench/scale_bench.py)."""
    todo = [a for a in agents if "tools" not in getattr(a, "_prefetched_objects_cache", {})]
    if not todo:
        return
    held: dict[str, list[Tool]] = {a.id: [] for a in todo}
    shared = (
        Tool.all_objects.filter(agent_attachments__agent_id__in=list(held))
        .annotate(holders=ArrayAgg("agent_attachments__agent_id"))
        .order_by("name")
    )
    for tool in shared:
        for agent_id in tool.holders:
            held[agent_id].append(tool)
    for agent in todo:
        cached = agent.tools.all()  # lazy: given its rows, as prefetch_related does
        cached._result_cache = held[agent.id]
        cached._prefetch_done = True  # type: ignore[attr-defined]
        agent.__dict__.setdefault("_prefetched_objects_cache", {})["tools"] = cached


def agent_state_get(*, actor: Actor, agent_id: str, include: frozenset[str] = AGENT_RELATIONSHIPS) -> Agent:
    """Raises AgentNotFound, also for another organisation's agent."""
    agent = agent_state_queryset(actor=actor, include=include).filter(id=agent_id).first()
    if agent is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    return agent


def agent_state_list(
    *,
    actor: Actor,
    name: str | None = None,
    tags: list[str] | None = None,
    match_all_tags: bool = False,
    query_text: str | None = None,
    created_by_id: str | None = None,
    last_stop_reason: str | None = None,
    show_hidden: bool = True,
    include: frozenset[str] = AGENT_RELATIONSHIPS,
) -> QuerySet[Agent]:
    """Agents for AgentState lists, with the relationships in `include`; `query_text` matches names
    case-insensitively; hidden agents (created with `hidden`) only with `show_hidden` (the API's
    show_hidden_agents, false by default as on Letta). Without their tools: `attach_shared_tools` gives a
    page theirs."""
    qs = agent_state_queryset(actor=actor, tools=False, include=include)
    if not show_hidden:
        qs = qs.filter(hidden=False)
    if name:
        qs = qs.filter(name=name)
    if tags:
        qs = qs.filter(tags__contains=tags) if match_all_tags else qs.filter(tags__overlap=tags)
    if query_text:
        qs = qs.filter(name__icontains=query_text)
    if created_by_id:
        qs = qs.filter(created_by_id=created_by_id)
    if last_stop_reason:
        qs = qs.filter(last_stop_reason=last_stop_reason)
    return qs


def agent_system_prompt(agent: Agent) -> str:
    """The system prompt the agent runs with: its own, or the default one when it has none."""
    return agent.system or DEFAULT_SYSTEM_PROMPT


def _require_agent(*, actor: Actor, agent_id: str) -> None:
    if not Agent.objects.for_actor(actor).filter(id=agent_id).exists():
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")


def agent_require(*, actor: Actor, agent_id: str) -> None:
    """Raises AgentNotFound unless the agent exists in the actor's organisation (one cheap query)."""
    _require_agent(actor=actor, agent_id=agent_id)


def agent_tool_list(*, actor: Actor, agent_id: str) -> QuerySet[Tool]:
    """The agent's tools. Raises AgentNotFound."""
    _require_agent(actor=actor, agent_id=agent_id)
    return Tool.objects.for_actor(actor).filter(agent_attachments__agent_id=agent_id)


def agent_block_list(*, actor: Actor, agent_id: str) -> QuerySet[Block]:
    """The agent's core-memory blocks. Raises AgentNotFound."""
    _require_agent(actor=actor, agent_id=agent_id)
    return Block.objects.for_actor(actor).filter(agent_attachments__agent_id=agent_id)


def agent_block_get_by_label(*, actor: Actor, agent_id: str, label: str) -> Block:
    """The agent's block with this label (labels are unique per agent). Raises AgentNotFound, BlockNotFound."""
    _require_agent(actor=actor, agent_id=agent_id)
    block = (
        Block.objects.for_actor(actor)
        .filter(agent_attachments__agent_id=agent_id, agent_attachments__block_label=label)
        .first()
    )
    if block is None:
        raise BlockNotFound(f"Block with label '{label}' not found on agent '{agent_id}'")
    return block


def agent_approval_tool_names(*, actor: Actor, agent_id: str) -> frozenset[str]:
    """Names of the agent's tools whose calls wait for a human decision (requires_approval rules and
    tools approved by default); client-side tools of a request come on top. One prepared statement, written
    as SQL: every send that streams tokens asks this (once its run is queued, so not on the first token's
    path), and the ORM's two queries took 0.9 ms of the web's CPU against 0.1 (bench/RESULTS.md)."""
    with prepared_cursor() as cursor:
        cursor.execute(_approval_tool_names_sql(), [agent_id, actor.organization_id])
        row = cursor.fetchone()
    if row is None:
        raise AgentNotFound(f"Agent with id '{agent_id}' not found")
    raw_rules, by_default = row
    # Django's connections load jsonb as text, which its JSONField decodes; a raw cursor gets the text
    rules = json.loads(raw_rules) if isinstance(raw_rules, str) else raw_rules
    by_rule = {
        rule.get("tool_name")
        for rule in rules or []
        if isinstance(rule, dict) and rule.get("type") == "requires_approval"
    }
    return frozenset({name for name in by_rule if name} | set(by_default))


@functools.cache
def _approval_tool_names_sql() -> str:
    attached = AgentTool._meta.db_table
    return (
        f"SELECT agent.tool_rules, ARRAY(SELECT tool.name FROM {Tool._meta.db_table} AS tool "
        f"JOIN {attached} AS attached ON attached.tool_id = tool.id WHERE attached.agent_id = agent.id "
        "AND tool.organization_id = agent.organization_id AND tool.default_requires_approval) "
        f"FROM {Agent._meta.db_table} AS agent WHERE agent.id = %s AND agent.organization_id = %s"
    )


def agent_tag_list(
    *,
    actor: Actor,
    query_text: str | None = None,
    after: str | None = None,
    before: str | None = None,
    limit: int = 50,
    order: str = "asc",
) -> list[str]:
    """Distinct tags of the organisation's agents, sorted by name; the cursors are tags, relative to `order`.

    One statement: unnest in SQL, since a set-returning function cannot be filtered through the ORM.
    """
    ascending = order == "asc"
    conditions = ["organization_id = %s"]
    params: list[Any] = [actor.organization_id]
    if query_text:
        conditions.append("tag ILIKE %s")
        params.append(f"%{_escape_like(query_text)}%")
    if after:
        conditions.append("tag > %s" if ascending else "tag < %s")
        params.append(after)
    if before:
        conditions.append("tag < %s" if ascending else "tag > %s")
        params.append(before)
    # Only fixed identifiers are interpolated; every value goes through params.
    sql = (
        f"SELECT DISTINCT tag FROM {Agent._meta.db_table}, unnest(tags) AS tag "
        f"WHERE {' AND '.join(conditions)} ORDER BY tag {'ASC' if ascending else 'DESC'} LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, limit])
        return [row[0] for row in cursor.fetchall()]


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def block_editor_names(*, actor: Actor, editor_ids: Iterable[str]) -> dict[str, str]:
    """Display names of who changed memory blocks (BlockHistory.actor_id): users by username, agents by
    name, keyed by id. Ids outside the actor's organisation are simply absent."""
    ids = {editor_id for editor_id in editor_ids if editor_id}
    if not ids:
        return {}
    users = User.objects.filter(id__in=ids, memberships__organization_id=actor.organization_id)
    agents = Agent.objects.for_actor(actor).filter(id__in=ids)
    return {
        **dict(users.values_list("id", "username")),
        **dict(agents.values_list("id", "name")),
    }


# --- Models an organisation's providers serve -----------------------------------------------------------


# The model catalogue: which handles an organisation can use. It lives here rather than in apps.llm only
# because of who owns which file today; it depends on nothing agent-specific and can move down unchanged.


MODEL_LIST_TIMEOUT = 2.0
"""Seconds to wait for an OpenAI-compatible server's /models: a listing must never hang on a dead server."""


KNOWN_OPENAI_CHAT_MODELS = ("gpt-4o-mini", "gpt-4o", "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "o4-mini")
KNOWN_OPENAI_EMBEDDING_MODELS = ("text-embedding-3-small", "text-embedding-3-large", "text-embedding-ada-002")
KNOWN_ANTHROPIC_CHAT_MODELS = ("claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1")
"""What api.openai.com and Anthropic are assumed to serve: their model lists are never fetched (no outbound
call for a listing; a handle outside these lists still works if the provider serves it)."""


_ENDPOINT_TYPE = {"anthropic": "anthropic", "ollama": "ollama"}  # everything else speaks OpenAI's API


@dataclass(frozen=True, slots=True)
class ChatModelInfo:
    """A chat model as /v1/models and AgentState.llm_config describe it."""

    handle: str
    name: str
    provider_name: str
    provider_type: str
    endpoint_type: str
    endpoint: str | None
    provider_category: str | None
    context_window: int
    max_context_window: int


@dataclass(frozen=True, slots=True)
class EmbeddingModelInfo:
    """An embedding model; `dimension` is None until a first call has taught it."""

    handle: str
    name: str
    provider_name: str
    provider_type: str
    endpoint_type: str
    endpoint: str | None
    provider_category: str | None
    dimension: int | None


@dataclass(frozen=True, slots=True)
class _ProviderSource:
    name: str
    provider_type: str
    api_key: str | None = field(repr=False)
    base_url: str | None
    category: str  # Letta's provider_category: "byok" (the organisation's own) or "base" (the deployment's)


def _letta_provider_type(provider_type: str) -> str:
    """Letta has no 'openai_compatible' type; such servers are spoken to as OpenAI."""
    return "openai" if provider_type == Provider.Type.OPENAI_COMPATIBLE else provider_type


def _provider_sources(*, actor: Actor) -> list[_ProviderSource]:
    """The organisation's providers, then the environment's that no provider of the same name shadows
    (the same precedence as apps.llm.handles)."""
    sources = [
        _ProviderSource(row.name, row.provider_type, row.api_key or None, row.base_url or None, "byok")
        for row in Provider.objects.for_actor(actor).order_by("name")
    ]
    taken = {s.name for s in sources}
    env = [
        ("openai", Provider.Type.OPENAI, settings.OPENAI_API_KEY, settings.OPENAI_BASE_URL),
        ("anthropic", Provider.Type.ANTHROPIC, settings.ANTHROPIC_API_KEY, ""),
        ("ollama", Provider.Type.OLLAMA, "", settings.OLLAMA_BASE_URL),
    ]
    sources += [
        _ProviderSource(name, kind, key or None, base or None, "base")
        for name, kind, key, base in env
        if name not in taken and (key or base)
    ]
    return sources


def _fetch_model_names(source: _ProviderSource) -> list[str]:
    """Model ids from the source's OpenAI-style `/models`; [] when it is down, slow, answers oddly or
    is refused by the outbound guard (an organisation's URL reaches public addresses only)."""
    base = (source.base_url or "").rstrip("/")
    if source.provider_type == Provider.Type.OLLAMA and not base.endswith("/v1"):
        base += "/v1"
    return fetch_model_ids(base, api_key=source.api_key or None, timeout=MODEL_LIST_TIMEOUT)


def _is_embedding_name(name: str) -> bool:
    return "embed" in name or name.split(":", 1)[0] in EMBEDDING_DIMENSIONS


def _source_model_names(sources: list[_ProviderSource]) -> dict[str, tuple[list[str], list[str]]]:
    """(chat names, embedding names) per source name; remote lists are fetched in parallel."""
    remote = [s for s in sources if s.base_url and s.provider_type != Provider.Type.ANTHROPIC]
    fetched: dict[str, list[str]] = {}
    if remote:
        with ThreadPoolExecutor(max_workers=len(remote)) as pool:
            fetched = dict(zip([s.name for s in remote], pool.map(_fetch_model_names, remote), strict=True))
    names: dict[str, tuple[list[str], list[str]]] = {}
    for source in sources:
        if source.name in fetched:
            all_names = fetched[source.name]
            names[source.name] = (
                [n for n in all_names if not _is_embedding_name(n)],
                [n for n in all_names if _is_embedding_name(n)],
            )
        elif source.provider_type == Provider.Type.ANTHROPIC:
            names[source.name] = (list(KNOWN_ANTHROPIC_CHAT_MODELS), [])
        elif source.provider_type == Provider.Type.OPENAI:
            names[source.name] = (list(KNOWN_OPENAI_CHAT_MODELS), list(KNOWN_OPENAI_EMBEDDING_MODELS))
        else:
            names[source.name] = ([], [])
    return names


def _chat_info(target: ModelTarget, *, category: str | None) -> ChatModelInfo:
    return ChatModelInfo(
        handle=target.handle,
        name=target.handle.partition("/")[2],
        provider_name=target.provider_name,
        provider_type=_letta_provider_type(target.provider_type),
        endpoint_type=_ENDPOINT_TYPE.get(target.provider_type, "openai"),
        endpoint=target.api_base,
        provider_category=category,
        context_window=target.context_window,
        max_context_window=target.max_context_window,
    )


def _embedding_info(target: EmbeddingTarget, *, category: str | None) -> EmbeddingModelInfo:
    return EmbeddingModelInfo(
        handle=target.handle,
        name=target.handle.partition("/")[2],
        provider_name=target.provider_name,
        provider_type=_letta_provider_type(target.provider_type),
        endpoint_type=_ENDPOINT_TYPE.get(target.provider_type, "openai"),
        endpoint=target.api_base,
        provider_category=category,
        dimension=target.dimension,
    )


def model_list(
    *,
    actor: Actor,
    provider_category: list[str] | None = None,
    provider_name: str | None = None,
    provider_type: str | None = None,
) -> list[ChatModelInfo]:
    """The chat models this organisation can use, each resolved as an agent with its handle would be
    (a provider that cannot serve, e.g. without a key, contributes nothing)."""
    sources = [
        s
        for s in _provider_sources(actor=actor)
        if (not provider_category or s.category in provider_category)
        and (not provider_name or s.name == provider_name)
        and (not provider_type or _letta_provider_type(s.provider_type) == provider_type)
    ]
    names = _source_model_names(sources)
    models = []
    for source in sources:
        for name in names[source.name][0]:
            try:
                target = resolve_model(f"{source.name}/{name}", organization_id=actor.organization_id)
            except UnknownModelHandle:
                continue
            models.append(_chat_info(target, category=source.category))
    return models


def embedding_model_list(*, actor: Actor) -> list[EmbeddingModelInfo]:
    """The embedding models this organisation can use (known sizes filled in, others learned on first use)."""
    sources = _provider_sources(actor=actor)
    names = _source_model_names(sources)
    models = []
    for source in sources:
        for name in names[source.name][1]:
            try:
                target = resolve_embedding(f"{source.name}/{name}", organization_id=actor.organization_id)
            except UnknownModelHandle:
                continue
            models.append(_embedding_info(target, category=source.category))
    return models


def agent_model_infos(
    *, actor: Actor, agents: Iterable[Agent]
) -> tuple[dict[str, ChatModelInfo], dict[str, EmbeddingModelInfo]]:
    """Chat and embedding model descriptions for the agents' handles, resolved once per distinct handle,
    so an AgentState list costs one query per distinct handle, not per agent. A handle that no longer
    resolves (provider removed, key unset) is still described, from the handle alone."""
    agents = list(agents)
    # The organisation's providers, read once for every handle (each resolve would read its own).
    byok = {provider.name: provider for provider in Provider.objects.for_actor(actor)}

    def category(handle: str) -> str:
        return "byok" if handle.partition("/")[0] in byok else "base"

    def rows(handle: str) -> list[Provider]:
        named = byok.get(handle.partition("/")[0])
        return [named] if named is not None else []

    chats: dict[str, ChatModelInfo] = {}
    for handle in sorted({a.model for a in agents if a.model}):
        try:
            target = resolve_model(handle, organization_id=actor.organization_id, provider_rows=rows(handle))
        except UnknownModelHandle:
            chats[handle] = _unresolved_chat_info(handle)
        else:
            chats[handle] = _chat_info(target, category=category(handle))
    embeddings: dict[str, EmbeddingModelInfo] = {}
    for handle in sorted({a.embedding for a in agents if a.embedding}):
        try:
            embedding_target = resolve_embedding(
                handle, organization_id=actor.organization_id, provider_rows=rows(handle)
            )
        except UnknownModelHandle:
            embeddings[handle] = _unresolved_embedding_info(handle)
        else:
            embeddings[handle] = _embedding_info(embedding_target, category=category(handle))
    return chats, embeddings


def _guessed_provider_type(handle: str) -> str:
    prefix = handle.partition("/")[0]
    return prefix if prefix in ("anthropic", "ollama") else "openai"


def _unresolved_chat_info(handle: str) -> ChatModelInfo:
    provider_name, _, name = handle.partition("/")
    provider_type = _guessed_provider_type(handle)
    return ChatModelInfo(
        handle=handle,
        name=name,
        provider_name=provider_name,
        provider_type=provider_type,
        endpoint_type=provider_type,
        endpoint=None,
        provider_category=None,
        context_window=DEFAULT_CONTEXT_WINDOW,
        max_context_window=DEFAULT_CONTEXT_WINDOW,
    )


def _unresolved_embedding_info(handle: str) -> EmbeddingModelInfo:
    provider_name, _, name = handle.partition("/")
    provider_type = _guessed_provider_type(handle)
    return EmbeddingModelInfo(
        handle=handle,
        name=name,
        provider_name=provider_name,
        provider_type=provider_type,
        endpoint_type=provider_type,
        endpoint=None,
        provider_category=None,
        dimension=EMBEDDING_DIMENSIONS.get(name.split(":", 1)[0]),
    )


# --- Conversations and threads --------------------------------------------------------------------------


ACTIVE_RUN_STATUSES = (Run.Status.CREATED, Run.Status.RUNNING)
TERMINAL_RUN_STATUSES = (Run.Status.COMPLETED, Run.Status.FAILED, Run.Status.CANCELLED)


def conversation_get(*, actor: Actor, conversation_id: str, agent_id: str | None = None) -> Conversation:
    """Raises NotFound, also for another organisation's conversation (or another agent's, given agent_id)."""
    qs = Conversation.objects.for_actor(actor).filter(id=conversation_id)
    if agent_id is not None:
        qs = qs.filter(agent_id=agent_id)
    conversation = qs.first()
    if conversation is None:
        raise NotFound(f"Conversation with id '{conversation_id}' not found")
    return conversation


def conversation_list(
    *, actor: Actor, agent_id: str | None = None, summary_search: str | None = None
) -> QuerySet[Conversation]:
    qs = Conversation.objects.for_actor(actor)
    if agent_id:
        qs = qs.filter(agent_id=agent_id)
    if summary_search:
        qs = qs.filter(summary__icontains=summary_search)
    return qs


def conversation_message_list(
    *, actor: Actor, conversation: Conversation, include_system: bool = False
) -> QuerySet[Message]:
    """The conversation's stored messages (recall, not only the context window), with those it shares
    with the thread it was forked from while they are in its context (a fork shares the source's messages
    instead of copying them, so they are stored under the source)."""
    mine = Q(conversation_id=conversation.id)
    if conversation.message_ids:
        mine |= Q(id__in=conversation.message_ids)
    qs = Message.objects.for_actor(actor).filter(mine, agent_id=conversation.agent_id)
    return _visible_messages(qs, include_system=include_system)


def thread_system_message(*, actor: Actor, agent_id: str, conversation_id: str | None = None) -> str:
    """The system message the agent's next LLM call in this thread would start with, compiled now from its
    current memory (the loop compiles it afresh for every call, so nothing stored can be stale). Raises
    AgentNotFound, NotFound (a conversation of another agent), InvalidInput when the agent's model cannot
    be used (the prompt depends on its provider)."""
    from apps.agents.loop import state as loop_state  # above the selectors, as in agent_context_overview

    _require_agent(actor=actor, agent_id=agent_id)
    if conversation_id is not None:
        conversation_get(actor=actor, conversation_id=conversation_id, agent_id=agent_id)
    probe = Run(
        organization_id=actor.organization_id,
        agent_id=agent_id,
        conversation_id=conversation_id,
        request_config={},
    )
    try:
        state = loop_state.load_state(probe, NullSink(), keep_messages=False)
    except loop_state.StopRun as exc:
        raise InvalidInput(exc.error or exc.reason) from exc
    return loop_state.system_sections(state).render()


def thread_run_list(
    *, actor: Actor, agent_id: str, conversation_id: str | None, active: bool = False
) -> QuerySet[Run]:
    """The runs of one agent thread (a conversation, or the default thread when `conversation_id` is
    None), newest first; `active`: only those not finished yet."""
    qs = Run.objects.for_actor(actor).filter(agent_id=agent_id, conversation_id=conversation_id)
    if active:
        qs = qs.filter(status__in=ACTIVE_RUN_STATUSES)
    return qs.order_by("-created_at")


# --- Messages -------------------------------------------------------------------------------------------


def _visible_messages(qs: QuerySet[Message], *, include_system: bool) -> QuerySet[Message]:
    """Threads' stored system messages are listed (first: apps.agents.system_messages), as in Letta; other
    system messages (the loop's alerts, system-role input) only when asked for."""
    return qs if include_system else qs.exclude(role=Message.Role.SYSTEM, sequence_id__gte=0)


def without_thread_system_messages(qs: QuerySet[Message]) -> QuerySet[Message]:
    """`qs` without threads' stored system messages (timelines of turns, which show the prompt apart)."""
    return qs.exclude(THREAD_SYSTEM_MESSAGE)


THREAD_ORDER = ("conversation_id", "sequence_id")
"""One thread's messages in sequence order. The conversation is the same on every row of a thread, so it
does not change the order, but it lets PostgreSQL read a page from message_agent_conv_seq_idx: sorting by
`sequence_id` alone, it cannot (`conversation_id IS NULL` does not fix the column the way `=` would), so it
walks the global sequence index backwards instead, through every newer message of every other agent (2 s
for an agent with 100,000 messages among 1,000,000: tests/api/test_scale_queries.py)."""


def agent_message_list(
    *, actor: Actor, agent_id: str, conversation_id: str | None = None, include_system: bool = False
) -> QuerySet[Message]:
    """Every stored message (recall, not only the context window) of the agent's default thread, or of one
    of its conversations, in THREAD_ORDER (message_page keeps it). Raises AgentNotFound, NotFound
    (conversation)."""
    _require_agent(actor=actor, agent_id=agent_id)
    qs = Message.objects.for_actor(actor).filter(agent_id=agent_id)
    if conversation_id:
        conversation_get(actor=actor, conversation_id=conversation_id, agent_id=agent_id)
        qs = qs.filter(conversation_id=conversation_id)
    else:
        qs = qs.filter(conversation__isnull=True)
    # Vectors are for recall search, not for showing messages (384 floats a row to fetch and parse).
    return _visible_messages(qs, include_system=include_system).defer("embedding").order_by(*THREAD_ORDER)


def message_list(
    *, actor: Actor, conversation_id: str | None = None, include_system: bool = False
) -> QuerySet[Message]:
    """The organisation's messages, across agents (GET /v1/messages/)."""
    qs = Message.objects.for_actor(actor)
    if conversation_id:
        qs = qs.filter(conversation_id=conversation_id)
    return _visible_messages(qs, include_system=include_system)


def message_get(*, actor: Actor, message_id: str) -> Message:
    """Raises NotFound, also for another organisation's message."""
    message = Message.objects.for_actor(actor).filter(id=message_id).first()
    if message is None:
        raise NotFound(f"Message with id '{message_id}' not found")
    return message


def run_message_list(*, actor: Actor, run_id: str, include_system: bool = False) -> QuerySet[Message]:
    """The run's messages: its input and what the agent produced. Raises NotFound."""
    run_get(actor=actor, run_id=run_id)
    qs = Message.objects.for_actor(actor).filter(run_id=run_id)
    return _visible_messages(qs, include_system=include_system)


def step_message_list(*, actor: Actor, step_id: str) -> QuerySet[Message]:
    """The messages one step produced. Raises NotFound."""
    step_get(actor=actor, step_id=step_id)
    return Message.objects.for_actor(actor).filter(step_id=step_id)


def message_page(
    qs: QuerySet[Message],
    *,
    actor: Actor,
    before: str | None = None,
    after: str | None = None,
    limit: int = 100,
    order: str = "desc",
) -> list[Message]:
    """One page of messages with Letta's message cursor semantics (letta_api.md 1.6).

    `after`/`before` compare the message sequence whatever the order (an unknown cursor gives an empty
    page); `desc` takes the newest `limit` messages and returns them oldest first, `asc` the oldest. One
    query: the cursors are subqueries. A thread's queryset (agent_message_list) is paged in THREAD_ORDER,
    the same order, read from the thread's index.
    """
    for cursor, lookup in ((after, "sequence_id__gt"), (before, "sequence_id__lt")):
        if cursor:
            position = Message.objects.for_actor(actor).filter(id=cursor).values("sequence_id")[:1]
            qs = qs.filter(**{lookup: Subquery(position)})
    keys = THREAD_ORDER if tuple(qs.query.order_by) == THREAD_ORDER else ("sequence_id",)
    if order == "asc":
        return list(qs.order_by(*keys)[:limit])
    return list(reversed(qs.order_by(*(f"-{key}" for key in keys))[:limit]))


# --- Runs -----------------------------------------------------------------------------------------------


def run_get(*, actor: Actor, run_id: str) -> Run:
    """Raises NotFound, also for another organisation's run."""
    run = Run.objects.for_actor(actor).filter(id=run_id).first()
    if run is None:
        raise NotFound(f"Run with id '{run_id}' not found")
    return run


def run_list(
    *,
    actor: Actor,
    agent_id: str | None = None,
    statuses: list[str] | None = None,
    active: bool = False,
    background: bool | None = None,
    stop_reason: str | None = None,
    conversation_id: str | None = None,
) -> QuerySet[Run]:
    """Runs, filtered; `active` keeps those not finished yet (created or running)."""
    qs = Run.objects.for_actor(actor)
    if agent_id:
        qs = qs.filter(agent_id=agent_id)
    if statuses:
        qs = qs.filter(status__in=statuses)
    if active:
        qs = qs.filter(status__in=ACTIVE_RUN_STATUSES)
    if background is not None:
        qs = qs.filter(background=background)
    if stop_reason:
        qs = qs.filter(stop_reason=stop_reason)
    if conversation_id:
        qs = qs.filter(conversation_id=conversation_id)
    return qs


def run_list_with_usage(*, actor: Actor, run_ids: Iterable[str]) -> dict[str, Run]:
    """The actor's runs among `run_ids`, each annotated with its steps' token totals (`prompt_tokens`,
    `completion_tokens`, `total_tokens`, `step_count`), in one query; another organisation's ids are
    simply absent. For timelines that show a usage line under every turn."""
    runs = (
        Run.objects.for_actor(actor)
        .filter(id__in=list(run_ids))
        .annotate(
            prompt_tokens=Sum("steps__prompt_tokens", default=0),
            completion_tokens=Sum("steps__completion_tokens", default=0),
            total_tokens=Sum("steps__total_tokens", default=0),
            step_count=Count("steps"),
        )
    )
    return {run.id: run for run in runs}


def run_produced_messages(*, actor: Actor, run_id: str) -> QuerySet[Message]:
    """What a run's agent produced, in order: no user or system input, no approval decision (those
    carry no step). Replays of a run whose event stream is gone start from here."""
    return (
        Message.objects.for_actor(actor)
        .filter(run_id=run_id)
        .exclude(role__in=[Message.Role.USER, Message.Role.SYSTEM])
        .exclude(step__isnull=True, role=Message.Role.APPROVAL)
        .defer("embedding")
        .order_by("sequence_id")
    )


def run_stop_reason(run: Run) -> str:
    """The run's stop reason; a run that ended without one was cancelled or failed."""
    if run.stop_reason:
        return run.stop_reason
    return "cancelled" if run.status == Run.Status.CANCELLED else "error"


def run_usage_event(*, actor: Actor, run: Run) -> dict[str, Any]:
    """Letta's usage_statistics message for a run, from its steps."""
    totals = run_usage(actor=actor, run_id=run.id)
    prompt, completion, steps = (
        int(totals[key] or 0) for key in ("prompt_tokens", "completion_tokens", "step_count")
    )
    return UsageStatistics(prompt, completion, steps, (run.id,)).event()


def run_usage(*, actor: Actor, run_id: str) -> dict[str, int | None]:
    """Token totals over the run's steps. Raises NotFound."""
    run_get(actor=actor, run_id=run_id)
    totals = (
        Step.objects.for_actor(actor)
        .filter(run_id=run_id)
        .aggregate(
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
            total_tokens=Sum("total_tokens"),
            reasoning_tokens=Sum("reasoning_tokens"),
            cached_input_tokens=Sum("cached_input_tokens"),
            step_count=Count("id"),
        )
    )
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        totals[key] = totals[key] or 0
    return totals


def run_last_logprobs(*, actor: Actor, run_id: str) -> dict[str, Any] | None:
    """The log probabilities of the run's last LLM call that has them (Step.logprobs), or None."""
    steps = Step.objects.for_actor(actor).filter(run_id=run_id, logprobs__isnull=False)
    return steps.order_by("-created_at", "-id").values_list("logprobs", flat=True).first()


def run_find_by_otids(*, actor: Actor, agent_id: str, otids: list[str]) -> Run | None:
    """The run that already took a message with one of these client ids (otid) for this agent: a resent
    request (an SDK retry after a timeout) is answered from it instead of running twice."""
    wanted = [otid for otid in otids if otid]
    if not wanted:
        return None
    message = (
        Message.objects.for_actor(actor)
        .filter(agent_id=agent_id, otid__in=wanted, run__isnull=False)
        .select_related("run")
        .order_by("sequence_id")
        .first()
    )
    return message.run if message is not None else None


def run_awaiting_approval(*, actor: Actor, run: Run, messages: Sequence[Message]) -> Message | None:
    """The approval request `run` stopped on, read from the run itself (`messages`: its own, oldest first):
    its last message, while the run is its thread's newest. The run's stream ends in the browser before
    its writes are all visible in the thread, and a turn fetched at that moment must still come with its
    decision form."""
    last = messages[-1] if messages else None
    if run.stop_reason != StopReason.REQUIRES_APPROVAL or last is None:
        return None
    if last.role != Message.Role.APPROVAL or not last.tool_calls:
        return None
    newest = (
        thread_run_list(actor=actor, agent_id=run.agent_id, conversation_id=run.conversation_id)
        .order_by("-created_at", "-id")
        .values_list("id", flat=True)
        .first()
    )
    return last if newest == run.id else None


def run_visible_to_user(*, user: User, run_id: str) -> bool:
    """Whether the run belongs to one of the user's organisations (for the WebSocket relay, which has a
    user but no actor). Another organisation's run looks exactly like a missing one."""
    org_ids = staff_organization_ids(user=user)
    return Run.objects.unscoped().filter(id=run_id, organization_id__in=org_ids).exists()


# --- Steps ----------------------------------------------------------------------------------------------


def step_get(*, actor: Actor, step_id: str) -> Step:
    """Raises NotFound, also for another organisation's step."""
    step = Step.objects.for_actor(actor).filter(id=step_id).first()
    if step is None:
        raise NotFound(f"Step with id '{step_id}' not found")
    return step


def step_list(
    *,
    actor: Actor,
    agent_id: str | None = None,
    run_id: str | None = None,
    model: str | None = None,
    feedback: str | None = None,
    has_feedback: bool | None = None,
    tags: list[str] | None = None,
    start_date: datetime | None = None,
    end_date: datetime | None = None,
) -> QuerySet[Step]:
    qs = Step.objects.for_actor(actor)
    if agent_id:
        qs = qs.filter(agent_id=agent_id)
    if run_id:
        qs = qs.filter(run_id=run_id)
    if model:
        qs = qs.filter(Q(model=model) | Q(model_handle=model))
    if feedback:
        qs = qs.filter(feedback=feedback)
    if has_feedback is not None:
        qs = qs.exclude(feedback="") if has_feedback else qs.filter(feedback="")
    if tags:
        qs = qs.filter(tags__overlap=tags)
    if start_date:
        qs = qs.filter(created_at__gte=start_date)
    if end_date:
        qs = qs.filter(created_at__lte=end_date)
    return qs


# --- The context window as the next LLM request would fill it -------------------------------------------


@dataclass(frozen=True, slots=True)
class ContextOverview:
    """The agent's next request, section by section, in tokens; `error` says why it could not be built
    (then `breakdown` is None)."""

    model: str
    breakdown: ContextBreakdown | None
    warning_threshold: int = 0
    compact_threshold: int = 0
    system_message: str = ""
    message_count: int = 0
    tool_names: tuple[str, ...] = ()
    error: str = ""


def agent_context_overview(
    *, actor: Actor, agent_id: str, conversation_id: str | None = None, agent: Agent | None = None
) -> ContextOverview:
    """What the agent's next LLM request would hold: system prompt, memory blocks, tool rules, memory
    metadata, summary, tool schemas and in-context messages, each in tokens, against its context window.

    Built from the loop's own code so it cannot drift from what is sent: apps.agents.loop.state loads the
    state (blocks, tools, rules, in-context messages, memory statistics) and counts messages and schemas
    as the runner does before each call; apps.agents.loop.context compiles the system message and
    budget.context_breakdown splits it.
    Raises AgentNotFound (and NotFound for a conversation of another agent). A model handle that cannot be
    resolved gives an overview with `error` set instead of raising. `agent`: the agent, when the caller
    has already loaded it for this actor (not loaded again).
    """
    # The loop's state module sits above the selectors (imported lazily): the very loading and counting
    # functions the runner calls before each LLM request.
    from apps.agents.loop import state as loop_state

    if agent is None or agent.id != agent_id or agent.organization_id != actor.organization_id:
        agent = agent_get(actor=actor, agent_id=agent_id)
    if conversation_id is not None:
        conversation_get(actor=actor, conversation_id=conversation_id, agent_id=agent.id)
    probe = Run(
        organization_id=actor.organization_id,
        agent_id=agent.id,
        conversation_id=conversation_id,
        request_config={},
    )
    try:
        state = loop_state.load_state(probe, NullSink(), keep_messages=False)  # the web process keeps none
    except loop_state.StopRun as exc:
        return ContextOverview(model=agent.model, breakdown=None, error=exc.error or exc.reason)

    sections = loop_state.system_sections(state)
    model = state.target.litellm_model
    allowed = state.solver.allowed_tools(list(loop_state.available_tool_names(state)))
    schemas = loop_state.tool_schemas(state, allowed)
    infos = [
        MessageInfo(id=message.id, role=message.role, tokens=tokens)
        for message, tokens in zip(state.in_context, loop_state.in_context_tokens(state), strict=True)
    ]
    summary_id = next((m.id for m in state.in_context if m.role == Message.Role.SUMMARY), None)
    breakdown = context_breakdown(
        context_window=state.context_window,
        sections=sections,
        count_tokens=lambda text: count_text_tokens(model, text),
        tool_schema_tokens=count_request_tokens(model, [], schemas) if schemas else 0,
        messages=infos,
        summary_message_id=summary_id,
    )
    budget = ContextBudget(state.context_window)
    return ContextOverview(
        model=agent.model,
        breakdown=breakdown,
        warning_threshold=budget.warning_threshold,
        compact_threshold=budget.compact_threshold,
        system_message=sections.render(),
        message_count=len(state.in_context),
        tool_names=tuple(allowed),
    )


def run_token_turns(*, actor: Actor, run_id: str) -> list[dict[str, Any]]:
    """Letta's `turns` of a send that asked for return_token_ids: each LLM call's output token ids and
    logprobs, and the tool results after it (apps.agents.trajectories)."""
    from apps.agents.trajectories import run_turns

    return run_turns(actor=actor, run_id=run_id)


def run_dataset_rows(
    *,
    actor: Actor,
    agent_id: str | None = None,
    since: Any = None,
    until: Any = None,
    feedback: str | None = None,
    limit: int = 100,
) -> Any:
    """The organisation's finished runs as dataset rows, streamed (apps.agents.trajectories.export_runs)."""
    from apps.agents.trajectories import ExportFilter, export_runs

    where = ExportFilter(agent_id=agent_id, since=since, until=until, feedback=feedback, limit=limit)
    return export_runs(actor=actor, where=where)
