"""LLM call records: every call of a run kept as sent and received (LlmCall), never a key or a header.

The hot path only notes each call (apps.llm.client appends the trace and the answer it already holds to the
run's collector, a context variable: no encoding, no SQL); the runner stores a run's calls after it has
answered, in one INSERT (`store`). What is stored is the request body as sent (the client's trace, which
never holds the key: it goes in a header) and the response as received, each cut at LLM_RECORD_MAX_BYTES;
the target's key is also scrubbed from both texts, should a provider echo it. Pruned past the
organisation's retention by the `llm.prune_llm_calls` beat task (`prune`).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps.llm.handles import ModelTarget
from apps.llm.models import LlmCall, LlmRecordPolicy
from apps.llm.selectors import endpoint_for_tenants

if TYPE_CHECKING:
    from apps.llm.client import ChatResponse

logger = logging.getLogger(__name__)

REDACTED = "[redacted]"


@dataclass(slots=True)
class NotedCall:
    """What the client knew of one call, kept until the run stores it (nothing is encoded here)."""

    target: ModelTarget
    request: Any  # the client's trace: the body as sent, plus api_base and timeout
    streamed: bool
    response: ChatResponse | None = None
    error: BaseException | None = None
    latency_ms: int | None = None


_collector: ContextVar[list[NotedCall] | None] = ContextVar("llm_call_collector", default=None)


@contextmanager
def collecting() -> Iterator[list[NotedCall]]:
    """Note every LLM call made inside the block (this thread or task) in the yielded list."""
    calls: list[NotedCall] = []
    token = _collector.set(calls)
    try:
        yield calls
    finally:
        _collector.reset(token)


def note(call: NotedCall) -> None:
    """Called by apps.llm.client for each call; free when nothing collects."""
    calls = _collector.get()
    if calls is not None:
        calls.append(call)


def store(calls: Sequence[NotedCall], **where: Any) -> None:
    """One INSERT of the `rows` for these calls."""
    built = rows(calls, **where)
    if built:
        LlmCall.all_objects.bulk_create(built)


def rows(
    calls: Sequence[NotedCall],
    *,
    organization_id: str,
    agent_id: str,
    run_id: str,
    traces: Sequence[tuple[str, Any, Any]] = (),
) -> list[LlmCall]:
    """Unsaved records of a run's calls (the runner inserts them with its traces: no statement of their
    own). `traces` (the runner's: step id, request, response) tell which step made each call (by the
    response object), so compaction's summariser calls are recorded without a step. No retention is read
    here (a statement per run): records an organisation keeps for 0 days go at the next prune."""
    step_ids = {id(response): step_id for step_id, _, response in traces}
    limit = int(settings.LLM_RECORD_MAX_BYTES)
    built: list[LlmCall] = []
    for call in calls:
        response = call.response
        request_text = getattr(call.request, "json_text", None) or _json(call.request)
        response_raw = response.raw.get("response") if response is not None else None
        response_text = _json(response_raw) if response_raw is not None else ""
        request_text, cut_request = _bounded(_scrub(request_text, call.target), limit)
        response_text, cut_response = _bounded(_scrub(response_text, call.target), limit)
        row = LlmCall(
            organization_id=organization_id,
            agent_id=agent_id,
            run_id=run_id,
            step_id=step_ids.get(id(response_raw), "") if response_raw is not None else "",
            model=call.target.litellm_model.split("/", 1)[-1],
            model_handle=call.target.handle,
            endpoint=endpoint_for_tenants(call.target.api_base) or "",
            streamed=call.streamed,
            request_body=request_text,
            response_body=response_text,
            truncated=cut_request or cut_response,
            latency_ms=call.latency_ms,
        )
        if response is not None:
            row.prompt_tokens, row.completion_tokens = response.prompt_tokens, response.completion_tokens
            row.latency_ms = response.latency_ms
            row.attempts = response.attempts
            row.cost_usd = _cost(call.target, response.prompt_tokens, response.completion_tokens)
            row.output_token_ids = response.token_ids
            row.logprobs = response.logprobs
        else:
            row.status = LlmCall.Status.ERROR
            row.error_type = type(call.error).__name__
            row.error_message = _scrub(str(getattr(call.error, "message", "") or call.error), call.target)[
                :4000
            ]
        built.append(row)
    return built


def store_collected(**where: Any) -> None:
    """Store the calls collected so far (as `store`) and forget them, so the run's later `store` does not
    write them again: for a send whose answer carries them (return_token_ids), stored before it."""
    calls = _collector.get()
    if calls:
        store(list(calls), **where)
        calls.clear()


def retention_days(organization_id: str) -> int:
    """The organisation's retention (LlmRecordPolicy), else LLM_RECORD_RETENTION_DAYS."""
    days = (
        LlmRecordPolicy.all_objects.filter(organization_id=organization_id)
        .values_list("retention_days", flat=True)
        .first()
    )
    return int(settings.LLM_RECORD_RETENTION_DAYS) if days is None else days


def prune(*, now: Any = None) -> int:
    """Delete the records past their organisation's retention; returns how many. One DELETE for the
    organisations on the default and one per organisation with a policy of its own."""
    now = now or timezone.now()
    policies = dict(LlmRecordPolicy.all_objects.values_list("organization_id", "retention_days"))
    default_cutoff = now - timedelta(days=int(settings.LLM_RECORD_RETENTION_DAYS))
    deleted, _ = (
        LlmCall.all_objects.filter(created_at__lt=default_cutoff)
        .exclude(organization_id__in=list(policies))
        .delete()
    )
    by_org = Q()
    for organization_id, days in policies.items():
        by_org |= Q(organization_id=organization_id, created_at__lt=now - timedelta(days=days))
    if policies:
        more, _ = LlmCall.all_objects.filter(by_org).delete()
        deleted += more
    if deleted:
        logger.info("llm.records_pruned", extra={"deleted": deleted})
    return deleted


def curl_command(record: LlmCall) -> str:
    """The recorded request as a curl command, with a placeholder where the key goes."""
    try:
        body = json.loads(record.request_body) if record.request_body and not record.truncated else None
    except ValueError:
        body = None
    base = ""
    if isinstance(body, dict):
        base = str(body.pop("api_base", "") or "")
        body.pop("timeout", None)
    url = f"{(base or record.endpoint or 'https://api.openai.com/v1').rstrip('/')}/chat/completions"
    data = (
        json.dumps(body, ensure_ascii=False) if body is not None else "<the request was cut: see the record>"
    )
    return (
        f"curl {_shell_quote(url)} \\\n"
        "  -H 'Authorization: Bearer $API_KEY' \\\n"
        "  -H 'Content-Type: application/json' \\\n"
        f"  -d {_shell_quote(data)}"
    )


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _scrub(text: str, target: ModelTarget) -> str:
    key = target.api_key
    if key and len(key) >= 8 and key in text:
        return text.replace(key, REDACTED)
    return text


def _bounded(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit // 4 or len(text.encode()) <= limit:
        return text, False
    return text.encode()[:limit].decode(errors="ignore"), True


def _cost(target: ModelTarget, prompt_tokens: int, completion_tokens: int) -> float | None:
    """litellm's cost map (bundled, offline): None for a model it does not price."""
    model = target.litellm_model.split("/", 1)[-1]
    prices = _linear_prices(model)
    if prices is not None:
        total = prompt_tokens * prices[0] + completion_tokens * prices[1]
    else:
        total = _litellm_cost(model, prompt_tokens, completion_tokens) or 0.0
    return total if total > 0 else None


def _litellm_cost(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    from apps.llm._litellm import litellm

    try:
        prompt_cost, completion_cost = litellm.cost_per_token(
            model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
    except Exception:
        return None
    return float(prompt_cost) + float(completion_cost)


@functools.lru_cache(maxsize=256)
def _linear_prices(model: str) -> tuple[float, float] | None:
    """(per prompt token, per completion token) of a model whose price does not depend on the tokens'
    count (no "..._above_128k_tokens" tier in litellm's map), from litellm itself; None otherwise. Asking
    litellm costs ~0.15 ms of CPU a call, twice a memory turn."""
    from apps.llm._litellm import litellm

    entry = litellm.model_cost.get(model)
    if not isinstance(entry, dict) or any("above" in key for key in entry):
        return None
    per_prompt = _litellm_cost(model, 1_000_000, 0)
    per_completion = _litellm_cost(model, 0, 1_000_000)
    if per_prompt is None or per_completion is None:
        return None
    return per_prompt / 1_000_000, per_completion / 1_000_000
