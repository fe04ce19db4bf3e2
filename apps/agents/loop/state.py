"""What a run works on (LoopState), how it is loaded, and the read-only views of it that the loop computes
before each LLM call: the system message's sections, the tools offered and their schemas, and each
in-context message's tokens. The ADE's context viewer (apps.agents.selectors) and the benchmarks use these
same functions, so what they show cannot drift from what the loop sends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.agents import context_sections
from apps.agents.loop import store
from apps.agents.loop.context import (
    BlockSnapshot,
    MemoryStats,
    SystemSections,
    ThreadIds,
    compile_system_sections,
)
from apps.agents.loop.convert import to_llm_messages
from apps.agents.loop.events import EventSink, UsageStatistics
from apps.agents.loop.stored_messages import MESSAGE_ALIAS, MESSAGE_EXCLUDE, MESSAGES_SQL, InContext
from apps.agents.models import Agent, Conversation, Message, Run, StopReason
from apps.agents.prompts import DEFAULT_SYSTEM_PROMPT
from apps.core.actor import Actor
from apps.llm import client as llm
from apps.llm.errors import LLMError
from apps.llm.handles import PROVIDER_ALIAS, ModelTarget, provider_query, resolve_model
from apps.llm.models import Provider
from apps.llm.retry import Deadline
from apps.llm.tokens import count_tokens
from apps.memory.archival import agent_archival_stats
from apps.memory.edits import should_show_line_numbers
from apps.memory.git_memory import GIT_MEMORY_TAG
from apps.memory.models import Block
from apps.tools.models import Tool
from apps.tools.rules import describe_tool_rules, parse_tool_rules
from apps.tools.solver import ToolRulesSolver


class StopRun(Exception):
    def __init__(self, reason: str, error: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    step_count: int = 0

    def as_dict(self, run_id: str) -> dict[str, Any]:
        return UsageStatistics(self.prompt_tokens, self.completion_tokens, self.step_count, (run_id,)).event()


def run_deadline() -> Deadline:
    """When a run starting now must be over (RUN_DEADLINE): checked between steps, and no LLM call of
    the run outlives it."""
    seconds = float(settings.RUN_DEADLINE)
    return Deadline.after(seconds, f"the run did not finish within {seconds:g} s (RUN_DEADLINE)")


@dataclass
class LoopState:
    """What one run works on, loaded once and kept current as the run goes."""

    run: Run
    agent: Agent
    actor: Actor
    conversation: Conversation | None
    target: ModelTarget
    context_window: int
    blocks: list[Block]
    tools: dict[str, Tool]
    client_tools: dict[str, dict[str, Any]]
    solver: ToolRulesSolver
    rules_text: str
    in_context: list[Message]
    stats: MemoryStats
    sink: EventSink
    stream_tokens: bool
    produced: list[Message] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    warned: bool = False
    token_counts: dict[str, int] = field(default_factory=dict)
    inputs: list[Message] = field(default_factory=list)  # the run's user messages (for recall embeddings)
    traces: list[tuple[str, Any, Any]] = field(default_factory=list)  # (step id, request, response)
    # The run's status as the last step's write read it (None: not read since); the next step's cancel
    # check uses it instead of a query of its own.
    status_at_persist: str | None = None
    deadline: Deadline = field(default_factory=run_deadline)
    # The `<directories>` section: attached folders and open files (apps.agents.context_sections).
    directories: str = ""
    # The text this run last wrote to the thread's stored system message (apps.agents.system_messages),
    # and the compiled one the next step's write stores when it differs.
    stored_system_message: str | None = None
    compiled_system_message: str | None = None

    @property
    def conversation_id(self) -> str | None:
        return self.conversation.id if self.conversation is not None else None

    def in_context_ids(self) -> list[str]:
        return [m.id for m in self.in_context]


def load_state(run: Run, sink: EventSink, *, keep_messages: bool = True) -> LoopState:
    """Everything a run works on. keep_messages: reuse and keep this process's loaded messages
    (apps.agents.loop.stored_messages). Raises StopRun when the agent's model cannot be used."""
    actor = Actor.system(run.organization_id)
    # Two round trips before the first step (a run's first LLM call waits for them): the thread's rows,
    # then the messages this process has not kept and the model's provider, which those rows name.
    loaded = store.load_thread(run.agent_id, run.conversation_id, actor)
    agent, conversation, blocks = loaded.agent, loaded.conversation, loaded.blocks
    override_model = run.request_config.get("override_model")  # this run's model, the agent unchanged
    handle = override_model or agent.model
    ids = conversation.message_ids if conversation else agent.message_ids
    pending = InContext(actor, ids, keep=keep_messages)
    provider = provider_query(handle, organization_id=actor.organization_id)
    reads = [store.Read(MESSAGES_SQL, pending.params(), Message, MESSAGE_ALIAS, MESSAGE_EXCLUDE)]
    reads = reads if pending.missing else []
    if provider is not None:
        reads.append(store.Read(provider[0], provider[1], Provider, PROVIDER_ALIAS))
    rows = store.read_together(*reads) if reads else []
    in_context = pending.complete(rows[0] if pending.missing else [])
    try:
        target = resolve_model(
            handle,
            organization_id=actor.organization_id,
            context_window_limit=None if override_model else agent.context_window_limit,
            provider_rows=rows[-1] if provider is not None else None,
        )
    except LLMError as exc:
        raise StopRun(StopReason.LLM_API_ERROR, exc.message) from exc
    except Exception as exc:  # an unusable handle is the agent's configuration problem, reported on the run
        raise StopRun(StopReason.LLM_API_ERROR, str(exc)) from exc
    rules = parse_tool_rules(agent.tool_rules)
    tools = {tool.name: tool for tool in loaded.tools}
    client_tools = {t["name"]: t for t in run.request_config.get("client_tools") or []}
    return LoopState(
        run=run,
        agent=agent,
        actor=actor,
        conversation=conversation,
        target=target,
        context_window=target.context_window,
        blocks=blocks,
        tools=tools,
        client_tools=client_tools,
        solver=ToolRulesSolver(rules),
        rules_text=describe_tool_rules(rules),
        in_context=in_context,
        stats=memory_stats(
            agent,
            actor,
            conversation,
            len(in_context),
            blocks,
            archival=(loaded.archival_count, loaded.archival_tags),
        ),
        sink=sink,
        stream_tokens=bool(run.request_config.get("stream_tokens")),
        directories=context_sections.load_directories(actor, agent, (t.tool_type for t in tools.values())),
    )


def memory_stats(
    agent: Agent,
    actor: Actor,
    conversation: Conversation | None,
    in_context_count: int,
    blocks: list[Block],
    *,
    fresh: bool = True,
    archival: tuple[int, list[str]] | None = None,
) -> MemoryStats:
    """fresh: `agent`/`conversation` were just read, so their message count is current; otherwise (later
    in a run, which has stored messages since) it is read again. archival: the archives' passage count
    and tags, when just read (else read here)."""
    holder = conversation or agent
    stored = (
        holder.message_count
        if fresh
        else store.stored_message_count(agent.id, conversation.id if conversation else None)
    )
    # kept per archive, not counted
    count, tags = archival if archival is not None else agent_archival_stats(actor=actor, agent_id=agent.id)
    return MemoryStats(
        last_memory_edit=max((b.updated_at for b in blocks), default=None),
        recall_message_count=max(0, stored - in_context_count),
        archival_passage_count=count,
        archival_tags=sorted(tags),
    )


def system_sections(state: LoopState) -> SystemSections:
    """The system message's sections for this state (the ADE's context viewer counts them too)."""
    return compile_system_sections(
        system_prompt=state.agent.system or DEFAULT_SYSTEM_PROMPT,
        blocks=[BlockSnapshot(b.label, b.description, b.value, b.limit, b.read_only) for b in state.blocks],
        stats=state.stats,
        tool_rules_text=state.rules_text,
        agent_type=state.agent.agent_type,
        show_line_numbers=should_show_line_numbers(state.agent.agent_type, state.target.provider_type),
        now=timezone.now(),
        timezone=state.agent.timezone or "UTC",
        directories=state.directories,
        thread=ThreadIds(state.agent.id, state.conversation_id),
        git_enabled=GIT_MEMORY_TAG in (state.agent.tags or ()),
    )


def available_tool_names(state: LoopState) -> list[str]:
    """The agent's tools, then the request's client tools of other names."""
    return [*state.tools, *(n for n in state.client_tools if n not in state.tools)]


def tool_schemas(state: LoopState, allowed: list[str]) -> list[dict[str, Any]]:
    """The OpenAI tool schemas of the `allowed` tools, as the request offers them."""
    schemas = []
    for name in allowed:
        if name in state.client_tools:
            spec = state.client_tools[name]
            function = {
                "name": name,
                "description": spec.get("description") or "",
                "parameters": spec.get("parameters") or {"type": "object", "properties": {}},
            }
        else:
            function = dict(state.tools[name].json_schema)
            function["name"] = name
        schemas.append({"type": "function", "function": function})
    return schemas


_TOKEN_CACHE: dict[tuple[str, str, Any], int] = {}
TOKEN_CACHE_MAX = 200_000
"""Token counts of stored messages, per process, keyed by (model, message id, updated_at): counted once,
not at the first step of every run (about 25 us a message: 5 ms a run at 200 in-context messages)."""


def in_context_tokens(state: LoopState) -> list[int]:
    """Tokens of each in-context message as the LLM sees it, counted once per message (per run, and
    across runs through the process-wide cache; an edited message has a new updated_at)."""
    counts = []
    model = state.target.litellm_model
    for message in state.in_context:
        tokens = state.token_counts.get(message.id)
        if tokens is None:
            key = (model, message.id, message.updated_at)
            tokens = _TOKEN_CACHE.get(key) if message.updated_at is not None else None
            if tokens is None:
                converted = llm_form([message])
                tokens = count_tokens(model, converted) if converted else 0
                if message.updated_at is not None:
                    if len(_TOKEN_CACHE) >= TOKEN_CACHE_MAX:
                        _TOKEN_CACHE.clear()
                    _TOKEN_CACHE[key] = tokens
            state.token_counts[message.id] = tokens
        counts.append(tokens)
    return counts


def llm_form(messages: list[Message]) -> list[dict[str, Any]]:
    """to_llm_messages, remembered on each message object: a step resends every in-context message, and a
    stored message does not change (apps.agents.loop.stored_messages; keyed by updated_at all the same).
    Callers must not mutate the dicts (build_llm_messages copies them)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        remembered = message.__dict__.get("_llm_form")
        if remembered is None or remembered[0] != message.updated_at:
            remembered = message.__dict__["_llm_form"] = (message.updated_at, to_llm_messages([message]))
        out.extend(remembered[1])
    return out


def messages_json(state: LoopState, messages: list[dict[str, Any]], *, dropped: int) -> list[str]:
    """The JSON text of a request's `messages` (ChatRequest.messages_json): the fresh system message's,
    then each in-context message's, encoded once per message object like llm_form. `dropped`: leading
    stored forms build_llm_messages left out (a stored system message)."""
    texts: list[str] = []
    for message in state.in_context:
        remembered = message.__dict__.get("_llm_json")
        if remembered is None or remembered[0] != message.updated_at:
            encoded = [llm.encode_message(form) for form in llm_form([message])]
            remembered = message.__dict__["_llm_json"] = (message.updated_at, encoded)
        texts.extend(remembered[1])
    return [llm.encode_message(messages[0]), *texts[dropped:]]
