from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("apps.api.urls")),
    path("", include("apps.ade.urls")),  # after the API: the ADE owns what /v1, /docs and /admin do not
]
