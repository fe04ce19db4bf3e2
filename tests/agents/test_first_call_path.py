"""What a worker does between taking a run and sending its first LLM request: the time a streaming client
waits for its first token beyond the model's own (issue 25: under 10 ms). Counted: statements and round
trips to PostgreSQL, each of which costs a wake-up of a database backend on a busy machine."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection

from apps.agents.loop.runner import execute_run_streamed
from apps.agents.services import MessageIn, run_create
from apps.llm import openai_wire
from tests.support.scripted_llm import text

pytestmark = pytest.mark.django_db

# the claim, which takes the conversation's lock; the agent, its blocks, its tools and its archives'
# statistics (one round trip); the messages this process has not seen and the model's provider (one).
# (Before issue 25's work: 8 statements, 8 round trips.)
STATEMENTS_BEFORE_THE_LLM_CALL = 7
ROUND_TRIPS_BEFORE_THE_LLM_CALL = 3


class RoundTrips:
    """Statements as sent, and round trips: a statement alone, or a pipeline with all its statements."""

    def __init__(self) -> None:
        self.statements: list[str] = []
        self.round_trips = 0
        self.at_llm_call: tuple[int, int] | None = None

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.statements.append(sql)
        if connection.connection.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF:
            self.round_trips += 1
        return execute(sql, params, many, context)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Any:
    counter = RoundTrips()
    original_pipeline = psycopg.Connection.pipeline

    @contextmanager
    def pipeline(self: psycopg.Connection[Any]) -> Any:
        before = len(counter.statements)
        with original_pipeline(self) as opened:
            yield opened
        if len(counter.statements) > before:
            counter.round_trips += 1

    original_stream = openai_wire.stream_chunks

    def stream_chunks(*args: Any, **kwargs: Any) -> Any:
        if counter.at_llm_call is None:
            counter.at_llm_call = (len(counter.statements), counter.round_trips)
        return original_stream(*args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "pipeline", pipeline)
    monkeypatch.setattr(openai_wire, "stream_chunks", stream_chunks)
    with connection.execute_wrapper(counter):
        yield counter


def test_a_streamed_run_sends_its_llm_request_after_three_round_trips(make_agent, actor, llm, counted):
    agent = make_agent(embedding="")
    llm.push(text("warm"), text("first tokens"))
    warm = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")], stream_tokens=True)
    execute_run_streamed(warm.id, agent_id=agent.id)  # this process has now kept the thread's messages
    run = run_create(
        actor=actor, agent_id=agent.id, messages=[MessageIn(content="again")], stream_tokens=True
    )
    counted.statements.clear()
    counted.round_trips, counted.at_llm_call = 0, None

    result = execute_run_streamed(run.id, agent_id=agent.id)

    assert result is not None
    assert [m.text for m in result.messages] == ["first tokens"]
    assert counted.at_llm_call == (STATEMENTS_BEFORE_THE_LLM_CALL, ROUND_TRIPS_BEFORE_THE_LLM_CALL), (
        counted.statements[: counted.at_llm_call[0] if counted.at_llm_call else None]
    )


def test_the_first_request_carries_what_the_batched_reads_loaded(make_agent, actor, llm):
    """The reads sent together still give the model the agent's memory and the thread's messages."""
    agent = make_agent(embedding="")
    llm.push(text("one"), text("two"))
    for content in ("my name is Ada", "what is my name?"):
        run = run_create(
            actor=actor, agent_id=agent.id, messages=[MessageIn(content=content)], stream_tokens=True
        )
        execute_run_streamed(run.id, agent_id=agent.id)

    body = llm.chat_requests()[-1]
    system = str(body["messages"][0]["content"])
    rest = " | ".join(str(m.get("content")) for m in body["messages"][1:])
    assert "Name: unknown" in system
    assert "I am a helpful assistant." in system
    assert "my name is Ada" in rest
    assert "one" in rest
    assert "what is my name?" in rest
