"""ADE: the workspace's right column: the context window viewer, core memory blocks (edit, history, restore),
archival and recall memory.

Every read goes through a selector and every write through the service the API and the agent's own memory
tools use, so a block edited here is versioned, limited and recorded in its history exactly like an edit by
the agent. Views answer HTMX requests with partials under ade/workspace/memory/; an action that changes what
the agent's next request contains answers with the `ade:agent-changed` client event (HX-Trigger), which
refreshes the context window viewer (memory.js) and the other columns.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.utils.timesince import timesince
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from apps.ade.forms.memory import BlockEditForm, PassageForm
from apps.ade.views.base import AdeRequest, ade_view, agent_changed, refusal_status
from apps.agents import selectors as agent_selectors
from apps.agents import services as agent_services
from apps.agents.models import Agent
from apps.core.actor import Actor
from apps.core.errors import DomainError, InvalidInput
from apps.memory import selectors as memory_selectors
from apps.memory import services as memory_services
from apps.memory.errors import BlockConcurrentUpdate
from apps.memory.models import Block, BlockHistory

HISTORY_LIMIT = 25
PASSAGES_PER_PAGE = 10
SEARCH_TOP_K = 20
RECALL_LIMIT = 20

# The context window bar's sections, in the order they appear in the request.
CONTEXT_SECTIONS = (
    ("system_prompt", "System prompt"),
    ("memory_blocks", "Core memory"),
    ("tool_rules", "Tool rules"),
    ("metadata", "Memory metadata"),
    ("summary", "Summary"),
    ("tool_schemas", "Tool schemas"),
    ("messages", "Messages"),
)


def column_context(request: AdeRequest, agent: Agent) -> dict[str, Any]:
    """What ade/workspace/_memory.html needs when the workspace page first renders."""
    # The page's agent comes with its blocks prefetched (agent_state_get), in the order _blocks gives; they
    # are the agent's organisation's (the database refuses any other attachment: memory migration 0004's
    # memory_agentblock_same_organization trigger).
    return {
        "blocks": list(agent.blocks.all()),
        "context": _context_view(request.actor, agent.id, _conversation_id(request), agent=agent),
    }


def _conversation_id(request: AdeRequest) -> str | None:
    """The conversation the centre column shows (`?conversation=`), None for the agent's default one."""
    return (request.GET.get("conversation") or "").strip() or None


# --- context window ---------------------------------------------------------------------------------------


@require_GET
@ade_view
def context_window(request: AdeRequest, agent_id: str) -> HttpResponse:
    agent = agent_selectors.agent_get(actor=request.actor, agent_id=agent_id)
    return render(
        request,
        "ade/workspace/memory/_context.html",
        {
            "agent": agent,
            "context": _context_view(request.actor, agent.id, _conversation_id(request), agent=agent),
        },
    )


@dataclass(frozen=True)
class ContextSection:
    key: str
    label: str
    tokens: int
    percent: str  # of the window, for the bar's CSS width


def _context_view(
    actor: Actor, agent_id: str, conversation_id: str | None, *, agent: Agent | None = None
) -> dict[str, Any]:
    overview = agent_selectors.agent_context_overview(
        actor=actor, agent_id=agent_id, conversation_id=conversation_id, agent=agent
    )
    breakdown = overview.breakdown
    if breakdown is None:
        return {"error": overview.error, "model": overview.model}
    window = breakdown.context_window
    sections = [
        ContextSection(key, label, tokens, f"{100 * tokens / window:.3f}")
        for key, label in CONTEXT_SECTIONS
        for tokens in [getattr(breakdown, key)]
    ]
    total = breakdown.total
    if total > overview.compact_threshold:
        level = "danger"
    elif total > overview.warning_threshold:
        level = "warn"
    else:
        level = "ok"
    return {
        "model": overview.model,
        "sections": sections,
        "total": total,
        "window": window,
        "free": breakdown.free,
        "used_percent": round(100 * total / window, 1),
        "level": level,
        "warning_threshold": overview.warning_threshold,
        "compact_threshold": overview.compact_threshold,
        "message_count": overview.message_count,
        "tool_count": len(overview.tool_names),
    }


# --- core memory blocks -----------------------------------------------------------------------------------


@require_GET
@ade_view
def block_list(request: AdeRequest, agent_id: str) -> HttpResponse:
    agent = agent_selectors.agent_get(actor=request.actor, agent_id=agent_id)
    return render(
        request,
        "ade/workspace/memory/_blocks.html",
        {"agent": agent, "blocks": _blocks(request.actor, agent.id)},
    )


@require_POST
@ade_view
def block_save(request: AdeRequest, agent_id: str, block_id: str) -> HttpResponse:
    """A person's edit of a block's value, compare-and-set on the version the editor was showing."""
    actor = request.actor
    block = _agent_block(actor, agent_id, block_id)
    form = BlockEditForm(request.POST)
    if not form.is_valid():
        return _block_response(request, agent_id, block, status=400, draft=form.draft, error=form.first_error)
    value, version = form.cleaned_data["value"], form.cleaned_data["version"]
    try:
        saved = memory_services.block_update(
            actor=actor, block_id=block.id, value=value, expected_version=version
        )
    except BlockConcurrentUpdate:
        current = memory_selectors.block_get(actor=actor, block_id=block.id)
        return _block_response(request, agent_id, current, status=409, unsaved=value, conflict_from=version)
    except InvalidInput as exc:  # BlockTooLong among them
        return _block_response(request, agent_id, block, status=422, draft=value, error=exc.message)
    return agent_changed(_block_response(request, agent_id, saved, saved_note=saved.version != version))


@require_GET
@ade_view
def block_history(request: AdeRequest, agent_id: str, block_id: str) -> HttpResponse:
    block = _agent_block(request.actor, agent_id, block_id)
    return render(
        request,
        "ade/workspace/memory/_history.html",
        {"agent_id": agent_id, "block": block, "history": _history(request.actor, block)},
    )


@require_POST
@ade_view
def block_restore(request: AdeRequest, agent_id: str, block_id: str, history_id: str) -> HttpResponse:
    """Put the block back to the value it had after one history entry (recorded as a new version)."""
    actor = request.actor
    block = _agent_block(actor, agent_id, block_id)
    entry = memory_selectors.block_history_get(actor=actor, block_id=block.id, history_id=history_id)
    try:
        restored = memory_services.block_restore(actor=actor, history_id=entry.id)
    except InvalidInput as exc:  # e.g. the old value is over a limit lowered since
        return _block_response(request, agent_id, block, status=422, error=exc.message, show_history=True)
    return agent_changed(_block_response(request, agent_id, restored, saved_note=True, show_history=True))


def _blocks(actor: Actor, agent_id: str) -> list[Block]:
    """In the order the loop renders them into the system message."""
    return list(agent_selectors.agent_block_list(actor=actor, agent_id=agent_id).order_by("created_at"))


def _agent_block(actor: Actor, agent_id: str, block_id: str) -> Block:
    """The block, only if it is attached to this agent of the actor's organisation (else 404)."""
    block = agent_selectors.agent_block_list(actor=actor, agent_id=agent_id).filter(id=block_id).first()
    if block is None:
        raise Http404("This agent has no such memory block")
    return block


def _block_response(
    request: AdeRequest,
    agent_id: str,
    block: Block,
    *,
    status: int = 200,
    draft: str | None = None,
    unsaved: str = "",
    error: str = "",
    conflict_from: int | None = None,
    saved_note: bool = False,
    show_history: bool = False,
) -> HttpResponse:
    context = {
        "agent_id": agent_id,
        "block": block,
        "draft": draft,
        "unsaved": unsaved,
        "error": error,
        "conflict_from": conflict_from,
        "saved_note": saved_note,
        "history": _history(request.actor, block) if show_history else None,
    }
    return render(request, "ade/workspace/memory/_block.html", context, status=status)


@dataclass(frozen=True)
class HistoryEntry:
    entry: BlockHistory
    editor: str
    diff: list[tuple[str, str]]
    is_current: bool

    @property
    def when(self) -> str:
        ago = timesince(self.entry.created_at)
        return "just now" if ago.startswith("0\xa0") else f"{ago} ago"


def _history(actor: Actor, block: Block) -> list[HistoryEntry]:
    entries = list(memory_selectors.block_history(actor=actor, block_id=block.id)[:HISTORY_LIMIT])
    names = agent_selectors.block_editor_names(actor=actor, editor_ids=[e.actor_id for e in entries])
    return [
        HistoryEntry(
            entry=entry,
            editor=_editor(entry, names),
            diff=value_diff(entry.value_before, entry.value_after),
            is_current=entry.version == block.version,
        )
        for entry in entries
    ]


def _editor(entry: BlockHistory, names: dict[str, str]) -> str:
    if entry.actor_type == BlockHistory.ActorType.USER:
        return f"User {names.get(entry.actor_id, 'unknown')}"
    if entry.actor_type == BlockHistory.ActorType.AGENT:
        return f"Agent {names.get(entry.actor_id, entry.actor_id or 'unknown')}"
    return "System"


def value_diff(before: str, after: str, *, context: int = 2) -> list[tuple[str, str]]:
    """Line diff of two block values as (kind, text) rows: kind is "add", "del", "ctx" or "gap" (lines
    left out between hunks). Empty when nothing but non-value fields changed."""
    rows: list[tuple[str, str]] = []
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=context)
    for index, line in enumerate(lines):
        if index < 2:  # the ---/+++ file headers
            continue
        if line.startswith("@@"):
            if rows:
                rows.append(("gap", "…"))
            continue
        rows.append(({"+": "add", "-": "del"}.get(line[:1], "ctx"), line[1:]))
    return rows


# --- archival memory --------------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@ade_view
def archival_panel(request: AdeRequest, agent_id: str) -> HttpResponse:
    """GET: the passages (semantic search with `q`, a tag filter, pages). POST: store a passage."""
    actor = request.actor
    agent = agent_selectors.agent_get(actor=actor, agent_id=agent_id)
    if request.method == "POST":
        return _archival_insert(request, agent)
    template = (
        "ade/workspace/memory/_passages.html"
        if request.GET.get("part") == "results"
        else "ade/workspace/memory/_archival.html"
    )
    return render(request, template, _archival_context(request, agent))


@require_POST
@ade_view
def passage_delete(request: AdeRequest, agent_id: str, passage_id: str) -> HttpResponse:
    actor = request.actor
    agent = agent_selectors.agent_get(actor=actor, agent_id=agent_id)
    agent_services.agent_passage_delete(actor=actor, agent_id=agent.id, passage_id=passage_id)
    response = render(
        request,
        "ade/workspace/memory/_passages.html",
        {**_archival_context(request, agent, query=request.POST), "notice": "Passage deleted."},
    )
    return agent_changed(response)


def _archival_insert(request: AdeRequest, agent: Agent) -> HttpResponse:
    form = PassageForm(request.POST)
    template = "ade/workspace/memory/_archival.html"
    status = 422
    if form.is_valid():
        try:
            agent_services.agent_passage_insert(
                actor=request.actor,
                agent_id=agent.id,
                text=form.cleaned_data["text"],
                tags=form.cleaned_data["tags"],
            )
        except DomainError as exc:  # empty text, bad tags, no embedding model, the provider failing
            form.add_domain_error(exc)
            status = refusal_status(exc)
        else:
            context = _archival_context(request, agent, query={})
            context["notice"] = "Passage saved to archival memory."
            return agent_changed(render(request, template, context))
    context = _archival_context(request, agent, query={})
    posted = form.values()
    context.update(
        add_error=form.first_error, add_text=posted["text"], add_tags=posted["tags"], add_open=True
    )
    return render(request, template, context, status=status)


def _archival_context(request: AdeRequest, agent: Agent, *, query: Any = None) -> dict[str, Any]:
    """The passages for the filters in `query` (default: the GET parameters): `q` (search by meaning),
    `tag`, `page`."""
    actor = request.actor
    params = request.GET if query is None else query
    q = (params.get("q") or "").strip()
    tag = (params.get("tag") or "").strip()
    archival = memory_selectors.agent_archival(actor=actor, agent_id=agent.id)
    context: dict[str, Any] = {
        "agent": agent,
        "q": q,
        "tag": tag,
        "tags": archival.tags,
        "total": archival.total,
        "has_embedding": bool(agent.embedding.strip()),
    }
    if q:
        try:
            hits = memory_selectors.agent_archival_search(
                actor=actor, archival=archival, query=q, tag=tag or None, top_k=SEARCH_TOP_K
            )
        except DomainError as exc:
            context["search_error"] = exc.message
            hits = []
        context["results"] = [
            {
                "passage": hit.passage,
                # A text match (no embedding model) has no similarity to show.
                "similarity": round(100 * hit.score) if hit.match == "vector" else None,
            }
            for hit in hits
        ]
        return context
    passages = memory_selectors.agent_archival_passages(actor=actor, archival=archival, tag=tag or None)
    page = Paginator(passages, PASSAGES_PER_PAGE).get_page(params.get("page"))
    context["page"] = page
    context["results"] = [{"passage": passage, "similarity": None} for passage in page]
    return context


# --- recall memory ----------------------------------------------------------------------------------------


@require_GET
@ade_view
def recall_search(request: AdeRequest, agent_id: str) -> HttpResponse:
    """Search the messages of the conversation on screen with the conversation_search tool's own ranking
    (keywords and meaning)."""
    actor = request.actor
    agent = agent_selectors.agent_get(actor=actor, agent_id=agent_id)
    q = (request.GET.get("q") or "").strip()
    context: dict[str, Any] = {"agent": agent, "q": q}
    try:
        context["results"] = agent_selectors.conversation_search(
            actor=actor,
            agent_id=agent.id,
            conversation_id=_conversation_id(request),
            query=q or None,
            limit=RECALL_LIMIT,
        )
    except InvalidInput as exc:
        context["error"] = exc.message
        context["results"] = []
    return render(request, "ade/workspace/memory/_recall.html", context)


_prefix = "agents/<str:agent_id>/memory/"
urlpatterns = [
    path(f"{_prefix}context/", context_window, name="memory-context"),
    path(f"{_prefix}blocks/", block_list, name="memory-blocks"),
    path(f"{_prefix}blocks/<str:block_id>/", block_save, name="memory-block-save"),
    path(f"{_prefix}blocks/<str:block_id>/history/", block_history, name="memory-block-history"),
    path(
        f"{_prefix}blocks/<str:block_id>/history/<str:history_id>/restore/",
        block_restore,
        name="memory-block-restore",
    ),
    path(f"{_prefix}archival/", archival_panel, name="memory-archival"),
    path(f"{_prefix}archival/<str:passage_id>/delete/", passage_delete, name="memory-passage-delete"),
    path(f"{_prefix}recall/", recall_search, name="memory-recall"),
]
