"""Chat completions, blocking or streaming, behind normalized dataclasses.

OpenAI-wire targets (`openai/...`: OpenAI, OpenAI-compatible servers, Ollama) are called by
apps.llm.openai_wire, which sends the request over HTTP itself and asks litellm only which parameters
the model accepts (litellm's per-message passes cost more than the rest of a step). Anthropic, and
every provider when LLM_CLIENT=litellm, go through `litellm.completion`.

Client reuse: one httpx.Client (`litellm.client_session`, set up in apps.llm._litellm, which also
keeps streamed connections reusable) carries the OpenAI-wire calls, and litellm's cached OpenAI SDK
clients when it makes them; we pass the same `timeout` (RetryPolicy, from settings; cut to the time left
near a call's deadline, apps.llm.retry) and `max_retries=0` every time, so consecutive calls to one
target, blocking or streamed, share one keep-alive connection. Anthropic calls go through litellm's own
module-level httpx client.

Nothing but the target URL is contacted: apps.llm._litellm forces litellm offline, `api_base` and
`api_key` are always explicit (litellm would otherwise read OPENAI_API_KEY / OPENAI_BASE_URL from the
process environment and could send the deployment's key to an organisation's server).

URLs an organisation chose (every provider URL but the deployment's own) go through
`apps.llm._litellm.tenant_client()` (litellm: as its `client=`), behind the outbound guard, and their
failures reach the caller summarised (`apps.llm.errors.told_to_tenant`: no body, no network detail).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from apps.llm import openai_wire, records
from apps.llm._litellm import litellm, tenant_litellm_handler
from apps.llm.errors import InvalidLLMResponse, told_to_tenant
from apps.llm.handles import ModelTarget
from apps.llm.openai_wire import KEYLESS_API_KEY
from apps.llm.retry import CallBounds, CallGuard, RetryPolicy, call_with_retries, guarded
from apps.llm.selectors import endpoint_for_tenants, is_deployment_endpoint
from apps.llm.tokens import count_text_tokens, count_tokens

__all__ = ["KEYLESS_API_KEY", "ChatRequest", "ChatResponse", "StreamDelta", "ToolCall", "complete", "stream"]


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One call's input in OpenAI's chat format; None means "provider default" and is not sent."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    parallel_tool_calls: bool | None = None
    # Log probabilities of the output tokens (OpenAI's `logprobs`, with `top_logprobs` alternatives each).
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # The output's token ids, as vLLM and SGLang's OpenAI-compatible servers return them when the body
    # carries `return_token_ids` (choice.token_ids; Letta's `return_token_ids`).
    return_token_ids: bool | None = None
    # The JSON text of each of `messages` (encode_message), when the caller keeps it: a step resends
    # hundreds of unchanged messages, and the OpenAI-wire body then encodes only what is new.
    messages_json: list[str] | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """`arguments` is the model's JSON text, verbatim: malformed JSON is the caller's to report."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatResponse:
    """The model's answer. `raw` holds the request and response JSON for step traces (no API key).

    `latency_ms` is the whole call as the caller waited for it, retries and backoff included.
    """

    content: str | None
    reasoning: str | None
    tool_calls: list[ToolCall]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    model: str
    raw: dict[str, Any] = field(repr=False)
    latency_ms: int
    attempts: int = 1
    # The choice's `logprobs` ({content: [{token, logprob, bytes, top_logprobs}], refusal}) when asked for
    # and the provider returned them.
    logprobs: dict[str, Any] | None = field(default=None, repr=False)
    # The output's token ids (choice.token_ids) when asked for (return_token_ids) and returned.
    token_ids: list[int] | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """A piece of a streamed answer. For tool calls, the first delta of each call carries its id and
    name (with possibly empty `text`), so a UI can show the call before its arguments arrive."""

    kind: Literal["reasoning", "content", "tool_call_args"]
    text: str
    tool_call_index: int | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None


def complete(
    target: ModelTarget,
    request: ChatRequest,
    *,
    policy: RetryPolicy | None = None,
    bounds: CallBounds | None = None,
) -> ChatResponse:
    """One blocking chat completion, ended at `bounds` (by default LLM_CALL_DEADLINE, no cancellation).

    Raises LLMApiError (after retrying transient failures; LLMDeadlineExceeded past the deadline),
    ContextWindowExceeded, InvalidLLMResponse, LLMCallCancelled.
    """
    policy = policy or RetryPolicy.from_settings()
    if openai_wire.handles(target):
        encoded, trace = _wire_request(target, request, policy, stream=False)

        def send(guard: CallGuard) -> dict[str, Any]:
            timeout = guard.read_timeout(policy.timeout)
            return openai_wire.complete(target, encoded, timeout=timeout, check=guard.check)

    else:
        kwargs = _call_kwargs(target, request, policy=policy, stream=False)
        trace = _trace(kwargs)

        def send(guard: CallGuard) -> dict[str, Any]:
            timeout = guard.read_timeout(policy.timeout, whole_seconds=True)
            return _dump(litellm.completion(**{**kwargs, "timeout": timeout}))

    started = time.monotonic()
    try:
        with (
            told_to_tenant(target.handle, applies=not is_deployment_endpoint(target.api_base)),
            guarded(bounds or CallBounds.from_settings(), label=target.handle) as guard,
        ):
            completion, attempts = call_with_retries(
                lambda: send(guard), policy=policy, label=target.handle, guard=guard
            )
        response = _from_completion(
            target,
            request,
            completion,
            trace=trace,
            latency_ms=_elapsed_ms(started),
            attempts=attempts,
        )
    except Exception as exc:
        records.note(records.NotedCall(target, trace, False, error=exc, latency_ms=_elapsed_ms(started)))
        raise
    records.note(records.NotedCall(target, trace, False, response=response))
    return response


def stream(
    target: ModelTarget,
    request: ChatRequest,
    on_delta: Callable[[StreamDelta], None],
    *,
    policy: RetryPolicy | None = None,
    bounds: CallBounds | None = None,
) -> ChatResponse:
    """A streamed chat completion: `on_delta` gets each piece in order; returns the assembled answer.

    A failure before the first delta is retried like `complete`; after it, the error is raised at once,
    because a retry would send the caller's listeners the same text twice. Exceptions raised by
    `on_delta` propagate unchanged (and close the stream). `bounds` as for `complete`: a stream that keeps
    trickling still ends at the deadline.
    """
    policy = policy or RetryPolicy.from_settings()
    if openai_wire.handles(target):
        encoded, trace = _wire_request(target, request, policy, stream=True)

        def chunks(guard: CallGuard) -> AbstractContextManager[Iterator[dict[str, Any]]]:
            return openai_wire.stream_chunks(target, encoded, timeout=guard.read_timeout(policy.timeout))

    else:
        kwargs = _call_kwargs(target, request, policy=policy, stream=True)
        trace = _trace(kwargs)

        @contextmanager
        def chunks(guard: CallGuard) -> Iterator[Iterator[dict[str, Any]]]:
            timeout = guard.read_timeout(policy.timeout, whole_seconds=True)
            with litellm.completion(**{**kwargs, "timeout": timeout}) as stream_response:
                yield (_dump(chunk) for chunk in stream_response)

    emitted = False

    def attempt(guard: CallGuard) -> _StreamAssembler:
        nonlocal emitted
        assembler = _StreamAssembler()
        with chunks(guard) as parsed_chunks:
            for chunk in parsed_chunks:
                guard.check()  # between chunks: the deadline, a cancellation
                for delta in assembler.add(chunk):
                    emitted = True
                    on_delta(delta)
        return assembler

    started = time.monotonic()
    try:
        with (
            told_to_tenant(target.handle, applies=not is_deployment_endpoint(target.api_base)),
            guarded(bounds or CallBounds.from_settings(), label=target.handle) as guard,
        ):
            assembler, attempts = call_with_retries(
                lambda: attempt(guard),
                policy=policy,
                label=target.handle,
                retryable=lambda: not emitted,
                guard=guard,
            )
        response = _from_completion(
            target,
            request,
            assembler.completion(fallback_model=target.litellm_model),
            trace=trace,
            latency_ms=_elapsed_ms(started),
            attempts=attempts,
        )
    except Exception as exc:
        records.note(records.NotedCall(target, trace, True, error=exc, latency_ms=_elapsed_ms(started)))
        raise
    records.note(records.NotedCall(target, trace, True, response=response))
    return response


class EncodedTrace(dict[str, Any]):
    """A trace dict that also carries its own JSON text (`json_text`), so storing it (Step.trace) does
    not encode the whole context a second time (~1.4 ms per step at 800 messages). The JSON text is the
    body as sent; the dict's messages may still hold None values the text leaves out (request_body's
    messages_encoded), so readers take `json_text`."""

    json_text: str


def encode_message(message: dict[str, Any]) -> str:
    """A chat message's JSON text as the OpenAI-wire body holds it (ChatRequest.messages_json)."""
    return openai_wire.encode_message(message)


def takes_messages_json(target: ModelTarget) -> bool:
    """Whether calls to `target` use ChatRequest.messages_json (litellm's path encodes the dicts itself)."""
    return openai_wire.handles(target)


def _wire_request(
    target: ModelTarget, request: ChatRequest, policy: RetryPolicy, *, stream: bool
) -> tuple[str, EncodedTrace]:
    """The OpenAI-wire body, encoded once, and its trace: the body as sent, with where it went and the
    timeout (never the key)."""
    body = openai_wire.request_body(
        target,
        messages=request.messages,
        tools=request.tools,
        tool_choice=request.tool_choice,
        temperature=request.temperature,
        max_tokens=request.max_tokens,
        parallel_tool_calls=request.parallel_tool_calls,
        stream=stream,
        logprobs=request.logprobs,
        top_logprobs=request.top_logprobs,
        return_token_ids=request.return_token_ids,
        messages_encoded=request.messages_json is not None,
    )
    encoded = openai_wire.encode(body, messages_json=request.messages_json)
    extra = {"api_base": endpoint_for_tenants(target.api_base), "timeout": policy.timeout}
    trace = EncodedTrace({**body, **extra})
    trace.json_text = encoded[:-1] + "," + json.dumps(extra, ensure_ascii=False, separators=(",", ":"))[1:]
    return encoded, trace


def _call_kwargs(
    target: ModelTarget, request: ChatRequest, *, policy: RetryPolicy, stream: bool
) -> dict[str, Any]:
    """litellm arguments. `drop_params` lets a provider ignore a setting it lacks (e.g. Ollama and
    parallel_tool_calls) instead of failing the call."""
    kwargs: dict[str, Any] = {
        "model": target.litellm_model,
        "messages": request.messages,
        "api_base": target.api_base,
        "api_key": target.api_key or KEYLESS_API_KEY,
        "timeout": policy.timeout,
        "max_retries": 0,
        "num_retries": 0,
        "drop_params": True,
    }
    if not is_deployment_endpoint(target.api_base):
        kwargs["client"] = tenant_litellm_handler()  # guarded; litellm's own clients are not
    if request.tools:
        kwargs["tools"] = request.tools
        if request.tool_choice is not None:
            kwargs["tool_choice"] = request.tool_choice
        if request.parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = request.parallel_tool_calls
    if request.temperature is not None:
        kwargs["temperature"] = request.temperature
    if request.max_tokens is not None:
        kwargs["max_tokens"] = request.max_tokens
    if request.logprobs:
        kwargs["logprobs"] = True
        if request.top_logprobs is not None:
            kwargs["top_logprobs"] = request.top_logprobs
    if request.return_token_ids:
        kwargs["extra_body"] = {"return_token_ids": True}
    if stream:
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


def _trace(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request as sent, minus credentials and our transport knobs; where it went as a tenant may see it."""
    hidden = {"api_key", "max_retries", "num_retries", "drop_params", "client"}
    trace = {key: value for key, value in kwargs.items() if key not in hidden}
    trace["api_base"] = endpoint_for_tenants(kwargs.get("api_base"))
    return trace


def _dump(response: Any) -> dict[str, Any]:
    """litellm's ModelResponse as plain JSON (what a JSONField can store)."""
    try:
        dumped = json.loads(response.model_dump_json())
    except (AttributeError, TypeError, ValueError) as exc:
        raise InvalidLLMResponse(f"unreadable chat completion: {exc}") from exc
    if not isinstance(dumped, dict):
        raise InvalidLLMResponse("chat completion is not a JSON object")
    return dumped


def _from_completion(
    target: ModelTarget,
    request: ChatRequest,
    completion: dict[str, Any],
    *,
    trace: dict[str, Any],
    latency_ms: int,
    attempts: int,
) -> ChatResponse:
    """Normalize an OpenAI-shaped chat completion; raises InvalidLLMResponse when it has no answer."""
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise InvalidLLMResponse(f"{target.handle}: the response has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise InvalidLLMResponse(f"{target.handle}: the response's first choice has no message")
    tool_calls = [
        _tool_call(target, index, call) for index, call in enumerate(message.get("tool_calls") or [])
    ]
    content = message.get("content")
    reasoning = message.get("reasoning_content")
    usage = completion.get("usage") or {}
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    completion_tokens = int(usage.get("completion_tokens") or 0)
    if not prompt_tokens and not completion_tokens:
        # Some OpenAI-compatible servers send no usage (or ignore stream_options): estimate instead.
        prompt_tokens = count_tokens(target.litellm_model, request.messages, request.tools)
        answer = (content or "") + (reasoning or "") + "".join(c.name + c.arguments for c in tool_calls)
        completion_tokens = count_text_tokens(target.litellm_model, answer)
    details = usage.get("completion_tokens_details") or {}
    logprobs = choice.get("logprobs")
    token_ids = choice.get("token_ids")
    return ChatResponse(
        content=content if isinstance(content, str) else None,
        reasoning=reasoning if isinstance(reasoning, str) and reasoning else None,
        tool_calls=tool_calls,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        reasoning_tokens=int(details.get("reasoning_tokens") or 0),
        model=str(completion.get("model") or target.litellm_model),
        raw={"request": trace, "response": completion},
        latency_ms=latency_ms,
        attempts=attempts,
        logprobs=logprobs if isinstance(logprobs, dict) and logprobs.get("content") is not None else None,
        token_ids=[int(t) for t in token_ids if isinstance(t, int)] if isinstance(token_ids, list) else None,
    )


def _tool_call(target: ModelTarget, index: int, call: Any) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise InvalidLLMResponse(f"{target.handle}: tool call #{index} has no function name")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments)  # a few providers send an object, not a JSON string
    # Letta pairs tool results with call ids; a few OpenAI-compatible servers omit them.
    call_id = call.get("id") or f"call_{uuid.uuid4().hex[:24]}"
    return ToolCall(id=str(call_id), name=function["name"], arguments=arguments)


def _elapsed_ms(started: float) -> int:
    return round((time.monotonic() - started) * 1000)


class _StreamAssembler:
    """Turns stream chunks (parsed JSON) into StreamDeltas and, at the end, one OpenAI-shaped completion."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.logprobs: list[Any] | None = None  # the chunks' logprobs.content entries, in order
        self.token_ids: list[int] | None = None  # the chunks' token_ids, in order (return_token_ids)
        self.usage: dict[str, Any] | None = None
        self.model: str | None = None
        self.id: str | None = None

    def add(self, data: dict[str, Any]) -> list[StreamDelta]:
        self.id = self.id or data.get("id")
        self.model = self.model or data.get("model")
        if isinstance(data.get("usage"), dict) and data["usage"]:
            self.usage = data["usage"]
        deltas: list[StreamDelta] = []
        for choice in data.get("choices") or []:
            if not isinstance(choice, dict):
                raise InvalidLLMResponse("stream chunk choice is not an object")
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            pieces = (choice.get("logprobs") or {}).get("content")
            if isinstance(pieces, list):
                self.logprobs = [*(self.logprobs or []), *pieces]
            if isinstance(ids := choice.get("token_ids"), list):
                self.token_ids = [*(self.token_ids or []), *ids]
            delta = choice.get("delta") or {}
            if reasoning := delta.get("reasoning_content"):
                self.reasoning.append(reasoning)
                deltas.append(StreamDelta(kind="reasoning", text=reasoning))
            if content := delta.get("content"):
                self.content.append(content)
                deltas.append(StreamDelta(kind="content", text=content))
            for position, piece in enumerate(delta.get("tool_calls") or []):
                deltas.extend(self._tool_piece(position, piece))
        return deltas

    def _tool_piece(self, position: int, piece: dict[str, Any]) -> list[StreamDelta]:
        index = piece.get("index")
        index = int(index) if isinstance(index, int) else position
        function = piece.get("function") or {}
        state = self.calls.get(index)
        is_new = state is None
        if state is None:
            state = self.calls[index] = {"id": None, "name": None, "arguments": []}
        state["id"] = state["id"] or piece.get("id")
        state["name"] = state["name"] or function.get("name")
        text = function.get("arguments") or ""
        if isinstance(text, dict):
            text = json.dumps(text)
        state["arguments"].append(text)
        if not text and not is_new:
            return []
        return [
            StreamDelta(
                kind="tool_call_args",
                text=text,
                tool_call_index=index,
                tool_call_id=state["id"],
                tool_name=state["name"],
            )
        ]

    def completion(self, *, fallback_model: str) -> dict[str, Any]:
        """The streamed answer in the same shape as a blocking response (what `raw` stores)."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": state["id"],
                    "type": "function",
                    "function": {"name": state["name"], "arguments": "".join(state["arguments"])},
                }
                for _, state in sorted(self.calls.items())
            ]
        return {
            "id": self.id,
            "object": "chat.completion",
            "model": self.model or fallback_model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": self.finish_reason,
                    "logprobs": None
                    if self.logprobs is None
                    else {"content": self.logprobs, "refusal": None},
                    **({"token_ids": self.token_ids} if self.token_ids is not None else {}),
                }
            ],
            "usage": self.usage,
        }
