"""Explicit /v1 routes. Both `/x` and `/x/` are served: the SDK is exact and inconsistent about slashes."""

from django.urls import re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from apps.api import views

urlpatterns = [
    re_path(r"^v1/health/?$", views.HealthApi.as_view(), name="health"),
    re_path(r"^v1/blocks/?$", views.BlockListCreateApi.as_view(), name="blocks"),
    re_path(r"^v1/blocks/(?P<block_id>[^/]+)/?$", views.BlockDetailApi.as_view(), name="block-detail"),
    re_path(r"^openapi\.json$", SpectacularAPIView.as_view(), name="openapi-schema"),
    re_path(r"^docs/?$", SpectacularSwaggerView.as_view(url_name="openapi-schema"), name="swagger-ui"),
]
