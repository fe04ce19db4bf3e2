"""The outbound guard in front of provider URLs an organisation chose, end to end: refused when stored
(services, the ADE's settings page), refused at call time before anything is connected, redirects not
followed, failures summarised, no cookies between organisations; the deployment's own providers stay
trusted. Every call runs twice: LLM_CLIENT=direct (apps.llm.openai_wire) and LLM_CLIENT=litellm.

Real servers on 127.0.0.x and ::1 only; `loopback_only` fails a test that would reach anything else.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from django.test import Client

from apps.agents.models import Step
from apps.api.errors import status_for
from apps.core import outbound
from apps.core.outbound import OutboundRefused
from apps.llm import services
from apps.llm._litellm import litellm
from apps.llm.client import ChatRequest, complete, stream
from apps.llm.embeddings import embed
from apps.llm.errors import LLMApiError
from apps.llm.handles import resolve_embedding, resolve_model
from apps.llm.models import Provider
from apps.llm.selectors import fetch_model_ids
from tests.factories import ProviderFactory
from tests.llm.conftest import MESSAGES
from tests.support.outbound import (
    ConnectionRecorder,
    FakeResolver,
    RecordingHTTPServer,
    loopback_only,
    openai_reply,
)

ATTACKER_BODY = "ATTACKER-BODY internal-admin.corp:8443 says hello"


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replaces the llm tests' fence with one that also lets 127.0.0.2 (the attacker) through."""
    loopback_only(monkeypatch)


@pytest.fixture(autouse=True, params=["direct", "litellm"])
def llm_client(request: pytest.FixtureRequest, settings) -> str:
    settings.LLM_CLIENT = request.param
    settings.OUTBOUND_ALLOW = []
    return str(request.param)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def tenant_provider(org_id: str, url: str, name: str = "mine", **fields: Any) -> Provider:
    """A provider row as it could have been stored before the guard (no creation check)."""
    fields.setdefault("provider_type", Provider.Type.OPENAI_COMPATIBLE)
    fields.setdefault("api_key", "")
    return ProviderFactory(organization_id=org_id, name=name, base_url=url, **fields)


# --- when a URL is stored ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("http://169.254.169.254/", "169.254.169.254 is a cloud metadata address"),
        ("http://127.0.0.1:{port}/v1", "127.0.0.1 is a loopback address"),
        ("http://[::1]:{port}/v1", "::1 is a loopback address"),
        ("http://localhost:{port}/v1", "localhost resolves to a loopback address"),
        ("http://llm.internal.test:{port}/v1", "llm.internal.test resolves to a private (RFC 1918) address"),
    ],
)
def test_a_provider_with_a_non_public_base_url_is_refused_with_the_reason(
    actor, monkeypatch, template, reason
):
    real = outbound.resolve
    monkeypatch.setattr(
        outbound,
        "resolve",
        lambda host, port: ["10.20.30.40"] if host == "llm.internal.test" else real(host, port),
    )
    with ConnectionRecorder() as v4, ConnectionRecorder("::1") as v6:
        url = template.format(port=v6.port if "[::1]" in template else v4.port)

        with pytest.raises(OutboundRefused) as refused:
            services.provider_create(
                actor=actor, name="evil", provider_type="openai_compatible", base_url=url
            )

    assert status_for(refused.value) == 400
    assert refused.value.message == (
        f"The base URL is not allowed: {reason}. Only public addresses can be reached; the operator "
        "can allow a private server with OUTBOUND_ALLOW."
    )
    assert not Provider.objects.for_actor(actor).exists()
    assert v4.connections == v6.connections == []


def test_the_ade_settings_page_refuses_it_and_says_why(user, actor):
    client = Client()
    client.force_login(user)

    response = client.post(
        "/settings/providers/",
        {"provider_type": "ollama", "name": "ollama", "api_key": "", "base_url": "http://169.254.169.254"},
        HTTP_HX_REQUEST="true",
    )

    assert response.status_code == 422
    assert "169.254.169.254 is a cloud metadata address" in response.content.decode()
    assert not Provider.objects.for_actor(actor).exists()


def test_an_allow_listed_private_server_is_accepted_and_called(actor, settings):
    with RecordingHTTPServer() as server:
        settings.OUTBOUND_ALLOW = [f"127.0.0.1:{server.port}"]
        services.provider_create(
            actor=actor, name="local", provider_type="openai_compatible", base_url=f"{server.url}/v1"
        )
        target = resolve_model("local/qwen", organization_id=actor.organization_id)

        response = complete(target, ChatRequest(messages=MESSAGES))

    assert response.content == "hello"
    assert [path for _, path, _ in server.requests] == ["/v1/chat/completions"]
    assert response.raw["request"]["api_base"] == f"{server.url}/v1"  # the organisation's own URL


# --- at call time -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
def test_a_stored_url_the_guard_refuses_fails_before_anything_is_connected(actor, streamed):
    with ConnectionRecorder() as platform:
        tenant_provider(actor.organization_id, f"{platform.url}/v1")
        target = resolve_model("mine/chat", organization_id=actor.organization_id)

        request = ChatRequest(messages=MESSAGES)
        call = (
            (lambda: stream(target, request, lambda delta: None))
            if streamed
            else (lambda: complete(target, request))
        )

        with pytest.raises(LLMApiError) as failed:
            call()

    assert failed.value.message.startswith(
        "mine/chat: The URL is not allowed: 127.0.0.1 is a loopback address."
    )
    assert platform.connections == []


def test_an_anthropic_provider_url_is_guarded_too(actor):
    """Anthropic calls always go through litellm: its `client=` is the guarded one, not litellm's own."""
    with ConnectionRecorder() as platform:
        tenant_provider(
            actor.organization_id, platform.url, provider_type=Provider.Type.ANTHROPIC, api_key="k"
        )
        target = resolve_model("mine/claude-haiku-4-5", organization_id=actor.organization_id)

        with pytest.raises(LLMApiError, match=r"127\.0\.0\.1 is a loopback address"):
            complete(target, ChatRequest(messages=MESSAGES))

    assert platform.connections == []


def test_a_redirect_to_an_internal_port_ends_the_run_with_llm_api_error_and_reaches_nothing(
    actor, settings, make_agent, send, env_openai
):
    """The operator allow-lists a model server (127.0.0.2) that turns out hostile: its 307 to a platform
    port is not followed, and nothing of its answer reaches the tenant."""
    with ConnectionRecorder("127.0.0.1") as platform:
        body = json.dumps({"error": {"message": ATTACKER_BODY}}).encode()
        headers = {"Location": f"http://127.0.0.1:{platform.port}/admin/"}
        with RecordingHTTPServer(
            "127.0.0.2", reply=openai_reply(status=307, headers=headers, body=body)
        ) as attacker:
            settings.OUTBOUND_ALLOW = [f"127.0.0.2:{attacker.port}"]
            tenant_provider(actor.organization_id, f"{attacker.url}/v1", name="attacker")
            agent = make_agent(model="attacker/chat")

            result = send(agent, "hi")

    message = result.run.error["message"]
    assert result.stop_reason == "llm_api_error"
    assert message == (
        "attacker/chat: the provider answered HTTP 307 (redirects are not followed) after 1 attempt(s)"
    )
    step = Step.all_objects.get(run=result.run)
    assert ATTACKER_BODY not in json.dumps(step.error_data)
    assert str(platform.port) not in message
    assert len(attacker.requests) == 1
    assert platform.connections == []


@pytest.mark.parametrize(
    ("reply", "summary"),
    [
        (
            openai_reply(status=500, body=json.dumps({"error": {"message": ATTACKER_BODY}}).encode()),
            "the provider answered HTTP 500 after 3 attempt(s)",
        ),
        (
            openai_reply(status=502, body=ATTACKER_BODY.encode()),
            "the provider answered HTTP 502 after 3 attempt(s)",
        ),
        (
            openai_reply(status=401, body=json.dumps({"error": {"message": ATTACKER_BODY}}).encode()),
            "the provider answered HTTP 401 (check the API key) after 1 attempt(s)",
        ),
        (openai_reply(status=200, body=ATTACKER_BODY.encode()), None),
    ],
)
def test_failures_of_a_tenant_url_are_summarised_never_echoed(actor, settings, reply, summary):
    settings.OUTBOUND_ALLOW = ["127.0.0.1"]
    with RecordingHTTPServer(reply=reply) as server:
        tenant_provider(actor.organization_id, f"{server.url}/v1")
        target = resolve_model("mine/chat", organization_id=actor.organization_id)

        with pytest.raises(Exception) as failed:
            complete(target, ChatRequest(messages=MESSAGES))

    message = failed.value.message
    expected = summary or "the provider's answer could not be read"
    assert message == f"mine/chat: {expected}"
    assert "ATTACKER" not in message


def test_a_refused_connection_is_could_not_connect(actor, settings):
    settings.OUTBOUND_ALLOW = ["127.0.0.1"]
    tenant_provider(actor.organization_id, f"http://127.0.0.1:{free_port()}/v1")
    target = resolve_model("mine/chat", organization_id=actor.organization_id)

    with pytest.raises(LLMApiError) as failed:
        complete(target, ChatRequest(messages=MESSAGES))

    assert failed.value.message == "mine/chat: could not connect to the provider after 3 attempt(s)"


def test_cookies_set_for_one_organisation_never_reach_another(actor, other_org_actor, settings):
    def cookie_reply(*args: Any) -> tuple[int, dict[str, str], bytes]:
        status, headers, body = openai_reply()(*args)
        return status, {**headers, "Set-Cookie": "session=org-a-secret; Path=/"}, body

    settings.OUTBOUND_ALLOW = ["127.0.0.1"]
    with RecordingHTTPServer(reply=cookie_reply) as theirs, RecordingHTTPServer() as ours:
        tenant_provider(actor.organization_id, f"{theirs.url}/v1")
        tenant_provider(other_org_actor.organization_id, f"{ours.url}/v1")
        settings.OPENAI_BASE_URL = f"{theirs.url}/v1"  # the deployment's shared client too
        settings.OPENAI_API_KEY = "sk-env"
        a = resolve_model("mine/chat", organization_id=actor.organization_id)
        b = resolve_model("mine/chat", organization_id=other_org_actor.organization_id)
        deployment = resolve_model("openai/chat", organization_id=other_org_actor.organization_id)

        for target in (a, deployment, b, a, b):
            complete(target, ChatRequest(messages=MESSAGES))

    assert len(theirs.requests) == 3
    assert len(ours.requests) == 2
    assert theirs.cookies_seen() == ours.cookies_seen() == []
    assert len(litellm.client_session.cookies.jar) == 0


def test_embeddings_of_a_tenant_url_are_guarded(actor, settings):
    with ConnectionRecorder() as platform, RecordingHTTPServer() as allowed:
        tenant_provider(actor.organization_id, f"{platform.url}/v1", name="blocked")
        tenant_provider(actor.organization_id, f"{allowed.url}/v1", name="allowed")
        settings.OUTBOUND_ALLOW = [f"127.0.0.1:{allowed.port}"]

        with pytest.raises(LLMApiError) as refused:
            embed(resolve_embedding("blocked/embed", organization_id=actor.organization_id), ["hi"])
        vectors = embed(resolve_embedding("allowed/embed", organization_id=actor.organization_id), ["hi"])

    assert refused.value.message.startswith("blocked/embed: The URL is not allowed: 127.0.0.1 is a loopback")
    assert platform.connections == []
    assert vectors == [[0.1, 0.2, 0.3]]


def test_a_name_that_resolves_later_is_judged_when_called(actor, monkeypatch):
    """Stored while it did not resolve; when called it resolves to a private address: refused then."""
    resolver = FakeResolver({})
    monkeypatch.setattr(outbound, "resolve", resolver)
    services.provider_create(
        actor=actor, name="later", provider_type="openai_compatible", base_url="http://llm.later.test/v1"
    )
    resolver.answers["llm.later.test"] = ["192.168.7.7"]
    target = resolve_model("later/chat", organization_id=actor.organization_id)

    with pytest.raises(LLMApiError) as refused:
        complete(target, ChatRequest(messages=MESSAGES))

    assert "llm.later.test resolves to a private (RFC 1918) address" in refused.value.message
    assert "192.168.7.7" not in refused.value.message


def test_model_lists_of_a_tenant_url_are_guarded(settings):
    def models(*args: Any) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Content-Type": "application/json"}, json.dumps({"data": [{"id": "qwen"}]}).encode()

    with ConnectionRecorder() as platform, RecordingHTTPServer(reply=models) as allowed:
        refused = fetch_model_ids(f"{platform.url}/v1", api_key="k", timeout=2)
        settings.OUTBOUND_ALLOW = [f"127.0.0.1:{allowed.port}"]
        listed = fetch_model_ids(f"{allowed.url}/v1", api_key="k", timeout=2)

    assert (refused, listed) == ([], ["qwen"])
    assert platform.connections == []


# --- the deployment's own providers -------------------------------------------------------------------------


def test_the_deployments_loopback_server_is_trusted_and_its_url_not_shown(target, llm):
    """OPENAI_BASE_URL (the scripted server on 127.0.0.1) needs no allow-list entry, and the trace a
    tenant can read does not name it."""
    response = complete(target, ChatRequest(messages=MESSAGES))

    assert response.content == "OK"
    assert response.raw["request"]["api_base"] is None
    assert llm.url not in json.dumps(response.raw)
    assert fetch_model_ids(llm.url, api_key=None, timeout=2)  # its model list too
