"""Trajectories: a run's token data (Letta's `turns`) and runs as a training/eval dataset (JSONL), and the
replay of a dataset against an agent (`manage.py eval`).

A dataset row is one run: its messages in OpenAI chat form, each with `loss_mask` (1 for what the model
produced, 0 for the rest), the tool calls, the per-call token data (`turns`: output token ids and logprobs
where the send asked for them, tool results with loss_mask 0) and the steps' feedback. Export is bounded
(`limit`, at most EXPORT_MAX_RUNS) and streamed row by row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from apps.agents.loop.convert import to_llm_messages
from apps.agents.models import Message, Run, Step
from apps.core.actor import Actor
from apps.llm.models import LlmCall

EXPORT_MAX_RUNS = 10_000


def run_turns(*, actor: Actor, run_id: str) -> list[dict[str, Any]]:
    """Letta's TurnTokenData for each LLM call of the run that has token ids, and each tool result after
    it: what a trainer needs for multi-turn loss masking."""
    calls = list(
        LlmCall.objects.for_actor(actor)
        .filter(run_id=run_id, status=LlmCall.Status.SUCCESS)
        .exclude(step_id="")
        .order_by("created_at", "id")
    )
    tools = _tool_messages(actor, [c.step_id for c in calls])
    return _turns(calls, tools)


def _tool_messages(actor: Actor, step_ids: list[str]) -> dict[str, list[Message]]:
    by_step: dict[str, list[Message]] = {}
    if not step_ids:
        return by_step
    rows = Message.objects.for_actor(actor).filter(step_id__in=step_ids, role=Message.Role.TOOL)
    for message in rows.order_by("sequence_id"):
        by_step.setdefault(message.step_id or "", []).append(message)
    return by_step


def _turns(calls: list[LlmCall], tools: dict[str, list[Message]]) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for call in calls:
        if call.output_token_ids is None:
            continue
        turns.append(
            {
                "role": "assistant",
                "output_ids": call.output_token_ids,
                "output_token_logprobs": _sglang_logprobs(call),
                "content": _answer_text(call),
                "tool_name": None,
            }
        )
        turns.extend(
            {
                "role": "tool",
                "output_ids": None,
                "output_token_logprobs": None,
                "content": message.text,
                "tool_name": message.name or None,
            }
            for message in tools.get(call.step_id, [])
        )
    return turns


def _sglang_logprobs(call: LlmCall) -> list[list[Any]] | None:
    """[[logprob, token_id, top_logprobs or None], ...] (Letta's shape, from SGLang), from OpenAI's
    logprobs.content entries and the call's token ids (matched by position when the counts agree)."""
    entries = (call.logprobs or {}).get("content") if isinstance(call.logprobs, dict) else None
    if not isinstance(entries, list):
        return None
    ids = call.output_token_ids or []
    aligned = len(ids) == len(entries)
    return [
        [entry.get("logprob"), ids[i] if aligned else None, entry.get("top_logprobs") or None]
        for i, entry in enumerate(entries)
        if isinstance(entry, dict)
    ]


def _answer_text(call: LlmCall) -> str | None:
    try:
        response = json.loads(call.response_body) if call.response_body and not call.truncated else {}
        content = response["choices"][0]["message"].get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return content if isinstance(content, str) else None


# --- export -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportFilter:
    agent_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    feedback: str | None = None  # runs with a step of this feedback ("positive" / "negative")
    limit: int = 1000


def export_runs(*, actor: Actor, where: ExportFilter) -> Iterator[dict[str, Any]]:
    """The organisation's finished runs as dataset rows, oldest first (see the module docstring)."""
    runs = Run.objects.for_actor(actor).exclude(status__in=[Run.Status.CREATED, Run.Status.RUNNING])
    if where.agent_id:
        runs = runs.filter(agent_id=where.agent_id)
    if where.since:
        runs = runs.filter(created_at__gte=where.since)
    if where.until:
        runs = runs.filter(created_at__lt=where.until)
    if where.feedback:
        runs = runs.filter(
            id__in=Step.objects.for_actor(actor).filter(feedback=where.feedback).values("run_id")
        )
    limit = max(1, min(where.limit, EXPORT_MAX_RUNS))
    for run in runs.order_by("created_at", "id")[:limit].iterator(chunk_size=100):
        yield _row(actor, run)


def _row(actor: Actor, run: Run) -> dict[str, Any]:
    stored = list(Message.objects.for_actor(actor).filter(run_id=run.id).order_by("sequence_id"))
    messages = []
    for form in to_llm_messages(stored):
        produced = form["role"] == "assistant"
        messages.append({**form, "loss_mask": 1 if produced else 0})
    tool_calls = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for m in messages
        for c in m.get("tool_calls") or []
        if isinstance(c, dict) and isinstance(c.get("function"), dict)
    ]
    calls = list(
        LlmCall.objects.for_actor(actor)
        .filter(run_id=run.id, status=LlmCall.Status.SUCCESS)
        .exclude(step_id="")
        .order_by("created_at", "id")
    )
    turns = _turns(calls, _tool_messages(actor, [c.step_id for c in calls]))
    for turn in turns:
        turn["loss_mask"] = 1 if turn["role"] == "assistant" else 0
    steps = Step.objects.for_actor(actor).filter(run_id=run.id).order_by("created_at", "id")
    return {
        "run_id": run.id,
        "agent_id": run.agent_id,
        "created_at": run.created_at.isoformat(),
        "stop_reason": run.stop_reason or None,
        "messages": messages,
        "tool_calls": tool_calls,
        "turns": turns,
        "steps": [
            {
                "id": s.id,
                "feedback": s.feedback or None,
                "feedback_note": s.feedback_note or None,
                "tags": list(s.tags),
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens,
            }
            for s in steps
        ],
    }


def jsonl(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    for row in rows:
        yield json.dumps(row, ensure_ascii=False, default=str) + "\n"


# --- eval -------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    run_id: str
    user: str
    expected_tools: list[str]
    got_tools: list[str]
    expected_answer: str | None
    got_answer: str | None
    tools_match: bool
    answer_match: bool
    errors: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.tools_match and self.answer_match


def dataset_cases(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Each user turn of each dataset row, with the tool calls and the final answer that followed it."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"line {number}: not JSON ({exc})") from exc
        messages = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(messages, list):
            raise ValueError(f"line {number}: no 'messages' list")
        case: dict[str, Any] | None = None
        for message in messages:
            if not isinstance(message, dict):
                continue
            if message.get("role") == "user":
                if case is not None:
                    yield case
                case = {"run_id": row.get("run_id") or f"line-{number}", "user": message.get("content") or ""}
                case |= {"tools": [], "answer": None}
            elif case is not None and message.get("role") == "assistant":
                for call in message.get("tool_calls") or []:
                    function = call.get("function") if isinstance(call, dict) else None
                    if isinstance(function, dict) and function.get("name") != "send_message":
                        case["tools"].append(function.get("name"))
                    elif isinstance(function, dict):
                        case["answer"] = _send_message_text(function.get("arguments"))
                if message.get("content"):
                    case["answer"] = message["content"]
        if case is not None:
            yield case


def _send_message_text(arguments: Any) -> str | None:
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return None
    return parsed.get("message") if isinstance(parsed, dict) else None


def replay(*, actor: Actor, agent_id: str, cases: Iterable[dict[str, Any]]) -> Iterator[CaseResult]:
    """Send each case's user turn to the agent through the real run path (agent_send_message) and compare
    the tools it called (names, in order) and its answer (exact, whitespace-trimmed) with the dataset's."""
    from apps.agents.services import MessageIn, agent_send_message

    for case in cases:
        result = agent_send_message(
            actor=actor, agent_id=agent_id, messages=[MessageIn(content=case["user"])]
        )
        produced = to_llm_messages(result.messages)
        got_tools: list[str] = []
        answer: str | None = None
        for message in produced:
            if message["role"] != "assistant":
                continue
            for call in message.get("tool_calls") or []:
                name = call["function"]["name"]
                if name == "send_message":
                    answer = _send_message_text(call["function"]["arguments"])
                else:
                    got_tools.append(name)
            if message.get("content"):
                answer = message["content"]
        expected = case["answer"]
        errors = [] if result.run.status == Run.Status.COMPLETED else [f"run {result.run.stop_reason}"]
        yield CaseResult(
            run_id=case["run_id"],
            user=case["user"],
            expected_tools=case["tools"],
            got_tools=got_tools,
            expected_answer=expected,
            got_answer=answer,
            tools_match=got_tools == case["tools"],
            answer_match=(expected or "").strip() == (answer or "").strip(),
            errors=errors,
        )


def write_parquet(rows: Iterable[dict[str, Any]], path: str, *, batch_rows: int = 200) -> int:
    """The rows as Parquet, written in row groups of `batch_rows` (memory stays bounded). Nested fields
    (messages, tool_calls, turns, steps) are JSON text columns, so any reader gets one flat schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [(name, pa.string()) for name in ("run_id", "agent_id", "created_at", "stop_reason")]
        + [(name, pa.string()) for name in PARQUET_JSON_COLUMNS]
    )
    count = 0
    with pq.ParquetWriter(path, schema) as writer:
        batch: list[dict[str, Any]] = []
        for row in rows:
            batch.append(
                {
                    **{key: row[key] for key in ("run_id", "agent_id", "created_at", "stop_reason")},
                    **{
                        key: json.dumps(row[key], ensure_ascii=False, default=str)
                        for key in PARQUET_JSON_COLUMNS
                    },
                }
            )
            count += 1
            if len(batch) >= batch_rows:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    return count


PARQUET_JSON_COLUMNS = ("messages", "tool_calls", "turns", "steps")
