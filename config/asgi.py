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


YOUNG_GENERATION_THRESHOLD = 10_000
"""Allocations between young collections (CPython's default: 700). A list page builds some 10,000
objects while it renders; at 700 two young collections walked them all each request."""


def _tune_the_garbage_collector() -> None:
    """Django, DRF, the views and the app registry live as long as the process: out of the garbage
    collector's walks with them (gc.freeze, after a collection so nothing dead is kept), as a worker does
    (config/celery.py). A full collection walked them all with every stream's event loop stopped. The
    URLconf is loaded first: it imports every view. Then the young generation's threshold (above)."""
    import gc

    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018  (loaded for its imports)
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, *gc.get_threshold()[1:])


_tune_the_garbage_collector()
