"""The one place litellm is imported and configured.

Offline: litellm fetches its model cost map from GitHub at import time and may download HuggingFace
tokenizers for some model names, unless told not to. Every module of this app imports litellm from
here, so the only network traffic is the call to the provider URL a caller chose. The environment
defaults are set before the import because the cost map is loaded during it; an operator may still
override them.

Connection reuse: litellm caches one OpenAI SDK client per (key, base URL, timeout, max_retries) and
gives it `litellm.client_session` as its httpx client when one is set. We set one, whose transport
finishes reading a server-sent-event stream after its `[DONE]` line: the OpenAI SDK's synchronous
stream stops reading right there and closes the response, and an HTTP/1.1 response closed before its
end costs its connection, so without this every streamed step would open a new (TLS) connection.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

import httpx
import litellm
from litellm.llms.custom_httpx.http_handler import get_ssl_configuration

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


litellm.telemetry = False
litellm.suppress_debug_info = True
litellm.disable_hf_tokenizer_download = True


def _new_http_client() -> httpx.Client:
    return httpx.Client(
        transport=_SSEDrainingTransport(verify=get_ssl_configuration()), follow_redirects=True
    )


def _fresh_clients_after_fork() -> None:
    """A forked child (a Celery prefork worker) must not share its parent's sockets or pool locks:
    give it its own HTTP client and drop litellm's cached provider clients built on the old one."""
    litellm.client_session = _new_http_client()
    cache = getattr(litellm, "in_memory_llm_clients_cache", None)
    if cache is not None and hasattr(cache, "flush_cache"):
        cache.flush_cache()


if litellm.client_session is None:
    litellm.client_session = _new_http_client()
os.register_at_fork(after_in_child=_fresh_clients_after_fork)

__all__ = ["litellm"]
