"""Chat calls driven for real over HTTP against the scripted OpenAI-compatible server.

Every test runs twice: with LLM_CLIENT=direct (OpenAI-wire calls sent by apps.llm.openai_wire, the
default) and with LLM_CLIENT=litellm (every call through litellm.completion).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from apps.accounts.models import Organization
from apps.llm._litellm import load as load_litellm
from apps.llm.client import ChatRequest, ChatResponse, StreamDelta, ToolCall, complete, stream
from apps.llm.errors import (
    ContextWindowExceeded,
    InvalidLLMResponse,
    LLMApiError,
    LLMCallCancelled,
    LLMDeadlineExceeded,
)
from apps.llm.handles import ModelTarget, resolve_model
from apps.llm.models import Provider
from apps.llm.retry import CallBounds, Deadline, read_timeout
from tests.factories import ProviderFactory
from tests.llm.conftest import MESSAGES
from tests.support.scripted_llm import (
    ScriptedLLM,
    ScriptedLLMServer,
    context_length_exceeded,
    error,
    text,
    tool_call,
    tool_calls,
)
from tests.support.tarpit_llm import TarpitLLMServer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "send_message",
            "description": "Send a message to the user.",
            "parameters": {
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
            },
        },
    }
]


@pytest.fixture(autouse=True, params=["direct", "litellm"])
def llm_client(request: pytest.FixtureRequest, settings) -> str:
    settings.LLM_CLIENT = request.param
    return str(request.param)


@pytest.fixture
def sent_authorization(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(URL, Authorization header) of every request httpx really sends; the server log redacts keys."""
    seen: list[tuple[str, str]] = []
    real_send = httpx.Client.send

    def spy(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        seen.append((str(request.url), request.headers.get("authorization", "")))
        return real_send(self, request, **kwargs)

    monkeypatch.setattr(httpx.Client, "send", spy)
    return seen


@pytest.fixture
def fresh_server() -> Iterator[ScriptedLLMServer]:
    """A server of its own, so no HTTP client cached by an earlier test already points at it."""
    with ScriptedLLMServer() as srv:
        yield srv


@pytest.fixture
def dropping_server() -> Iterator[tuple[str, list[str]]]:
    """Streams one content chunk, then drops the connection mid-body; yields its /v1 URL and its hits."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            hits.append(self.path)
            chunk = {
                "id": "chatcmpl-drop",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "scripted-chat",
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None}
                ],
            }
            data = f"data: {json.dumps(chunk)}\n\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", hits
    httpd.shutdown()
    httpd.server_close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- blocking ------------------------------------------------------------------------------------------


def test_complete_returns_text_usage_and_trace(
    target: ModelTarget, llm: ScriptedLLM, llm_client: str
) -> None:
    llm.push(text("Hello there!", usage={"prompt_tokens": 42, "completion_tokens": 7}))

    response = complete(target, ChatRequest(messages=MESSAGES))

    assert (response.content, response.reasoning, response.tool_calls) == ("Hello there!", None, [])
    assert (response.finish_reason, response.model, response.attempts) == ("stop", "scripted-chat", 1)
    assert (response.prompt_tokens, response.completion_tokens, response.reasoning_tokens) == (42, 7, 0)
    assert response.latency_ms >= 0
    # The trace is the request as sent: litellm's arguments, or the body the direct client posted.
    sent_model = "scripted-chat" if llm_client == "direct" else "openai/scripted-chat"
    assert response.raw["request"] == {
        "model": sent_model,
        "messages": MESSAGES,
        "api_base": None,  # the deployment's own server: its URL is not for tenants to see
        "timeout": 10.0,
    }
    assert response.raw["response"]["choices"][0]["message"]["content"] == "Hello there!"
    assert json.loads(json.dumps(response.raw)) == response.raw


def test_the_stored_trace_is_the_request_as_sent(target: ModelTarget, llm: ScriptedLLM) -> None:
    from apps.agents.models import pack_trace, unpack_trace

    llm.push(text("Hello"))
    request = ChatRequest(messages=[*MESSAGES, {"role": "user", "content": "ünïcode ✓"}], tools=TOOLS)

    response = complete(target, request)

    stored = unpack_trace(pack_trace(response.raw["request"], response.raw["response"]))
    assert stored == {"request": dict(response.raw["request"]), "response": response.raw["response"]}
    assert stored["request"]["messages"] == llm.last_chat_request()["messages"]


def test_request_settings_reach_the_server(target: ModelTarget, llm: ScriptedLLM) -> None:
    request = ChatRequest(
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        temperature=0.2,
        max_tokens=50,
        parallel_tool_calls=True,
    )

    complete(target, request)

    body = llm.last_chat_request()
    assert body["model"] == "scripted-chat"
    assert body["messages"] == MESSAGES
    assert body["tools"] == TOOLS
    assert (body["tool_choice"], body["temperature"], body["max_tokens"]) == ("required", 0.2, 50)
    assert body["parallel_tool_calls"] is True
    assert "stream" not in body


def test_reasoning_models_get_the_parameters_they_accept(
    settings,
    org: Organization,
    llm: ScriptedLLM,
) -> None:
    settings.OPENAI_BASE_URL = llm.url
    target = resolve_model("openai/o3-mini", organization_id=org.id)

    complete(target, ChatRequest(messages=MESSAGES, tools=TOOLS, temperature=0.2, max_tokens=50))

    body = llm.last_chat_request()
    assert body["max_completion_tokens"] == 50
    assert "max_tokens" not in body
    assert "temperature" not in body
    assert body["tools"] == TOOLS


def test_null_message_fields_are_not_sent(target: ModelTarget, llm: ScriptedLLM) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "send_message", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "hi", "name": None},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sent"},
    ]

    complete(target, ChatRequest(messages=messages, tools=TOOLS))

    assert llm.last_chat_request()["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sent"},
    ]
    assert messages[1]["content"] is None  # the caller's messages are not changed


def test_unset_request_settings_are_not_sent(target: ModelTarget, llm: ScriptedLLM) -> None:
    complete(target, ChatRequest(messages=MESSAGES, parallel_tool_calls=True))

    body = llm.last_chat_request()
    assert sorted(body) == ["messages", "model"]


def test_complete_returns_reasoning(target: ModelTarget, llm: ScriptedLLM) -> None:
    llm.push(
        text(
            "Hi!",
            reasoning="The user greeted me.",
            usage={"prompt_tokens": 10, "completion_tokens": 20, "reasoning_tokens": 12},
        )
    )

    response = complete(target, ChatRequest(messages=MESSAGES))

    assert (response.content, response.reasoning) == ("Hi!", "The user greeted me.")
    assert response.reasoning_tokens == 12


def test_complete_returns_parallel_tool_calls(target: ModelTarget, llm: ScriptedLLM) -> None:
    llm.push(
        tool_calls(
            tool_call("send_message", {"message": "Hi!"}, id="call_a"),
            tool_call("archival_memory_search", {"query": "hiking"}, id="call_b"),
        )
    )

    response = complete(target, ChatRequest(messages=MESSAGES, tools=TOOLS, parallel_tool_calls=True))

    assert response.tool_calls == [
        ToolCall(id="call_a", name="send_message", arguments='{"message": "Hi!"}'),
        ToolCall(id="call_b", name="archival_memory_search", arguments='{"query": "hiking"}'),
    ]
    assert (response.content, response.finish_reason) == (None, "tool_calls")


def test_malformed_tool_arguments_are_kept_verbatim(target: ModelTarget, llm: ScriptedLLM) -> None:
    llm.push(tool_calls(tool_call("send_message", '{"message": "unterminated', id="call_x")))

    response = complete(target, ChatRequest(messages=MESSAGES, tools=TOOLS))

    assert response.tool_calls == [
        ToolCall(id="call_x", name="send_message", arguments='{"message": "unterminated')
    ]


# -- streaming -----------------------------------------------------------------------------------------


def test_stream_emits_reasoning_then_content_in_order(target: ModelTarget, llm: ScriptedLLM) -> None:
    llm.push(
        text(
            "one two three",
            reasoning="thinking hard now",
            usage={"prompt_tokens": 11, "completion_tokens": 5},
        )
    )
    deltas: list[StreamDelta] = []

    response = stream(target, ChatRequest(messages=MESSAGES), deltas.append)

    assert [(d.kind, d.text) for d in deltas] == [
        ("reasoning", "thinking"),
        ("reasoning", " hard"),
        ("reasoning", " now"),
        ("content", "one"),
        ("content", " two"),
        ("content", " three"),
    ]
    assert (response.content, response.reasoning, response.tool_calls) == (
        "one two three",
        "thinking hard now",
        [],
    )
    assert (response.finish_reason, response.prompt_tokens, response.completion_tokens) == ("stop", 11, 5)
    assert response.raw["request"]["stream"] is True
    assert response.raw["response"]["choices"][0]["message"]["content"] == "one two three"
    assert llm.last_chat_request()["stream_options"] == {"include_usage": True}


def test_stream_emits_tool_call_argument_deltas_and_assembles_parallel_calls(
    target: ModelTarget, llm: ScriptedLLM
) -> None:
    args_a = json.dumps({"message": "A fairly long message so the arguments arrive in pieces"})
    llm.push(
        tool_calls(
            tool_call("send_message", args_a, id="call_a"),
            tool_call("conversation_search", {"query": "tea"}, id="call_b"),
        )
    )
    deltas: list[StreamDelta] = []

    response = stream(target, ChatRequest(messages=MESSAGES, tools=TOOLS), deltas.append)

    assert deltas[0] == StreamDelta(
        kind="tool_call_args", text="", tool_call_index=0, tool_call_id="call_a", tool_name="send_message"
    )
    assert {d.kind for d in deltas} == {"tool_call_args"}
    assert [d.tool_call_index for d in deltas] == sorted(d.tool_call_index for d in deltas)  # type: ignore[type-var]
    first = [d for d in deltas if d.tool_call_index == 0]
    second = [d for d in deltas if d.tool_call_index == 1]
    assert len(first) >= 3
    assert "".join(d.text for d in first) == args_a
    assert "".join(d.text for d in second) == '{"query": "tea"}'
    assert {(d.tool_call_id, d.tool_name) for d in second} == {("call_b", "conversation_search")}
    assert response.tool_calls == [
        ToolCall(id="call_a", name="send_message", arguments=args_a),
        ToolCall(id="call_b", name="conversation_search", arguments='{"query": "tea"}'),
    ]
    assert response.finish_reason == "tool_calls"


def test_stream_failure_before_the_first_delta_is_retried(target: ModelTarget, llm: ScriptedLLM) -> None:
    llm.push(error(503, "warming up"), text("ready now"))
    deltas: list[StreamDelta] = []

    response = stream(target, ChatRequest(messages=MESSAGES), deltas.append)

    assert [d.text for d in deltas] == ["ready", " now"]
    assert (response.content, response.attempts) == ("ready now", 2)
    assert len(llm.chat_requests()) == 2


def test_stream_failure_after_a_delta_is_not_retried(
    settings, org: Organization, dropping_server: tuple[str, list[str]]
) -> None:
    url, hits = dropping_server
    settings.OPENAI_BASE_URL = url
    target = resolve_model("openai/scripted-chat", organization_id=org.id)
    deltas: list[StreamDelta] = []

    with pytest.raises(LLMApiError) as info:
        stream(target, ChatRequest(messages=MESSAGES), deltas.append)

    assert deltas == [StreamDelta(kind="content", text="Hel")]
    assert (info.value.status, info.value.attempts) == (None, 1)
    assert hits == ["/v1/chat/completions"]


def test_exception_in_on_delta_propagates_unchanged(target: ModelTarget, llm: ScriptedLLM) -> None:
    llm.push(text("one two three"))

    def explode(delta: StreamDelta) -> None:
        raise KeyError("listener broke")

    with pytest.raises(KeyError, match="listener broke"):
        stream(target, ChatRequest(messages=MESSAGES), explode)

    assert len(llm.chat_requests()) == 1


# -- retries and errors --------------------------------------------------------------------------------


def test_500_then_success_is_retried(target: ModelTarget, llm: ScriptedLLM) -> None:
    llm.push(error(500, "upstream exploded"), text("recovered"))

    response = complete(target, ChatRequest(messages=MESSAGES))

    assert (response.content, response.attempts) == ("recovered", 2)
    assert len(llm.chat_requests()) == 2


def test_429_then_success_is_retried(target: ModelTarget, llm: ScriptedLLM) -> None:
    llm.push(error(429, "slow down", code="rate_limit_exceeded"), text("recovered"))

    response = complete(target, ChatRequest(messages=MESSAGES))

    assert (response.content, response.attempts) == ("recovered", 2)
    assert len(llm.chat_requests()) == 2


def test_retry_after_header_replaces_the_backoff(settings, target: ModelTarget, llm: ScriptedLLM) -> None:
    settings.LLM_RETRY_BASE_DELAY = 30.0
    settings.LLM_RETRY_MAX_DELAY = 60.0
    llm.push(error(429, "slow down", headers={"retry-after-ms": "20"}), text("recovered"))
    started = time.monotonic()

    response = complete(target, ChatRequest(messages=MESSAGES))

    assert response.content == "recovered"
    assert time.monotonic() - started < 5


def test_persistent_500_raises_llm_api_error_after_max_attempts(
    target: ModelTarget, llm: ScriptedLLM
) -> None:
    llm.push(error(500, "upstream exploded", persist=True))

    with pytest.raises(LLMApiError) as info:
        complete(target, ChatRequest(messages=MESSAGES))

    assert (info.value.status, info.value.provider_message, info.value.attempts) == (
        500,
        "upstream exploded",
        3,
    )
    assert info.value.code == "llm_api_error"
    assert len(llm.chat_requests()) == 3


def test_max_attempts_setting_counts_every_request(settings, target: ModelTarget, llm: ScriptedLLM) -> None:
    settings.LLM_MAX_ATTEMPTS = 5
    llm.push(error(502, "bad gateway", persist=True))

    with pytest.raises(LLMApiError) as info:
        stream(target, ChatRequest(messages=MESSAGES), lambda delta: None)

    assert (info.value.status, info.value.attempts) == (502, 5)
    assert len(llm.chat_requests()) == 5


def test_bad_request_is_not_retried(target: ModelTarget, llm: ScriptedLLM) -> None:
    llm.push(error(400, "bad tool schema"))

    with pytest.raises(LLMApiError) as info:
        complete(target, ChatRequest(messages=MESSAGES))

    assert (info.value.status, info.value.provider_message, info.value.attempts) == (
        400,
        "bad tool schema",
        1,
    )
    assert len(llm.chat_requests()) == 1


def test_context_length_exceeded_raises_context_window_exceeded(
    target: ModelTarget, llm: ScriptedLLM
) -> None:
    llm.push(context_length_exceeded(max_tokens=8192, requested=9000))

    with pytest.raises(ContextWindowExceeded) as info:
        complete(target, ChatRequest(messages=MESSAGES))

    assert info.value.code == "context_window_exceeded"
    assert info.value.provider_message == (
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. "
        "Please reduce the length of the messages."
    )
    assert len(llm.chat_requests()) == 1


def test_context_overflow_in_words_only_raises_context_window_exceeded(
    settings,
    org: Organization,
    canned_server: Callable[..., tuple[str, list[str]]],
) -> None:
    """vLLM says it in words, with a numeric code and no `context_length_exceeded`."""
    message = "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."
    body = {"object": "error", "message": message, "type": "BadRequestError", "code": 400}
    url, hits = canned_server(json.dumps(body).encode(), status=400)
    settings.OPENAI_BASE_URL = url
    target = resolve_model("openai/local-model", organization_id=org.id)

    with pytest.raises(ContextWindowExceeded):
        complete(target, ChatRequest(messages=MESSAGES))

    assert hits == ["/v1/chat/completions"]


def test_error_event_inside_a_stream_raises_llm_api_error(
    settings,
    org: Organization,
    canned_server: Callable[..., tuple[str, list[str]]],
) -> None:
    events = b'data: {"error": {"message": "The server had an error while processing your request."}}\n\n'
    url, hits = canned_server(events, content_type="text/event-stream")
    settings.OPENAI_BASE_URL = url
    target = resolve_model("openai/scripted-chat", organization_id=org.id)

    with pytest.raises(LLMApiError) as info:
        stream(target, ChatRequest(messages=MESSAGES), lambda delta: None)

    assert "The server had an error while processing your request." in str(info.value)
    assert hits


def test_timeout_is_retried(settings, target: ModelTarget, llm: ScriptedLLM) -> None:
    settings.LLM_REQUEST_TIMEOUT = 0.3
    llm.push(text("too slow", latency=1.0), text("in time"))

    response = complete(target, ChatRequest(messages=MESSAGES))

    assert (response.content, response.attempts) == ("in time", 2)
    assert len(llm.chat_requests()) == 2


def test_connection_refused_raises_after_max_attempts(settings, org: Organization) -> None:
    settings.OPENAI_BASE_URL = f"http://127.0.0.1:{_closed_port()}/v1"
    target = resolve_model("openai/scripted-chat", organization_id=org.id)

    with pytest.raises(LLMApiError) as info:
        complete(target, ChatRequest(messages=MESSAGES))

    assert (info.value.status, info.value.attempts) == (None, 3)


def test_unreadable_response_raises_invalid_llm_response_without_retry(
    settings,
    org: Organization,
    canned_server: Callable[..., tuple[str, list[str]]],
) -> None:
    url, hits = canned_server(b"this is not json")
    settings.OPENAI_BASE_URL = url
    target = resolve_model("openai/scripted-chat", organization_id=org.id)

    with pytest.raises(InvalidLLMResponse):
        complete(target, ChatRequest(messages=MESSAGES))

    assert hits == ["/v1/chat/completions"]


def test_response_without_choices_raises_invalid_llm_response(
    settings,
    org: Organization,
    canned_server: Callable[..., tuple[str, list[str]]],
) -> None:
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}
    url, hits = canned_server(json.dumps(body).encode())
    settings.OPENAI_BASE_URL = url
    target = resolve_model("openai/scripted-chat", organization_id=org.id)

    with pytest.raises(InvalidLLMResponse) as info:
        complete(target, ChatRequest(messages=MESSAGES))

    assert str(info.value) == "openai/scripted-chat: the response has no choices"
    assert hits == ["/v1/chat/completions"]


def test_missing_usage_is_estimated(
    settings,
    org: Organization,
    canned_server: Callable[..., tuple[str, list[str]]],
) -> None:
    body = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "local-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hello world"}, "finish_reason": "stop"}
        ],
    }
    url, _ = canned_server(json.dumps(body).encode())
    settings.OPENAI_BASE_URL = url
    target = resolve_model("openai/local-model", organization_id=org.id)

    response = complete(target, ChatRequest(messages=[{"role": "user", "content": "hello world"}]))

    assert (response.content, response.prompt_tokens, response.completion_tokens) == ("hello world", 9, 2)


# -- credentials and client reuse ----------------------------------------------------------------------


def test_org_provider_credentials_reach_their_server_not_the_environments(
    settings,
    allow_loopback: None,
    org: Organization,
    llm: ScriptedLLM,
    fresh_server: ScriptedLLMServer,
    sent_authorization: list[tuple[str, str]],
) -> None:
    settings.OPENAI_API_KEY = "sk-env"
    settings.OPENAI_BASE_URL = llm.url
    ProviderFactory(organization=org, name="openai", api_key="sk-org", base_url=fresh_server.url)
    target = resolve_model("openai/scripted-chat", organization_id=org.id)

    complete(target, ChatRequest(messages=MESSAGES))

    assert len(fresh_server.client().chat_requests()) == 1
    assert llm.chat_requests() == []
    assert sent_authorization == [(fresh_server.url + "/chat/completions", "Bearer sk-org")]


def test_keyless_server_never_gets_the_process_openai_key(
    settings,
    monkeypatch: pytest.MonkeyPatch,
    org: Organization,
    llm: ScriptedLLM,
    sent_authorization: list[tuple[str, str]],
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-process-secret")
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = llm.url
    target = resolve_model("openai/scripted-chat", organization_id=org.id)

    complete(target, ChatRequest(messages=MESSAGES))

    assert sent_authorization == [(llm.url + "/chat/completions", "Bearer no-key")]


def test_keyless_org_provider_never_gets_the_environment_key(
    settings,
    allow_loopback: None,
    monkeypatch: pytest.MonkeyPatch,
    org: Organization,
    fresh_server: ScriptedLLMServer,
    sent_authorization: list[tuple[str, str]],
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-process-secret")
    settings.OPENAI_API_KEY = "sk-env-secret"
    ProviderFactory(
        organization=org,
        name="local",
        provider_type=Provider.Type.OPENAI_COMPATIBLE,
        base_url=fresh_server.url,
        api_key="",
    )
    target = resolve_model("local/qwen", organization_id=org.id)

    complete(target, ChatRequest(messages=MESSAGES))

    assert sent_authorization == [(fresh_server.url + "/chat/completions", "Bearer no-key")]


def test_org_compatible_provider_is_called_at_its_base_url(
    settings,
    allow_loopback: None,
    org: Organization,
    fresh_server: ScriptedLLMServer,
) -> None:
    settings.OPENAI_BASE_URL = ""
    ProviderFactory(
        organization=org,
        name="vllm",
        provider_type=Provider.Type.OPENAI_COMPATIBLE,
        base_url=fresh_server.url,
        api_key="sk-vllm",
    )
    fresh_server.client().push(text("from vllm"))
    target = resolve_model("vllm/Qwen/Qwen2.5-7B-Instruct", organization_id=org.id)

    response = complete(target, ChatRequest(messages=MESSAGES))

    assert response.content == "from vllm"
    assert fresh_server.client().last_chat_request()["model"] == "Qwen/Qwen2.5-7B-Instruct"


def test_consecutive_calls_reuse_one_connection(
    settings,
    monkeypatch: pytest.MonkeyPatch,
    org: Organization,
    fresh_server: ScriptedLLMServer,
) -> None:
    settings.OPENAI_BASE_URL = fresh_server.url
    target = resolve_model("openai/scripted-chat", organization_id=org.id)
    connects: list[Any] = []
    guarded_connect = socket.socket.connect

    def counting(self: socket.socket, address: Any) -> Any:
        if address == ("127.0.0.1", fresh_server.port):
            connects.append(address)
        return guarded_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", counting)

    complete(target, ChatRequest(messages=MESSAGES))
    stream(target, ChatRequest(messages=MESSAGES), lambda delta: None)
    complete(target, ChatRequest(messages=MESSAGES))

    assert len(connects) == 1
    assert len(fresh_server.client().chat_requests()) == 3


def test_response_is_a_chat_response(target: ModelTarget, llm: ScriptedLLM) -> None:
    response = complete(target, ChatRequest(messages=MESSAGES))

    assert isinstance(response, ChatResponse)
    assert response.content == "OK"


# -- bodies with the messages' JSON given (ChatRequest.messages_json) -------------------------------------


def test_a_body_built_from_encoded_messages_is_the_body_encoded_whole():
    from apps.llm import openai_wire

    messages = [
        {"role": "system", "content": "You are Letta. ¿Qué tal? 🙂"},
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": "\\u00e9"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]  # fmt: skip
    body = {"model": "gpt-4o-mini", "messages": messages, "tool_choice": "auto", "temperature": 0.2}

    spliced = openai_wire.encode(body, messages_json=[openai_wire.encode_message(m) for m in messages])

    assert json.loads(spliced) == json.loads(openai_wire.encode(body))
    only_messages = {"messages": messages[:1]}
    assert json.loads(
        openai_wire.encode(only_messages, messages_json=[openai_wire.encode_message(messages[0])])
    ) == (only_messages)
    # As request_body does for whole bodies, an encoded message leaves out keys whose value is None.
    assert json.loads(openai_wire.encode_message({"role": "assistant", "content": None, "name": "x"})) == {
        "role": "assistant",
        "name": "x",
    }
    with pytest.raises(ValueError, match="2 encoded messages for 3 messages"):
        openai_wire.encode(body, messages_json=["{}", "{}"])


# -- bounds: a deadline per call, cancellation in flight (tests/support/tarpit_llm.py) ----------------------

DEADLINE = 1.5
MARGIN = 0.7
"""How late past its deadline a call may end: the watchdog's period, thread hops, a loaded machine."""


@pytest.fixture(scope="module")
def tarpit_server() -> Iterator[TarpitLLMServer]:
    with TarpitLLMServer(interval=0.2) as server:
        yield server


@pytest.fixture
def tarpit(
    settings, tarpit_server: TarpitLLMServer, org: Organization
) -> tuple[TarpitLLMServer, ModelTarget]:
    """The tarpit as the deployment's OpenAI-compatible server; a call may last DEADLINE seconds, and each
    read 0.5 s, which every trickled byte (one per 0.2 s) beats."""
    load_litellm()  # imported before the clock starts (a first import takes seconds)
    tarpit_server.reset()
    settings.OPENAI_BASE_URL = tarpit_server.url
    settings.OPENAI_API_KEY = "sk-env"
    settings.LLM_CALL_DEADLINE = DEADLINE
    settings.LLM_REQUEST_TIMEOUT = 0.5
    return tarpit_server, resolve_model("openai/scripted-chat", organization_id=org.id)


def _call(target: ModelTarget, *, streamed: bool, **options: Any) -> ChatResponse:
    if streamed:
        return stream(target, ChatRequest(messages=MESSAGES), lambda delta: None, **options)
    return complete(target, ChatRequest(messages=MESSAGES), **options)


def test_a_stream_that_trickles_ends_at_the_call_deadline_and_hangs_up(
    tarpit: tuple[TarpitLLMServer, ModelTarget],
) -> None:
    server, target = tarpit
    started = time.monotonic()

    with pytest.raises(LLMDeadlineExceeded) as info:
        stream(target, ChatRequest(messages=MESSAGES), lambda delta: None)

    assert DEADLINE <= time.monotonic() - started < DEADLINE + MARGIN
    assert (
        info.value.message
        == "openai/scripted-chat: the model did not answer within 1.5 s (LLM_CALL_DEADLINE)"
    )
    assert (info.value.code, info.value.status, info.value.attempts) == ("llm_api_error", None, 1)
    [request] = server.chat_requests()  # a deadline is not retried
    assert request.streamed
    assert request.bytes_sent >= 4  # no read waited its whole timeout: only the deadline ended the call
    assert server.wait_for_hangup(request) - started < DEADLINE + MARGIN


def test_a_blocking_body_that_trickles_ends_at_the_call_deadline_and_hangs_up(
    tarpit: tuple[TarpitLLMServer, ModelTarget],
) -> None:
    server, target = tarpit
    started = time.monotonic()

    with pytest.raises(LLMDeadlineExceeded, match=r"did not answer within 1\.5 s"):
        complete(target, ChatRequest(messages=MESSAGES))

    assert DEADLINE <= time.monotonic() - started < DEADLINE + MARGIN
    [request] = server.chat_requests()
    assert not request.streamed
    assert request.bytes_sent >= 4
    assert server.wait_for_hangup(request) - started < DEADLINE + MARGIN


@pytest.mark.parametrize("streamed", [False, True])
def test_a_server_that_never_answers_fails_at_the_deadline_not_at_the_read_timeout(
    settings,
    tarpit: tuple[TarpitLLMServer, ModelTarget],
    streamed: bool,
) -> None:
    server, target = tarpit
    server.set_mode("silent")
    settings.LLM_REQUEST_TIMEOUT = 30.0
    started = time.monotonic()

    with pytest.raises(LLMDeadlineExceeded):
        _call(target, streamed=streamed)

    assert time.monotonic() - started < DEADLINE + MARGIN
    [request] = server.chat_requests()
    assert server.wait_for_hangup(request) - started < DEADLINE + MARGIN


def test_a_retry_never_waits_past_the_deadline(settings, target: ModelTarget, llm: ScriptedLLM) -> None:
    settings.LLM_CALL_DEADLINE = 2.0
    settings.LLM_RETRY_MAX_DELAY = 60.0
    llm.push(error(503, "overloaded", headers={"retry-after": "30"}), text("too late"))
    started = time.monotonic()

    with pytest.raises(LLMDeadlineExceeded) as info:
        complete(target, ChatRequest(messages=MESSAGES))

    assert time.monotonic() - started < 1.0  # failed at once rather than sleeping into the deadline
    assert info.value.message.startswith("openai/scripted-chat: the model did not answer within 2 s")
    assert "(last failure: openai/scripted-chat: the provider answered HTTP 503" in info.value.message
    assert len(llm.chat_requests()) == 1


@pytest.mark.parametrize("mode", ["trickle", "silent"])
@pytest.mark.parametrize("streamed", [False, True])
def test_a_cancelled_call_ends_within_a_second_and_hangs_up(
    settings,
    tarpit: tuple[TarpitLLMServer, ModelTarget],
    mode: str,
    streamed: bool,
) -> None:
    server, target = tarpit
    server.set_mode(mode)
    settings.LLM_CALL_DEADLINE = 60.0
    settings.LLM_REQUEST_TIMEOUT = 30.0  # a silent server's headers would time out first
    cancelled = threading.Event()
    threading.Timer(0.5, cancelled.set).start()
    bounds = CallBounds.from_settings(cancelled=cancelled.is_set)
    started = time.monotonic()

    with pytest.raises(LLMCallCancelled, match="openai/scripted-chat: the call was cancelled"):
        _call(target, streamed=streamed, bounds=bounds)

    assert time.monotonic() - started < 0.5 + 1.0
    [request] = server.chat_requests()
    assert server.wait_for_hangup(request) - started < 0.5 + 1.0


def test_a_call_is_bounded_by_the_earlier_of_its_own_deadline_and_the_callers(settings) -> None:
    settings.LLM_CALL_DEADLINE = 300.0
    soon = Deadline.after(5.0, "the run did not finish within 5 s (RUN_DEADLINE)")
    late = Deadline.after(900.0, "the run did not finish within 900 s (RUN_DEADLINE)")

    assert CallBounds.from_settings(within=soon).deadline is soon
    assert CallBounds.from_settings(within=late).deadline.reason == (
        "the model did not answer within 300 s (LLM_CALL_DEADLINE)"
    )
    assert CallBounds.from_settings().deadline.remaining() == pytest.approx(300.0, abs=1.0)


def test_a_read_timeout_is_cut_to_the_time_a_call_has_left() -> None:
    assert read_timeout(120.0, 500.0) == 120.0
    assert read_timeout(120.0, 5.25) == 5.25
    assert read_timeout(120.0, -1.0) == 0.001  # past the deadline: the caller's check raises first
    assert read_timeout(120.0, 5.25, whole_seconds=True) == 6.0  # litellm: few distinct timeouts
    assert read_timeout(120.0, 500.0, whole_seconds=True) == 120.0
    assert read_timeout(0.5, 0.2, whole_seconds=True) == 0.5
