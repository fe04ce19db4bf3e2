"""/v1/providers: an organisation's own LLM provider credentials over the API, and checking their keys.

Checks talk to small HTTP servers on loopback (tests/support/outbound.py), let through the outbound guard
with OUTBOUND_ALLOW where a test needs it; `loopback_only` fails a test that would reach anything else.
letta-client 1.12.1 has no providers methods: the SDK test uses its generic transport.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections
from letta_client import Letta
from rest_framework.test import APIClient

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.core.actor import Actor, Role
from apps.llm import services as llm_services
from apps.llm.models import Provider
from tests.factories import ProviderFactory
from tests.support.outbound import RecordingHTTPServer, Reply, loopback_only

SECRET = "sk-byok-very-secret-0123456789"


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    loopback_only(monkeypatch)


@pytest.fixture
def client(actor: Actor, api_client_for: Callable[[Actor], APIClient]) -> APIClient:
    return api_client_for(actor)


@pytest.fixture
def people(org, make_user) -> dict[str, Actor]:
    actors = {}
    for role in (Role.OWNER, Role.ADMIN, Role.MEMBER):
        user = make_user(org, role=role, username=f"{role}-person")
        actors[role.value] = Actor(organization_id=org.id, user_id=user.id, role=role)
    return actors


def models_reply(status: int = 200, body: Any = None, delay: float = 0.0) -> Callable[..., Reply]:
    def reply(method: str, path: str, headers: dict[str, str], request_body: bytes) -> Reply:
        if delay:
            time.sleep(delay)
        payload = body if body is not None else {"object": "list", "data": [{"id": "local-model"}]}
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return status, {"Content-Type": "application/json"}, raw

    return reply


@pytest.fixture
def model_server(settings) -> Iterator[RecordingHTTPServer]:
    """An OpenAI-style model server on loopback that the outbound guard lets through."""
    with RecordingHTTPServer(reply=models_reply()) as server:
        settings.OUTBOUND_ALLOW = [f"127.0.0.1:{server.port}"]
        yield server


def body_text(response: Any) -> str:
    return response.content.decode()


# --- create, read, update, delete ------------------------------------------------------------------------


def test_create_a_provider_and_the_key_is_never_returned(client, actor, model_server):
    response = client.post(
        "/v1/providers/",
        {
            "name": "vllm",
            "provider_type": "openai_compatible",
            "api_key": SECRET,
            "base_url": model_server.url,
        },
        format="json",
    )

    provider = Provider.objects.for_actor(actor).get()
    body = response.json()
    assert response.status_code == 200
    assert body == {
        "id": provider.id,
        "name": "vllm",
        "provider_type": "openai_compatible",
        "provider_category": "byok",
        "base_url": model_server.url,
        "region": None,
        "api_version": None,
        "organization_id": actor.organization_id,
        "created_at": body["created_at"],
        "updated_at": body["updated_at"],
        "last_synced": None,
    }
    assert provider.api_key == SECRET
    assert SECRET not in body_text(response)
    assert model_server.requests == []  # creating sends nothing


def test_reads_never_show_a_key_or_url_credentials(client, actor):
    ProviderFactory(
        organization_id=actor.organization_id,
        name="gpu",
        provider_type="openai_compatible",
        api_key=SECRET,
        base_url="https://user:hunter2@llm.example.com/v1",
    )
    provider = Provider.objects.for_actor(actor).get()

    listed = client.get("/v1/providers/")
    fetched = client.get(f"/v1/providers/{provider.id}")

    assert [p["base_url"] for p in listed.json()] == ["https://llm.example.com/v1"]
    assert fetched.json()["base_url"] == "https://llm.example.com/v1"
    for response in (listed, fetched):
        assert SECRET not in body_text(response)
        assert "hunter2" not in body_text(response)
        assert "api_key" not in body_text(response)


def test_an_openai_provider_without_a_base_url_shows_openais(client, actor):
    ProviderFactory(organization_id=actor.organization_id, name="openai")

    response = client.get("/v1/providers/")

    assert response.json()[0]["base_url"] == "https://api.openai.com/v1"


def test_list_filters_by_name_and_type_newest_first_with_cursors(client, actor):
    first = ProviderFactory(organization_id=actor.organization_id, name="a", provider_type="anthropic")
    second = ProviderFactory(organization_id=actor.organization_id, name="b")
    third = ProviderFactory(organization_id=actor.organization_id, name="c")

    everything = client.get("/v1/providers/").json()
    by_name = client.get("/v1/providers/?name=b").json()
    by_type = client.get("/v1/providers/?provider_type=anthropic").json()
    after = client.get(f"/v1/providers/?after={third.id}&limit=1").json()
    oldest_first = client.get("/v1/providers/?order=asc").json()

    assert [p["id"] for p in everything] == [third.id, second.id, first.id]
    assert [p["id"] for p in by_name] == [second.id]
    assert [p["id"] for p in by_type] == [first.id]
    assert [p["id"] for p in after] == [second.id]
    assert [p["id"] for p in oldest_first] == [first.id, second.id, third.id]


def test_a_taken_name_is_409(client, actor):
    ProviderFactory(organization_id=actor.organization_id, name="openai")

    response = client.post(
        "/v1/providers/", {"name": "openai", "provider_type": "openai", "api_key": SECRET}, format="json"
    )

    assert response.status_code == 409
    assert Provider.objects.for_actor(actor).count() == 1


def test_an_unknown_type_is_422(client, actor):
    response = client.post(
        "/v1/providers/", {"name": "x", "provider_type": "bedrock", "api_key": SECRET}, format="json"
    )

    assert response.status_code == 422
    assert "provider_type" in response.json()["errors"]
    assert not Provider.objects.for_actor(actor).exists()


def test_a_base_url_the_guard_refuses_is_400_and_nothing_is_stored(client, actor):
    response = client.post(
        "/v1/providers/",
        {"name": "local", "provider_type": "ollama", "base_url": "http://127.0.0.1:11434"},
        format="json",
    )

    assert response.status_code == 400
    assert "OUTBOUND_ALLOW" in response.json()["detail"]
    assert not Provider.objects.for_actor(actor).exists()


def test_update_replaces_the_key_and_keeps_what_is_not_sent(client, actor, model_server):
    provider = ProviderFactory(
        organization_id=actor.organization_id, provider_type="openai_compatible", base_url=model_server.url
    )

    response = client.patch(f"/v1/providers/{provider.id}", {"api_key": SECRET}, format="json")

    provider.refresh_from_db()
    assert response.status_code == 200
    assert (provider.api_key, provider.base_url) == (SECRET, model_server.url)
    assert SECRET not in body_text(response)


def test_update_cannot_leave_a_provider_without_what_its_type_needs(client, actor, model_server):
    provider = ProviderFactory(
        organization_id=actor.organization_id, provider_type="openai_compatible", base_url=model_server.url
    )

    response = client.patch(f"/v1/providers/{provider.id}", {"base_url": None}, format="json")

    provider.refresh_from_db()
    assert response.status_code == 400
    assert response.json()["detail"] == "OpenAI-compatible (vLLM, LM Studio, ...) providers need a base URL."
    assert provider.base_url == model_server.url


def test_update_to_a_url_the_guard_refuses_is_400(client, actor):
    provider = ProviderFactory(organization_id=actor.organization_id)

    response = client.patch(
        f"/v1/providers/{provider.id}", {"base_url": "http://169.254.169.254/v1"}, format="json"
    )

    provider.refresh_from_db()
    assert response.status_code == 400
    assert provider.base_url == ""


def test_delete_answers_lettas_message(client, actor):
    provider = ProviderFactory(organization_id=actor.organization_id)

    response = client.delete(f"/v1/providers/{provider.id}")

    assert response.status_code == 200
    assert response.json() == {"message": f"Provider id={provider.id} successfully deleted"}
    assert not Provider.objects.for_actor(actor).exists()


@pytest.mark.parametrize(
    ("method", "suffix"),
    [("get", ""), ("patch", ""), ("delete", ""), ("post", "/check")],
)
def test_another_organisations_provider_is_404_and_unchanged(
    method, suffix, other_org_actor, api_client_for, actor
):
    provider = ProviderFactory(organization_id=actor.organization_id, api_key=SECRET)
    stranger = api_client_for(other_org_actor)

    response = getattr(stranger, method)(
        f"/v1/providers/{provider.id}{suffix}", {"api_key": "x"}, format="json"
    )

    provider.refresh_from_db()
    assert response.status_code == 404
    assert provider.api_key == SECRET


def test_another_organisations_providers_are_not_listed(client, other_org_actor):
    ProviderFactory(organization_id=other_org_actor.organization_id)

    assert client.get("/v1/providers/").json() == []


@pytest.mark.parametrize("path", ["/v1/providers/", "/v1/providers/provider-x", "/v1/providers/check"])
def test_without_a_key_it_is_401(db, path):
    assert APIClient().get(path).status_code == 401
    assert APIClient().post(path, {}, format="json").status_code == 401


# --- roles -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["owner", "admin", "member"])
def test_only_owners_and_admins_add_providers(role, people, api_client_for, model_server):
    client = api_client_for(people[role])

    response = client.post(
        "/v1/providers/",
        {"name": "vllm", "provider_type": "openai_compatible", "base_url": model_server.url},
        format="json",
    )

    created = Provider.objects.for_actor(people[role]).filter(name="vllm").exists()
    if role == "member":
        assert response.status_code == 403
        assert response.json()["detail"].startswith("Not allowed")
        assert not created
    else:
        assert response.status_code == 200
        assert created


@pytest.mark.parametrize("role", ["owner", "admin", "member"])
def test_only_owners_and_admins_change_or_delete_providers(role, people, api_client_for):
    provider = ProviderFactory(organization_id=people[role].organization_id, api_key=SECRET)
    client = api_client_for(people[role])

    patched = client.patch(f"/v1/providers/{provider.id}", {"api_key": "sk-replaced-key"}, format="json")
    deleted = client.delete(f"/v1/providers/{provider.id}")

    remaining = Provider.objects.for_actor(people[role]).filter(id=provider.id).first()
    if role == "member":
        assert (patched.status_code, deleted.status_code) == (403, 403)
        assert patched.json()["detail"].startswith("Not allowed")
        assert deleted.json()["detail"].startswith("Not allowed")
        assert remaining is not None
        assert remaining.api_key == SECRET
    else:
        assert (patched.status_code, deleted.status_code) == (200, 200)
        assert remaining is None


@pytest.mark.parametrize("role", ["owner", "admin", "member"])
def test_only_owners_and_admins_check_keys_and_members_send_nothing(
    role, people, api_client_for, model_server
):
    provider = ProviderFactory(
        organization_id=people[role].organization_id,
        provider_type="openai_compatible",
        base_url=model_server.url,
    )
    client = api_client_for(people[role])

    stored = client.post(f"/v1/providers/{provider.id}/check")
    adhoc = client.post(
        "/v1/providers/check",
        {"provider_type": "openai_compatible", "api_key": SECRET, "base_url": model_server.url},
        format="json",
    )

    if role == "member":
        assert (stored.status_code, adhoc.status_code) == (403, 403)
        assert adhoc.json()["detail"].startswith("Not allowed")
        assert model_server.requests == []
    else:
        assert (stored.status_code, adhoc.status_code) == (200, 200)
        assert len(model_server.requests) == 2


def test_members_read_providers(people, api_client_for):
    provider = ProviderFactory(organization_id=people["member"].organization_id, api_key=SECRET)
    client = api_client_for(people["member"])

    listed = client.get("/v1/providers/")
    fetched = client.get(f"/v1/providers/{provider.id}")

    assert [p["id"] for p in listed.json()] == [provider.id]
    assert fetched.status_code == 200
    assert SECRET not in body_text(listed) + body_text(fetched)


# --- checks ----------------------------------------------------------------------------------------------


def test_check_lists_the_models_with_the_key(client, model_server):
    response = client.post(
        "/v1/providers/check",
        {"provider_type": "openai_compatible", "api_key": SECRET, "base_url": model_server.url + "/v1"},
        format="json",
    )

    assert response.status_code == 200
    assert response.json() == {"message": "Valid api key for provider_type=openai_compatible"}
    assert [(m, p) for m, p, _ in model_server.requests] == [("GET", "/v1/models")]
    assert model_server.requests[0][2]["authorization"] == f"Bearer {SECRET}"
    assert model_server.cookies_seen() == []


def test_check_of_a_stored_provider_uses_its_key(client, actor, model_server):
    provider = ProviderFactory(
        organization_id=actor.organization_id,
        provider_type="ollama",
        api_key="",
        base_url=model_server.url,
    )

    response = client.post(f"/v1/providers/{provider.id}/check")

    assert response.status_code == 200
    assert response.json() == {"message": "Valid api key for provider_type=ollama"}
    assert [p for _, p, _ in model_server.requests] == ["/v1/models"]  # Ollama's OpenAI API is under /v1
    assert "authorization" not in model_server.requests[0][2]


def test_an_anthropic_check_sends_the_key_as_anthropic_expects(client, actor, model_server):
    provider = ProviderFactory(
        organization_id=actor.organization_id,
        provider_type="anthropic",
        api_key=SECRET,
        base_url=model_server.url,
    )

    response = client.post(f"/v1/providers/{provider.id}/check")

    headers = model_server.requests[0][2]
    assert response.status_code == 200
    assert model_server.requests[0][1] == "/v1/models"
    assert (headers["x-api-key"], headers["anthropic-version"]) == (SECRET, "2023-06-01")


def test_a_refused_key_is_401_without_the_providers_words(client, settings):
    reply = models_reply(401, {"error": {"message": "internal detail: key sk-abc belongs to tenant 7"}})
    with RecordingHTTPServer(reply=reply) as server:
        settings.OUTBOUND_ALLOW = [f"127.0.0.1:{server.port}"]

        response = client.post(
            "/v1/providers/check",
            {"provider_type": "openai_compatible", "api_key": SECRET, "base_url": server.url},
            format="json",
        )

    assert response.status_code == 401
    assert response.json() == {
        "detail": "Provider check failed: the provider refused the API key (HTTP 401)",
        "code": "provider_check_failed",
    }
    assert response["x-should-retry"] == "false"


@pytest.mark.parametrize(
    ("reply", "detail"),
    [
        (models_reply(500, {"error": {"message": "db at 10.0.0.5 down"}}), "the provider answered HTTP 500"),
        (models_reply(302, b""), "the provider answered HTTP 302 (redirects are not followed)"),
        (models_reply(200, b"<html>login</html>"), "the answer is not a model list (check the base URL)"),
    ],
)
def test_a_provider_that_answers_oddly_is_502_with_a_summary(client, settings, reply, detail):
    with RecordingHTTPServer(reply=reply) as server:
        settings.OUTBOUND_ALLOW = [f"127.0.0.1:{server.port}"]

        response = client.post(
            "/v1/providers/check",
            {"provider_type": "openai_compatible", "api_key": SECRET, "base_url": server.url},
            format="json",
        )

    assert response.status_code == 502
    assert response.json()["detail"] == f"Provider check failed: {detail}"


def test_a_provider_that_is_down_is_502(client, settings):
    with RecordingHTTPServer() as server:
        port = server.port
    settings.OUTBOUND_ALLOW = [f"127.0.0.1:{port}"]

    response = client.post(
        "/v1/providers/check",
        {"provider_type": "openai_compatible", "base_url": f"http://127.0.0.1:{port}"},
        format="json",
    )

    assert response.status_code == 502
    assert response.json()["detail"] == "Provider check failed: could not connect to the provider"


def test_a_slow_provider_is_ended_at_the_check_deadline(client, settings, monkeypatch):
    monkeypatch.setattr(llm_services, "CHECK_DEADLINE_S", 0.5)
    with RecordingHTTPServer(reply=models_reply(delay=3.0)) as server:
        settings.OUTBOUND_ALLOW = [f"127.0.0.1:{server.port}"]
        started = time.monotonic()

        response = client.post(
            "/v1/providers/check",
            {"provider_type": "openai_compatible", "base_url": server.url},
            format="json",
        )

        elapsed = time.monotonic() - started
    assert response.status_code == 502
    assert response.json()["detail"] == "Provider check failed: the provider did not answer within 0.5 s"
    assert elapsed < 2.5


def test_a_check_of_a_url_the_guard_refuses_is_400_and_sends_nothing(client, settings):
    settings.OUTBOUND_ALLOW = []
    with RecordingHTTPServer(reply=models_reply()) as server:
        response = client.post(
            "/v1/providers/check",
            {"provider_type": "openai_compatible", "api_key": SECRET, "base_url": server.url},
            format="json",
        )

        assert response.status_code == 400
        assert "OUTBOUND_ALLOW" in response.json()["detail"]
        assert server.requests == []


def test_a_check_needs_what_the_type_needs(client):
    response = client.post("/v1/providers/check", {"provider_type": "anthropic"}, format="json")

    assert response.status_code == 400
    assert response.json()["detail"] == "Anthropic providers need an API key."


# --- the SDK's transport ---------------------------------------------------------------------------------


@pytest.fixture
def _no_persistent_connections_in_server_threads() -> Iterator[None]:
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_no_persistent_connections_in_server_threads")
def test_providers_through_the_letta_sdks_transport(live_server, actor, model_server):
    """letta-client 1.12.1 has no providers resource; its generic methods send what it sends everywhere."""
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk").raw_key
    sdk = Letta(base_url=live_server.url, api_key=key, max_retries=0, timeout=20)

    created: Any = sdk.post(
        "/v1/providers/",
        body={
            "name": "vllm",
            "provider_type": "openai_compatible",
            "api_key": SECRET,
            "base_url": model_server.url,
        },
        cast_to=object,
    )
    listed: Any = sdk.get("/v1/providers/", cast_to=object)
    checked: Any = sdk.post(f"/v1/providers/{created['id']}/check", cast_to=object)
    deleted: Any = sdk.delete(f"/v1/providers/{created['id']}", cast_to=object)

    assert [p["name"] for p in listed] == ["vllm"]
    assert checked == {"message": "Valid api key for provider_type=openai_compatible"}
    assert deleted == {"message": f"Provider id={created['id']} successfully deleted"}
    assert SECRET not in json.dumps([created, listed])
    assert not Provider.objects.for_actor(actor).exists()
