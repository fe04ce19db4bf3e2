"""run_collect (the blocking send's wait) against the races between a run's end in the database and its
event stream, reproduced deterministically by driving the stream reads by hand."""

import pytest

from apps.agents.loop.runner import execute_run_streamed
from apps.agents.models import Run
from apps.agents.services import MessageIn, run_collect, run_create
from apps.streams import events as stream_events
from apps.streams.redis_client import get_redis
from tests.support.scripted_llm import text, tool_call, tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_that_ends_between_a_silent_read_and_the_database_check_is_collected_whole(
    make_agent, actor, llm, monkeypatch
):
    """32 agents on 2 workers: the reader's 5th blocking read comes back empty while the run is queued,
    then the whole run executes before the reader looks at the database, which already says
    'completed'. The answer must still carry the run's messages, stop reason and usage."""
    agent = make_agent(embedding="")
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        text("Hi Sam!"),
    )
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="I'm Sam")])
    real_read = stream_events.read_events
    silent_reads = 0

    def racing_read(run_id, *, after=stream_events.START, block_ms=None, count=500):
        nonlocal silent_reads
        if block_ms is not None and silent_reads < 5:
            silent_reads += 1
            if silent_reads == 5:  # the worker runs the turn while this read returns "nothing yet"
                execute_run_streamed(run.id)
            return []
        return real_read(run_id, after=after, block_ms=block_ms, count=count)

    monkeypatch.setattr(stream_events, "read_events", racing_read)
    collected = run_collect(actor=actor, run_id=run.id, timeout_s=30)

    assert silent_reads == 5
    assert collected.finished is True
    assert collected.run.status == Run.Status.COMPLETED
    assert [m["message_type"] for m in collected.messages] == [
        "tool_call_message",
        "tool_return_message",
        "assistant_message",
    ]
    assert collected.stop_reason == {"message_type": "stop_reason", "stop_reason": "end_turn"}
    assert collected.usage["step_count"] == 2


def test_a_finished_run_whose_stream_is_gone_is_answered_from_the_database(make_agent, actor, llm):
    agent = make_agent(embedding="")
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        text("Hi Sam!"),
    )
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="I'm Sam")])
    execute_run_streamed(run.id)
    from_stream = run_collect(actor=actor, run_id=run.id, timeout_s=5)
    get_redis().delete(stream_events.stream_key(run.id))  # expired (24 h), or never written

    collected = run_collect(actor=actor, run_id=run.id, timeout_s=5)

    assert collected.finished is True
    assert without_seq_ids(collected.messages) == without_seq_ids(from_stream.messages)
    assert collected.stop_reason == from_stream.stop_reason
    assert collected.usage["step_count"] == 2
    assert collected.usage["total_tokens"] == from_stream.usage["total_tokens"]


def without_seq_ids(messages):
    """seq_id (the stored sequence number) and date (the row's creation time) are set when the step is
    stored, after the loop emitted its live events."""
    return [{k: v for k, v in m.items() if k not in ("seq_id", "date")} for m in messages]
