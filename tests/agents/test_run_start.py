"""How an executor takes a run: claimed once, after the earlier runs of its conversation, failing the runs
that a dead executor left RUNNING; and what it stores after the answer (provider traces)."""

import pytest

from apps.agents.loop.runner import RunDeferred, after_run, execute_run
from apps.agents.models import Run, Step
from apps.agents.recovery import WORKER_LOST
from apps.agents.services import MessageIn, run_create
from tests.support.scripted_llm import text

pytestmark = pytest.mark.django_db


def new_run(actor, agent, content="hello") -> Run:
    return run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content=content)])


def test_a_run_goes_after_an_earlier_run_of_its_conversation_that_still_waits(make_agent, actor, llm):
    agent = make_agent(embedding="")
    llm.push(text("first answer"), text("second answer"))
    first, second = new_run(actor, agent, "one"), new_run(actor, agent, "two")

    with pytest.raises(RunDeferred):
        execute_run(second.id, agent_id=agent.id)
    assert Run.all_objects.get(id=second.id).status == Run.Status.CREATED

    assert execute_run(first.id).stop_reason == "end_turn"
    result = execute_run(second.id, agent_id=agent.id)
    assert [m.text for m in result.messages] == ["second answer"]


def test_a_run_is_executed_once(make_agent, actor, llm):
    agent = make_agent(embedding="")
    llm.push(text("only once"))
    run = new_run(actor, agent)

    assert execute_run(run.id, agent_id=agent.id) is not None
    assert execute_run(run.id, agent_id=agent.id) is None  # a second delivery of its task
    assert execute_run(run.id) is None
    assert len(llm.chat_requests()) == 1


def test_a_run_that_starts_fails_the_run_a_dead_executor_left_running(make_agent, actor, llm):
    agent = make_agent(embedding="")
    abandoned = new_run(actor, agent, "lost")
    Run.all_objects.filter(id=abandoned.id).update(status=Run.Status.RUNNING)  # its worker died (no lock)
    llm.push(text("I am here"))
    follow_up = new_run(actor, agent, "still there?")

    result = execute_run(follow_up.id, agent_id=agent.id)

    assert result.run.status == Run.Status.COMPLETED
    crashed = Run.all_objects.get(id=abandoned.id)
    assert (crashed.status, crashed.error) == (Run.Status.FAILED, {"message": WORKER_LOST})


def test_provider_traces_are_stored_after_the_answer(make_agent, actor, llm):
    agent = make_agent(embedding="")
    llm.push(text("traced"))
    run = new_run(actor, agent)

    result = execute_run(run.id, agent_id=agent.id, defer_after_run=True)
    step = Step.all_objects.get(run=run)
    assert (step.request_json, step.response_json) == (None, None)  # not on the way to the answer

    after_run(result)
    step.refresh_from_db()
    assert step.request_json["messages"][-1] == {"role": "user", "content": "hello"}
    assert step.response_json["choices"][0]["message"]["content"] == "traced"
