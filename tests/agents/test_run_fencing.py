"""Fencing: an executor that lost its run (failed by recovery, or claimed by another executor after it was
cut off from the database) cannot store anything for it when it comes back."""

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.agents.loop import runner, store
from apps.agents.models import Message, Run, Step
from apps.agents.services import MessageIn, run_create
from apps.memory.models import Block, BlockHistory
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
    llm.push(tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "likes tea"})))
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


# --- writes below the loop: the run's stream and the memory tools' block writes ---------------------


def stream_of(run_id):
    return [event.data for event in read_events(run_id)]


def test_an_executor_that_lost_its_run_appends_nothing_to_the_run_stream_after_the_new_one(
    make_agent, actor, llm, monkeypatch
):
    """Handed to a second executor while the first waited for the model: once the second has written to
    the run's stream, the first (coming back) appends nothing, and the readers see the second's events."""
    from apps.streams.events import RedisStreamSink

    agent = make_agent()
    llm.push(text("the first executor's reply"))
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")], stream_tokens=True)

    def taken_over(run_id):
        claimed_elsewhere(run_id)
        second = Run.objects.unscoped().get(id=run_id)
        sink = RedisStreamSink(run_id)
        sink.hold(second.lease, int(second.started_at.timestamp() * 1000) + 1)
        sink.emit({"message_type": "second_executor", "run_id": run_id})

    lose_the_run_during_the_llm_call(monkeypatch, taken_over)

    assert runner.execute_run_streamed(run.id) is None

    types = [event.get("message_type") for event in stream_of(run.id)]
    assert types[-1] == "second_executor"  # nothing of the first's after the take-over
    assert "assistant_message" not in types[types.index("second_executor") :]


def test_the_stream_refuses_an_older_writer_and_admits_a_newer_one():
    from apps.streams.events import StreamFenced, append_events_fenced, end_stream

    run_id = "run-fence-probe"
    append_events_fenced(run_id, [{"n": 1}], lease="a", generation=1000)
    append_events_fenced(run_id, [{"n": 2}], lease="b", generation=2000)  # claimed again later: takes over
    with pytest.raises(StreamFenced):
        append_events_fenced(run_id, [{"n": 3}], lease="a", generation=1000)
    append_events_fenced(run_id, [{"n": 4}], lease="b", generation=2000)
    end_stream(run_id, status="failed", stop_reason="error", fence=True)  # recovery ends it: newest writer
    with pytest.raises(StreamFenced):
        append_events_fenced(run_id, [{"n": 5}], lease="b", generation=2000)

    assert [event.get("n", event.get("message_type")) for event in stream_of(run_id)] == [1, 2, 4, "run_end"]


def test_recovery_ends_the_stream_so_the_lost_executor_appends_nothing_after_the_end(
    make_agent, actor, llm, monkeypatch
):
    from apps.agents import recovery

    agent = make_agent()
    llm.push(text("too late"))
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")], stream_tokens=True)

    def failed_and_ended(run_id):
        failed_by_recovery(run_id)
        recovery.end_stream(run_id, status="failed", stop_reason="error", fence=True)

    lose_the_run_during_the_llm_call(monkeypatch, failed_and_ended)

    assert runner.execute_run_streamed(run.id) is None

    events = stream_of(run.id)
    assert events[-1]["message_type"] == "run_end"
    assert [event["message_type"] for event in events].count("run_end") == 1


def human_block(agent_id):
    return Block.objects.unscoped().get(agent_attachments__agent_id=agent_id, label="human")


def test_a_memory_tool_of_an_executor_that_lost_its_run_writes_no_block(make_agent, actor, llm, monkeypatch):
    agent = make_agent()
    before = human_block(agent.id)
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "likes tea"})), text("ok")
    )
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="remember: tea")])
    lose_the_run_during_the_llm_call(monkeypatch, claimed_elsewhere)

    assert runner.execute_run(run.id) is None

    after = human_block(agent.id)
    assert (after.value, after.version) == (before.value, before.version)
    assert (
        not BlockHistory.objects.unscoped()
        .filter(block_id=before.id)
        .exclude(version__lte=before.version)
        .exists()
    )


def test_a_memory_tool_block_write_checks_the_lease_in_its_own_statement(make_agent, actor, llm):
    agent = make_agent()
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "likes tea"})), text("ok")
    )
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="remember: tea")])

    with CaptureQueriesContext(connection) as captured:
        result = runner.execute_run(run.id)

    assert result is not None
    assert result.stop_reason == "end_turn"
    assert "likes tea" in human_block(agent.id).value
    edits = [q["sql"] for q in captured.captured_queries if "UPDATE memory_block SET" in q["sql"]]
    assert len(edits) == 1  # one statement, as before: the lease check is inside it
    assert "agents_require_run_lease" in edits[0]


# --- why recovery failed a run ---------------------------------------------------------------------


def test_a_run_that_lost_its_session_to_a_database_restart_is_failed_saying_so(make_agent, actor):
    from datetime import timedelta

    from apps.agents import recovery

    agent = make_agent()
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")])
    before_restart = recovery.database_started_at() - timedelta(minutes=1)
    Run.objects.unscoped().filter(id=run.id).update(status=Run.Status.RUNNING, started_at=before_restart)

    assert recovery.fail_orphaned_runs() == [run.id]

    run.refresh_from_db()
    assert (run.status, run.error) == (Run.Status.FAILED, {"message": recovery.DATABASE_RESTARTED})


def test_a_run_whose_worker_stopped_since_the_database_started_is_failed_as_worker_lost(make_agent, actor):
    from apps.agents import recovery

    agent = make_agent()
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")])
    Run.objects.unscoped().filter(id=run.id).update(status=Run.Status.RUNNING, started_at=timezone.now())

    assert recovery.fail_orphaned_runs() == [run.id]

    run.refresh_from_db()
    assert run.error == {"message": recovery.WORKER_LOST}
    assert read_events(run.id)[-1].data["message_type"] == "run_end"
