"""POST /v1/chat/completions with the official `openai` client, unpatched, against a live server.

The server is pytest-django's threaded live server in this process; each send runs in a real Celery worker
process calling the scripted LLM, with the agent's memory tools. Nothing leaves the loopback interface.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from django.db import connections

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.models import Message, Run
from apps.api import sse
from apps.core.actor import Actor, Role
from apps.memory.models import Block
from tests.api.test_messages_api import new_agent
from tests.support.ade_server import AdeServer
from tests.support.scripted_llm import error, text, tool_call, tool_calls
from tests.support.workers import worker_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_persistent_connections_in_server_threads() -> Iterator[None]:
    """The live server answers each request in a new thread; with persistent connections each would leave
    a database session open and the test database could not be dropped."""
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


@pytest.fixture(autouse=True)
def _short_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "FOLLOW_TIMEOUT_S", 30.0)


def openai_for(live_server: Any, actor: Actor) -> openai.OpenAI:
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="openai").raw_key
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture
def client(live_server: Any, actor: Actor) -> openai.OpenAI:
    return openai_for(live_server, actor)


def remember_sam() -> list[dict[str, Any]]:
    return [
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        text("Nice to meet you, Sam!"),
    ]


def human(actor: Actor) -> str:
    return Block.objects.for_actor(actor).get(label="human").value


# --- blocking --------------------------------------------------------------------------------------------


def test_a_completion_is_the_agents_answer_and_its_memory_edit_sticks(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(*remember_sam())

    completion = client.chat.completions.create(
        model=agent.id,
        messages=[
            {"role": "system", "content": "You are a pirate."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Ahoy"},
            {"role": "user", "content": "My name is Sam"},
        ],
    )

    run = Run.objects.for_actor(actor).get()
    assert completion.object == "chat.completion"
    assert completion.id == f"chatcmpl-{run.id}"
    assert completion.model == "gpt-4o-mini"
    assert len(completion.choices) == 1
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == "Nice to meet you, Sam!"
    assert completion.choices[0].finish_reason == "stop"
    assert (
        completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    assert completion.usage.total_tokens > 0
    assert human(actor) == "Name: Sam"
    assert list(Message.objects.for_actor(actor).filter(role="user").values_list("text", flat=True)) == [
        "My name is Sam"
    ]
    assert len(llm.chat_requests()) == 2
    assert (run.status, run.stop_reason) == ("completed", "end_turn")


def test_text_parts_are_sent_as_the_message(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("Two parts received."))

    completion = client.chat.completions.create(
        model=agent.id,
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}]}
        ],
    )

    assert completion.choices[0].message.content == "Two parts received."
    assert Message.objects.for_actor(actor).get(role="user").content == [
        {"type": "text", "text": "one "},
        {"type": "text", "text": "two"},
    ]


def test_what_the_agent_says_in_several_steps_is_one_answer(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(
        tool_calls(
            tool_call("memory_insert", {"label": "human", "new_string": "Hikes"}), text="Let me note that."
        ),
        text("Noted: you hike."),
    )

    completion = client.chat.completions.create(
        model=agent.id, messages=[{"role": "user", "content": "I hike"}]
    )

    assert completion.choices[0].message.content == "Let me note that.\n\nNoted: you hike."


def test_a_member_may_talk_to_an_agent_someone_else_created(
    live_server, actor, org, make_user, llm, celery_worker
):
    agent = new_agent(actor)
    member = make_user(org, role=Role.MEMBER)
    client = openai_for(live_server, Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER))
    llm.push(text("Hello, colleague."))

    completion = client.chat.completions.create(model=agent.id, messages=[{"role": "user", "content": "hi"}])

    assert completion.choices[0].message.content == "Hello, colleague."


def test_an_llm_failure_is_a_502_the_client_does_not_retry(live_server, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(error(500, "provider down", times=3))
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="retrying").raw_key
    retrying = openai.OpenAI(base_url=live_server.url + "/v1", api_key=key, max_retries=2, timeout=30)

    with pytest.raises(openai.InternalServerError) as caught:
        retrying.chat.completions.create(model=agent.id, messages=[{"role": "user", "content": "hi"}])

    assert caught.value.status_code == 502
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert Run.objects.for_actor(actor).get().status == "failed"
    assert Message.objects.for_actor(actor).filter(role="user").count() == 1


# --- streaming -------------------------------------------------------------------------------------------


def test_a_stream_is_chunks_of_the_answer_ending_with_the_finish_and_usage(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(*remember_sam())

    chunks = list(
        client.chat.completions.create(
            model=agent.id,
            messages=[{"role": "user", "content": "My name is Sam"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    run = Run.objects.for_actor(actor).get()
    with_choices = [c for c in chunks if c.choices]
    pieces = [c.choices[0].delta.content for c in with_choices if c.choices[0].delta.content]
    assert {c.id for c in chunks} == {f"chatcmpl-{run.id}"}
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert {c.model for c in chunks} == {"gpt-4o-mini"}
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert "".join(pieces) == "Nice to meet you, Sam!"
    assert len(pieces) > 1  # token by token
    assert [c.choices[0].finish_reason for c in with_choices] == [None] * (len(with_choices) - 1) + ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.total_tokens > 0
    assert human(actor) == "Name: Sam"


def test_a_stream_joins_messages_as_the_blocking_answer_does(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(
        tool_calls(
            tool_call("memory_insert", {"label": "human", "new_string": "Hikes"}), text="Let me note that."
        ),
        text("Noted: you hike."),
    )

    stream = client.chat.completions.create(
        model=agent.id, messages=[{"role": "user", "content": "I hike"}], stream=True
    )

    text_ = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text_ == "Let me note that.\n\nNoted: you hike."
    assert "Hikes" in human(actor)


def test_a_run_that_fails_mid_stream_raises_in_the_client(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(error(500, "provider down", times=3))

    stream = client.chat.completions.create(
        model=agent.id, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    with pytest.raises(openai.APIError) as caught:
        list(stream)

    assert caught.value.body["type"] == "llm_api_error"
    assert caught.value.message == caught.value.body["message"]
    assert Run.objects.for_actor(actor).get().status == "failed"


@pytest.fixture(scope="module")
def daphne(django_db_setup, scripted_server, tmp_path_factory) -> Iterator[AdeServer]:
    """`daphne config.asgi:application`, as `make run` serves, on the test database."""
    server = AdeServer(
        worker_env(scripted_server.url), Path(tmp_path_factory.mktemp("daphne-chat"))
    ).wait_ready()
    yield server
    server.stop()


def test_a_stream_through_daphne(daphne, actor, llm, celery_worker):
    agent = new_agent(actor)
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="asgi").raw_key
    client = openai.OpenAI(base_url=daphne.url + "/v1", api_key=key, max_retries=0, timeout=30)
    llm.push(*remember_sam())

    stream = client.chat.completions.create(
        model=agent.id, messages=[{"role": "user", "content": "My name is Sam"}], stream=True
    )

    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Nice to meet you, Sam!"
    assert human(actor) == "Name: Sam"


def test_a_blocking_completion_through_daphne(daphne, actor, llm, celery_worker):
    """Under daphne a blocking send's wait is the event loop's; a completion still gets its answer."""
    agent = new_agent(actor)
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="asgi").raw_key
    client = openai.OpenAI(base_url=daphne.url + "/v1", api_key=key, max_retries=0, timeout=30)
    llm.push(*remember_sam())

    completion = client.chat.completions.create(
        model=agent.id, messages=[{"role": "user", "content": "My name is Sam"}]
    )

    assert completion.choices[0].message.content == "Nice to meet you, Sam!"
    assert completion.id.startswith("chatcmpl-run-")
    assert human(actor) == "Name: Sam"


# --- refusals (no run is started) ------------------------------------------------------------------------


def test_an_unknown_agent_is_404_in_lettas_shape(client, actor):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(
            model="agent-00000000-0000-4000-8000-000000000000", messages=[{"role": "user", "content": "hi"}]
        )

    assert (
        caught.value.body["detail"] == "Agent with id 'agent-00000000-0000-4000-8000-000000000000' not found"
    )
    assert not Run.objects.for_actor(actor).exists()


def test_another_organisations_agent_is_404_and_nothing_is_stored(live_server, actor, other_org_actor, llm):
    agent = new_agent(actor)
    stranger = openai_for(live_server, other_org_actor)

    with pytest.raises(openai.NotFoundError):
        stranger.chat.completions.create(model=agent.id, messages=[{"role": "user", "content": "hi"}])

    assert not Run.objects.for_actor(actor).exists()
    assert not Message.objects.for_actor(actor).filter(role="user").exists()


def test_a_model_that_is_not_an_agent_id_is_400(client, actor):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])

    assert caught.value.body["detail"].startswith(
        "For this endpoint, the 'model' field should contain an agent ID"
    )


def test_a_request_without_a_user_message_is_400(client, actor, llm):
    agent = new_agent(actor)

    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=agent.id, messages=[{"role": "system", "content": "Be brief."}])

    assert caught.value.body["detail"].startswith("No user message found in the request.")
    assert not Run.objects.for_actor(actor).exists()


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"n": 2}, "n"), ({"temperature": 3}, "temperature")],
)
def test_out_of_range_parameters_are_422(client, actor, llm, extra, field):
    agent = new_agent(actor)

    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.chat.completions.create(model=agent.id, messages=[{"role": "user", "content": "hi"}], **extra)

    assert field in caught.value.body["errors"]
    assert not Run.objects.for_actor(actor).exists()


def test_an_image_part_is_422(client, actor, llm):
    agent = new_agent(actor)
    content = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]

    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model=agent.id, messages=[{"role": "user", "content": content}])

    assert not Run.objects.for_actor(actor).exists()


def test_a_wrong_key_is_401(live_server, actor, llm):
    agent = new_agent(actor)
    wrong = openai.OpenAI(base_url=live_server.url + "/v1", api_key="sk-let-wrong", max_retries=0, timeout=10)

    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=agent.id, messages=[{"role": "user", "content": "hi"}])

    assert not Run.objects.for_actor(actor).exists()
