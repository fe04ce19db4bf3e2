"""ASGI entry point: HTTP goes to Django, WebSockets to the ADE's Channels consumers."""

import os

import django
from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

from apps.ade.routing import websocket_urlpatterns  # noqa: E402  (needs the app registry loaded)
from apps.core.asgi import SyncChainASGIHandler  # noqa: E402
from apps.observability.tracing import configure  # noqa: E402

configure("letta-web")  # before the handler loads its middleware (the Django instrumentation adds one)

application = ProtocolTypeRouter(
    {
        "http": SyncChainASGIHandler(),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
