"""Middleware of the platform's own."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse


class SyncChainMiddleware:
    """The innermost middleware, synchronous only: under ASGI the whole chain then runs in the request's
    thread.

    Django runs each middleware in the mode of the handler below it. WhiteNoise is synchronous only, so
    the seven middlewares below it ran in async mode, where every process_request/process_response is
    handed to the request's thread with sync_to_async: ~14 event-loop <-> thread hops per request, each
    a wake-up of the loop (daphne's one thread). Below them all, this leaves one hop into the thread and
    one back out for the view.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)
