"""LettaRequest's per-request options through POST /v1/agents/{id}/messages (and its async and streaming
twins), with the real worker and the scripted LLM: override_model, override_system (and its alias
`system`), client_skills, include_compaction_messages; the token-data fields are refused by name."""

from __future__ import annotations

import time

import pytest

from apps.agents.models import Agent, Run, Step
from tests.api.test_messages_api import new_agent, send, sse_events, types, user
from tests.support.scripted_llm import text, tool_call, tool_calls

worker = pytest.mark.django_db(transaction=True)
LONG = "I went hiking in the Alps last summer and the views were amazing. " * 8  # about 130 tokens


@pytest.fixture
def client(actor, api_client_for):
    return api_client_for(actor)


def wait_for_run(run_id: str, timeout: float = 60) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.unscoped().get(id=run_id)
        if run.status in ("completed", "failed", "cancelled"):
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not finish")


@worker
def test_override_model_is_used_for_this_request_only_on_every_send_path(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("from the big model"), text("streamed"), text("async"), text("back to the agent's"))

    blocking = send(client, agent.id, {**user("hi"), "override_model": "openai/gpt-4o"})
    streamed = client.post(
        f"/v1/agents/{agent.id}/messages/stream",
        {**user("again"), "override_model": "openai/gpt-4o"},
        format="json",
    )
    sse_events(streamed)
    queued = client.post(
        f"/v1/agents/{agent.id}/messages/async",
        {**user("later"), "override_model": "openai/gpt-4o"},
        format="json",
    )
    wait_for_run(queued.json()["id"])
    plain = send(client, agent.id, user("and now?"))

    assert blocking.status_code == 200
    assert plain.status_code == 200
    assert [r["model"] for r in llm.chat_requests()] == ["gpt-4o", "gpt-4o", "gpt-4o", "gpt-4o-mini"]
    assert Agent.objects.for_actor(actor).get(id=agent.id).model == "openai/gpt-4o-mini"


@worker
def test_an_override_model_the_organisation_cannot_use_is_refused_before_anything_is_stored(
    client, actor, llm, celery_worker
):
    agent = new_agent(actor)

    response = send(client, agent.id, {**user("hi"), "override_model": "nosuch/model-x"})

    assert response.status_code == 404
    assert response.json()["detail"] == "Model 'nosuch/model-x' not found or not accessible"
    assert not Run.objects.for_actor(actor).exists()
    assert llm.chat_requests() == []


@worker
@pytest.mark.parametrize("field", ["override_system", "system"])
def test_override_system_replaces_the_compiled_system_message_for_that_request(
    client, actor, llm, celery_worker, field
):
    agent = new_agent(actor)
    llm.push(text("Arr."), text("Hello."))

    send(client, agent.id, {**user("hi"), field: "You are a pirate. Answer in one word."})
    send(client, agent.id, user("hi again"))

    first, second = llm.chat_requests()
    assert first["messages"][0] == {"role": "system", "content": "You are a pirate. Answer in one word."}
    assert "<memory_blocks>" in second["messages"][0]["content"]  # the next request compiles as before


@worker
def test_client_skills_are_listed_in_the_system_message_of_that_request(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("ok"), text("ok"))
    skills = [
        {"name": "pdf", "description": "Fill PDF forms.\nMore details.", "location": "skills/pdf/SKILL.md"},
        {"name": "deploy", "description": "Ship the app", "location": "skills/deploy/SKILL.md"},
    ]

    send(client, agent.id, {**user("hi"), "client_skills": skills})
    send(client, agent.id, user("hi again"))

    first, second = (r["messages"][0]["content"] for r in llm.chat_requests())
    assert first.endswith(
        "<available_skills>\nskills\n├── deploy/\n│   └── SKILL.md (Ship the app)\n"
        "└── pdf/\n    └── SKILL.md (Fill PDF forms.)\n</available_skills>"
    )
    assert "<available_skills>" not in second


@worker
@pytest.mark.parametrize("structured", [True, False])
def test_compaction_answers_as_event_and_summary_only_when_asked(
    client, actor, llm, celery_worker, structured
):
    agent = new_agent(actor, context_window_limit=1200, include_base_tools=False)
    llm.configure(strict=False, default_turn={"content": "Noted."})

    answers = [
        send(
            client, agent.id, {**user(f"Message {i}: {LONG}"), "include_compaction_messages": structured}
        ).json()
        for i in range(8)
    ]

    compacted = next(
        a["messages"] for a in answers if {"user_message", "summary_message"} & set(types(a["messages"]))
    )
    kinds = types(compacted)
    if structured:
        event, summary = kinds.index("event_message"), kinds.index("summary_message")
        assert event < summary
        assert compacted[event]["event_type"] == "compaction"
        assert compacted[event]["event_data"]["context_window"] == 1200
        assert compacted[summary]["compaction_stats"]["trigger"] == "context_window"
    else:
        assert "event_message" not in kinds
        assert "Summary of what was removed" in compacted[kinds.index("user_message")]["content"]


@worker
def test_return_logprobs_asks_the_model_and_answers_the_last_calls_keeping_each_with_its_step(
    client, actor, llm, celery_worker
):
    agent = new_agent(actor)
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "Likes tea"})),
        text("Noted, tea it is."),
    )

    response = send(client, agent.id, {**user("I like tea"), "return_logprobs": True, "top_logprobs": 2})

    assert response.status_code == 200, response.content
    first, last = llm.chat_requests()[-2:]
    assert (first["logprobs"], first["top_logprobs"]) == (True, 2)
    assert (last["logprobs"], last["top_logprobs"]) == (True, 2)
    logprobs = response.json()["logprobs"]
    assert [entry["token"] for entry in logprobs["content"]] == ["Noted,", " tea", " it", " is."]
    assert [len(entry["top_logprobs"]) for entry in logprobs["content"]] == [2, 2, 2, 2]
    assert all(entry["logprob"] < 0 for entry in logprobs["content"])
    steps = Step.objects.for_actor(actor).order_by("created_at")
    assert [step.logprobs is not None for step in steps] == [True, True]  # kept with each step
    assert steps[1].logprobs == logprobs


@worker
def test_a_token_streamed_send_keeps_the_streamed_logprobs_with_its_step(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("Streamed words here."))

    response = send(
        client, agent.id, {**user("hi"), "streaming": True, "stream_tokens": True, "return_logprobs": True}
    )

    assert [d for _, d in sse_events(response)][-1] == "[DONE]"
    assert llm.last_chat_request()["stream"] is True
    kept = Step.objects.for_actor(actor).get().logprobs
    assert [entry["token"] for entry in kept["content"]] == ["Streamed", " words", " here."]


@worker
def test_without_return_logprobs_nothing_is_asked_or_answered(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("Hello"))

    response = send(client, agent.id, {**user("hi"), "return_logprobs": False, "top_logprobs": None})

    assert response.status_code == 200
    assert response.json()["logprobs"] is None
    assert "logprobs" not in llm.last_chat_request()
    assert Step.objects.for_actor(actor).get().logprobs is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"top_logprobs": 3}, "top_logprobs", "Requires return_logprobs=true."),
        ({"return_logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
        ({"return_token_ids": "maybe"}, "return_token_ids", "Must be a valid boolean."),
    ],
)
def test_token_data_fields_that_cannot_be_honoured_are_refused_by_name(client, actor, body, field, says):
    agent = new_agent(actor)

    response = send(client, agent.id, {**user("hi"), **body})

    assert response.status_code == 422
    assert response.json()["detail"].startswith(f"{field}:")
    assert says in response.json()["detail"]
    assert not Run.objects.for_actor(actor).exists()


@worker
def test_include_return_message_types_filters_an_async_runs_stream_and_can_ask_for_the_user_message(
    client, actor, llm, celery_worker
):
    agent = new_agent(actor)
    llm.push(text("Hello", reasoning="Greet back."), text("Hi again", reasoning="Once more."))
    wanted = ["user_message", "assistant_message"]

    blocking = send(client, agent.id, {**user("hi"), "include_return_message_types": wanted})
    queued = client.post(
        f"/v1/agents/{agent.id}/messages/async",
        {**user("later"), "include_return_message_types": ["assistant_message"]},
        format="json",
    ).json()
    wait_for_run(queued["id"])
    streamed = sse_events(client.post(f"/v1/runs/{queued['id']}/stream", {}, format="json"))

    assert [(m["message_type"], m.get("content")) for m in blocking.json()["messages"]] == [
        ("user_message", "hi"),
        ("assistant_message", "Hello"),
    ]
    messages = [data for _, data in streamed if isinstance(data, dict) and "message_type" in data]
    assert [
        m["message_type"] for m in messages if m["message_type"] not in ("stop_reason", "usage_statistics")
    ] == ["assistant_message"]
