"""Fencing: an executor that lost its run (failed by recovery, or claimed by another executor after it was
cut off from the database) cannot store anything for it when it comes back."""

import pytest
from django.db import DatabaseError, connection

from apps.agents.loop import runner, store
from apps.agents.models import Message, Run, Step
from apps.agents.services import MessageIn, run_create
from apps.streams.events import read_events
from tests.support.scripted_llm import text, tool_call, tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


def lose_the_run_during_the_llm_call(monkeypatch, take_away):
    """While the model answers (the executor holds no database lock then), `take_away(run_id)` does what
    recovery or another executor would."""
    call_llm = runner._call_llm

    def meanwhile(state, *args, **kwargs):
        response = call_llm(state, *args, **kwargs)
        take_away(state.run.id)
        return response

    monkeypatch.setattr(runner, "_call_llm", meanwhile)


def claimed_elsewhere(run_id):
    """Handed back and claimed by a second executor: same status, a new lease."""
    run = Run.objects.unscoped().get(id=run_id)
    Run.objects.unscoped().filter(id=run_id).update(status=Run.Status.CREATED)
    claim = store.claim_run(run_id, run.agent_id, run.conversation_id)
    assert claim.run is not None
    assert claim.run.lease != run.lease


def failed_by_recovery(run_id):
    Run.objects.unscoped().filter(id=run_id).update(
        status=Run.Status.FAILED, stop_reason="error", error={"message": "worker lost"}
    )


def produced(run_id):
    return list(
        Message.all_objects.filter(run_id=run_id)
        .exclude(role=Message.Role.USER)
        .values_list("role", flat=True)
    )


def test_a_run_claimed_by_another_executor_meanwhile_gets_nothing_from_the_first(
    make_agent, actor, llm, monkeypatch
):
    agent = make_agent()
    llm.push(text("the first executor's reply"))
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")], stream_tokens=True)
    lose_the_run_during_the_llm_call(monkeypatch, claimed_elsewhere)

    assert runner.execute_run_streamed(run.id) is None

    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING  # the second executor's now, untouched
    assert Step.all_objects.filter(run_id=run.id).count() == 0
    assert produced(run.id) == []
    agent.refresh_from_db()
    assert agent.last_stop_reason in ("", None)
    # The run's stream is the second executor's to end: the first wrote no stop and no end event.
    assert all(event.data.get("message_type") != "stop_reason" for event in read_events(run.id))


def test_a_run_failed_by_recovery_meanwhile_stays_failed(make_agent, actor, llm, monkeypatch):
    agent = make_agent()
    llm.push(tool_calls(tool_call("memory_insert", {"label": "human", "new_str": "likes tea"})))
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="remember: tea")])
    lose_the_run_during_the_llm_call(monkeypatch, failed_by_recovery)

    assert runner.execute_run(run.id) is None

    run.refresh_from_db()
    assert (run.status, run.error) == (Run.Status.FAILED, {"message": "worker lost"})
    assert Step.all_objects.filter(run_id=run.id).count() == 0
    assert produced(run.id) == []


def test_a_run_cancelled_meanwhile_keeps_its_lease_and_stores_its_step(make_agent, actor, llm, monkeypatch):
    """A cancel is the user's, not another executor's: the step in flight is stored, the run ends cancelled."""
    from apps.agents.services import run_cancel

    agent = make_agent()
    llm.push(text("hello"))
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")])
    lose_the_run_during_the_llm_call(monkeypatch, lambda run_id: run_cancel(actor=actor, run_id=run_id))

    result = runner.execute_run(run.id)

    assert result is not None
    assert result.run.status == Run.Status.CANCELLED
    assert produced(run.id) == ["assistant"]


def test_the_database_refuses_a_write_under_a_stale_lease(make_agent, actor):
    agent = make_agent()
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")])
    claim = store.claim_run(run.id, agent.id, None)
    assert claim.run is not None

    with connection.cursor() as cursor:
        cursor.execute("SELECT agents_require_run_lease(%s, %s)", [run.id, claim.run.lease])
        assert cursor.fetchone()[0] is True
    with pytest.raises(DatabaseError) as refused, connection.cursor() as cursor:
        cursor.execute("SELECT agents_require_run_lease(%s, %s)", [run.id, "stale"])
    assert refused.value.__cause__.sqlstate == store.LEASE_LOST_SQLSTATE
