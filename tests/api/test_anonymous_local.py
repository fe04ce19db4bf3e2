"""Single-user local mode (ALLOW_ANONYMOUS_LOCAL): /v1 without a key acts as the bootstrap admin, only for
requests from this machine, and the platform refuses to start with it on a non-loopback HOST."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.db import connections
from letta_client import Letta
from rest_framework.test import APIClient

from apps.accounts.models import Membership, User
from apps.core.actor import Actor, Role
from apps.memory.models import Block
from scripts import devenv
from tests.factories import BlockFactory
from tests.support.ade_server import AdeServer
from tests.support.workers import worker_env

ROOT = Path(__file__).resolve().parent.parent.parent


def local_client() -> APIClient:
    """A client on this machine, as `curl http://localhost:8283/v1/...` is (Django's test host is "testserver")."""
    return APIClient(HTTP_HOST="localhost:8283")


@pytest.fixture
def local_mode(settings, user):
    """The mode on, with the fixture's owner (alice) as the bootstrap admin."""
    settings.ALLOW_ANONYMOUS_LOCAL = True
    settings.ANONYMOUS_LOCAL_USERNAME = user.username
    return user


def test_off_by_default_a_request_without_a_key_is_401(settings, org):
    assert settings.ALLOW_ANONYMOUS_LOCAL is False
    BlockFactory(organization=org)

    response = local_client().get("/v1/blocks/")

    assert response.status_code == 401


def test_a_local_request_without_a_key_acts_as_the_bootstrap_admin(local_mode, org, other_org):
    mine = BlockFactory(organization=org)
    BlockFactory(organization=other_org)
    client = local_client()

    listed = client.get("/v1/blocks/")
    created = client.post("/v1/blocks/", {"label": "notes", "value": "from the laptop"}, format="json")

    assert [b["id"] for b in listed.json()] == [mine.id]
    assert created.status_code == 200
    assert Block.objects.for_org(org.id).get(label="notes").created_by_id == local_mode.id


@pytest.mark.parametrize(
    "extra",
    [
        {"REMOTE_ADDR": "10.1.2.3"},
        {"REMOTE_ADDR": "192.168.1.20"},
        {"HTTP_X_FORWARDED_FOR": "203.0.113.9"},
        {"HTTP_FORWARDED": "for=203.0.113.9"},
        {"HTTP_X_REAL_IP": "203.0.113.9"},
        {"HTTP_ORIGIN": "https://evil.example"},
        {"HTTP_SEC_FETCH_SITE": "cross-site"},
        {"HTTP_HOST": "rebound.example"},
    ],
    ids=["remote", "lan", "x-forwarded-for", "forwarded", "x-real-ip", "origin", "sec-fetch-site", "host"],
)
def test_a_request_that_is_not_from_this_machine_is_401_and_changes_nothing(local_mode, org, settings, extra):
    settings.ALLOWED_HOSTS = ["*"]  # even when every host name is served

    response = local_client().post("/v1/blocks/", {"label": "notes", "value": "x"}, format="json", **extra)

    assert response.status_code == 401
    assert not Block.objects.for_org(org.id).filter(label="notes").exists()


@pytest.mark.parametrize("address", ["127.0.0.1", "127.8.9.10", "::1"])
def test_every_loopback_address_counts(local_mode, address):
    response = local_client().get("/v1/blocks/", REMOTE_ADDR=address)

    assert response.status_code == 200


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1:8283", "[::1]:8283"])
def test_every_loopback_host_name_counts(local_mode, host):
    response = local_client().get("/v1/blocks/", HTTP_HOST=host)

    assert response.status_code == 200


def test_a_wrong_key_is_still_401(local_mode):
    client = local_client()
    client.credentials(HTTP_AUTHORIZATION="Bearer sk-let-wrong-key")

    assert client.get("/v1/blocks/").status_code == 401


def test_a_key_or_a_session_still_decides_who_acts(local_mode, org, make_user, api_client_for):
    member = make_user(org, role=Role.MEMBER)
    with_key = api_client_for(Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER))
    with_session = local_client()
    with_session.force_login(member)

    by_key = with_key.post(
        "/v1/providers/", {"name": "x", "provider_type": "anthropic", "api_key": "k" * 20}, format="json"
    )
    by_session = with_session.post(
        "/v1/providers/", {"name": "x", "provider_type": "anthropic", "api_key": "k" * 20}, format="json"
    )

    assert (by_key.status_code, by_session.status_code) == (403, 403)


def test_the_admin_acts_with_the_role_they_have_now(local_mode, org):
    Membership.objects.filter(user=local_mode, organization=org).update(role=Role.MEMBER)

    response = local_client().post(
        "/v1/providers/", {"name": "x", "provider_type": "anthropic", "api_key": "k" * 20}, format="json"
    )

    assert response.status_code == 403
    assert response.json()["detail"].startswith("Not allowed")


@pytest.mark.parametrize("change", ["missing", "inactive"])
def test_without_an_active_bootstrap_admin_it_is_401(local_mode, settings, change):
    if change == "missing":
        settings.ANONYMOUS_LOCAL_USERNAME = "nobody-of-that-name"
    else:
        User.objects.filter(id=local_mode.id).update(is_active=False)

    assert local_client().get("/v1/blocks/").status_code == 401


# --- the SDK, as a local user runs it ---------------------------------------------------------------------


@pytest.fixture
def _no_persistent_connections_in_server_threads() -> Iterator[None]:
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_no_persistent_connections_in_server_threads")
@pytest.mark.parametrize("enabled", [True, False])
def test_the_letta_sdk_without_a_key(live_server, settings, user, org, monkeypatch, enabled):
    monkeypatch.delenv("LETTA_API_KEY", raising=False)
    settings.ALLOW_ANONYMOUS_LOCAL = enabled
    settings.ANONYMOUS_LOCAL_USERNAME = user.username
    block = BlockFactory(organization=org)
    sdk = Letta(base_url=live_server.url, max_retries=0, timeout=20)

    if enabled:
        assert [b.id for b in sdk.blocks.list()] == [block.id]
    else:
        with pytest.raises(Exception, match="401"):
            sdk.blocks.list()


@pytest.fixture
def daphne_in_local_mode(django_db_setup, user, tmp_path) -> Iterator[AdeServer]:
    env = worker_env(
        "http://127.0.0.1:9/v1",
        ALLOW_ANONYMOUS_LOCAL="true",
        DJANGO_SUPERUSER_USERNAME=user.username,
        HOST="127.0.0.1",
    )
    server = AdeServer(env, tmp_path).wait_ready()
    yield server
    server.stop()


@pytest.mark.django_db(transaction=True)
def test_daphne_serves_a_keyless_local_request_and_refuses_a_proxied_one(daphne_in_local_mode, org):
    block = BlockFactory(organization=org)
    url = f"{daphne_in_local_mode.url}/v1/blocks/"

    local = httpx.get(url, timeout=10)
    proxied = httpx.get(url, headers={"X-Forwarded-For": "203.0.113.9"}, timeout=10)

    assert [b["id"] for b in local.json()] == [block.id]
    assert proxied.status_code == 401


# --- start-up: the settings and `make run` -------------------------------------------------------------------


def settings_load(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in {"ALLOW_ANONYMOUS_LOCAL", "HOST"}}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; print(settings.ALLOW_ANONYMOUS_LOCAL)",
        ],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "example.com", "::"])
def test_no_process_starts_with_the_mode_on_a_host_that_is_not_loopback(host):
    result = settings_load(ALLOW_ANONYMOUS_LOCAL="true", HOST=host)

    assert result.returncode != 0
    assert "ALLOW_ANONYMOUS_LOCAL=true lets anyone who reaches the server act as its owner" in result.stderr


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost"])
def test_the_mode_loads_on_a_loopback_host(host):
    result = settings_load(ALLOW_ANONYMOUS_LOCAL="true", HOST=host)

    assert (result.returncode, result.stdout.strip()) == (0, "True"), result.stderr


def test_make_run_prints_the_mode_loudly():
    banner, may_start = devenv.local_mode_banner(
        {"ALLOW_ANONYMOUS_LOCAL": "true", "DJANGO_SUPERUSER_USERNAME": "root"}
    )

    assert may_start is True
    assert "SINGLE-USER LOCAL MODE (ALLOW_ANONYMOUS_LOCAL=true)" in banner
    assert "act as 'root'" in banner
    assert devenv.local_mode_banner({}) == (None, True)


def test_make_run_refuses_to_start_on_a_host_that_is_not_loopback(monkeypatch, capsys):
    monkeypatch.setenv("ALLOW_ANONYMOUS_LOCAL", "true")
    monkeypatch.setenv("HOST", "0.0.0.0")
    monkeypatch.setattr(devenv, "ensure_sandbox_image", lambda: pytest.fail("the platform started"))

    code = devenv.run_platform()

    assert code == 2
    assert "REFUSING TO START" in capsys.readouterr().err
