"""The one place litellm is imported and configured.

Offline: litellm fetches its model cost map from GitHub at import time and may download HuggingFace
tokenizers for some model names, unless told not to. Every module of this app imports litellm from
here, so the only network traffic is the call to the provider URL a caller chose. The environment
defaults are set before the import because the cost map is loaded during it; an operator may still
override them.

Connection reuse: OpenAI and OpenAI-compatible calls go through litellm's own HTTP handler (the
EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER switch below), whose httpx clients litellm caches and reuses.
Providers litellm still calls through the OpenAI SDK (Azure, some OpenAI-compatible hosts) get one SDK
client per (key, base URL, timeout, max_retries), with `litellm.client_session` as its httpx client. We set one, whose transport
finishes reading a server-sent-event stream after its `[DONE]` line: the OpenAI SDK's synchronous
stream stops reading right there and closes the response, and an HTTP/1.1 response closed before its
end costs its connection, so without this every streamed step would open a new (TLS) connection.

Provider URLs an organisation chose never use those clients: `tenant_client()` (and, as litellm's
`client=`, `tenant_litellm_handler()`) is behind the outbound guard (apps.core.outbound), follows no
redirect and, like `client_session`, keeps no cookies (both are shared by every organisation).

Imported on first use: `litellm` here is a stand-in that imports and configures the real module the
first time an attribute is read. litellm costs ~155 MiB of memory and ~2 s to import, and the web
process, which imports the agent loop for its services, rarely calls a provider (the workers do);
Celery workers load it before they fork (`load()` on `worker_init`, config/celery.py), so their
children share it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
# OpenAI and OpenAI-compatible calls through litellm's own HTTP handler, not the OpenAI SDK: the SDK's
# request transformation walks every message against its type annotations, ~4 ms of CPU per call with
# 20 messages and more as the context grows (bench/RESULTS.md).
os.environ.setdefault("EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER", "true")

import httpx

from apps.core.outbound import GuardedTransport, guarded_client, no_cookies

SSE_END = b"data: [DONE]"


class _DrainAfterDoneStream(httpx.SyncByteStream):
    """Passes a response body through; on close, reads the rest if the stream already said [DONE].

    Only the chunked-encoding terminator is left after [DONE], so the drain reads a few bytes and the
    connection returns to the pool. A stream abandoned before [DONE] is closed as usual (draining it
    would wait for the rest of a generation nobody wants).
    """

    def __init__(self, inner: httpx.SyncByteStream) -> None:
        self._inner = inner
        self._chunks = iter(inner)
        self._tail = b""

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self._tail = (self._tail + chunk)[-64:]
            yield chunk

    def close(self) -> None:
        try:
            if SSE_END in self._tail:
                for _ in self._chunks:
                    pass
        except httpx.HTTPError:
            pass  # the drain is an optimisation; the connection is simply not reused
        finally:
            self._inner.close()


class _SSEDrainingTransport(httpx.HTTPTransport):
    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            response.stream = _DrainAfterDoneStream(response.stream)  # type: ignore[arg-type]
        return response


class _GuardedSSEDrainingTransport(_SSEDrainingTransport, GuardedTransport):
    """The same, behind the outbound guard: for provider URLs an organisation chose."""


_module: ModuleType | None = None
_loading = threading.Lock()
_tenant_client: httpx.Client | None = None
_tenant_handler: Any = None


def load() -> ModuleType:
    """litellm, imported and configured once (thread-safe: daphne runs requests in threads)."""
    global _module
    if _module is None:
        with _loading:
            if _module is None:
                import litellm as module

                module.telemetry = False
                module.suppress_debug_info = True
                module.disable_hf_tokenizer_download = True
                # No litellm callbacks are registered, so its logging only costs: for every streamed
                # chunk it hands a task to a thread that runs an event loop (~4 ms of CPU per streamed
                # call, bench/llm_calls.py), and it would keep prompt text in its logging objects.
                module.disable_streaming_logging = True
                module.turn_off_message_logging = True
                if module.client_session is None:
                    module.client_session = _new_http_client()
                os.register_at_fork(after_in_child=_fresh_clients_after_fork)
                _module = module
    return _module


def _new_http_client() -> httpx.Client:
    from litellm.llms.custom_httpx.http_handler import get_ssl_configuration

    # No cookie jar: every organisation's calls share this client (a provider's cookies would ride along).
    return httpx.Client(
        transport=_SSEDrainingTransport(verify=get_ssl_configuration()),
        follow_redirects=True,
        cookies=no_cookies(),
    )


def tenant_client() -> httpx.Client:
    """The HTTP client of calls to provider URLs an organisation chose (not the deployment's own):
    behind the outbound guard (apps.core.outbound: public addresses or OUTBOUND_ALLOW only, checked at
    connect time), no redirects, no cookies; streams drained like `client_session`'s."""
    global _tenant_client
    if _tenant_client is None:
        load()  # configured, and the fork hook registered, before a client exists
        from litellm.llms.custom_httpx.http_handler import get_ssl_configuration

        with _loading:
            if _tenant_client is None:
                _tenant_client = guarded_client(
                    transport=_GuardedSSEDrainingTransport(verify=get_ssl_configuration())
                )
    return _tenant_client


def tenant_litellm_handler() -> Any:
    """`tenant_client` as the `client=` of a litellm call (its HTTPHandler), so that litellm's own
    cached clients, which follow redirects and are unguarded, never carry a tenant's call."""
    global _tenant_handler
    if _tenant_handler is None:
        from litellm.llms.custom_httpx.http_handler import HTTPHandler

        _tenant_handler = HTTPHandler(client=tenant_client())
    return _tenant_handler


def _fresh_clients_after_fork() -> None:
    """A forked child (a Celery prefork worker) must not share its parent's sockets or pool locks:
    give it its own HTTP client and drop litellm's cached provider clients built on the old one."""
    global _tenant_client, _tenant_handler
    module = load()
    module.client_session = _new_http_client()
    _tenant_client = _tenant_handler = None
    cache = getattr(module, "in_memory_llm_clients_cache", None)
    if cache is not None and hasattr(cache, "flush_cache"):
        cache.flush_cache()


class _LazyLitellm:
    """Stands for the litellm module; the first attribute read imports it (see the module docstring)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(load(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(load(), name, value)


litellm: Any = _LazyLitellm()

__all__ = ["litellm", "load", "tenant_client", "tenant_litellm_handler"]
