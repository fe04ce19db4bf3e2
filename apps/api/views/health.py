"""/v1/health, /v1/live and /v1/ready: what load balancers and orchestrators ask a web process.

All three need no key, are not throttled and say nothing of hosts, URLs or error texts (the server log has
those). /v1/health is Letta's (clients read its version); /v1/live is liveness, 200 while the process
answers, also while it shuts down (an orchestrator that restarted it then would cut its streams short);
/v1/ready is readiness: 200 only when PostgreSQL and Redis answer, every migration is applied and the
process is not shutting down (config/serve.py), else 503 naming what is not ready.
"""

from __future__ import annotations

import functools
import logging

import redis
from django.conf import settings
from django.db import connection, transaction
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.db.utils import Error as DatabaseError
from django.urls import re_path
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api.serializers import blocks as block_s
from apps.core import draining

logger = logging.getLogger(__name__)

LETTA_API_VERSION = "0.16.7"
"""The Letta server version whose /v1 API this one reproduces: /v1/health answers it as `version`, which
clients compare to decide what the server supports."""
VERSION = "0.1.0"
"""This server's own version (`server_version` in /v1/health)."""
READY_CHECK_TIMEOUT_S = 2.0
"""The longest each dependency may take to answer a readiness check (probes time out after a few seconds)."""


def _health(state: str) -> dict[str, str]:
    return {"status": state, "version": LETTA_API_VERSION, "server_version": VERSION}


class HealthApi(APIView):
    """Letta's health check: 200 while the process answers (dependencies are /v1/ready's business)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes: list = []

    @extend_schema(operation_id="check_health", responses=block_s.HealthOut)
    def get(self, request: Request) -> Response:
        return Response(_health("ok"))


class LiveApi(HealthApi):
    """Liveness: the process is up. Touches nothing, and stays 200 while the process shuts down."""

    @extend_schema(operation_id="check_liveness", responses=block_s.HealthOut)
    def get(self, request: Request) -> Response:
        return Response(_health("ok"))


@functools.cache
def expected_migrations() -> frozenset[tuple[str, str]]:
    """Every migration this code has (read from disk once per process; squashed ones as `migrate` records
    them)."""
    return frozenset(MigrationLoader(None, ignore_no_migrations=True).graph.nodes)


def _unapplied_migrations() -> int | None:
    """How many of this code's migrations the database lacks; None when PostgreSQL does not answer in time.
    One query, in a transaction whose statement timeout is READY_CHECK_TIMEOUT_S (SET LOCAL: a pooled
    connection keeps no trace of it)."""
    table = MigrationRecorder.Migration._meta.db_table
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, true)", [str(int(READY_CHECK_TIMEOUT_S * 1000))]
            )
            cursor.execute(f"SELECT app, name FROM {table}")
            applied = set(cursor.fetchall())
    except DatabaseError:
        logger.warning("api.ready.postgres_unavailable", exc_info=True)
        return None
    return len(expected_migrations() - applied)


def _redis_answers() -> bool:
    """A fresh client with short timeouts: the process's shared one would wait for a hung server."""
    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=READY_CHECK_TIMEOUT_S, socket_connect_timeout=READY_CHECK_TIMEOUT_S
    )
    try:
        client.ping()
    except redis.RedisError:
        logger.warning("api.ready.redis_unavailable", exc_info=True)
        return False
    finally:
        client.close()
    return True


def readiness() -> tuple[dict[str, str], list[str]]:
    """Each check's state, and what is not ready in words (empty when all is)."""
    unapplied = _unapplied_migrations()
    redis_ok = _redis_answers()
    checks = {
        "server": "shutting_down" if draining.is_draining() else "ok",
        "postgres": "unavailable" if unapplied is None else "ok",
        "redis": "ok" if redis_ok else "unavailable",
        "migrations": "unknown" if unapplied is None else ("pending" if unapplied else "ok"),
    }
    problems = []
    silent = [name for name, ok in (("PostgreSQL", unapplied is not None), ("Redis", redis_ok)) if not ok]
    if silent:
        problems.append(f"{' and '.join(silent)} did not answer")
    if unapplied:
        problems.append(f"{unapplied} migration(s) not applied (run `manage.py migrate`)")
    if draining.is_draining():
        problems.append("this process is shutting down")
    return checks, problems


class ReadyApi(APIView):
    """Readiness: 200 when this process can serve, else 503 naming what is not ready (no error text: the path
    needs no key, and errors may name internal hosts)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes: list = []

    @extend_schema(operation_id="check_readiness", responses={200: block_s.ReadyOut, 503: block_s.ReadyOut})
    def get(self, request: Request) -> Response:
        checks, problems = readiness()
        if not problems:
            return Response({**_health("ok"), "checks": checks})
        body = {**_health("unavailable"), "checks": checks, "detail": f"Not ready: {'; '.join(problems)}"}
        return Response(body, status=status.HTTP_503_SERVICE_UNAVAILABLE)


urlpatterns = [
    re_path(r"^v1/health/?$", HealthApi.as_view(), name="health"),
    re_path(r"^v1/live/?$", LiveApi.as_view(), name="live"),
    re_path(r"^v1/ready/?$", ReadyApi.as_view(), name="ready"),
]
