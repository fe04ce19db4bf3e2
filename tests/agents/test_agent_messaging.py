"""Agent-to-agent messaging (apps/agents/agent_messaging.py): Letta's letta_multi_agent_core tools.

Most tests run the sender's turn in this process (the `send` fixture) with the scripted LLM answering both
agents: a turn scripted `when_last_user_contains=INCOMING` is the receiving agent's (its last user message
is the incoming one), the others the sender's. The end-to-end tests at the bottom drive the official SDK
against the live server, with every run executed by one Celery worker process of ONE thread.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import current_app
from django.db import connection, connections
from letta_client import Letta

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents import agent_messaging, services
from apps.agents.agent_messaging import WAIT_KEY
from apps.agents.locks import conversation_lock
from apps.agents.loop.runner import execute_run_streamed
from apps.agents.models import Agent, AgentType, Message, Run
from apps.agents.recovery import note_task
from apps.agents.services import agent_create
from apps.core.actor import Actor
from apps.streams.redis_client import get_redis
from tests.factories import AgentFactory
from tests.support.scripted_llm import ScriptedLLM, text, tool_call, tool_calls
from tests.support.workers import WorkerProcess, worker_env

INCOMING = "Incoming message from agent with ID"
WAIT = "send_message_to_agent_and_wait_for_reply"
ASYNC = "send_message_to_agent_async"
TAGS = "send_message_to_agents_matching_tags"


def reply_prefix(sender: Agent) -> str:
    return f"[Incoming message from agent with ID '{sender.id}' - your response will be delivered to the sender] "


def tool_returns(result: Any) -> list[dict[str, Any]]:
    return [m.tool_returns[0] for m in result.messages if m.role == "tool"]


def incoming(agent: Agent) -> list[Message]:
    """What other agents sent `agent`: system messages naming the sender, as Letta stores them."""
    return list(
        Message.all_objects.filter(agent=agent, role="system").exclude(sender_id="").order_by("sequence_id")
    )


def runs_of(agent: Agent) -> list[Run]:
    return list(Run.all_objects.filter(agent=agent).order_by("created_at"))


@pytest.fixture
def sender(make_agent: Callable[..., Agent]) -> Agent:
    return make_agent(name="Asker", tools=[WAIT, ASYNC, TAGS])


@contextmanager
def lock_held_elsewhere(agent: Agent, then: Callable[[], None] | None = None) -> Iterator[threading.Event]:
    """Another database session (another worker, as far as the waiting step can tell) holds the agent's
    conversation lock until the returned event is set, then runs `then` while still holding it."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with conversation_lock(agent.id, None) as acquired:
                assert acquired
                taken.set()
                release.wait(30)
                if then is not None:
                    then()
        finally:
            connection.close()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert taken.wait(10)
    try:
        yield release
    finally:
        release.set()
        holder.join(30)


# --- send_message_to_agent_and_wait_for_reply -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_reply_of_the_other_agent_is_the_tool_result_and_its_message_names_the_sender(
    sender, make_agent, send, llm, api_client_for, actor
):
    other = make_agent(name="Oracle")
    llm.push(
        tool_calls(tool_call(WAIT, {"message": "What is 2+2?", "other_agent_id": other.id})),
        text("Four.", when_last_user_contains=INCOMING),
        text("The oracle says four."),
    )

    result = send(sender, "ask the oracle")

    assert tool_returns(result)[0]["status"] == "success"
    assert json.loads(tool_returns(result)[0]["tool_return"]) == {"agent_id": other.id, "response": ["Four."]}
    assert result.messages[-1].text == "The oracle says four."
    [received] = incoming(other)
    assert received.text == reply_prefix(sender) + "What is 2+2?"
    assert (received.sender_id, received.name) == (sender.id, "Asker")
    assert [(r.status, r.stop_reason) for r in runs_of(other)] == [("completed", "end_turn")]
    assert llm.chat_requests()[1]["messages"][-1] == {"role": "user", "content": received.text}
    [asking] = runs_of(sender)
    assert api_client_for(actor).get(f"/v1/runs/{runs_of(other)[0].id}").json()["metadata"] == {
        "run_type": WAIT,
        "sender_agent_id": sender.id,
        "sender_run_id": asking.id,
    }


@pytest.mark.django_db(transaction=True)
def test_asking_the_same_agent_twice_gets_both_replies(sender, make_agent, send, llm):
    other = make_agent(name="Oracle")
    llm.push(
        tool_calls(tool_call(WAIT, {"message": "first?", "other_agent_id": other.id})),
        text("one", when_last_user_contains=INCOMING),
        tool_calls(tool_call(WAIT, {"message": "second?", "other_agent_id": other.id})),
        text("two", when_last_user_contains=INCOMING),
        text("done"),
    )

    result = send(sender, "ask twice")

    assert [json.loads(r["tool_return"])["response"] for r in tool_returns(result)] == [["one"], ["two"]]
    assert [m.text.removeprefix(reply_prefix(sender)) for m in incoming(other)] == ["first?", "second?"]
    assert [r.status for r in runs_of(other)] == ["completed", "completed"]


@pytest.mark.django_db(transaction=True)
def test_a_legacy_agent_replies_through_send_message(sender, make_agent, send, llm):
    other = make_agent(name="Legacy", agent_type=AgentType.MEMGPT_V2)
    llm.push(
        tool_calls(tool_call(WAIT, {"message": "hello?", "other_agent_id": other.id})),
        tool_calls(tool_call("send_message", {"message": "hello back"}), when_last_user_contains=INCOMING),
        text("ok"),
    )

    result = send(sender, "greet the legacy agent")

    assert json.loads(tool_returns(result)[0]["tool_return"]) == {
        "agent_id": other.id,
        "response": ["hello back"],
    }


@pytest.mark.django_db(transaction=True)
def test_waiting_on_each_other_is_a_cycle_returned_as_an_error_not_a_hang(make_agent, send, llm):
    first = make_agent(name="First", tools=[WAIT])
    second = make_agent(name="Second", tools=[WAIT])
    llm.push(
        tool_calls(tool_call(WAIT, {"message": "ping", "other_agent_id": second.id})),
        tool_calls(
            tool_call(WAIT, {"message": "pong?", "other_agent_id": first.id}),
            when_last_user_contains=INCOMING,
        ),
        text("I could not ask you back.", when_last_user_contains=INCOMING),
        text("finished"),
    )

    result = send(first, "start")

    [second_run] = runs_of(second)
    second_return = Message.all_objects.get(run=second_run, role="tool").tool_returns[0]
    assert second_return["status"] == "error"
    assert second_return["tool_return"] == agent_messaging._cycle_message(first.id)
    assert json.loads(tool_returns(result)[0]["tool_return"]) == {
        "agent_id": second.id,
        "response": ["I could not ask you back."],
    }
    assert (result.run.status, second_run.status) == ("completed", "completed")
    assert len(runs_of(first)) == 1  # nothing was delivered to the first agent


def test_an_agent_cannot_wait_for_itself(sender, send, llm):
    llm.push(tool_calls(tool_call(WAIT, {"message": "me?", "other_agent_id": sender.id})), text("right"))

    result = send(sender, "ask yourself")

    assert tool_returns(result)[0] == {
        **tool_returns(result)[0],
        "status": "error",
        "tool_return": "You cannot wait for a reply from yourself.",
    }
    assert len(runs_of(sender)) == 1


@pytest.mark.django_db(transaction=True)
def test_a_wait_registered_by_another_worker_closes_a_cycle(sender, make_agent, send, llm):
    other = make_agent(name="Elsewhere")
    # The other agent's step waits, in another worker, for the sender: the registry says so.
    get_redis().zadd(WAIT_KEY.format(agent_id=other.id), {f"{sender.id}|elsewhere": time.time() + 60})
    llm.push(tool_calls(tool_call(WAIT, {"message": "hi", "other_agent_id": other.id})), text("ok"))

    try:
        result = send(sender, "ask")
    finally:
        get_redis().delete(WAIT_KEY.format(agent_id=other.id))

    assert tool_returns(result)[0]["status"] == "error"
    assert tool_returns(result)[0]["tool_return"] == agent_messaging._cycle_message(other.id)
    assert runs_of(other) == []
    assert not get_redis().exists(WAIT_KEY.format(agent_id=sender.id))  # its own wait is unregistered


def test_another_organisations_agent_is_not_found_like_a_missing_one(sender, send, llm, other_org_actor):
    foreign = AgentFactory(organization_id=other_org_actor.organization_id)
    llm.push(
        tool_calls(
            tool_call(WAIT, {"message": "hi", "other_agent_id": foreign.id}),
            tool_call(ASYNC, {"message": "hi", "other_agent_id": foreign.id}),
            tool_call(WAIT, {"message": "hi", "other_agent_id": "agent-missing"}),
        ),
        text("nobody there"),
    )

    result = send(sender, "reach out")

    assert [(r["status"], r["tool_return"]) for r in tool_returns(result)] == [
        ("error", f"Agent with id '{foreign.id}' not found"),
        ("error", f"Agent with id '{foreign.id}' not found"),
        ("error", "Agent with id 'agent-missing' not found"),
    ]
    assert (runs_of(foreign), incoming(foreign)) == ([], [])


@pytest.mark.django_db(transaction=True)
def test_a_busy_agent_is_waited_for_then_its_run_executes_here(sender, make_agent, send, llm, settings):
    other = make_agent(name="Busy")
    llm.push(
        tool_calls(tool_call(WAIT, {"message": "when free?", "other_agent_id": other.id})),
        text("now", when_last_user_contains=INCOMING),
        text("ok"),
    )

    with lock_held_elsewhere(other) as release:
        threading.Timer(0.6, release.set).start()
        started = time.monotonic()
        result = send(sender, "ask the busy one")

    assert time.monotonic() - started >= 0.6
    assert json.loads(tool_returns(result)[0]["tool_return"]) == {"agent_id": other.id, "response": ["now"]}


@pytest.mark.django_db(transaction=True)
def test_a_run_another_executor_claims_is_followed_to_its_end(sender, make_agent, send, llm):
    other = make_agent(name="Taken")
    llm.push(
        tool_calls(tool_call(WAIT, {"message": "who answers?", "other_agent_id": other.id})),
        text("the other worker", when_last_user_contains=INCOMING, latency=0.3),
        text("ok"),
    )

    def execute_it_there() -> None:  # the holder of the lock executes the queued run itself
        deadline = time.monotonic() + 10
        while not (queued := Run.all_objects.filter(agent=other, status="created").first()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        execute_run_streamed(queued.id, agent_id=other.id, conversation_id=None)

    with lock_held_elsewhere(other, then=execute_it_there) as release:
        release.set()
        result = send(sender, "ask")

    assert json.loads(tool_returns(result)[0]["tool_return"]) == {
        "agent_id": other.id,
        "response": ["the other worker"],
    }


@pytest.mark.django_db(transaction=True)
def test_no_reply_within_the_timeout_is_an_error_and_cancels_the_request(
    sender, make_agent, send, llm, settings
):
    settings.AGENT_REPLY_TIMEOUT = 0.5
    other = make_agent(name="Never")
    llm.push(
        tool_calls(tool_call(WAIT, {"message": "hello?", "other_agent_id": other.id})), text("no answer")
    )

    with lock_held_elsewhere(other):
        result = send(sender, "ask")

    assert tool_returns(result)[0]["status"] == "error"
    assert tool_returns(result)[0]["tool_return"] == (
        f"Agent '{other.id}' did not reply in time (no reply came within 0.5 s (AGENT_REPLY_TIMEOUT)); your "
        "message to it was cancelled. Try again later, or use send_message_to_agent_async if you need no "
        "reply."
    )
    assert [(r.status, r.started_at) for r in runs_of(other)] == [("cancelled", None)]


@pytest.mark.django_db(transaction=True)
def test_a_reply_that_takes_too_long_is_cut_at_the_timeout(sender, make_agent, send, llm, settings):
    settings.AGENT_REPLY_TIMEOUT = 1.0
    other = make_agent(name="Slow")
    llm.push(
        tool_calls(tool_call(WAIT, {"message": "think hard", "other_agent_id": other.id})),
        text("after a long think", when_last_user_contains=INCOMING, latency=4),
        text("gave up"),
    )

    started = time.monotonic()
    result = send(sender, "ask")

    assert time.monotonic() - started < 3.5
    assert tool_returns(result)[0]["status"] == "error"
    assert "did not reply in time" in tool_returns(result)[0]["tool_return"]
    assert [(r.status, r.stop_reason) for r in runs_of(other)] == [("cancelled", "cancelled")]


@pytest.mark.django_db(transaction=True)
def test_cancelling_the_senders_run_cancels_the_run_it_waits_for(sender, make_agent, actor, send, llm):
    other = make_agent(name="Slow")
    llm.push(
        tool_calls(tool_call(WAIT, {"message": "take your time", "other_agent_id": other.id})),
        text("much later", when_last_user_contains=INCOMING, latency=4),
    )

    def cancel_the_sender() -> None:
        try:
            running = Run.all_objects.get(agent=sender, status="running")
            services.run_cancel(actor=actor, run_id=running.id)
        finally:
            connection.close()

    threading.Timer(0.8, cancel_the_sender).start()
    started = time.monotonic()
    result = send(sender, "ask")

    assert time.monotonic() - started < 3.5
    assert (result.run.status, result.stop_reason) == ("cancelled", "cancelled")
    assert tool_returns(result)[0]["tool_return"] == (
        f"Stopped waiting for agent '{other.id}': your run was cancelled; your message to it was too."
    )
    assert [r.status for r in runs_of(other)] == ["cancelled"]


# --- send_message_to_agent_async --------------------------------------------------------------------------


def test_an_async_message_queues_a_run_of_the_other_agent_and_returns_a_receipt(
    sender, make_agent, send, llm, django_capture_on_commit_callbacks, monkeypatch
):
    other = make_agent(name="Later")
    enqueued: list[tuple[Any, ...]] = []
    monkeypatch.setattr(services, "enqueue_run", lambda *args: enqueued.append(args))
    llm.push(tool_calls(tool_call(ASYNC, {"message": "FYI: done", "other_agent_id": other.id})), text("sent"))

    with django_capture_on_commit_callbacks(execute=True):
        result = send(sender, "tell the other")

    [queued] = runs_of(other)
    assert tool_returns(result)[0]["status"] == "success"
    assert tool_returns(result)[0]["tool_return"] == (
        f"Successfully sent message to agent '{other.id}' (run '{queued.id}')."
    )
    assert queued.status == "created"
    assert enqueued == [(queued.id, other.id, None)]
    assert queued.metadata["run_type"] == ASYNC
    [received] = incoming(other)
    assert received.text == (
        f"[Incoming message from agent with ID '{sender.id}' - to reply to this message, make sure to use the "
        "'send_message_to_agent_async' tool, or the agent will not receive your message] FYI: done"
    )
    assert received.sender_id == sender.id


# --- send_message_to_agents_matching_tags -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_tag_matching_reaches_agents_with_all_of_one_list_and_some_of_the_other(
    sender, make_agent, send, llm, monkeypatch
):
    monkeypatch.setattr(services, "enqueue_run", lambda *args: None)  # no worker: each runs inline
    red = make_agent(name="Red", tags=["team", "red"])
    blue = make_agent(name="Blue", tags=["team", "blue"])
    plain = make_agent(name="Plain", tags=["team"])
    outsider = make_agent(name="Outsider", tags=["red", "blue"])
    sender.tags = ["team", "red"]
    sender.save(update_fields=["tags"])
    llm.push(
        tool_calls(
            tool_call(TAGS, {"message": "status?", "match_all": ["team"], "match_some": ["red", "blue"]})
        ),
        text("all good", when_last_user_contains=INCOMING, times=2),
        text("gathered"),
    )

    result = send(sender, "poll the team")

    expected = sorted([red.id, blue.id])
    assert json.loads(tool_returns(result)[0]["tool_return"]) == [
        {"agent_id": agent_id, "response": ["all good"]} for agent_id in expected
    ]
    assert [len(incoming(a)) for a in (red, blue, plain, outsider, sender)] == [1, 1, 0, 0, 0]
    assert incoming(red)[0].text == reply_prefix(sender) + "status?"
    assert [runs_of(a)[0].metadata["run_type"] for a in (red, blue)] == [TAGS, TAGS]


@pytest.mark.django_db(transaction=True)
def test_an_empty_tag_list_puts_no_condition(sender, make_agent, send, llm, monkeypatch):
    monkeypatch.setattr(services, "enqueue_run", lambda *args: None)
    first = make_agent(name="One", tags=["team"])
    second = make_agent(name="Two", tags=["team", "x"])
    make_agent(name="Three", tags=["other"])
    llm.push(
        tool_calls(tool_call(TAGS, {"message": "hi", "match_all": ["team"], "match_some": []})),
        text("hi", when_last_user_contains=INCOMING, times=2),
        text("done"),
    )

    result = send(sender, "greet")

    assert [r["agent_id"] for r in json.loads(tool_returns(result)[0]["tool_return"])] == sorted(
        [first.id, second.id]
    )


def test_no_matching_agent_is_an_empty_list(sender, send, llm):
    llm.push(
        tool_calls(tool_call(TAGS, {"message": "hi", "match_all": ["nobody"], "match_some": []})), text("-")
    )

    result = send(sender, "greet")

    assert (tool_returns(result)[0]["status"], tool_returns(result)[0]["tool_return"]) == ("success", "[]")


def test_more_matching_agents_than_the_bound_is_an_error_and_sends_nothing(sender, send, llm, actor):
    AgentFactory.create_batch(
        agent_messaging.MAX_RECIPIENTS + 1, organization_id=actor.organization_id, tags=["all"]
    )
    llm.push(
        tool_calls(tool_call(TAGS, {"message": "hi", "match_all": ["all"], "match_some": []})), text("-")
    )

    result = send(sender, "broadcast")

    assert tool_returns(result)[0]["status"] == "error"
    assert tool_returns(result)[0]["tool_return"] == (
        "More than 50 agents match these tags; a message reaches at most 50. Narrow match_all or match_some. "
        "Nothing was sent."
    )
    assert Run.all_objects.exclude(agent=sender).count() == 0


def test_another_organisations_agents_never_match(sender, send, llm, other_org_actor):
    AgentFactory(organization_id=other_org_actor.organization_id, tags=["team"])
    llm.push(
        tool_calls(tool_call(TAGS, {"message": "hi", "match_all": ["team"], "match_some": []})), text("-")
    )

    result = send(sender, "greet")

    assert tool_returns(result)[0]["tool_return"] == "[]"


# --- end to end: the SDK, the live server, one worker process of one thread ----------------------------------

QUEUE = "agent-messaging"


@pytest.fixture(scope="module")
def one_thread_worker(django_db_setup, scripted_server, tmp_path_factory) -> Iterator[WorkerProcess]:
    """ONE worker thread for every run: the API's sends come to its queue (`sdk` below); the runs the
    tools submit go to the default queue, which it serves too."""
    worker = WorkerProcess(
        "one-thread",
        worker_env(scripted_server.url, AGENT_REPLY_TIMEOUT="30"),
        tmp_path_factory.mktemp("one-thread"),
        concurrency=1,
        queues=f"{QUEUE},celery",
    ).wait_ready()
    yield worker
    worker.stop()


@pytest.fixture
def to_the_worker(one_thread_worker: WorkerProcess, llm: ScriptedLLM, monkeypatch) -> Iterator[WorkerProcess]:
    """The API's sends go to the one-thread worker's queue; the test ends once the worker is idle."""

    def enqueue(run_id: str, agent_id: str | None = None, conversation_id: str | None = None) -> None:
        note_task(run_id)
        current_app.send_task("agents.execute_run", args=[run_id, agent_id, conversation_id], queue=QUEUE)

    monkeypatch.setattr(services, "enqueue_run", enqueue)
    yield one_thread_worker
    one_thread_worker.wait_idle()


@pytest.fixture
def sdk(live_server: Any, actor: Actor, to_the_worker: WorkerProcess) -> Iterator[Letta]:
    db_settings = connections.settings["default"]  # the live server's request threads keep no session
    saved, db_settings["CONN_MAX_AGE"] = db_settings["CONN_MAX_AGE"], 0
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk")
    yield Letta(base_url=live_server.url, api_key=key.raw_key, timeout=60, max_retries=0)
    db_settings["CONN_MAX_AGE"] = saved


def create(sdk: Letta, name: str, **fields: Any) -> Any:
    return sdk.agents.create(name=name, model="openai/gpt-4o-mini", **fields)


def user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


@pytest.mark.django_db(transaction=True)
def test_the_multi_agent_tools_attach_at_creation_and_by_name(sdk):
    with_flag = create(sdk, "Flagged", extra_body={"include_multi_agent_tools": True})
    by_name = create(sdk, "Named", tools=[WAIT])

    assert {WAIT, ASYNC, TAGS} <= {t.name for t in with_flag.tools}
    assert {t.tool_type for t in with_flag.tools if t.name in (WAIT, ASYNC, TAGS)} == {
        "letta_multi_agent_core"
    }
    assert WAIT in {t.name for t in by_name.tools}
    assert not {ASYNC, TAGS} & {t.name for t in by_name.tools}


@pytest.mark.django_db(transaction=True)
def test_waiting_for_a_reply_completes_with_a_pool_of_one_worker_thread(sdk, llm):
    asker = create(sdk, "Asker", extra_body={"include_multi_agent_tools": True})
    helper = create(sdk, "Helper")
    llm.push(
        tool_calls(tool_call(WAIT, {"message": "capital of France?", "other_agent_id": helper.id})),
        text("Paris.", when_last_user_contains=INCOMING),
        text("The helper says Paris."),
    )

    response = sdk.agents.messages.create(asker.id, messages=user("ask the helper"))

    tool_return = next(m for m in response.messages if m.message_type == "tool_return_message")
    assert (tool_return.status, json.loads(tool_return.tool_return)) == (
        "success",
        {"agent_id": helper.id, "response": ["Paris."]},
    )
    assert response.messages[-1].content == "The helper says Paris."
    [asked] = Run.all_objects.filter(agent_id=asker.id)
    [answered] = Run.all_objects.filter(agent_id=helper.id)
    assert (asked.status, answered.status) == ("completed", "completed")
    assert asked.started_at < answered.started_at < answered.completed_at < asked.completed_at
    # Letta lists system-role input only when asked for.
    helper_messages = list(sdk.agents.messages.list(helper.id, extra_query={"include_system": "true"}))
    received = next(m for m in helper_messages if m.message_type == "system_message" and m.sender_id)
    assert received.content == (
        f"[Incoming message from agent with ID '{asker.id}' - your response will be delivered to the sender] "
        "capital of France?"
    )
    assert received.sender_id == asker.id


@pytest.mark.django_db(transaction=True)
def test_a_wait_cycle_through_the_api_is_an_error_and_both_turns_end(sdk, llm):
    first = create(sdk, "First", tools=[WAIT])
    second = create(sdk, "Second", tools=[WAIT])
    llm.push(
        tool_calls(tool_call(WAIT, {"message": "ping", "other_agent_id": second.id})),
        tool_calls(
            tool_call(WAIT, {"message": "pong?", "other_agent_id": first.id}),
            when_last_user_contains=INCOMING,
        ),
        text("cannot ask back", when_last_user_contains=INCOMING),
        text("finished"),
    )

    response = sdk.agents.messages.create(first.id, messages=user("start"))

    assert response.stop_reason.stop_reason == "end_turn"
    [second_run] = Run.all_objects.filter(agent_id=second.id)
    second_return = Message.all_objects.get(run=second_run, role="tool").tool_returns[0]
    assert (second_return["status"], second_return["tool_return"]) == (
        "error",
        agent_messaging._cycle_message(first.id),
    )
    assert second_run.status == "completed"


@pytest.mark.django_db(transaction=True)
def test_an_async_message_through_the_api_is_answered_by_a_worker_after_the_sender(sdk, llm):
    sender = create(sdk, "Sender", tools=[ASYNC])
    receiver = create(sdk, "Receiver")
    llm.push(
        tool_calls(tool_call(ASYNC, {"message": "job done", "other_agent_id": receiver.id})),
        text("told them"),
        text("noted", when_last_user_contains=INCOMING),
    )

    response = sdk.agents.messages.create(sender.id, messages=user("tell the receiver"))

    receipt = next(m for m in response.messages if m.message_type == "tool_return_message")
    assert receipt.tool_return.startswith(f"Successfully sent message to agent '{receiver.id}' (run 'run-")
    deadline = time.monotonic() + 30
    while (run := Run.all_objects.get(agent_id=receiver.id)).status != "completed":
        assert time.monotonic() < deadline, run.status
        time.sleep(0.1)
    assert Message.all_objects.filter(run=run, role="assistant").get().text == "noted"


@pytest.mark.django_db(transaction=True)
def test_tag_matching_through_the_api_gathers_every_reply(sdk, llm, actor, other_org_actor):
    sender = create(sdk, "Coordinator", tools=[TAGS])
    members = sorted(
        [create(sdk, "Alpha", tags=["crew", "a"]), create(sdk, "Beta", tags=["crew", "b"])],
        key=lambda a: a.id,
    )
    create(sdk, "Idle", tags=["crew"])
    agent_create(actor=other_org_actor, name="Foreign", model="openai/gpt-4o-mini", tags=["crew", "a"])
    llm.push(
        tool_calls(tool_call(TAGS, {"message": "report", "match_all": ["crew"], "match_some": ["a", "b"]})),
        text("reporting", when_last_user_contains=INCOMING, times=2),
        text("all reported"),
    )

    response = sdk.agents.messages.create(sender.id, messages=user("collect reports"))

    tool_return = next(m for m in response.messages if m.message_type == "tool_return_message")
    assert json.loads(tool_return.tool_return) == [
        {"agent_id": member.id, "response": ["reporting"]} for member in members
    ]
    assert Run.all_objects.filter(organization_id=other_org_actor.organization_id).count() == 0


@pytest.mark.django_db(transaction=True)
def test_running_the_wait_tool_outside_a_turn_has_a_worker_answer(sdk, llm):
    # POST /v1/agents/{id}/tools/{name}/run executes in the web process, which never calls an LLM.
    asker = create(sdk, "Asker", tools=[WAIT])
    helper = create(sdk, "Helper")
    llm.push(text("from the worker", when_last_user_contains=INCOMING))

    result = sdk.agents.tools.run(
        WAIT, agent_id=asker.id, args={"message": "hi", "other_agent_id": helper.id}
    )

    assert (result.status, json.loads(result.func_return)) == (
        "success",
        {"agent_id": helper.id, "response": ["from the worker"]},
    )
    assert [r.status for r in Run.all_objects.filter(agent_id=helper.id)] == ["completed"]
