"""/v1/conversations (issue 18): update, delete, fork, compact, recompile, message order, the agent-direct
routes, stream retrieve, and the role matrix's CONVERSATION_WRITE, through DRF's APIClient.

Sends run for real (a Celery worker process against the scripted LLM); compaction calls the scripted LLM
from the request itself, as Letta's does.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from apps.agents.locks import conversation_lock
from apps.agents.models import Agent, Conversation, Message, Run
from apps.agents.services import conversation_create
from apps.agents.system_messages import THREAD_SYSTEM_MESSAGE, thread_system_message_id
from apps.core.actor import Actor, Role
from apps.core.permissions import Action, allows
from apps.memory.models import Block
from apps.streams.events import append_event, end_stream
from tests.api.test_messages_api import new_agent, sse_events, user
from tests.api.test_runs_api import make_run, message_event
from tests.factories import MessageFactory
from tests.support.scripted_llm import error, text

worker = pytest.mark.django_db(transaction=True)

NOT_REDUCED = (
    "Summarization failed to reduce the number of messages. You may not have enough messages to compact "
    "or need to use a different CompactionSettings (e.g. using `all` mode)."
)


@pytest.fixture
def client(actor: Actor, api_client_for: Any) -> APIClient:
    return api_client_for(actor)


def seed(actor: Actor, agent: Agent, conversation: Conversation | None, *texts: str) -> list[Message]:
    """Stored messages, alternately the user's and the agent's, that are the thread's context window."""
    rows = [
        MessageFactory(
            organization_id=actor.organization_id,
            agent=agent,
            conversation=conversation,
            role="user" if index % 2 == 0 else "assistant",
            text=body,
        )
        for index, body in enumerate(texts)
    ]
    holder: Agent | Conversation = conversation or agent
    holder.message_ids = [*holder.message_ids, *(row.id for row in rows)]
    holder.save(update_fields=["message_ids"])
    return rows


def in_context(conversation: Conversation) -> list[str]:
    return Conversation.objects.unscoped().get(id=conversation.id).message_ids


def contents(messages: list[dict[str, Any]]) -> list[Any]:
    """The messages' contents, without the thread's stored system message (checked where it matters)."""
    return [m.get("content") for m in messages if m["message_type"] != "system_message"]


def conversation_messages(actor: Actor) -> list[Message]:
    """The organisation's stored messages besides threads' system messages."""
    return list(Message.objects.for_actor(actor).exclude(THREAD_SYSTEM_MESSAGE))


# --- update and delete ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_conversation_is_renamed_and_a_null_keeps_the_summary(client, actor):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id, summary="trip")

    renamed = client.patch(f"/v1/conversations/{conversation.id}", {"summary": "Trip to Rome"}, format="json")
    kept = client.patch(f"/v1/conversations/{conversation.id}", {"summary": None}, format="json")

    assert renamed.status_code == 200
    assert renamed.json()["summary"] == "Trip to Rome"
    assert kept.json()["summary"] == "Trip to Rome"
    assert Conversation.objects.for_actor(actor).get().summary == "Trip to Rome"


@pytest.mark.django_db
def test_a_model_override_is_refused_rather_than_dropped(client, actor):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id, summary="trip")

    response = client.patch(
        f"/v1/conversations/{conversation.id}", {"summary": "new", "model": "openai/gpt-4o"}, format="json"
    )

    assert response.status_code == 400
    assert "model" in response.json()["detail"]
    assert Conversation.objects.for_actor(actor).get().summary == "trip"


@pytest.mark.django_db
def test_deleting_a_conversation_removes_it_its_runs_and_its_messages(client, actor):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    make_run(actor, agent, conversation=conversation, status="completed", stop_reason="end_turn")
    seed(actor, agent, conversation, "hi", "hello")
    seed(actor, agent, None, "in the default thread")

    response = client.delete(f"/v1/conversations/{conversation.id}")

    assert response.status_code == 200
    assert response.json() is None
    assert not Conversation.objects.for_actor(actor).exists()
    assert not Run.objects.for_actor(actor).exists()
    assert [m.text for m in conversation_messages(actor)] == ["in the default thread"]
    assert not Message.objects.for_actor(actor).filter(id=thread_system_message_id(agent.id, conversation.id))
    assert client.get(f"/v1/conversations/{conversation.id}").status_code == 404


@pytest.mark.django_db
def test_a_conversation_with_a_run_in_progress_is_not_deleted(client, actor):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    make_run(actor, agent, conversation=conversation, status="running")

    response = client.delete(f"/v1/conversations/{conversation.id}")

    assert response.status_code == 409
    assert Conversation.objects.for_actor(actor).exists()


# --- fork -------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_fork_shares_the_sources_messages_without_its_system_messages(client, actor):
    agent = new_agent(actor)
    source = conversation_create(actor=actor, agent_id=agent.id, summary="source")
    [question, answer] = seed(actor, agent, source, "What is the capital of Italy?", "Rome.")
    alert = MessageFactory(
        organization_id=actor.organization_id, agent=agent, conversation=source, role="system", text="alert"
    )
    source.message_ids = [alert.id, question.id, answer.id]
    source.save(update_fields=["message_ids"])

    response = client.post(f"/v1/conversations/{source.id}/fork")

    fork = response.json()
    assert response.status_code == 200
    assert fork["id"] != source.id
    assert fork["agent_id"] == agent.id
    own_system = thread_system_message_id(agent.id, fork["id"])
    assert fork["in_context_message_ids"] == [own_system, question.id, answer.id]
    assert len(conversation_messages(actor)) == 3  # shared, not copied
    listed = client.get(f"/v1/conversations/{fork['id']}/messages", {"order": "asc"}).json()
    assert [m["id"] for m in listed] == [own_system, question.id, answer.id]
    assert in_context(source) == [alert.id, question.id, answer.id]


@worker
def test_a_fork_goes_its_own_way_and_keeps_its_past_when_the_source_is_deleted(
    client, actor, llm, celery_worker
):
    agent = new_agent(actor)
    source = client.post(f"/v1/conversations/?agent_id={agent.id}", {}, format="json").json()
    llm.push(text("Rome."), text("About 2.8 million."))
    client.post(
        f"/v1/conversations/{source['id']}/messages",
        {**user("What is the capital of Italy?"), "streaming": False},
        format="json",
    )
    fork = client.post(f"/v1/conversations/{source['id']}/fork").json()

    client.post(
        f"/v1/conversations/{fork['id']}/messages",
        {**user("How many people live there?"), "streaming": False},
        format="json",
    )
    deleted = client.delete(f"/v1/conversations/{source['id']}")

    assert deleted.status_code == 200
    listed = client.get(f"/v1/conversations/{fork['id']}/messages", {"order": "asc"}).json()
    assert contents(listed) == [
        "What is the capital of Italy?",
        "Rome.",
        "How many people live there?",
        "About 2.8 million.",
    ]
    last_request = [m["content"] for m in llm.chat_requests()[-1]["messages"][1:]]
    assert last_request == ["What is the capital of Italy?", "Rome.", "How many people live there?"]
    assert Conversation.objects.for_actor(actor).get().message_count == 4


@pytest.mark.parametrize("form", ["agent_id", "default"])
@pytest.mark.django_db
def test_the_default_thread_is_forked_agent_direct(client, actor, form):
    agent = new_agent(actor)
    rows = seed(actor, agent, None, "hi", "hello")
    path = f"/v1/conversations/{agent.id}/fork" if form == "agent_id" else "/v1/conversations/default/fork"

    response = client.post(path + ("" if form == "agent_id" else f"?agent_id={agent.id}"))

    assert response.status_code == 200
    fork = Conversation.objects.for_actor(actor).get()
    assert response.json()["in_context_message_ids"] == [
        thread_system_message_id(agent.id, fork.id),
        *(row.id for row in rows),
    ]
    assert fork.agent_id == agent.id


# --- message order ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_conversation_messages_list_newest_first_by_default_and_oldest_first_when_asked(client, actor):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    seed(actor, agent, conversation, "one", "two", "three")
    path = f"/v1/conversations/{conversation.id}/messages"

    newest_first = client.get(path).json()
    oldest_first = client.get(path, {"order": "asc"}).json()
    newest_two = client.get(path, {"order": "desc", "limit": 2}).json()

    assert contents(newest_first) == ["three", "two", "one"]
    assert newest_first[-1]["message_type"] == "system_message"  # the oldest
    assert contents(oldest_first) == ["one", "two", "three"]
    assert oldest_first[0]["id"] == thread_system_message_id(agent.id, conversation.id)
    assert contents(newest_two) == ["three", "two"]
    assert len(newest_two) == 2


# --- recompile --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_recompile_renders_current_memory_and_a_dry_run_stores_nothing(client, actor, llm):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    seed(actor, agent, conversation, "hi")
    Block.objects.for_actor(actor).filter(label="human").update(value="Name: Ada")
    before = (Message.objects.for_actor(actor).count(), in_context(conversation))

    dry = client.post(f"/v1/conversations/{conversation.id}/recompile?dry_run=true", {}, format="json")
    saved = client.post(f"/v1/conversations/{conversation.id}/recompile", {}, format="json")

    assert dry.status_code == saved.status_code == 200
    assert isinstance(dry.json(), str)
    assert "Name: Ada" in dry.json()
    assert "I am a helpful assistant." in dry.json()
    assert saved.json() == dry.json()
    assert (Message.objects.for_actor(actor).count(), in_context(conversation)) == before


# --- compact ----------------------------------------------------------------------------------------------


@worker
def test_compacting_a_conversation_summarises_its_past_into_one_message(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    conversation = client.post(f"/v1/conversations/?agent_id={agent.id}", {}, format="json").json()
    long_answer = "Lovely! " * 40  # the recent tail the sliding window keeps: this answer alone
    for question, answer in (("I am Sam", "Hi Sam"), ("I like tea", "Noted"), ("And hiking", long_answer)):
        llm.push(text(answer))
        client.post(
            f"/v1/conversations/{conversation['id']}/messages",
            {**user(question), "streaming": False},
            format="json",
        )
    llm.push(text("Sam likes tea and hiking."))

    response = client.post(f"/v1/conversations/{conversation['id']}/compact", {}, format="json")

    assert response.status_code == 200, response.content
    assert response.json() == {
        "summary": "Sam likes tea and hiking.",
        "num_messages_before": 6,
        "num_messages_after": 2,
    }
    summarised = llm.last_chat_request()["messages"][1]["content"]
    assert summarised.splitlines() == [
        "user: I am Sam",
        "assistant: Hi Sam",
        "user: I like tea",
        "assistant: Noted",
        "user: And hiking",
    ]
    ids = Conversation.objects.for_actor(actor).get().message_ids
    summary = Message.objects.for_actor(actor).get(id=ids[0])
    assert summary.role == "summary"
    assert summary.text.endswith("Sam likes tea and hiking.")
    assert Message.objects.for_actor(actor).get(id=ids[1]).text == long_answer
    assert Message.objects.for_actor(actor).filter(role="user").count() == 3  # still in recall


@pytest.mark.django_db
def test_compacting_in_all_mode_keeps_only_the_summary(client, actor, llm):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    seed(actor, agent, conversation, "hi", "hello")
    llm.push(text("They greeted each other."))

    response = client.post(
        f"/v1/conversations/{conversation.id}/compact",
        {"compaction_settings": {"mode": "all"}},
        format="json",
    )

    assert response.json() == {
        "summary": "They greeted each other.",
        "num_messages_before": 2,
        "num_messages_after": 1,
    }
    assert len(in_context(conversation)) == 1


@pytest.mark.django_db
def test_compacting_too_little_or_nothing_is_a_400_and_calls_no_model(client, actor, llm):
    agent = new_agent(actor)
    empty = conversation_create(actor=actor, agent_id=agent.id)
    short = conversation_create(actor=actor, agent_id=agent.id)
    seed(actor, agent, short, "hi", "hello")

    nothing = client.post(f"/v1/conversations/{empty.id}/compact", {}, format="json")
    too_little = client.post(f"/v1/conversations/{short.id}/compact", {}, format="json")

    assert (nothing.status_code, nothing.json()["detail"]) == (
        400,
        "No in-context messages found for this conversation.",
    )
    assert (too_little.status_code, too_little.json()["detail"]) == (400, NOT_REDUCED)
    assert llm.chat_requests() == []
    assert len(in_context(short)) == 2


@pytest.mark.django_db
def test_a_compaction_while_a_run_executes_is_a_409(client, actor, llm):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    seed(actor, agent, conversation, "a", "b", "c", "d")
    held, release = threading.Event(), threading.Event()

    def executor() -> None:  # what a worker executing a run of the conversation holds
        with conversation_lock(agent.id, conversation.id):
            held.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=executor)
    thread.start()
    held.wait(10)
    try:
        response = client.post(f"/v1/conversations/{conversation.id}/compact", {}, format="json")
    finally:
        release.set()
        thread.join()

    assert response.status_code == 409
    assert llm.chat_requests() == []
    assert len(in_context(conversation)) == 4


@pytest.mark.django_db
def test_a_failing_summariser_is_a_502_and_changes_nothing(client, actor, llm):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    seed(actor, agent, conversation, "a", "b", "c", "d")
    llm.push(error(500, "down", times=3))

    response = client.post(f"/v1/conversations/{conversation.id}/compact", {}, format="json")

    assert response.status_code == 502
    assert response.json()["detail"].startswith("LLM provider error:")
    assert len(in_context(conversation)) == 4
    assert not Message.objects.for_actor(actor).filter(role="summary").exists()


# --- agent-direct mode ------------------------------------------------------------------------------------


@worker
def test_an_agent_id_as_conversation_id_is_the_agents_default_thread(client, actor, llm, celery_worker):
    agent = new_agent(actor)
    llm.push(text("Hello from the default thread"))

    sent = sse_events(client.post(f"/v1/conversations/{agent.id}/messages", user("hi"), format="json"))
    listed = client.get(f"/v1/conversations/{agent.id}/messages", {"order": "asc"}).json()
    recompiled = client.post(f"/v1/conversations/{agent.id}/recompile", {}, format="json")
    cancelled = client.post(f"/v1/conversations/{agent.id}/cancel")
    streamed = client.post(f"/v1/conversations/{agent.id}/stream", {}, format="json")

    assert [d for _, d in sent][-1] == "[DONE]"
    assert contents(listed) == ["hi", "Hello from the default thread"]
    assert listed[0]["id"] == thread_system_message_id(agent.id, None)
    assert contents(client.get(f"/v1/agents/{agent.id}/messages", {"order": "asc"}).json()) == contents(
        listed
    )
    assert not Conversation.objects.for_actor(actor).exists()
    assert "Name: unknown" in recompiled.json()
    assert cancelled.status_code == 409  # nothing active
    assert streamed.status_code == 400
    assert Run.objects.for_actor(actor).get().conversation_id is None


@pytest.mark.django_db
def test_the_default_thread_is_compacted_agent_direct(client, actor, llm):
    agent = new_agent(actor)
    seed(actor, agent, None, "a", "b", "c", "d")
    llm.push(text("Letters."))

    by_id = client.post(f"/v1/conversations/{agent.id}/compact", {}, format="json")

    assert by_id.json() == {"summary": "Letters.", "num_messages_before": 4, "num_messages_after": 2}
    assert len(Agent.objects.for_actor(actor).get().message_ids) == 2


@pytest.mark.django_db
def test_default_needs_an_agent_id_and_update_delete_take_conversation_ids_only(client, actor):
    agent = new_agent(actor)

    without_agent = client.post("/v1/conversations/default/compact", {}, format="json")
    patched = client.patch(f"/v1/conversations/{agent.id}", {"summary": "x"}, format="json")
    deleted = client.delete(f"/v1/conversations/{agent.id}")

    assert without_agent.status_code == 400
    assert (patched.status_code, deleted.status_code) == (404, 404)
    assert Agent.objects.for_actor(actor).exists()


# --- stream retrieve --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_stream_retrieve_is_a_400_without_an_active_background_run(client, actor):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    path = f"/v1/conversations/{conversation.id}/stream"

    none_active = client.post(path, {}, format="json")
    make_run(actor, agent, conversation=conversation, status="running", background=False)
    not_background = client.post(path, {}, format="json")

    assert (none_active.status_code, none_active.json()["detail"]) == (
        400,
        "No active runs found for this conversation.",
    )
    assert (not_background.status_code, not_background.json()["detail"]) == (
        400,
        "Run was not created in background mode, so it cannot be retrieved.",
    )


@pytest.mark.django_db
def test_stream_retrieve_replays_a_finished_run_by_id_or_otid(client, actor, fast_streams):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    run = make_run(actor, agent, conversation=conversation, status="completed", stop_reason="end_turn")
    MessageFactory(
        organization_id=actor.organization_id, agent=agent, conversation=conversation, run=run, otid="otid-1"
    )
    reply = MessageFactory(
        organization_id=actor.organization_id,
        agent=agent,
        conversation=conversation,
        run=run,
        role="assistant",
        text="Done.",
    )
    append_event(run.id, message_event(reply))
    append_event(run.id, {"message_type": "stop_reason", "stop_reason": "end_turn"})
    end_stream(run.id, status="completed", stop_reason="end_turn")
    path = f"/v1/conversations/{conversation.id}/stream"

    by_run = [d for _, d in sse_events(client.post(path, {"run_id": run.id}, format="json"))]
    by_otid = [d for _, d in sse_events(client.post(path, {"otid": "otid-1"}, format="json"))]
    unknown = client.post(path, {"otid": "otid-unknown"}, format="json")

    assert [d["message_type"] if isinstance(d, dict) else d for d in by_run] == [
        "assistant_message",
        "stop_reason",
        "usage_statistics",
        "[DONE]",
    ]
    assert by_run[0]["content"] == "Done."
    assert by_otid == by_run
    assert unknown.status_code == 404


@worker
def test_stream_retrieve_follows_the_active_background_run(client, actor, llm, celery_worker, fast_streams):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    llm.push(text("Slowly done", latency=1.5))
    started = client.post(
        f"/v1/conversations/{conversation.id}/messages",
        {**user("go"), "background": True, "streaming": True},
        format="json",
    )
    started.close()

    events = [
        d
        for _, d in sse_events(client.post(f"/v1/conversations/{conversation.id}/stream", {}, format="json"))
    ]

    items = [
        d["message_type"] if isinstance(d, dict) else d
        for d in events
        if not (isinstance(d, dict) and d["message_type"] == "ping")
    ]
    assert items == ["assistant_message", "stop_reason", "usage_statistics", "[DONE]"]


# --- tenancy ----------------------------------------------------------------------------------------------

NEW_ENDPOINTS = [
    ("patch", "/v1/conversations/{conversation}", {"summary": "x"}),
    ("delete", "/v1/conversations/{conversation}", None),
    ("post", "/v1/conversations/{conversation}/fork", None),
    ("post", "/v1/conversations/{conversation}/compact", {}),
    ("post", "/v1/conversations/{conversation}/recompile", {}),
    ("post", "/v1/conversations/{agent}/fork", None),
    ("post", "/v1/conversations/{agent}/compact", {}),
    ("post", "/v1/conversations/{agent}/recompile", {}),
    ("get", "/v1/conversations/{agent}/messages", None),
    ("post", "/v1/conversations/{agent}/messages", {"input": "hi"}),
    ("post", "/v1/conversations/{agent}/stream", {}),
    ("post", "/v1/conversations/{agent}/cancel", None),
]


@pytest.mark.parametrize(("method", "path", "body"), NEW_ENDPOINTS)
@pytest.mark.django_db
def test_another_organisation_gets_404(api_client_for, actor, other_org_actor, llm, method, path, body):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id, summary="mine")
    seed(actor, agent, conversation, "a", "b", "c", "d")
    seed(actor, agent, None, "a", "b", "c", "d")

    response = getattr(api_client_for(other_org_actor), method)(
        path.format(conversation=conversation.id, agent=agent.id), body, format="json"
    )

    assert response.status_code == 404
    assert Conversation.objects.for_actor(actor).get().summary == "mine"
    assert Conversation.objects.for_actor(actor).count() == 1
    assert len(conversation_messages(actor)) == 8
    assert Message.objects.for_actor(actor).filter(THREAD_SYSTEM_MESSAGE).count() == 2
    assert not Run.objects.for_actor(actor).exists()
    assert llm.chat_requests() == []


@pytest.mark.parametrize(("method", "path", "body"), NEW_ENDPOINTS)
@pytest.mark.django_db
def test_no_key_is_401(actor, method, path, body):
    agent = new_agent(actor)
    conversation = conversation_create(actor=actor, agent_id=agent.id)

    response = getattr(APIClient(), method)(
        path.format(conversation=conversation.id, agent=agent.id), body, format="json"
    )

    assert response.status_code == 401


# --- the role matrix: CONVERSATION_WRITE ---------------------------------------------------------------------

ROLES = ("owner", "admin", "creator", "member")


@pytest.fixture
def people(org, make_user, db) -> dict[str, Actor]:
    actors = {}
    for name, role in (
        ("owner", Role.OWNER),
        ("admin", Role.ADMIN),
        ("creator", Role.MEMBER),
        ("member", Role.MEMBER),
    ):
        person = make_user(org, role=role, username=name)
        actors[name] = Actor(organization_id=org.id, user_id=person.id, role=role)
    return actors


def _summary_of(conversation: Conversation) -> str:
    return Conversation.objects.unscoped().get(id=conversation.id).summary


OPERATIONS = {
    "update": (
        lambda c, conv: c.patch(f"/v1/conversations/{conv.id}", {"summary": "renamed"}, format="json"),
        lambda conv: _summary_of(conv) == "renamed",
    ),
    "delete": (
        lambda c, conv: c.delete(f"/v1/conversations/{conv.id}"),
        lambda conv: not Conversation.objects.unscoped().filter(id=conv.id).exists(),
    ),
    "fork": (
        lambda c, conv: c.post(f"/v1/conversations/{conv.id}/fork"),
        lambda conv: Conversation.objects.unscoped().filter(agent_id=conv.agent_id).count() == 2,
    ),
    "compact": (
        lambda c, conv: c.post(
            f"/v1/conversations/{conv.id}/compact", {"compaction_settings": {"mode": "all"}}, format="json"
        ),
        lambda conv: len(in_context(conv)) == 1,
    ),
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
@pytest.mark.parametrize("role", ROLES)
def test_conversation_writes_follow_the_role_matrix(operation, role, people, api_client_for, llm):
    creator = people["creator"]
    agent = new_agent(creator)
    conversation = conversation_create(actor=creator, agent_id=agent.id, summary="mine")
    seed(creator, agent, conversation, "hi", "hello")
    llm.push(text("A greeting."))
    act, changed = OPERATIONS[operation]
    actor = people[role]
    expected = allows(
        actor, Action.CONVERSATION_WRITE, creator_id=(conversation.created_by_id, agent.created_by_id)
    )

    response = act(api_client_for(actor), conversation)

    if expected:
        assert response.status_code == 200, response.content
        assert changed(conversation)
    else:
        assert response.status_code == 403, response.content
        assert response.json()["detail"].startswith("Not allowed"), response.json()
        assert not changed(conversation)
        assert _summary_of(conversation) == "mine"
        assert llm.chat_requests() == []


def test_a_member_may_change_the_conversation_they_opened_on_someone_elses_agent(people, api_client_for):
    agent = new_agent(people["creator"])
    conversation = conversation_create(actor=people["member"], agent_id=agent.id, summary="mine")

    response = api_client_for(people["member"]).patch(
        f"/v1/conversations/{conversation.id}", {"summary": "renamed"}, format="json"
    )

    assert response.status_code == 200
    assert _summary_of(conversation) == "renamed"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("isolated_block_labels", ["human"]),
        ("model", "openai/gpt-4o"),
        ("model_settings", {"temperature": 0.1}),
    ],
)
def test_create_refuses_by_name_what_a_conversation_cannot_have_here(field, value, actor, api_client_for):
    agent = new_agent(actor)

    response = api_client_for(actor).post(
        f"/v1/conversations/?agent_id={agent.id}", {field: value}, format="json"
    )

    assert response.status_code == 422
    assert response.json()["detail"].startswith(f"{field}: not supported")
    assert not agent.conversations.exists()
