"""Explicit /v1 routes. Both `/x` and `/x/` are served: the SDK is exact and inconsistent about slashes.

Each resource module owns its patterns; order matters where a static segment competes with an id
(letta_api.md section 10), so modules list their static paths first.
"""

from django.urls import re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from apps.api.views import (
    agent_file,
    agent_ops,
    agents,
    archival,
    archives,
    blocks,
    chat,
    cloud_only,
    conversations,
    datasets,
    folders,
    git_http,
    groups,
    health,
    identities,
    llm_calls,
    mcp,
    message_search,
    messages,
    metrics,
    models,
    providers,
    runs,
    sandbox_config,
    steps,
    tools,
)

urlpatterns = [
    *agent_file.urlpatterns,  # first: /v1/agents/import before any /v1/agents/{agent_id}
    *groups.urlpatterns,  # /v1/groups and /v1/agents/{agent_id}/groups
    *tools.urlpatterns,
    *mcp.urlpatterns,
    *archival.urlpatterns,
    *health.urlpatterns,
    *blocks.urlpatterns,
    *folders.urlpatterns,  # before agents: /v1/agents/{agent_id}/folders|sources|files...
    *agents.urlpatterns,
    *models.urlpatterns,
    *message_search.urlpatterns,
    *messages.urlpatterns,
    *agent_ops.urlpatterns,
    *runs.urlpatterns,
    *metrics.urlpatterns,  # /metrics (Prometheus), off unless METRICS_TOKEN is set
    *steps.urlpatterns,
    *llm_calls.urlpatterns,
    *datasets.urlpatterns,
    *conversations.urlpatterns,
    *archives.urlpatterns,
    *identities.urlpatterns,
    *chat.urlpatterns,
    *providers.urlpatterns,
    *sandbox_config.urlpatterns,
    *git_http.urlpatterns,  # git smart HTTP for agent memory (not in the schema, as in Letta)
    re_path(r"^openapi\.json$", SpectacularAPIView.as_view(), name="openapi-schema"),
    re_path(r"^docs/?$", SpectacularSwaggerView.as_view(url_name="openapi-schema"), name="swagger-ui"),
]

# Last, after every module above: Letta Cloud's paths answer a JSON 501 and any other /v1 path a JSON 404
# (FastAPI's {"detail": "Not Found"}), never Django's HTML page.
urlpatterns += [*cloud_only.urlpatterns, *cloud_only.fallback_patterns]
