"""Chat completions and embeddings on the OpenAI wire (OpenAI, OpenAI-compatible servers, Ollama), sent
over HTTP here.

Why not `litellm.completion` for these: it walks the whole message list several times per call
(message validation, None clean-up, thought-signature and tool-search history passes, PDF detection,
cost), ~3.9 ms of CPU per call plus ~13 us per message: 12 ms per call at 600 messages, against ~1 ms
for the HTTP exchange itself (bench/RESULTS.md). An agent step resends its whole context, so that was
the largest cost of a turn. litellm still decides what the provider accepts: the parameters come from
`litellm.get_optional_params` (max_completion_tokens for reasoning models, a dropped temperature or
parallel_tool_calls where a model refuses them), cached per model and settings. Other providers
(Anthropic) go through litellm as a whole; `LLM_CLIENT=litellm` sends every provider through it.

The messages are sent as the caller built them, without None-valued fields (as litellm did: some
servers reject `"name": null`). Provider errors surface as httpx errors, which apps.llm.retry
classifies; a body that is not JSON raises InvalidLLMResponse, an error event inside a stream
LLMApiError. Every call uses one pooled httpx client (`litellm.client_session`, apps.llm._litellm), so
consecutive calls, blocking or streamed, share a keep-alive connection; calls to a URL an organisation
chose use `tenant_client()` instead, behind the outbound guard (apps.core.outbound).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
from django.conf import settings

from apps.llm._litellm import litellm, tenant_client
from apps.llm.errors import InvalidLLMResponse, LLMApiError
from apps.llm.handles import EmbeddingTarget, ModelTarget
from apps.llm.selectors import is_deployment_endpoint
from apps.observability.tracing import propagation_headers

WIRE_PREFIX = "openai/"

KEYLESS_API_KEY = "no-key"
"""Sent to keyless OpenAI-compatible servers (Ollama, a local vLLM): they expect some bearer token, and
an empty one would make litellm fall back to the process's OPENAI_API_KEY."""


def handles(target: ModelTarget | EmbeddingTarget) -> bool:
    """Whether this module sends the target's calls (else litellm does)."""
    return getattr(settings, "LLM_CLIENT", "direct") == "direct" and target.litellm_model.startswith(
        WIRE_PREFIX
    )


def request_body(
    target: ModelTarget,
    *,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    temperature: float | None,
    max_tokens: int | None,
    parallel_tool_calls: bool | None,
    stream: bool,
    logprobs: bool | None = None,
    top_logprobs: int | None = None,
    return_token_ids: bool | None = None,
    messages_encoded: bool = False,
) -> dict[str, Any]:
    """The JSON body of POST {api_base}/chat/completions. `messages_encoded`: the caller has each
    message's JSON text (encode's messages_json, written without nulls), so the body keeps the messages
    as given instead of copying each without its None values (~1.5 us a message, every step)."""
    model = target.litellm_model.removeprefix(WIRE_PREFIX)
    body: dict[str, Any] = {
        "model": model,
        "messages": messages if messages_encoded else [_without_nulls(m) for m in messages],
    }
    params = _provider_params(
        model,
        temperature=temperature,
        max_tokens=max_tokens,
        has_tools=bool(tools),
        tool_choice=json.dumps(tool_choice) if isinstance(tool_choice, dict) else tool_choice,
        parallel_tool_calls=parallel_tool_calls if tools else None,
    )
    for key, value in params.items():
        if key == "tools":
            body["tools"] = tools
        elif key == "tool_choice" and isinstance(tool_choice, dict):
            body["tool_choice"] = tool_choice
        else:
            body[key] = value
    if logprobs:
        body["logprobs"] = True
        if top_logprobs is not None:
            body["top_logprobs"] = top_logprobs
    if return_token_ids:  # vLLM's and SGLang's extra parameter: choice.token_ids in the answer
        body["return_token_ids"] = True
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def encode(body: dict[str, Any], *, messages_json: Sequence[str] | None = None) -> str:
    """The body as sent (compact JSON, as httpx would write it). `messages_json`: the JSON text of each of
    the body's messages (encode_message), when the caller has it: only the rest is encoded here (at 800
    messages, 0.94 -> 0.08 ms a call)."""
    if messages_json is None:
        return _compact_json(body)
    if len(messages_json) != len(body["messages"]):
        raise ValueError(f"{len(messages_json)} encoded messages for {len(body['messages'])} messages")
    rest = _compact_json({key: value for key, value in body.items() if key != "messages"})
    return rest[:-1] + ("," if rest != "{}" else "") + '"messages":[' + ",".join(messages_json) + "]}"


def encode_message(message: dict[str, Any]) -> str:
    """One chat message's JSON text as encode writes it into a body."""
    return _compact_json(_without_nulls(message))


def _compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def complete(
    target: ModelTarget, body: str, *, timeout: float, check: Callable[[], None] | None = None
) -> dict[str, Any]:
    """One blocking call with an encoded body; the parsed completion. `check` runs between the pieces of
    the body as they arrive (a deadline: a body that trickles in still ends there). Raises httpx errors
    and InvalidLLMResponse."""
    content = bytearray()
    with _http(target).stream(
        "POST", _url(target), content=body.encode(), headers=_headers(target), timeout=timeout
    ) as response:
        if response.is_error:
            response.read()  # the error body, for the provider's message
        response.raise_for_status()
        for piece in response.iter_bytes():
            if check is not None:
                check()
            content += piece
    return _json_object(target, bytes(content), "chat completion")


def embed(target: EmbeddingTarget, texts: list[str], *, timeout: float) -> Any:
    """POST {api_base}/embeddings for these texts; the response's `data` (checked by the caller).
    litellm.embedding spent ~6.6 ms of CPU per call around a ~1 ms exchange."""
    body = encode({"model": target.litellm_model.removeprefix(WIRE_PREFIX), "input": texts})
    url = f"{(target.api_base or '').rstrip('/')}/embeddings"
    response = _http(target).post(url, content=body.encode(), headers=_headers(target), timeout=timeout)
    response.raise_for_status()
    return _json_object(target, response.content, "embedding response").get("data")


@contextmanager
def stream_chunks(target: ModelTarget, body: str, *, timeout: float) -> Iterator[Iterator[dict[str, Any]]]:
    """A streamed call: yields an iterator of the parsed chunks, up to `data: [DONE]`."""
    with _http(target).stream(
        "POST", _url(target), content=body.encode(), headers=_headers(target), timeout=timeout
    ) as response:
        if response.is_error:
            response.read()  # the error body, for the provider's message
        response.raise_for_status()
        yield _events(target, response)


def _events(target: ModelTarget, response: httpx.Response) -> Iterator[dict[str, Any]]:
    """Server-sent events: `data:` lines, joined until a blank line; comments and other fields ignored."""
    data: list[str] = []
    for line in response.iter_lines():
        if line:
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            continue
        if not data:
            continue
        payload, data = "\n".join(data), []
        if payload == "[DONE]":
            return
        chunk = _json_object(target, payload, "stream chunk")
        if chunk.get("error"):
            raise _stream_error(target, chunk["error"])
        yield chunk
    if data and "\n".join(data) != "[DONE]":
        yield _json_object(target, "\n".join(data), "stream chunk")


def _json_object(target: ModelTarget | EmbeddingTarget, text: str | bytes, what: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise InvalidLLMResponse(f"{target.handle}: unreadable response: {what} is not JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise InvalidLLMResponse(f"{target.handle}: unreadable response: {what} is not a JSON object")
    return parsed


def _stream_error(target: ModelTarget, error: Any) -> LLMApiError:
    message = error.get("message") if isinstance(error, dict) else None
    message = message if isinstance(message, str) else json.dumps(error)
    return LLMApiError(
        f"{target.handle}: the provider ended the stream with an error: {message}",
        status=None,
        provider_message=message,
        attempts=1,
    )


def _without_nulls(message: dict[str, Any]) -> dict[str, Any]:
    if None in message.values():
        return {key: value for key, value in message.items() if value is not None}
    return message


@functools.lru_cache(maxsize=512)
def _provider_params(
    model: str,
    *,
    temperature: float | None,
    max_tokens: int | None,
    has_tools: bool,
    tool_choice: str | None,
    parallel_tool_calls: bool | None,
) -> dict[str, Any]:
    """litellm's mapping of our settings onto what this model accepts (drop_params: a setting the
    model refuses is left out, not an error). `tools` stands for the caller's tools; the mapping only
    looks at whether there are any."""
    requested: dict[str, Any] = {
        "temperature": temperature,
        "max_tokens": max_tokens,
        "tools": [{"type": "function", "function": {"name": "tool", "parameters": {}}}]
        if has_tools
        else None,
        "tool_choice": tool_choice if has_tools else None,
        "parallel_tool_calls": parallel_tool_calls,
    }
    mapped = litellm.get_optional_params(
        model=model,
        custom_llm_provider="openai",
        drop_params=True,
        **{key: value for key, value in requested.items() if value is not None},
    )
    params = {
        key: value
        for key, value in mapped.items()
        if key not in ("extra_body", "stream", "stream_options") and value is not None
    }
    params.update(mapped.get("extra_body") or {})
    return params


def _url(target: ModelTarget) -> str:
    return f"{(target.api_base or '').rstrip('/')}/chat/completions"


def _headers(target: ModelTarget | EmbeddingTarget) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {target.api_key or KEYLESS_API_KEY}",
        "Content-Type": "application/json",
        **propagation_headers(),  # with OTLP on: the provider can join the run's trace
    }


def _http(target: ModelTarget | EmbeddingTarget) -> httpx.Client:
    """The deployment's providers: the shared client. URLs an organisation chose: the guarded one."""
    if is_deployment_endpoint(target.api_base):
        return litellm.client_session
    return tenant_client()
