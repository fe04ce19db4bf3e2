"""Runs executed by a real Celery worker, their events streamed through Redis."""

import time

import pytest

from apps.agents.models import Message, Run, Step
from apps.agents.services import MessageIn, run_collect, run_create, run_submit
from apps.streams.events import read_events
from tests.support.scripted_llm import text, tool_call, tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


def submit(actor, agent, content):
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content=content)])
    run_submit(run)  # on commit: transaction=True tests autocommit, so it is enqueued at once
    return run


def test_a_worker_executes_the_run_and_streams_its_events(make_agent, actor, llm, celery_worker):
    agent = make_agent()
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        text("Hi Sam!"),
    )

    run = submit(actor, agent, "I'm Sam")
    collected = run_collect(actor=actor, run_id=run.id, timeout_s=30)

    assert collected.finished is True
    assert (collected.run.status, collected.run.error) == (Run.Status.COMPLETED, None)
    assert [m["message_type"] for m in collected.messages] == [
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
    ]
    assert collected.stop_reason == {"message_type": "stop_reason", "stop_reason": "end_turn"}
    assert collected.usage["step_count"] == 2
    assert Message.all_objects.filter(run=run, role="assistant").count() == 2


def test_a_reader_that_arrives_late_gets_everything_then_nothing_twice(make_agent, actor, llm, celery_worker):
    agent = make_agent()
    llm.push(text("one"))
    run = submit(actor, agent, "hello")
    run_collect(actor=actor, run_id=run.id, timeout_s=30)

    everything = read_events(run.id)
    first_two = everything[:2]
    rest = read_events(run.id, after=first_two[-1].cursor)

    assert [e.cursor for e in first_two + rest] == [e.cursor for e in everything]
    assert everything[-1].data["message_type"] == "run_end"


def _sessions_opened() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def test_a_worker_keeps_its_database_connection_from_one_run_to_the_next(
    make_agent, actor, llm, celery_worker
):
    # Celery's Django fixup would close it after every task: a new PostgreSQL backend per turn.
    agent = make_agent(embedding="")
    for _ in range(3):  # every worker thread has connected once
        llm.push(text("warm"))
        run_collect(actor=actor, run_id=submit(actor, agent, "hello").id, timeout_s=30)
    before = _sessions_opened()

    for _ in range(6):
        llm.push(text("again"))
        collected = run_collect(actor=actor, run_id=submit(actor, agent, "hello").id, timeout_s=30)
        assert collected.run.status == Run.Status.COMPLETED

    assert _sessions_opened() - before < 3


def test_a_worker_stores_each_steps_provider_trace_after_the_answer(make_agent, actor, llm, celery_worker):
    agent = make_agent(embedding="")
    llm.push(text("traced by a worker"))
    run = submit(actor, agent, "hello")
    run_collect(actor=actor, run_id=run.id, timeout_s=30)

    deadline = time.monotonic() + 10
    while (step := Step.all_objects.get(run=run)).response_json is None:
        assert time.monotonic() < deadline, "the trace was never stored"
        time.sleep(0.05)
    assert step.response_json["choices"][0]["message"]["content"] == "traced by a worker"
    assert step.request_json["messages"][-1] == {"role": "user", "content": "hello"}
