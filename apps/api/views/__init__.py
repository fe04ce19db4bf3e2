"""/v1 views, one module per Letta resource; each module declares its own `urlpatterns`."""
