"""Raw exception text never reaches a tenant: API errors, stream errors and crashed runs answer a plain
message with an error id, and the server log has that id with the exception and its traceback."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.agents import services as agent_services
from apps.agents.loop import runner
from apps.api import sse
from apps.memory import selectors as memory_selectors
from tests.api.test_messages_api import new_agent, sse_events, user
from tests.api.test_messages_api import send as api_send
from tests.api.test_runs_api import finished_run_with_stream

SECRET = "db-7.internal.example:5432 refused the connection"
ERROR_ID = re.compile(r"error_id[\"=: ]+([0-9a-f]{32})")


def boom(*args: Any, **kwargs: Any) -> Any:
    raise ConnectionError(SECRET)


@pytest.fixture
def client(actor, api_client_for) -> APIClient:
    client = api_client_for(actor)
    client.raise_request_exception = False  # answer as in production: the response, not the exception
    return client


def logged_with_traceback(caplog: pytest.LogCaptureFixture, error_id: str) -> bool:
    return any(
        error_id in record.getMessage() and record.exc_info and SECRET in str(record.exc_info[1])
        for record in caplog.records
    )


@pytest.mark.django_db
def test_an_unexpected_error_in_a_view_is_a_plain_500_with_an_error_id(client, monkeypatch, caplog):
    monkeypatch.setattr(memory_selectors, "block_list", boom)

    with caplog.at_level(logging.ERROR):
        response = client.get("/v1/blocks/")

    assert response.status_code == 500
    body = response.json()
    assert SECRET not in response.content.decode()
    assert "ConnectionError" not in response.content.decode()
    assert body["error_id"] in body["detail"]
    assert body["detail"].startswith("Internal server error")
    assert logged_with_traceback(caplog, body["error_id"])


@pytest.mark.django_db
def test_an_unexpected_error_in_a_send_is_a_plain_500_not_retried(client, actor, monkeypatch, caplog):
    agent = new_agent(actor)
    monkeypatch.setattr(agent_services, "run_create", boom)

    with caplog.at_level(logging.ERROR):
        response = api_send(client, agent.id, user("hello"))

    assert response.status_code == 500
    assert response["x-should-retry"] == "false"
    assert SECRET not in response.content.decode()
    assert logged_with_traceback(caplog, response.json()["error_id"])


@pytest.mark.django_db
def test_a_stream_that_fails_midway_says_so_without_the_exception(
    client, actor, fast_streams, monkeypatch, caplog
):
    run, _ = finished_run_with_stream(actor)
    monkeypatch.setattr(sse, "follow_events", boom)

    with caplog.at_level(logging.ERROR):
        events = sse_events(client.post(f"/v1/runs/{run.id}/stream", {}, format="json"))

    name, error = events[0]
    assert name == "error"
    assert error["error_type"] == "internal_error"
    assert SECRET not in str(error)
    assert "ConnectionError" not in str(error)
    assert error["error_id"] in error["detail"]
    assert logged_with_traceback(caplog, error["error_id"])
    assert events[-1] == (None, "[DONE]")


@pytest.mark.parametrize("where", ["load_state", "_loop"])
def test_a_crashed_run_records_a_plain_error_with_an_error_id(
    where, make_agent, send, llm, monkeypatch, caplog
):
    agent = make_agent()
    monkeypatch.setattr(runner, where, boom)

    with caplog.at_level(logging.ERROR):
        result = send(agent, "hi")

    message = result.run.error["message"]
    assert result.run.status == "failed"
    assert SECRET not in message
    assert "ConnectionError" not in message
    error_id = ERROR_ID.search(message).group(1)
    assert logged_with_traceback(caplog, error_id)
    assert SECRET not in str(result.run.metadata)


@pytest.mark.django_db
def test_the_api_shows_a_crashed_runs_error_without_the_exception(
    client, actor, make_agent, send, monkeypatch
):
    agent = make_agent()
    monkeypatch.setattr(runner, "_loop", boom)
    run = send(agent, "hi").run

    body = client.get(f"/v1/runs/{run.id}").content.decode()

    assert SECRET not in body
    assert "error_id" in body
