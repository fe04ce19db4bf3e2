"""Django's ASGI handler, with the middleware chain and the view run as one synchronous call, and request
bodies bounded (MAX_REQUEST_BODY_BYTES) before anything else runs: authentication, parsing, the view."""

from __future__ import annotations

import io
import json
import logging
import tempfile
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async
from daphne import http_protocol
from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler
from django.db import connections
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from twisted.web import http as twisted_http

logger = logging.getLogger(__name__)

LINGER_SECONDS = 5.0
"""How long daphne keeps reading (and dropping) what a refused client still sends after its 413, so the
client reads the answer instead of a connection reset; then the connection is closed."""


class BodyTooLarge(Exception):
    """A request body crossed MAX_REQUEST_BODY_BYTES while it was read."""


def too_large_body(limit: int) -> bytes:
    """The 413's JSON body, in the API's shape."""
    message = f"Request body too large: the limit is {limit:,} bytes (MAX_REQUEST_BODY_BYTES)"
    return json.dumps({"detail": message, "code": "request_body_too_large"}).encode()


def declared_length(scope: dict[str, Any]) -> int | None:
    """The request's Content-Length, when it has a valid one (ASGI header names are lowercase)."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class RequestThread(ThreadPoolExecutor):
    """One thread for a request's synchronous parts (what asgiref's ThreadSensitiveContext needs: one call at
    a time, in order), kept after the request for the next one."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="request")
        self.last: Future[Any] | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.last = super().submit(fn, *args, **kwargs)
        return self.last

    @property
    def idle(self) -> bool:
        """Nothing runs or waits in it (one worker, first in first out: the last call done, all are)."""
        return self.last is None or self.last.done()


class RequestThreads:
    """Idle RequestThreads, lent to requests. Django's ASGIHandler gives every request a context of its own
    whose thread asgiref starts for it and, when the request ends, joins from yet another new thread: 0.65
    ms of daphne's CPU a request, 1.4 ms a blocking send (bench/web_requests.py, bench/RESULTS.md).
    Borrowed and given back on the event loop's thread. A thread still busy when its request ends (a
    client that left while its view ran) is not kept, nor one past `keep` idle threads: it ends when its
    work does."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.idle: list[RequestThread] = []

    def borrow(self) -> RequestThread:
        return self.idle.pop() if self.idle else RequestThread()

    def give_back(self, thread: Executor | None) -> None:
        if isinstance(thread, RequestThread) and thread.idle and len(self.idle) < self.keep:
            self.idle.append(thread)
        elif thread is not None:  # busy, surplus, or one asgiref made after the request's own was released
            thread.shutdown(wait=False)


REQUEST_THREADS = RequestThreads(keep=64)


class SyncChainASGIHandler(ASGIHandler):
    """Every view and middleware here is synchronous, yet Django's ASGI handler builds an asynchronous chain
    around them: the request goes from the event loop to its thread for the middleware, back to the loop
    for URL resolution, to the thread again for the view, and the same way back, each hand-off a wake-up
    of daphne's one thread. Here the synchronous chain (Django's WSGI path) runs with one hop into the
    request's thread and one back: /v1/health/ 4.0-5.3 -> 2.9-3.2 ms at the client. Streaming responses
    are still sent by the event loop.
    """

    def __init__(self) -> None:
        super().__init__()
        self.load_middleware(is_async=False)
        limit_daphne_request_bodies()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's, with the request's thread borrowed from REQUEST_THREADS and given back at its end."""
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        context = ThreadSensitiveContext(executor=REQUEST_THREADS.borrow())
        ending: Any = None  # the thread the request ends with: its own, a lent one, or one of asgiref's
        try:
            async with context:
                try:
                    await self.handle(scope, receive, send)
                finally:
                    ending = SyncToAsync.context_to_thread_executor.get(context)
        finally:
            REQUEST_THREADS.give_back(ending)

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """413 for a body past MAX_REQUEST_BODY_BYTES: by its Content-Length before any of it is read, else
        as soon as the bytes received cross the limit (chunked bodies), with nothing kept."""
        limit = settings.MAX_REQUEST_BODY_BYTES
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            await self.refuse_body(send, limit)
            return
        try:
            await super().handle(scope, receive, send)
        except BodyTooLarge:  # raised by read_body, before anything was sent
            await self.refuse_body(send, limit)

    async def read_body(self, receive: Any) -> Any:
        """Django's (a temporary file that moves to disk past FILE_UPLOAD_MAX_MEMORY_SIZE), refusing a body
        past MAX_REQUEST_BODY_BYTES before writing the chunk that crosses it."""
        limit = settings.MAX_REQUEST_BODY_BYTES
        # Closed here on every way out but the normal one, where the request owns it (as in Django).
        body_file = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b")  # noqa: SIM115
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                body_file.close()
                raise RequestAborted()
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > limit:
                body_file.close()
                raise BodyTooLarge()
            body_file.write(chunk)
            if not message.get("more_body", False):
                break
        body_file.seek(0)
        return body_file

    @staticmethod
    async def refuse_body(send: Any, limit: int) -> None:
        body = too_large_body(limit)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),  # the rest of the body is never read
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        # The request's own thread (ASGIHandler gives each request a ThreadSensitiveContext), where its
        # database connection lives; the response is closed there too.
        # Views may answer with an AwaitedResponse (see awaits_answers).
        request.awaits_answers = True  # type: ignore[attr-defined]
        response: Any = await sync_to_async(self._respond_in_thread, thread_sensitive=True)(request)
        if isinstance(response, AwaitedResponse):
            release_request_thread()
            answer = await response.resolve()
            lend_request_thread()  # for closing the response, the request's last synchronous call
            return answer
        if response.streaming and response.is_async:
            release_request_thread()
        return response

    def _respond_in_thread(self, request: HttpRequest) -> HttpResponseBase:
        response: Any = self.get_response(request)
        if isinstance(response, AwaitedResponse) or (response.streaming and response.is_async):
            # The answer is awaited, or the body sent, by the event loop (a stream may last an hour, a
            # blocking send ten minutes): the request's thread goes now, and its database connections with
            # it (back to the pool).
            connections.close_all()
        return response


class AwaitedResponse(HttpResponse):
    """A view's answer that comes later, awaited on the event loop rather than in the request's thread
    (a blocking send waiting for its run): SyncChainASGIHandler lets the thread go, awaits `answer()` and
    sends the response it returns, with the headers the middleware gave this stand-in. Return one only
    when awaits_answers(request)."""

    def __init__(self, answer: Callable[[], Awaitable[HttpResponseBase]]) -> None:
        super().__init__()
        self.answer = answer

    async def resolve(self) -> HttpResponseBase:
        response = await self.answer()
        for header, value in self.items():
            if header.lower() not in ("content-type", "content-length") and not response.has_header(header):
                response[header] = value
        for name, cookie in self.cookies.items():
            response.cookies.setdefault(name, cookie)
        if isinstance(response, HttpResponse) and not response.has_header("Content-Length"):
            response["Content-Length"] = str(len(response.content))  # as CommonMiddleware would
        return response


def awaits_answers(request: Any) -> bool:
    """Whether the request (Django's or DRF's) is served by SyncChainASGIHandler, which awaits an
    AwaitedResponse; Django's test client and WSGI do not."""
    return bool(getattr(request, "awaits_answers", False))


def release_request_thread() -> None:
    """Give the current request's thread (its ThreadSensitiveContext's executor) back now rather than when
    the response is done: an asynchronous streaming body needs no thread, and 2,000 open streams would
    otherwise hold 2,000 idle threads. A later thread-sensitive call of the request (closing the response)
    gets a thread of asgiref's for its moment, unless lend_request_thread gave it one of the kept ones."""
    context = SyncToAsync.thread_sensitive_context.get(None)
    executor = SyncToAsync.context_to_thread_executor.pop(context, None) if context is not None else None
    if executor is not None:
        REQUEST_THREADS.give_back(executor)


def lend_request_thread() -> None:
    """A kept thread for the current request's next thread-sensitive calls, after release_request_thread:
    when the wait is over and the response is about to be sent and closed."""
    context = SyncToAsync.thread_sensitive_context.get(None)
    if context is not None and context not in SyncToAsync.context_to_thread_executor:
        SyncToAsync.context_to_thread_executor[context] = REQUEST_THREADS.borrow()


class BoundedWebRequest(http_protocol.WebRequest):
    """daphne's request, refusing a body past MAX_REQUEST_BODY_BYTES as it arrives. Twisted receives the
    whole body (on disk past 100 KB) before daphne calls the application, so without this a 1 GB upload
    would be stored before SyncChainASGIHandler saw its first byte. A Content-Length past the limit is
    answered 413 before any of the body is read; a chunked body when it crosses the limit. What the client
    still sends is dropped for LINGER_SECONDS (so that it reads the answer), then the connection closes."""

    _refused = False
    _received = 0
    _linger: Any = None

    def gotLength(self, length: int | None) -> None:
        limit = settings.MAX_REQUEST_BODY_BYTES
        if length is not None and length > limit:
            self._refuse(limit)
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        limit = settings.MAX_REQUEST_BODY_BYTES
        if self._received > limit:
            self.content.close()  # what was kept so far (an unlinked temporary file) goes now
            self._refuse(limit)
            return
        super().handleContentChunk(data)

    def process(self) -> Any:
        if self._refused:  # the rest arrived after all: it was answered already
            return None
        return super().process()

    def connectionLost(self, reason: Any) -> None:
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        super().connectionLost(reason)

    def _refuse(self, limit: int) -> None:
        self._refused = True
        self.content = io.BytesIO()  # for Twisted, should the rest of the body arrive; nothing is kept
        self.requestHeaders.removeHeader(b"expect")  # no "100 Continue" after the answer
        channel = self.channel
        logger.warning("Refused a request body over %d bytes from %s", limit, channel.transport.getPeer())
        if not isinstance(channel, twisted_http.HTTPChannel):  # an HTTP/2 stream: just close it
            channel.loseConnection()
            return
        body = too_large_body(limit)
        channel.transport.write(
            b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
        channel.persistent = False
        half_close = getattr(channel.transport, "loseWriteConnection", None)  # TCP; TLS has none
        if half_close is None:
            channel.loseConnection()
            return
        half_close()  # the answer, then FIN; reading (and dropping) goes on
        self._linger = channel.callLater(LINGER_SECONDS, channel.loseConnection)


def limit_daphne_request_bodies() -> None:
    """Have daphne's HTTP/1 connections make BoundedWebRequests (its factory looks the class up in its module
    for every connection). Idempotent; changes nothing for other ASGI servers, where the handler's own
    check comes before the body is read."""
    if not issubclass(http_protocol.WebRequest, BoundedWebRequest):
        http_protocol.WebRequest = BoundedWebRequest
