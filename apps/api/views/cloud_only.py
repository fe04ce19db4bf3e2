"""What /v1 answers outside its routes, in Letta's JSON shape instead of Django's HTML pages: Letta
Cloud's own features (templates, agent schedules, environments, client-side access tokens) are a JSON 501
saying so, and any other path is FastAPI's `{"detail": "Not Found"}` 404. Neither needs a key (there is
nothing to protect, and FastAPI routes before it authenticates).

These patterns go last in the /v1 URLconf: the fallback matches every path under /v1.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import re_path
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from apps.api.errors import NOT_FOUND


class CloudOnlyView(View):
    """Every method of a Letta Cloud feature's paths: 501, never retried (the SDK retries 5xx)."""

    cloud_only = True  # scripts/compat_table.py reports these as "Letta Cloud only"
    feature = ""
    prefix = ""

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
        response = JsonResponse(
            {
                "detail": f"{self.feature} are Letta Cloud only: this self-hosted server does not implement "
                f"{self.prefix}.",
                "code": "letta_cloud_only",
            },
            status=501,
        )
        response["x-should-retry"] = "false"
        return response


def _cloud(pattern: str, feature: str, prefix: str, name: str) -> Any:
    view = csrf_exempt(CloudOnlyView.as_view(feature=feature, prefix=prefix))
    return re_path(pattern, view, name=name)


@csrf_exempt
def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    return JsonResponse({"detail": NOT_FOUND}, status=404)


# Letta Cloud's route prefixes (fern/openapi.json of letta 0.16.7), with or without a trailing slash.
urlpatterns = [
    _cloud(r"^v1/templates(?:/.*)?$", "Templates", "/v1/templates", "cloud-templates"),
    _cloud(r"^v1/legacy-templates(?:/.*)?$", "Templates", "/v1/legacy-templates", "cloud-legacy-templates"),
    _cloud(
        r"^v1/agents/[^/]+/schedule(?:/.*)?$",
        "Scheduled messages",
        "/v1/agents/{agent_id}/schedule",
        "cloud-agent-schedule",
    ),
    _cloud(r"^v1/environments(?:/.*)?$", "Environments", "/v1/environments", "cloud-environments"),
    _cloud(
        r"^v1/client-side-access-tokens(?:/.*)?$",
        "Client-side access tokens",
        "/v1/client-side-access-tokens",
        "cloud-client-side-access-tokens",
    ),
]

fallback_patterns = [re_path(r"^v1(?:/.*)?$", not_found, name="v1-not-found")]
"""After every other /v1 pattern: any path left is a JSON 404."""
