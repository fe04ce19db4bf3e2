"""LLM call records through the real loop (in-process turns, the scripted LLM over HTTP)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.agents.models import Step
from apps.llm import records
from apps.llm.models import LlmCall, LlmRecordPolicy
from apps.llm.tasks import prune_llm_calls_task
from tests.support.scripted_llm import error, text, tool_call, tool_calls

pytestmark = pytest.mark.django_db

KEY = "sk-deployment-secret-7f3a9c2e41b8"


def every_stored_text(record: LlmCall) -> str:
    return json.dumps({f.attname: getattr(record, f.attname) for f in LlmCall._meta.fields}, default=str)


def test_every_call_of_a_run_is_recorded_as_sent_and_received_without_the_key(
    make_agent, send, llm, settings
):
    settings.OPENAI_API_KEY = KEY
    agent = make_agent()
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "Likes tea"})),
        text("Noted, you like tea."),
    )

    result = send(agent, "I like tea")

    calls = list(LlmCall.all_objects.filter(run_id=result.run.id).order_by("created_at"))
    steps = list(Step.all_objects.filter(run_id=result.run.id).order_by("created_at"))
    sent = llm.chat_requests()
    assert [c.step_id for c in calls] == [s.id for s in steps]
    assert [c.status for c in calls] == ["success", "success"]
    assert {(c.agent_id, c.organization_id, c.model, c.model_handle) for c in calls} == {
        (agent.id, agent.organization_id, "gpt-4o-mini", "openai/gpt-4o-mini")
    }
    assert [json.loads(c.request_body)["messages"] for c in calls] == [r["messages"] for r in sent]
    assert json.loads(calls[1].response_body)["choices"][0]["message"]["content"] == "Noted, you like tea."
    assert [c.prompt_tokens for c in calls] == [s.prompt_tokens for s in steps]
    assert all(c.latency_ms is not None and c.cost_usd and c.cost_usd > 0 for c in calls)
    assert not any(c.truncated for c in calls)
    for call in calls:
        stored = every_stored_text(call)
        assert KEY not in stored
        assert "Bearer" not in stored
        assert "authorization" not in stored.lower()


def test_a_failed_call_is_recorded_with_its_error_and_request(make_agent, send, llm, settings):
    settings.OPENAI_API_KEY = KEY
    settings.LLM_MAX_ATTEMPTS = 1
    agent = make_agent()
    llm.push(error(400, f"bad request from a server that echoes {KEY}"))

    result = send(agent, "hello")

    call = LlmCall.all_objects.get(run_id=result.run.id)
    assert result.stop_reason == "llm_api_error"
    assert (call.status, call.error_type, call.step_id, call.response_body) == (
        "error",
        "LLMApiError",
        "",
        "",
    )
    assert json.loads(call.request_body)["messages"][-1]["content"] == "hello"
    assert KEY not in every_stored_text(call)


def test_a_body_past_the_limit_is_cut_and_the_record_says_so(make_agent, send, llm, settings):
    settings.LLM_RECORD_MAX_BYTES = 3000
    agent = make_agent()
    llm.push(text("ok"))

    result = send(agent, "long " * 2000)

    call = LlmCall.all_objects.get(run_id=result.run.id)
    assert call.truncated is True
    assert len(call.request_body.encode()) <= 3000
    assert json.loads(call.response_body)["choices"][0]["message"]["content"] == "ok"


def test_retention_prunes_each_organisation_at_its_own_setting(org, other_org, settings):
    settings.LLM_RECORD_RETENTION_DAYS = 30
    LlmRecordPolicy.all_objects.create(organization=other_org, retention_days=2)
    now = timezone.now()
    rows = {
        (org.id, 10): LlmCall.all_objects.create(organization=org),
        (org.id, 40): LlmCall.all_objects.create(organization=org),
        (other_org.id, 1): LlmCall.all_objects.create(organization=other_org),
        (other_org.id, 3): LlmCall.all_objects.create(organization=other_org),
    }
    for (_, days), row in rows.items():
        LlmCall.all_objects.filter(id=row.id).update(created_at=now - timedelta(days=days))

    deleted = prune_llm_calls_task()

    kept = set(LlmCall.all_objects.values_list("id", flat=True))
    assert deleted == 2
    assert kept == {rows[(org.id, 10)].id, rows[(other_org.id, 1)].id}


def test_the_beat_schedules_the_prune(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["prune-llm-calls"]

    assert entry["task"] == prune_llm_calls_task.name == "llm.prune_llm_calls"


def test_a_request_copies_as_curl_with_a_placeholder_for_the_key(make_agent, send, llm, settings):
    settings.OPENAI_API_KEY = KEY
    agent = make_agent()
    llm.push(text("hi"))
    result = send(agent, "it's me")

    command = records.curl_command(LlmCall.all_objects.get(run_id=result.run.id))

    # The deployment's own provider URL is never shown to tenants (endpoint_for_tenants): OpenAI's instead.
    assert command.startswith(
        "curl 'https://api.openai.com/v1/chat/completions' \\\n  -H 'Authorization: Bearer $API_KEY'"
    )
    assert "it'\\''s me" in command  # shell-quoted
    assert KEY not in command
    assert '"timeout"' not in command


def test_no_run_means_no_record(make_agent, llm):
    from apps.llm import client
    from apps.llm.handles import resolve_model

    llm.push(text("hi"))
    target = resolve_model("openai/gpt-4o-mini", organization_id=make_agent().organization_id)

    client.complete(target, client.ChatRequest(messages=[{"role": "user", "content": "hi"}]))

    assert not LlmCall.all_objects.exists()


def test_streamed_calls_keep_the_same_token_ids_as_blocking_ones(make_agent, send, llm):
    from tests.support.scripted_llm import token_id

    agent = make_agent()
    llm.push(text("Hello there"), text("Hello there"))

    streamed = send(agent, "hi", stream_tokens=True, return_token_ids=True)
    blocking = send(agent, "hi", return_token_ids=True)

    ids = [LlmCall.all_objects.get(run_id=r.run.id).output_token_ids for r in (streamed, blocking)]
    assert ids == [[token_id("Hello"), token_id(" there")]] * 2
    assert LlmCall.all_objects.get(run_id=streamed.run.id).streamed is True
