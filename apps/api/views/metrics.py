"""GET /metrics: the platform's Prometheus metrics (apps.observability.metrics), for the operator.

Off (404) unless METRICS_TOKEN is set; then only `Authorization: Bearer <METRICS_TOKEN>` reads it (401
otherwise). Not part of Letta's API: no organisation's data, only platform-wide counts.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from django.urls import re_path
from django.views.decorators.http import require_GET
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from apps.observability import selectors as observability_selectors


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    token = settings.METRICS_TOKEN
    if not token:
        return HttpResponseNotFound("Not Found", content_type="text/plain")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        response = HttpResponse("A valid METRICS_TOKEN bearer token is required.", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        response["Content-Type"] = "text/plain"
        return response
    return HttpResponse(observability_selectors.metrics_text(), content_type=CONTENT_TYPE_LATEST)


urlpatterns = [re_path(r"^metrics/?$", metrics_view, name="metrics")]
