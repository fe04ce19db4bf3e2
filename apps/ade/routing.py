"""WebSocket routes of the ADE (the run stream relay arrives with the workers issue)."""

websocket_urlpatterns: list = []
