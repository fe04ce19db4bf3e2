"""The base view every /v1 view inherits: authenticated, with the Actor resolved once."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api.throttles import FixedWindowRateThrottle, refused_by
from apps.core.actor import Actor
from apps.core.errors import InvalidInput

NUL = "\x00"


def _contains_nul(value: Any) -> bool:
    if isinstance(value, str):
        return NUL in value
    if isinstance(value, dict):
        return any(_contains_nul(k) or _contains_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_contains_nul(v) for v in value)
    return False


def _forget_the_response(response: Any) -> None:  # a rendered rest_framework Response
    """Once rendered, a response is its bytes. What named it in cycles is dropped (its renderer context
    names the response itself, and the view keeps it as `view.response`), so it and its data (a list
    page's 330 KB of dicts) are freed when it is sent, not at the garbage collector's next pass, which
    walked them all (bench/scale_bench.py)."""
    view = (response.renderer_context or {}).get("view")
    if view is not None and getattr(view, "response", None) is response:
        view.response = None
    response.renderer_context = None


class OrgApiView(APIView):
    actor: Actor

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)
        if isinstance(response, Response):
            response.add_post_render_callback(_forget_the_response)
        return response

    def check_throttles(self, request: Request) -> None:
        """DRF's, with every fixed-window rate counted in one Redis round trip instead of one each."""
        throttles = self.get_throttles()
        windowed = [t for t in throttles if isinstance(t, FixedWindowRateThrottle)]
        refused = refused_by(windowed, request, self)
        refused += [t for t in throttles if t not in windowed and not t.allow_request(request, self)]
        if refused:
            waits = [wait for t in refused if (wait := t.wait()) is not None]
            self.throttled(request, max(waits, default=1.0))

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        self.actor = request.auth  # set by our authentication classes; IsAuthenticated ran already
        self._refuse_nul(request)

    @staticmethod
    def _refuse_nul(request: Request) -> None:
        """PostgreSQL cannot store NUL in text or JSON: refuse it here, once, as bad input (not a 500)."""
        params = {key: request.query_params.getlist(key) for key in request.query_params}
        data = request.data
        body = {key: data.getlist(key) for key in data} if hasattr(data, "getlist") else data
        if (
            _contains_nul(params)
            or _contains_nul(body)
            or _contains_nul(list(request.parser_context["kwargs"].values()))
        ):
            raise InvalidInput("Text may not contain the NUL character (\\u0000)")
