"""POST /v1/chat/completions (Letta's OpenAI-compatible router): talk to an agent with the `openai` client.

`model` is the agent's id. The last user message of `messages` is sent to the agent as a normal send
(apps.api.views.messages: run_create, a worker executes the run, memory edits included), and the answer
is the run's assistant text: a JSON `chat.completion`, or with `stream: true` `chat.completion.chunk`
events (token by token) ending with `data: [DONE]`, relayed from the run's event stream (apps.api.sse).

Everyone who can see the agent may use it (Action.AGENT_USE); another organisation's agent, or none, is
404 in Letta's shape (`{"detail": ...}`, as Letta answers it; the `openai` client raises NotFoundError).
A run that failed on the LLM provider is 502, one that crashed 500, a run still going at the client's
read timeout 504 (none of them retried: `x-should-retry: false`); inside a stream, a failure is an
OpenAI-style `{"error": ...}` event, which the client raises. Differences from Letta: a blocking answer
(Letta refuses `stream: false`), `user` is ignored (Letta takes it as the acting user's id), `n` must be 1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, cast

from django.http import HttpResponse
from django.urls import re_path
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.agents.errors import PendingApproval
from apps.agents.services import MessageIn
from apps.api import throttles
from apps.api.serializers import chat as s
from apps.api.serializers.messages import SendRequest
from apps.api.sse import StreamOptions, run_sse, sse_response
from apps.api.views.messages import MessageSendApiView

ANSWER_TYPES = frozenset({"assistant_message"})
PING = b": ping\n\n"
"""A keep-alive as an SSE comment: the `openai` client skips it (a Letta ping would not parse as a chunk)."""


def model_name(handle: str) -> str:
    """Letta answers with the agent's model name (its llm_config.model), not the agent id."""
    return handle.partition("/")[2] or handle or "unknown"


class ChatCompletionsApi(MessageSendApiView):
    @extend_schema(operation_id="create_chat_completion", request=s.ChatCompletionIn, responses={200: dict})
    def post(self, request: Request) -> HttpResponse:
        data = s.ChatCompletionIn(data=request.data)
        data.is_valid(raise_exception=True)
        agent_id = data.agent_id()
        content = data.user_content()
        agent = agent_selectors.agent_get(
            actor=self.actor, agent_id=agent_id
        )  # 404 before anything is stored
        model = model_name(agent.model)
        created = int(time.time())
        if data.validated_data.get("stream"):
            send = SendRequest(
                messages=[MessageIn(content=content)],
                include_return_message_types=ANSWER_TYPES,
                streaming=True,
                stream_tokens=True,
            )
            return self.chat_stream(
                request,
                agent_id=agent_id,
                send=send,
                model=model,
                created=created,
                usage=data.include_usage(),
            )
        send = SendRequest(messages=[MessageIn(content=content)], include_return_message_types=ANSWER_TYPES)
        # Its data is translated here, so the wait is in this thread, as under WSGI.
        response = cast(Response, self.blocking(request, agent_id=agent_id, send=send, on_event_loop=False))
        if response.status_code != status.HTTP_200_OK:
            return response
        completion_id = f"chatcmpl-{_run_id(response.data)}"
        return Response(
            s.chat_completion(response.data, completion_id=completion_id, model=model, created=created)
        )

    def chat_stream(
        self, request: Request, *, agent_id: str, send: SendRequest, model: str, created: int, usage: bool
    ) -> HttpResponse:
        """The run's Letta stream (from its start, with its stream slot) translated into chunks."""
        slot = throttles.require_stream_slot(self.actor)
        try:
            run = self.start_run(agent_id=agent_id, send=send)
        except PendingApproval as exc:
            slot.release()
            return Response({"detail": exc.message}, status=status.HTTP_409_CONFLICT)
        except BaseException:
            slot.release()
            raise
        options = StreamOptions(stream_tokens=True, include_types=ANSWER_TYPES, include_pings=True)
        letta = run_sse(actor=self.actor, run_id=run.id, options=options, slot=slot)
        chunks = ChatChunks(
            letta, completion_id=f"chatcmpl-{run.id}", model=model, created=created, usage=usage
        )
        return sse_response(request, chunks)


def _run_id(letta_response: dict[str, Any]) -> str:
    run_ids = (letta_response.get("usage") or {}).get("run_ids") or []
    if run_ids:
        return str(run_ids[0])
    messages = letta_response.get("messages") or []
    return str(messages[0].get("run_id")) if messages and messages[0].get("run_id") else "unknown"


def parse_event(raw: bytes) -> tuple[str | None, Any]:
    """One event of apps.api.sse (each chunk it yields is exactly one: `data: <json>` or `[DONE]`,
    `event: error` before the data of an error) as (event name, data)."""
    name, data = None, []
    for line in raw.decode().splitlines():
        field, _, value = line.partition(": ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    text = "\n".join(data)
    if text == "[DONE]" or not text:
        return name, text
    return name, json.loads(text)


class ChatChunks:
    """A run's Letta SSE bytes -> `chat.completion.chunk` SSE bytes: a first chunk with the role, the
    assistant text as it streams (a blank line between two messages, as in the blocking answer), a last
    chunk with the finish reason, the usage chunk when `stream_options.include_usage` asked for it, then
    `[DONE]`. Closing it closes the Letta stream (which releases the stream slot), even unstarted."""

    def __init__(
        self, letta: Iterator[bytes], *, completion_id: str, model: str, created: int, usage: bool
    ) -> None:
        self.letta = letta
        self.ids = {"completion_id": completion_id, "model": model, "created": created}
        self.usage = usage
        self.chunks = self._translate()

    def __iter__(self) -> ChatChunks:
        return self

    def __next__(self) -> bytes:
        return next(self.chunks)

    def close(self) -> None:
        try:
            self.chunks.close()
        finally:
            close = getattr(self.letta, "close", None)
            if close is not None:
                close()

    def _translate(self) -> Iterator[bytes]:
        yield s.chunk(**self.ids, delta={"role": "assistant", "content": ""})
        stop_reason: str | None = None
        statistics: dict[str, Any] | None = None
        message_id: str | None = None
        for raw in self.letta:
            name, data = parse_event(raw)
            if data == "[DONE]":
                break
            if name == "error":
                message = data.get("message") or "The run failed."
                yield s.error_event(message, data.get("error_type") or "server_error")
                yield b"data: [DONE]\n\n"
                return
            kind = data.get("message_type") if isinstance(data, dict) else None
            if kind == "ping":
                yield PING
            elif kind == "assistant_message":
                text = s.message_text(data)
                if not text:
                    continue
                if message_id is not None and data.get("id") != message_id:
                    text = s.MESSAGE_SEPARATOR + text
                message_id = data.get("id")
                yield s.chunk(**self.ids, delta={"content": text})
            elif kind == "stop_reason":
                stop_reason = data.get("stop_reason")
            elif kind == "usage_statistics":
                statistics = data
        yield s.chunk(**self.ids, delta={}, finish=s.finish_reason(stop_reason))
        if self.usage:
            yield s.chunk(**self.ids, usage_=s.usage(statistics))
        yield b"data: [DONE]\n\n"


urlpatterns = [
    re_path(r"^v1/chat/completions/?$", ChatCompletionsApi.as_view(), name="chat-completions"),
]
