import os

import django
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

from apps.observability.tracing import configure  # noqa: E402  (needs the app registry loaded)

configure("letta-web")  # before the handler loads its middleware (the Django instrumentation adds one)
application = get_wsgi_application()
