"""The context budget: when to warn, when to compact, what to evict, and how big a tool return may be.

Pure arithmetic on token counts the caller measured (the tokenizer lives in apps.llm), so every
branch is tested with exact numbers. Letta's defaults are the reference: compaction triggers at
90% of the window (not 100%, which left no room for the reply), a system prompt that alone fills
the window stops the run with `context_window_overflow_in_system_prompt` (summaries cannot shrink
it), and the kept tail never separates a tool call from its results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from apps.agents.loop.context import CORE_MEMORY_PLACEHOLDER, SystemSections

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_TOOL_RETURN_FRACTION",
    "BudgetState",
    "BudgetVerdict",
    "CompactionPlan",
    "ContextBreakdown",
    "ContextBudget",
    "MessageInfo",
    "chunk_for_summary",
    "context_breakdown",
    "group_tool_exchanges",
    "tool_return_char_limit",
    "truncate_tool_return",
]

CHARS_PER_TOKEN = 4
"""Rough characters per token (Letta's fallback counter uses bytes / 4); only for turning a token
share of the window into a character limit, never for budgeting itself."""

DEFAULT_TOOL_RETURN_FRACTION = 0.1
"""Share of the window one tool return may fill: 12,800 tokens (51,200 chars) at 128k, close to
Letta's fixed 50,000-character return limit, and proportionally less on small windows."""

BudgetState = Literal["ok", "warning", "overflow", "system_overflow"]


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """An in-context message as the budget sees it.

    `tool_call_ids` are the calls an assistant message makes; `tool_call_id` is the call a tool
    message answers.
    """

    id: str
    role: str
    tokens: int
    tool_call_ids: tuple[str, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class BudgetVerdict:
    """What the next request would cost and what the runner should do about it.

    `ok`: send. `warning`: send, with the memory-pressure alert. `overflow`: compact first.
    `system_overflow`: stop; the instructions, blocks and tool schemas alone fill the window.
    """

    state: BudgetState
    total: int
    fixed: int
    context_window: int


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """Which in-context messages to summarise and which stay, both in conversation order.

    `keep_ids` starts with the first (system) message. An empty `summarize_ids` means there is
    nothing worth compacting.
    """

    keep_ids: tuple[str, ...]
    summarize_ids: tuple[str, ...]
    kept_tokens: int
    summarized_tokens: int


@dataclass(frozen=True, slots=True)
class ContextBudget:
    """Thresholds for one agent's context window, as fractions of `context_window` tokens.

    `compact_fraction` is Letta's summarization trigger (0.9); `keep_recent_fraction` is the share of
    the message tokens that stays verbatim after compaction (Letta's sliding window keeps 30% too).
    """

    context_window: int
    warning_fraction: float = 0.7
    keep_recent_fraction: float = 0.3
    compact_fraction: float = 0.9

    def __post_init__(self) -> None:
        if self.context_window <= 0:
            raise ValueError(f"context_window must be positive, got {self.context_window}")
        if not 0 < self.warning_fraction <= self.compact_fraction <= 1:
            raise ValueError(
                "fractions must satisfy 0 < warning_fraction <= compact_fraction <= 1, got "
                f"{self.warning_fraction} and {self.compact_fraction}"
            )
        if not 0 < self.keep_recent_fraction < 1:
            raise ValueError(f"keep_recent_fraction must be between 0 and 1, got {self.keep_recent_fraction}")

    @property
    def warning_threshold(self) -> int:
        """Totals above this many tokens get the memory-pressure alert."""
        return _share(self.context_window, self.warning_fraction)

    @property
    def compact_threshold(self) -> int:
        """Totals above this many tokens are compacted before the request is sent."""
        return _share(self.context_window, self.compact_fraction)

    def assess(
        self, system_tokens: int, message_tokens: Sequence[int], tool_schema_tokens: int
    ) -> BudgetVerdict:
        """Classify the next request; `system_tokens` covers the whole compiled system message."""
        if system_tokens < 0 or tool_schema_tokens < 0 or any(tokens < 0 for tokens in message_tokens):
            raise ValueError("token counts cannot be negative")
        fixed = system_tokens + tool_schema_tokens
        total = fixed + sum(message_tokens)
        state: BudgetState
        if fixed >= self.context_window:
            state = "system_overflow"
        elif total > self.compact_threshold:
            state = "overflow"
        elif total > self.warning_threshold:
            state = "warning"
        else:
            state = "ok"
        return BudgetVerdict(state=state, total=total, fixed=fixed, context_window=self.context_window)

    def choose_messages_to_compact(
        self, messages: Sequence[MessageInfo], *, keep_tokens: int | None = None
    ) -> CompactionPlan:
        """Split the in-context messages into the oldest part to summarise and the recent tail to keep.

        The first message (the system message) always stays. The tail is the newest tool exchanges
        (see `group_tool_exchanges`) whose tokens fit in `keep_tokens`, by default
        `keep_recent_fraction` of the other messages' tokens; the newest exchange is kept even when
        it alone is larger, so a pending tool call is never evicted. The tail never starts with a
        tool message, whose call would otherwise be missing.
        """
        if not messages:
            return CompactionPlan(keep_ids=(), summarize_ids=(), kept_tokens=0, summarized_tokens=0)
        first, rest = messages[0], messages[1:]
        budget = keep_tokens if keep_tokens is not None else _share(_tokens(rest), self.keep_recent_fraction)

        groups = group_tool_exchanges(rest)
        kept_from = len(groups)
        tail_tokens = 0
        for index in range(len(groups) - 1, -1, -1):
            group_tokens = _tokens(groups[index])
            if kept_from < len(groups) and tail_tokens + group_tokens > budget:
                break
            kept_from = index
            tail_tokens += group_tokens
        if kept_from < len(groups) and groups[kept_from][0].role == "tool":
            tail_tokens -= _tokens(groups[kept_from])
            kept_from += 1

        evicted = [message for group in groups[:kept_from] for message in group]
        kept = [first, *(message for group in groups[kept_from:] for message in group)]
        return CompactionPlan(
            keep_ids=tuple(message.id for message in kept),
            summarize_ids=tuple(message.id for message in evicted),
            kept_tokens=first.tokens + tail_tokens,
            summarized_tokens=_tokens(evicted),
        )


def group_tool_exchanges(messages: Sequence[MessageInfo]) -> list[list[MessageInfo]]:
    """Consecutive runs of messages that must stay together: a message, and if it calls tools,
    everything up to the last result of those calls, plus any tool messages right after.

    A tool message therefore only starts a group when it is first in `messages` (an orphan).
    Calls that are never answered (a pending approval) simply end their group at the call.
    """
    answered_at: dict[str, int] = {}
    for index, message in enumerate(messages):
        if message.tool_call_id is not None:
            answered_at[message.tool_call_id] = index

    groups: list[list[MessageInfo]] = []
    start = 0
    while start < len(messages):
        end = start
        scan = start
        while scan <= end:
            for call_id in messages[scan].tool_call_ids:
                end = max(end, answered_at.get(call_id, end))
            scan += 1
        while end + 1 < len(messages) and messages[end + 1].role == "tool":
            end += 1
        groups.append(list(messages[start : end + 1]))
        start = end + 1
    return groups


def chunk_for_summary(messages: Sequence[MessageInfo], max_tokens: int) -> list[list[MessageInfo]]:
    """Cut the messages to summarise into consecutive pieces of at most `max_tokens` each.

    Tool exchanges stay in one piece when they fit; one that does not is split between messages.
    A single message over `max_tokens` gets a piece of its own: shorten it first (for tool returns,
    `truncate_tool_return`) if every piece must fit.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    chunks: list[list[MessageInfo]] = []
    current: list[MessageInfo] = []
    current_tokens = 0
    for group in group_tool_exchanges(messages):
        units = [group] if _tokens(group) <= max_tokens else [[message] for message in group]
        for unit in units:
            unit_tokens = _tokens(unit)
            if current and current_tokens + unit_tokens > max_tokens:
                chunks.append(current)
                current, current_tokens = [], 0
            current += unit
            current_tokens += unit_tokens
    if current:
        chunks.append(current)
    return chunks


def tool_return_char_limit(context_window: int, fraction: float = DEFAULT_TOOL_RETURN_FRACTION) -> int:
    """How many characters of one tool return fit in `fraction` of the window."""
    if context_window <= 0:
        raise ValueError(f"context_window must be positive, got {context_window}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return max(1, _share(context_window * CHARS_PER_TOKEN, fraction))


def truncate_tool_return(
    text: str, *, context_window: int, fraction: float = DEFAULT_TOOL_RETURN_FRACTION
) -> str:
    """Keep the start of an over-long tool return and say how much was cut, so the model knows.

    Letta also keeps the head and appends a note; here the limit follows the window instead of a
    fixed 50,000 characters, so a small model is not flooded by one tool call.
    """
    limit = tool_return_char_limit(context_window, fraction)
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return (
        f"{text[:limit]}\n[... {cut} characters cut: the tool returned {len(text)} characters "
        f"and at most {limit} fit in the context window]"
    )


@dataclass(frozen=True, slots=True)
class ContextBreakdown:
    """Tokens per section of the next request, for the ADE's context-window bar (Letta's overview)."""

    context_window: int
    system_prompt: int
    memory_blocks: int
    tool_rules: int
    metadata: int
    summary: int
    tool_schemas: int
    messages: int

    @property
    def total(self) -> int:
        """All sections together: what the request costs."""
        return (
            self.system_prompt
            + self.memory_blocks
            + self.tool_rules
            + self.metadata
            + self.summary
            + self.tool_schemas
            + self.messages
        )

    @property
    def free(self) -> int:
        """Tokens left in the window (never negative)."""
        return max(0, self.context_window - self.total)


def context_breakdown(
    *,
    context_window: int,
    sections: SystemSections,
    count_tokens: Callable[[str], int],
    tool_schema_tokens: int,
    messages: Sequence[MessageInfo],
    summary_message_id: str | None = None,
) -> ContextBreakdown:
    """Count each section of the next request.

    `messages` are the in-context messages after the system message (which `sections` describes);
    the one with `summary_message_id`, if any, is counted as the summary rather than as a message.
    """
    summary = sum(message.tokens for message in messages if message.id == summary_message_id)
    return ContextBreakdown(
        context_window=context_window,
        system_prompt=count_tokens(sections.system_prompt.replace(CORE_MEMORY_PLACEHOLDER, "")),
        # Open files (`<directories>`) are Letta's file blocks: counted with the memory blocks.
        memory_blocks=_count_if(sections.memory_blocks, count_tokens)
        + _count_if(sections.directories, count_tokens),
        tool_rules=_count_if(sections.tool_rules, count_tokens),
        metadata=_count_if(sections.metadata, count_tokens),
        summary=summary,
        tool_schemas=tool_schema_tokens,
        messages=_tokens(messages) - summary,
    )


def _count_if(text: str, count_tokens: Callable[[str], int]) -> int:
    return count_tokens(text) if text else 0


def _tokens(messages: Sequence[MessageInfo]) -> int:
    return sum(message.tokens for message in messages)


def _share(total: int, fraction: float) -> int:
    """`floor(total * fraction)` in decimal arithmetic, so 0.7 of 128,000 is 89,600, not 89,599."""
    return int(Decimal(str(fraction)) * total)
