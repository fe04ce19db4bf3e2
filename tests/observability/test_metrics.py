"""GET /metrics: Prometheus text, behind METRICS_TOKEN; a run moves its counters, whichever process ran it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from apps.agents.services import MessageIn, run_collect, run_create, run_submit
from apps.observability import metrics, tracing
from tests.support.scripted_llm import error, text, tool_call, tool_calls

TOKEN = "metrics-token-for-tests"


@pytest.fixture
def metrics_on(settings) -> Iterator[None]:
    settings.METRICS_TOKEN = TOKEN
    tracing.reset_for_tests()
    metrics.reset_for_tests()
    yield
    metrics.reset_for_tests()
    tracing.reset_for_tests()


def scrape(token: str = TOKEN) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_are_off_without_a_token(settings):
    settings.METRICS_TOKEN = ""

    assert Client().get("/metrics").status_code == 404


def test_a_missing_or_wrong_token_is_refused(metrics_on):
    assert Client().get("/metrics").status_code == 401
    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'


def test_a_run_moves_its_counters_and_histograms(metrics_on, make_agent, send, llm):
    agent = make_agent(embedding="")
    before = scrape()
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        text("Hi Sam!"),
    )

    send(agent, "I'm Sam")
    after = scrape()

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("letta_runs_total", status="completed", stop_reason="end_turn") == 1
    assert delta("letta_step_duration_seconds_count") == 2
    assert delta("letta_llm_call_duration_seconds_count", model="openai/gpt-4o-mini") == 2
    assert delta("letta_llm_tokens_total", model="openai/gpt-4o-mini", kind="prompt") > 0
    assert delta("letta_tool_calls_total", tool_type="letta_sleeptime_core", outcome="success") == 1
    assert delta("letta_run_queue_wait_seconds_count") == 1
    assert ("letta_active_streams", ()) in after
    assert ("letta_queue_depth", (("queue", "celery"),)) in after


def test_a_failed_run_counts_an_error_of_its_kind(metrics_on, make_agent, send, llm):
    agent = make_agent(embedding="")
    llm.push(*[error(500, "down")] * 3)

    result = send(agent, "hello")

    assert result.stop_reason == "llm_api_error"
    samples = scrape()
    assert samples[("letta_errors_total", (("kind", "run:llm_api_error"),))] == 1
    assert samples[("letta_runs_total", (("status", "failed"), ("stop_reason", "llm_api_error")))] == 1


@pytest.mark.django_db(transaction=True)
def test_a_run_a_worker_executed_is_counted_in_the_web_processes_metrics(
    settings, actor, make_agent, llm, scripted_server, tmp_path, monkeypatch
):
    """The worker is another process (its own METRICS_TOKEN): its counts reach this process's /metrics."""
    from apps.agents import services
    from tests.support.workers import WorkerProcess, worker_env

    settings.METRICS_TOKEN = TOKEN
    metrics.reset_for_tests()
    queue = "metrics-test"
    worker = WorkerProcess(
        "metrics", worker_env(scripted_server.url, METRICS_TOKEN=TOKEN), tmp_path, queues=queue
    ).wait_ready()
    try:
        from celery import current_app

        def enqueue(run_id: str, agent_id: str | None = None, conversation_id: str | None = None) -> None:
            current_app.send_task("agents.execute_run", args=[run_id, agent_id, conversation_id], queue=queue)

        monkeypatch.setattr(services, "enqueue_run", enqueue)
        agent = make_agent(embedding="")
        llm.push(text("hello"))
        run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")])
        run_submit(run)
        collected = run_collect(actor=actor, run_id=run.id, timeout_s=30)
        key = ("letta_runs_total", (("status", "completed"), ("stop_reason", "end_turn")))
        deadline = time.monotonic() + 10  # the worker sends its counts once a second
        while scrape().get(key) != 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        samples = scrape()
    finally:
        worker.stop()

    assert collected.run.status == "completed"
    assert samples[key] == 1
