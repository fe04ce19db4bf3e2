"""Runs against a provider that never finishes answering (tests/support/tarpit_llm.py), through the API and
a real Celery worker with small bounds: LLM_CALL_DEADLINE 3 s, LLM_REQUEST_TIMEOUT 2 s (every trickled byte
comes sooner), RUN_DEADLINE 6 s. Before these bounds such a run held its worker thread forever.

The worker listens on a queue of its own, and this module's sends are enqueued there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import current_app
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.agents import services
from apps.agents.loop import runner
from apps.agents.models import Run, Step
from apps.agents.recovery import note_task
from apps.streams.events import read_events
from tests.api.test_messages_api import sse_events
from tests.support.scripted_llm import text
from tests.support.tarpit_llm import TarpitLLMServer
from tests.support.workers import WorkerProcess, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "run-deadlines"
CALL_DEADLINE = 3.0
RUN_DEADLINE = 6.0
MARGIN = 2.5
"""How much longer than a deadline the API may take to answer: the watchdog's period, the worker's write,
the API's wait on the run's stream, two busy cores."""


@pytest.fixture(scope="module")
def tarpit() -> Iterator[TarpitLLMServer]:
    with TarpitLLMServer(interval=0.5) as server:
        yield server


@pytest.fixture(scope="module")
def deadline_worker(django_db_setup, tarpit: TarpitLLMServer, tmp_path_factory) -> Iterator[WorkerProcess]:
    """One worker thread, so a run that held it would block the next one."""
    env = worker_env(
        tarpit.url,
        LLM_CALL_DEADLINE=str(CALL_DEADLINE),
        LLM_REQUEST_TIMEOUT="2",
        RUN_DEADLINE=str(RUN_DEADLINE),
    )
    worker = WorkerProcess("deadlines", env, tmp_path_factory.mktemp("deadlines"), queues=QUEUE).wait_ready()
    yield worker
    worker.stop()


@pytest.fixture
def api(
    deadline_worker: WorkerProcess, tarpit: TarpitLLMServer, api_client_for, actor, monkeypatch, fast_streams
):
    """The API, its runs enqueued for this module's worker."""

    def enqueue(run_id: str, agent_id: str | None = None, conversation_id: str | None = None) -> None:
        note_task(run_id)
        current_app.send_task("agents.execute_run", args=[run_id, agent_id, conversation_id], queue=QUEUE)

    monkeypatch.setattr(services, "enqueue_run", enqueue)
    tarpit.reset()
    tarpit.answer_delay = 0.0
    yield api_client_for(actor)
    # A failed run's answer comes with its end event; the worker still writes its spans and records
    # after it. The database is flushed only once it is done (a TRUNCATE meeting those inserts deadlocks).
    deadline_worker.wait_idle()


def send(api: Any, agent_id: str, text: str, **options: Any) -> Any:
    body = {"messages": [{"role": "user", "content": text}], **options}
    return api.post(f"/v1/agents/{agent_id}/messages", body, format="json")


def test_a_model_that_trickles_its_answer_fails_the_run_at_the_call_deadline(api, make_agent, tarpit):
    agent = make_agent(embedding="")
    started = time.monotonic()

    response = send(api, agent.id, "hello?")

    assert CALL_DEADLINE <= time.monotonic() - started < CALL_DEADLINE + MARGIN
    assert response.status_code == 502
    body = response.json()
    assert body["stop_reason"] == "llm_api_error"
    assert body["detail"] == "openai/gpt-4o-mini: the model did not answer within 3 s (LLM_CALL_DEADLINE)"
    run = Run.all_objects.get(id=body["run_id"])
    assert (run.status, run.stop_reason) == ("failed", "llm_api_error")
    assert Step.all_objects.get(run=run).status == Step.Status.FAILED
    [request] = tarpit.chat_requests()
    assert not request.streamed
    assert request.bytes_sent >= 4  # each read got its byte well in time: only the deadline ended it
    assert tarpit.wait_for_hangup(request) - started < CALL_DEADLINE + MARGIN


def test_a_token_stream_that_trickles_fails_the_run_at_the_call_deadline(api, make_agent, tarpit):
    agent = make_agent(embedding="")
    started = time.monotonic()

    response = send(api, agent.id, "hello?", streaming=True, stream_tokens=True, include_pings=False)
    events = [data for _, data in sse_events(response)]

    assert CALL_DEADLINE <= time.monotonic() - started < CALL_DEADLINE + MARGIN
    stop = next(e for e in events if isinstance(e, dict) and e.get("message_type") == "stop_reason")
    assert stop["stop_reason"] == "llm_api_error"
    [request] = tarpit.chat_requests()
    assert request.streamed
    assert tarpit.wait_for_hangup(request) - started < CALL_DEADLINE + MARGIN


def test_cancel_ends_a_call_in_flight_within_a_second_and_frees_the_worker(api, make_agent, tarpit):
    agent = make_agent(embedding="")
    run_id = api.post(
        f"/v1/agents/{agent.id}/messages/async",
        {"messages": [{"role": "user", "content": "take your time"}]},
        format="json",
    ).json()["id"]
    deadline = time.monotonic() + 10
    while not tarpit.chat_requests():  # the model is answering, a byte at a time
        assert time.monotonic() < deadline, "the worker never called the model"
        time.sleep(0.05)
    time.sleep(0.3)

    cancelled_at = time.monotonic()
    response = api.post(f"/v1/agents/{agent.id}/messages/cancel", {}, format="json")

    assert response.json() == {run_id: "cancelled"}
    [request] = tarpit.chat_requests()
    assert tarpit.wait_for_hangup(request) - cancelled_at < 1.5  # the connection is closed, not abandoned
    while not (end := [e for e in read_events(run_id) if e.is_end]):
        assert time.monotonic() - cancelled_at < 2.5, "the run did not end promptly"
        time.sleep(0.05)
    assert (end[0].data["status"], end[0].data["stop_reason"]) == ("cancelled", "cancelled")
    run = Run.all_objects.get(id=run_id)
    assert (run.status, run.stop_reason, run.error) == ("cancelled", "cancelled", None)

    tarpit.set_mode("answer")
    started = time.monotonic()
    answered = send(api, agent.id, "are you there?")

    assert answered.status_code == 200
    assert answered.json()["messages"][-1]["content"] == "OK"
    assert time.monotonic() - started < 5  # the worker's one thread was free


def test_the_run_deadline_stops_a_run_whose_steps_keep_going(api, make_agent, tarpit):
    agent = make_agent(embedding="")
    tarpit.set_mode("tool")  # every answer calls a tool; the loop reads its error and goes on
    tarpit.answer_delay = 0.2
    started = time.monotonic()

    response = send(api, agent.id, "go on forever", max_steps=100)

    assert RUN_DEADLINE <= time.monotonic() - started < RUN_DEADLINE + MARGIN
    assert response.status_code == 500
    body = response.json()
    assert body["stop_reason"] == "error"
    run = Run.all_objects.get(id=body["run_id"])
    steps = Step.all_objects.filter(run=run).count()
    assert 5 <= steps < 100
    assert body["detail"] in (
        # between two steps, or during a call (which the run's deadline cut short)
        f"Stopped after {steps} step(s): the run did not finish within 6 s (RUN_DEADLINE).",
        f"Stopped after {steps - 1} step(s): the run did not finish within 6 s (RUN_DEADLINE).",
    )
    assert (run.status, run.stop_reason) == ("failed", "error")


def test_bounds_add_no_statement_to_a_turn_and_a_waiting_call_makes_none(make_agent, send, llm, monkeypatch):
    """In-process: the run's deadline and the cancel signal ride on no SQL. A one-step turn keeps its
    bound (README, "Cost"), and while a call waits, its cancellation is asked of Redis by the watchdog."""
    agent = make_agent()
    checks: list[int] = []
    real_check = runner.cancel_requested
    monkeypatch.setattr(
        runner, "cancel_requested", lambda run_id: checks.append(threading.get_ident()) or real_check(run_id)
    )
    during_calls: list[int] = []
    real_complete = runner.llm.complete

    def watched(*args: Any, **kwargs: Any) -> Any:
        with CaptureQueriesContext(connection) as captured:
            response = real_complete(*args, **kwargs)
        during_calls.append(len(captured))
        return response

    monkeypatch.setattr(runner.llm, "complete", watched)
    llm.push(text("warm"), text("slowly", latency=1.3))
    send(agent, "warm up")

    with CaptureQueriesContext(connection) as turn:
        result = send(agent, "hello")

    assert result.stop_reason == "end_turn"
    statements = [q["sql"] for q in turn.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    # As without bounds (README, "Cost"; tests/agents/test_loop_memory_pressure.py).
    assert len(statements) == 15
    assert during_calls == [0, 0]
    assert len(checks) >= 2  # at 0.5 s into the call, then every 0.5 s
    assert threading.get_ident() not in checks
