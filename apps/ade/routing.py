"""WebSocket routes of the ADE."""

from django.urls import re_path

from apps.ade.consumers import RunStreamConsumer

websocket_urlpatterns = [
    re_path(r"^ws/runs/(?P<run_id>[^/]+)/?$", RunStreamConsumer.as_asgi()),
]
