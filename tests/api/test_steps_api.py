"""/v1/steps: list, retrieve, feedback, messages, metrics and trace."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from apps.agents.models import Agent, Run, Step, pack_trace
from apps.core.actor import Actor
from tests.api.test_messages_api import AUTH_QUERIES, new_agent, types
from tests.factories import MessageFactory
from tests.support.outbound import loopback_only
from tests.support.scripted_llm import text


@pytest.fixture
def client(actor: Actor, api_client_for: Any) -> APIClient:
    return api_client_for(actor)


def make_step(actor: Actor, agent: Agent, run: Run | None = None, **fields: Any) -> Step:
    return Step.all_objects.create(organization_id=actor.organization_id, agent=agent, run=run, **fields)


@pytest.mark.django_db
def test_steps_list_filters_by_agent_run_and_feedback(client, actor):
    agent, other = new_agent(actor), new_agent(actor, name="Other")
    run = Run.objects.for_actor(actor).create(agent=agent)
    in_run = make_step(actor, agent, run, feedback="positive")
    loose = make_step(actor, agent)
    make_step(actor, other)

    by_agent = client.get("/v1/steps/", {"agent_id": agent.id, "order": "asc"}).json()
    by_run = client.get("/v1/steps/", {"run_id": run.id}).json()
    with_feedback = client.get("/v1/steps/", {"has_feedback": "true"}).json()
    negative = client.get("/v1/steps/", {"feedback": "negative"}).json()

    assert [s["id"] for s in by_agent] == [in_run.id, loose.id]
    assert [s["id"] for s in by_run] == [in_run.id]
    assert [s["id"] for s in with_feedback] == [in_run.id]
    assert negative == []


@pytest.mark.django_db
def test_steps_list_honours_after_until_an_empty_page(client, actor):
    agent = new_agent(actor)
    steps = [make_step(actor, agent) for _ in range(3)]

    seen, after = [], None
    for _ in range(5):
        query = {"limit": 2, "order": "asc"} | ({"after": after} if after else {})
        page = client.get("/v1/steps/", query).json()
        if not page:
            break
        seen += [s["id"] for s in page]
        after = page[-1]["id"]

    assert seen == [s.id for s in steps]


@pytest.mark.django_db
def test_steps_list_costs_the_same_queries_however_long(client, actor):
    agent = new_agent(actor)
    make_step(actor, agent)
    client.get("/v1/steps/")  # the key's first use is stamped

    with CaptureQueriesContext(connection) as short:
        client.get("/v1/steps/")
    for _ in range(10):
        make_step(actor, agent)
    with CaptureQueriesContext(connection) as long:
        response = client.get("/v1/steps/")

    assert len(response.json()) == 11
    assert len(long.captured_queries) == len(short.captured_queries) == AUTH_QUERIES + 1


@pytest.mark.django_db
def test_a_step_has_lettas_shape(client, actor):
    agent = new_agent(actor)
    step = make_step(
        actor,
        agent,
        status="success",
        model="gpt-4o-mini",
        model_handle="openai/gpt-4o-mini",
        prompt_tokens=12,
        completion_tokens=3,
        total_tokens=15,
        latency_ms=40,
        trace=pack_trace({"messages": []}, {"choices": []}),
    )

    body = client.get(f"/v1/steps/{step.id}").json()
    metrics = client.get(f"/v1/steps/{step.id}/metrics").json()
    trace = client.get(f"/v1/steps/{step.id}/trace").json()

    assert body["id"] == step.id
    assert body["agent_id"] == agent.id
    assert body["status"] == "success"
    assert body["model_handle"] == "openai/gpt-4o-mini"
    assert (body["prompt_tokens"], body["completion_tokens"], body["total_tokens"]) == (12, 3, 15)
    assert body["feedback"] is None
    assert body["stop_reason"] is None
    assert metrics["llm_request_ns"] == 40_000_000
    assert trace["request_json"] == {"messages": []}
    assert trace["response_json"] == {"choices": []}


@pytest.mark.django_db
def test_a_steps_messages(client, actor):
    agent = new_agent(actor)
    step = make_step(actor, agent)
    produced = MessageFactory(organization_id=actor.organization_id, agent=agent, step=step, role="assistant")
    MessageFactory(organization_id=actor.organization_id, agent=agent)

    listed = client.get(f"/v1/steps/{step.id}/messages").json()

    assert [m["id"] for m in listed] == [produced.id]
    assert types(listed) == ["assistant_message"]


@pytest.mark.django_db
def test_feedback_is_recorded_and_cleared(client, actor):
    step = make_step(actor, new_agent(actor))

    given = client.patch(
        f"/v1/steps/{step.id}/feedback", {"feedback": "positive", "tags": ["good"]}, format="json"
    )
    cleared = client.patch(f"/v1/steps/{step.id}/feedback", {"feedback": None}, format="json")

    assert given.json()["feedback"] == "positive"
    assert given.json()["tags"] == ["good"]
    assert cleared.json()["feedback"] is None


@pytest.mark.django_db
def test_feedback_must_be_positive_or_negative(client, actor):
    step = make_step(actor, new_agent(actor))

    response = client.patch(f"/v1/steps/{step.id}/feedback", {"feedback": "meh"}, format="json")

    assert response.status_code == 422
    step.refresh_from_db()
    assert step.feedback == ""


STEP_ENDPOINTS = [
    ("get", "/v1/steps/{step}", None),
    ("patch", "/v1/steps/{step}/feedback", {"feedback": "negative"}),
    ("get", "/v1/steps/{step}/messages", None),
    ("get", "/v1/steps/{step}/metrics", None),
    ("get", "/v1/steps/{step}/trace", None),
]


@pytest.mark.parametrize(("method", "path", "body"), STEP_ENDPOINTS)
@pytest.mark.django_db
def test_another_organisation_gets_404_for_a_step(api_client_for, actor, other_org_actor, method, path, body):
    step = make_step(actor, new_agent(actor))

    response = getattr(api_client_for(other_org_actor), method)(
        path.format(step=step.id), body, format="json"
    )

    assert response.status_code == 404
    assert response.json()["detail"] == f"Step with id '{step.id}' not found"
    step.refresh_from_db()
    assert step.feedback == ""


@pytest.mark.parametrize(("method", "path", "body"), [*STEP_ENDPOINTS, ("get", "/v1/steps/", None)])
@pytest.mark.django_db
def test_no_key_is_401_for_steps(actor, method, path, body):
    step = make_step(actor, new_agent(actor))

    response = getattr(APIClient(), method)(path.format(step=step.id), body, format="json")

    assert response.status_code == 401
    step.refresh_from_db()
    assert step.feedback == ""


@pytest.mark.django_db
def test_another_organisations_step_list_is_empty(api_client_for, actor, other_org_actor):
    make_step(actor, new_agent(actor))

    assert api_client_for(other_org_actor).get("/v1/steps/").json() == []


# --- no deployment hostname reaches a tenant ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_step_and_its_trace_never_show_the_deployments_llm_host(client, make_agent, send, llm, settings):
    agent = make_agent()
    llm.push(text("Hello"))
    step = Step.all_objects.get(run=send(agent, "hi").run)

    body = client.get(f"/v1/steps/{step.id}")
    trace = client.get(f"/v1/steps/{step.id}/trace")
    listed = client.get("/v1/steps/", {"agent_id": agent.id})

    assert body.json()["model_endpoint"] is None
    assert trace.json()["request_json"]["api_base"] is None
    assert trace.json()["request_json"]["messages"]  # the rest of the request is there
    host = urlsplit(settings.OPENAI_BASE_URL).netloc
    for response in (body, trace, listed):
        assert host not in response.content.decode()


@pytest.mark.django_db
def test_steps_stored_before_the_rule_are_shown_without_the_deployments_host(
    client, actor, settings, monkeypatch
):
    loopback_only(monkeypatch)  # nothing here may try to reach the made-up deployment host
    settings.OPENAI_BASE_URL = "http://llm.internal.example:8000/v1"
    agent = new_agent(actor)
    deployment = make_step(
        actor,
        agent,
        model_endpoint=settings.OPENAI_BASE_URL,
        trace=pack_trace({"api_base": settings.OPENAI_BASE_URL, "messages": []}, {"choices": []}),
    )
    public = make_step(actor, agent, model_endpoint="https://api.openai.com/v1")
    own = make_step(actor, agent, model_endpoint="https://user:s3cret@llm.example.org/v1")

    trace = client.get(f"/v1/steps/{deployment.id}/trace").json()
    endpoints = [client.get(f"/v1/steps/{s.id}").json()["model_endpoint"] for s in (deployment, public, own)]

    assert trace["request_json"] == {"api_base": None, "messages": []}
    assert endpoints == [None, "https://api.openai.com/v1", "https://llm.example.org/v1"]


def test_listing_by_trace_ids_is_refused_by_name_not_answered_empty(actor, api_client_for):
    response = api_client_for(actor).get("/v1/steps/", {"trace_ids": ["trace-1"]})

    assert response.status_code == 422
    assert response.json()["detail"].startswith("trace_ids: not supported")
