"""/v1/llm-calls, the run page's LLM calls (ADE), and token ids through a real send (the worker)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from apps.agents.models import Step
from apps.agents.services import BlockSpec, MessageIn, agent_create, agent_send_message
from apps.llm.models import LlmCall
from tests.api.test_messages_api import new_agent, send, user
from tests.support.scripted_llm import text, token_id, tool_call, tool_calls

KEY = "sk-deployment-secret-7f3a9c2e41b8"


def finished_run(actor, llm):
    agent = agent_create(
        actor=actor,
        name="Scribe",
        model="openai/gpt-4o-mini",
        memory_blocks=[BlockSpec(label="human", value="", limit=2000)],
    )
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "Likes jazz"})),
        text("Noted: you like jazz."),
    )
    return agent_send_message(
        actor=actor, agent_id=agent.id, messages=[MessageIn(content="Remember that I like jazz")]
    ).run


@pytest.mark.django_db
def test_llm_calls_list_without_bodies_and_retrieve_with_them(api_client_for, actor, other_org_actor, llm):
    run = finished_run(actor, llm)
    client = api_client_for(actor)

    listed = client.get("/v1/llm-calls/", {"run_id": run.id, "order": "asc"}).json()
    one = client.get(f"/v1/llm-calls/{listed[1]['id']}").json()
    by_step = client.get("/v1/llm-calls", {"step_id": listed[0]["step_id"]}).json()
    theirs = api_client_for(other_org_actor)

    steps = list(Step.all_objects.filter(run_id=run.id).order_by("created_at").values_list("id", flat=True))
    assert [c["step_id"] for c in listed] == steps
    assert [c["request_json"] for c in listed] == [None, None]
    assert json.loads(one["response_json"])["choices"][0]["message"]["content"] == "Noted: you like jazz."
    assert json.loads(one["request_json"])["model"] == "gpt-4o-mini"
    assert (one["status"], one["run_id"], one["model_handle"]) == ("success", run.id, "openai/gpt-4o-mini")
    assert [c["id"] for c in by_step] == [listed[0]["id"]]
    assert theirs.get(f"/v1/llm-calls/{one['id']}").status_code == 404
    assert theirs.get("/v1/llm-calls/", {"run_id": run.id}).json() == []
    assert client.__class__().get("/v1/llm-calls/").status_code == 401


@pytest.mark.django_db
def test_deleting_an_agent_deletes_its_llm_call_records(api_client_for, actor, llm, client, user):
    deleted_by_api = finished_run(actor, llm)
    deleted_in_admin = finished_run(actor, llm)
    kept = finished_run(actor, llm)
    client = api_client_for(actor)

    assert client.delete(f"/v1/agents/{deleted_by_api.agent_id}").status_code in (200, 204)
    user.is_staff = True  # an owner of the organisation, in the admin
    user.save()
    user.user_permissions.set(Permission.objects.all())
    client.force_login(user)
    page = client.post(
        reverse("admin:agents_agent_delete", args=[deleted_in_admin.agent_id]), {"post": "yes"}
    )

    assert page.status_code == 302

    remaining = set(LlmCall.all_objects.values_list("agent_id", flat=True))
    assert remaining == {kept.agent_id}


@pytest.mark.django_db
def test_the_run_page_loads_its_llm_calls_with_a_curl_without_the_key(client, user, actor, llm, settings):
    settings.OPENAI_API_KEY = KEY
    run = finished_run(actor, llm)
    client.force_login(user)

    page = client.get(reverse("ade:run-detail", args=[run.id])).content.decode()
    calls = client.get(reverse("ade:run-llm-calls", args=[run.id])).content.decode()

    assert f'hx-get="{reverse("ade:run-llm-calls", args=[run.id])}"' in page
    assert calls.count('data-testid="llm-call"') == 2
    assert calls.count('data-testid="copy-curl"') == 2
    assert "Bearer $API_KEY" in calls
    assert "Likes jazz" in calls
    assert KEY not in calls


@pytest.mark.django_db
def test_another_organisation_cannot_see_a_runs_llm_calls_in_the_ade(client, other_user, actor, llm):
    run = finished_run(actor, llm)
    client.force_login(other_user)

    response = client.get(reverse("ade:run-llm-calls", args=[run.id]))

    assert response.status_code == 404
    assert "Likes jazz" not in response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_return_token_ids_reach_the_response_the_records_and_the_request(
    api_client_for, actor, llm, celery_worker
):
    client = api_client_for(actor)
    agent = new_agent(actor)
    args = {"label": "human", "new_string": "Likes tea"}
    llm.push(tool_calls(tool_call("memory_insert", args)), text("Noted tea"))

    response = send(
        client, agent.id, {**user("I like tea"), "return_token_ids": True, "return_logprobs": True}
    )

    body = response.json()
    requests = llm.chat_requests()
    calls = list(LlmCall.objects.for_actor(actor).filter(run_id=body["messages"][0]["run_id"]))
    calls.sort(key=lambda c: c.created_at)
    answer_ids = [token_id("Noted"), token_id(" tea")]
    assert response.status_code == 200
    assert [r.get("return_token_ids") for r in requests] == [True, True]
    assert [t["role"] for t in body["turns"]] == ["assistant", "tool", "assistant"]
    assert body["turns"][2]["output_ids"] == answer_ids
    assert body["turns"][2]["content"] == "Noted tea"
    assert [lp[1] for lp in body["turns"][2]["output_token_logprobs"]] == answer_ids
    assert body["turns"][1]["tool_name"] == "memory_insert"
    assert body["turns"][0]["output_ids"] == calls[0].output_token_ids
    assert len(calls[0].output_token_ids) >= 2  # the call's argument pieces
    assert calls[1].output_token_ids == answer_ids
    assert body["logprobs"]["content"][0]["token"] == "Noted"


@pytest.mark.django_db(transaction=True)
def test_without_return_token_ids_nothing_is_asked_or_answered(api_client_for, actor, llm, celery_worker):
    client = api_client_for(actor)
    agent = new_agent(actor)
    llm.push(text("Hello"))

    response = send(client, agent.id, user("hi"))

    assert response.json()["turns"] is None
    assert "return_token_ids" not in llm.last_chat_request()


@pytest.mark.django_db
def test_a_feedback_note_is_saved_from_the_run_page_and_too_long_a_note_is_refused(client, user, actor, llm):
    run = finished_run(actor, llm)
    step = Step.all_objects.filter(run=run).first()
    client.force_login(user)
    url = reverse("ade:step-feedback-note", args=[step.id])

    page = client.get(reverse("ade:run-detail", args=[run.id])).content.decode()
    saved = client.post(url, {"note": "  Wrong block  "}, HTTP_HX_REQUEST="true")
    refused = client.post(url, {"note": "x" * 2001}, HTTP_HX_REQUEST="true")

    assert f'hx-post="{url}"' in page
    assert saved.status_code == 200
    assert 'data-testid="feedback-note-saved"' in saved.content.decode()
    assert refused.status_code == 422
    assert Step.all_objects.get(id=step.id).feedback_note == "Wrong block"


@pytest.mark.django_db
def test_a_feedback_note_over_the_api_is_kept_cleared_and_bounded(api_client_for, actor, llm):
    run = finished_run(actor, llm)
    step = Step.all_objects.filter(run=run).first()
    client = api_client_for(actor)

    noted = client.patch(
        f"/v1/steps/{step.id}/feedback", {"feedback": "negative", "note": "Bad tool"}, format="json"
    )
    kept = client.patch(f"/v1/steps/{step.id}/feedback", {"tags": ["x"]}, format="json")
    too_long = client.patch(f"/v1/steps/{step.id}/feedback", {"note": "x" * 2001}, format="json")
    cleared = client.patch(f"/v1/steps/{step.id}/feedback", {"note": None}, format="json")

    assert (noted.json()["feedback"], noted.json()["feedback_note"]) == ("negative", "Bad tool")
    assert kept.json()["feedback_note"] == "Bad tool"
    assert too_long.status_code == 422
    assert cleared.json()["feedback_note"] is None
