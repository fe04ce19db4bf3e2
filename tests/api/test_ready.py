"""/v1/health (Letta's), /v1/live (liveness) and /v1/ready (readiness): no key, cheap, nothing leaked."""

from __future__ import annotations

import socket
import threading
import time

import psycopg
import pytest
from django.db import connection
from django.db.utils import OperationalError
from rest_framework.test import APIClient

from apps.core import draining
from tests.support import workers

ALL_READY = {"server": "ok", "postgres": "ok", "redis": "ok", "migrations": "ok"}


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def shutting_down(monkeypatch):
    """This process as config/serve.py leaves it once it has begun draining."""
    event = threading.Event()
    event.set()
    monkeypatch.setattr(draining, "_draining", event)


def test_health_reports_the_letta_api_version_and_ours(db):
    response = APIClient().get("/v1/health/")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "version": "0.16.7", "server_version": "0.1.0"}


def test_live_touches_no_database_and_stays_200_while_shutting_down(shutting_down, settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{unused_port()}/0"  # nothing listens there: not asked

    response = APIClient().get("/v1/live")  # no `db` fixture: a query would fail the test

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "version": "0.16.7", "server_version": "0.1.0"}


def test_ready_is_200_when_everything_answers(db):
    response = APIClient().get("/v1/ready/")

    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "version": "0.16.7",
        "server_version": "0.1.0",
        "checks": ALL_READY,
    }


def test_ready_is_503_naming_redis_and_nothing_of_its_url(db, settings):
    port = unused_port()
    settings.REDIS_URL = f"redis://:s3cret-password@127.0.0.1:{port}/0"

    response = APIClient().get("/v1/ready")

    assert response.status_code == 503
    assert response.json()["checks"] == {**ALL_READY, "redis": "unavailable"}
    assert response.json()["detail"] == "Not ready: Redis did not answer"
    for secret in ("s3cret", "127.0.0.1", str(port)):
        assert secret not in response.content.decode()


def test_ready_is_503_naming_postgres_when_it_does_not_answer(db, monkeypatch):
    def refuse() -> None:
        raise OperationalError("connection to server at 10.1.2.3 failed: password authentication failed")

    with monkeypatch.context() as patched:
        patched.setattr(connection, "ensure_connection", refuse)

        response = APIClient().get("/v1/ready")

    assert response.status_code == 503
    assert response.json()["checks"] == {**ALL_READY, "postgres": "unavailable", "migrations": "unknown"}
    assert response.json()["detail"] == "Not ready: PostgreSQL did not answer"
    assert "10.1.2.3" not in response.content.decode()


def test_ready_gives_up_on_a_postgres_that_hangs_within_its_bound(db):
    holder = psycopg.connect(workers.test_database_url())
    holder.execute("LOCK TABLE django_migrations IN ACCESS EXCLUSIVE MODE")  # every reader now waits
    try:
        started = time.monotonic()
        response = APIClient().get("/v1/ready")
        took = time.monotonic() - started
    finally:
        holder.close()

    assert response.status_code == 503
    assert response.json()["checks"]["postgres"] == "unavailable"
    assert 1.5 < took < 4  # READY_CHECK_TIMEOUT_S, then the answer


def test_ready_is_503_while_a_migration_is_not_applied(db):
    with connection.cursor() as cursor:  # as after deploying code whose migration has not run yet
        cursor.execute("DELETE FROM django_migrations WHERE app = 'agents' AND name = '0011_step_logprobs'")

    response = APIClient().get("/v1/ready")

    assert response.status_code == 503
    assert response.json()["checks"] == {**ALL_READY, "migrations": "pending"}
    assert response.json()["detail"] == "Not ready: 1 migration(s) not applied (run `manage.py migrate`)"


def test_ready_is_503_once_the_process_shuts_down(db, shutting_down):
    response = APIClient().get("/v1/ready")

    assert response.status_code == 503
    assert response.json()["checks"] == {**ALL_READY, "server": "shutting_down"}
    assert response.json()["detail"] == "Not ready: this process is shutting down"


@pytest.mark.parametrize("path", ["/v1/health", "/v1/live", "/v1/ready"])
def test_probes_ignore_a_wrong_key(db, path):
    response = APIClient().get(path, HTTP_AUTHORIZATION="Bearer sk-let-not-a-key")

    assert response.status_code == 200
