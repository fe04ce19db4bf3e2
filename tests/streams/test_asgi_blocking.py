"""Blocking sends (POST /v1/agents/{id}/messages without streaming) through the ASGI application, as daphne
serves it: the wait for the run is the event loop's (apps.api.sse.acollect_run on the process's StreamHub),
not a thread per waiting request, with the same answers as the blocking path (200, 504, 502), the same
stream slots, and nothing left behind when the client goes away."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core.signals import request_finished
from django.db import connection

from apps.agents import services as agent_services
from apps.agents.models import Run
from apps.api import throttles
from apps.core import asgi
from apps.streams.events import append_event, end_stream
from apps.streams.hub import get_hub
from tests.api.test_messages_api import new_agent
from tests.api.test_runs_api import message_event
from tests.core.test_asgi import key_for, scope
from tests.factories import MessageFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def no_worker(monkeypatch):
    """Runs are created but not executed: the test plays the worker (events, end, status)."""
    monkeypatch.setattr(agent_services, "run_submit", lambda run: None)


async def send(
    key: str, agent_id: str, text: str, headers: dict[str, str] | None = None
) -> ApplicationCommunicator:
    from config.asgi import application

    body = json.dumps({"messages": [{"role": "user", "content": text}]}).encode()
    headers = {
        "authorization": f"Bearer {key}",
        "content-type": "application/json",
        "content-length": str(len(body)),
        **(headers or {}),
    }
    app = ApplicationCommunicator(application, scope("POST", f"/v1/agents/{agent_id}/messages", headers))
    await app.send_input({"type": "http.request", "body": body, "more_body": False})
    return app


async def answer(app: ApplicationCommunicator, wait_s: float = 30) -> tuple[int, dict[str, str], Any]:
    start = await app.receive_output(timeout=wait_s)
    body = b""
    while True:
        message = await app.receive_output(timeout=wait_s)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    assert int(headers["content-length"]) == len(body)
    return start["status"], headers, json.loads(body)


async def until(condition: Any, wait_s: float = 20) -> None:
    async with asyncio.timeout(wait_s):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def runs_of(actor: Any, agent_ids: list[str]) -> list[Run]:
    """The agents' runs, in their order (fewer while some sends have not made theirs yet)."""
    try:
        by_agent = {run.agent_id: run for run in Run.objects.for_actor(actor).filter(agent_id__in=agent_ids)}
        return [by_agent[agent_id] for agent_id in agent_ids if agent_id in by_agent]
    finally:
        connection.close()


def work(
    actor: Any, run: Run, text: str, *, status: str = "completed", stop_reason: str = "end_turn"
) -> None:
    """What the worker does: a reply in the stream, then the run's end (database first, as it does)."""
    try:
        reply: Any = MessageFactory(
            organization_id=actor.organization_id, agent_id=run.agent_id, run=run, role="assistant", text=text
        )
        append_event(run.id, message_event(reply))
        error = {"message": "provider down"} if status == "failed" else None
        Run.all_objects.filter(id=run.id).update(status=status, stop_reason=stop_reason, error=error)
    finally:
        connection.close()
    if status == "completed":
        append_event(run.id, {"message_type": "stop_reason", "stop_reason": stop_reason})
        append_event(run.id, {"message_type": "usage_statistics", "step_count": 1, "run_ids": [run.id]})
    end_stream(run.id, status=status, stop_reason=stop_reason)


def in_thread(func: Any, *args: Any, **kwargs: Any) -> Any:
    return sync_to_async(func, thread_sensitive=False)(*args, **kwargs)


def test_many_blocking_sends_wait_without_a_thread_each(actor, no_worker, settings, monkeypatch):
    settings.MAX_STREAMS_PER_USER = 0
    # Request threads given back are kept for later requests, at most `keep` of them: a few here, so what
    # is counted below is the threads the waits hold, not the ones kept idle.
    monkeypatch.setattr(asgi.REQUEST_THREADS, "keep", 2)
    agents = [new_agent(actor, name=f"Agent {n}").id for n in range(30)]
    key = key_for(actor)

    async def scenario() -> tuple[int, int, list[tuple[int, dict[str, str], Any]], list[Run], int]:
        before = threading.active_count()
        apps = [await send(key, agent_id, f"hello {n}") for n, agent_id in enumerate(agents)]
        while len(runs := await in_thread(runs_of, actor, agents)) < len(agents):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # every send is waiting now; the threads that ended are gone
        extra_threads, waiting = threading.active_count() - before, get_hub().subscriber_count()
        for n, run in enumerate(runs):
            await in_thread(work, actor, run, f"reply {n}")
        answers = [await answer(app) for app in apps]
        await asyncio.sleep(0.1)
        left = get_hub().subscriber_count()
        await get_hub().aclose()
        return extra_threads, waiting, answers, runs, left

    extra_threads, waiting, answers, runs, left = async_to_sync(scenario)()

    assert extra_threads < 10  # 30 waiting sends: the loop's few shared threads at most, not one each
    assert waiting == 30  # each followed through the hub
    for n, ((status, _, body), run) in enumerate(zip(answers, runs, strict=True)):
        assert status == 200
        assert [(m["message_type"], m["content"]) for m in body["messages"]] == [
            ("assistant_message", f"reply {n}")
        ]
        assert body["stop_reason"] == {"message_type": "stop_reason", "stop_reason": "end_turn"}
        assert body["usage"]["run_ids"] == [run.id]
    assert left == 0
    assert throttles.open_streams(actor.user_id) == 0


def test_a_send_still_running_at_the_client_deadline_is_504_with_what_it_did_so_far(actor, no_worker):
    agent = new_agent(actor)
    key = key_for(actor)

    async def scenario() -> tuple[int, dict[str, str], Any, Run]:
        app = await send(key, agent.id, "take your time", {"x-stainless-read-timeout": "6"})  # waits 1 s
        await until(lambda: get_hub().subscriber_count() == 1)
        [run] = await in_thread(runs_of, actor, [agent.id])
        reply = await in_thread(
            MessageFactory,
            organization_id=actor.organization_id,
            agent=agent,
            run=run,
            role="assistant",
            text="so far",
        )
        await in_thread(append_event, run.id, message_event(reply))
        status, headers, body = await answer(app)
        await get_hub().aclose()
        return status, headers, body, run

    status, headers, body, run = async_to_sync(scenario)()

    assert status == 504
    assert headers["x-should-retry"] == "false"
    assert (body["code"], body["run_id"]) == ("RUN_STILL_RUNNING", run.id)
    assert [m["content"] for m in body["messages"]] == ["so far"]
    assert throttles.open_streams(actor.user_id) == 0


def test_a_run_failing_on_the_provider_is_a_502_the_sdk_does_not_retry(actor, no_worker):
    agent = new_agent(actor)
    key = key_for(actor)

    async def scenario() -> tuple[int, dict[str, str], Any]:
        app = await send(key, agent.id, "hi")
        await until(lambda: get_hub().subscriber_count() == 1)
        [run] = await in_thread(runs_of, actor, [agent.id])
        await in_thread(work, actor, run, "partial", status="failed", stop_reason="llm_api_error")
        result = await answer(app)
        await get_hub().aclose()
        return result

    status, headers, body = async_to_sync(scenario)()

    assert status == 502
    assert headers["x-should-retry"] == "false"
    assert (body["stop_reason"], body["detail"]) == ("llm_api_error", "provider down")


def test_a_blocking_send_is_closed_in_a_kept_thread_after_its_wait(actor, no_worker):
    """The send's thread goes back while the event loop waits for the run; the answer is then closed in a
    kept thread lent to it, not in one started for the moment."""
    agent = new_agent(actor)
    key = key_for(actor)
    closed_in: list[str] = []

    def record(**kwargs: Any) -> None:  # request_finished: sent when the response closes, in its thread
        closed_in.append(threading.current_thread().name)

    async def scenario() -> tuple[int, dict[str, str], Any]:
        app = await send(key, agent.id, "hi")
        await until(lambda: get_hub().subscriber_count() == 1)
        [run] = await in_thread(runs_of, actor, [agent.id])
        await in_thread(work, actor, run, "hello")
        result = await answer(app)
        await app.wait(timeout=10)  # the request's end: its response closed
        await get_hub().aclose()
        return result

    request_finished.connect(record)
    try:
        status, _, body = async_to_sync(scenario)()
    finally:
        request_finished.disconnect(record)

    assert status == 200
    assert [m["content"] for m in body["messages"]] == ["hello"]
    assert len(closed_in) == 1
    assert closed_in[0].startswith("request")


def test_a_waiting_send_holds_its_stream_slot_until_answered(actor, no_worker, settings):
    settings.MAX_STREAMS_PER_USER = 1
    first, second = new_agent(actor), new_agent(actor, name="Other")
    key = key_for(actor)

    async def scenario() -> tuple[int, int]:
        waiting = await send(key, first.id, "hi")
        await until(lambda: get_hub().subscriber_count() == 1)
        refused, _, _ = await answer(await send(key, second.id, "me too"))
        [run] = await in_thread(runs_of, actor, [first.id])
        await in_thread(work, actor, run, "done")
        answered, _, _ = await answer(waiting)
        await get_hub().aclose()
        return refused, answered

    refused, answered = async_to_sync(scenario)()

    assert (refused, answered) == (429, 200)
    assert throttles.open_streams(actor.user_id) == 0


def test_a_client_gone_while_its_send_waits_leaves_nothing_behind(actor, no_worker):
    agent = new_agent(actor)
    key = key_for(actor)

    async def scenario() -> tuple[int, int, int]:
        app = await send(key, agent.id, "hi")
        await until(lambda: get_hub().subscriber_count() == 1)
        held = await in_thread(throttles.open_streams, actor.user_id)
        await app.send_input({"type": "http.disconnect"})
        await app.wait(timeout=10)
        left = get_hub().subscriber_count()
        await get_hub().aclose()
        return held, left, await in_thread(throttles.open_streams, actor.user_id)

    held, left, open_after = async_to_sync(scenario)()

    assert held == 1
    assert (left, open_after) == (0, 0)
