"""A group turn under concurrency and crashes: two advances after the same finished speaker (Celery
delivers at least once) start one next speaker; a cancel racing an advance leaves no speaker running; a
turn whose advance task was lost is moved on by the periodic recovery, with a real worker; every speaker's
run says in its metadata (the runs API) that a group started it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from apps.agents import group_turns, groups
from apps.agents.group_turns import Progress, advance, drive, recover_stalled_turns
from apps.agents.groups import group_create, group_turn_cancel, group_turn_create, group_turn_runs
from apps.agents.loop.runner import execute_run_streamed
from apps.agents.models import Agent, GroupTurn, Run
from apps.agents.tasks import recover_runs_task
from apps.core.actor import Actor
from apps.streams.redis_client import get_redis
from tests.support.scripted_llm import ScriptedLLM, text

MakeAgent = Callable[..., Agent]


def user(content: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


@pytest.fixture
def no_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn's first advance task is never sent (lost, as far as the turn can tell): the test advances."""
    monkeypatch.setattr(groups, "_submit", lambda turn_id: None)


def first_speaker_finished(actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM, *names: str) -> GroupTurn:
    """A round-robin turn whose first speaker's run has ended, the turn not yet moved on (the worker that
    executed the run died before it could, or a second delivery of its task is about to)."""
    agents = [make_agent(name=name) for name in names]
    group = group_create(actor=actor, agent_ids=[a.id for a in agents], description="")
    llm.push(text(f"{names[0]} here"))
    turn = group_turn_create(actor=actor, group_id=group.id, messages=user("go"))
    assert advance(turn.id) is Progress.CONTINUE  # the first speaker's run is created
    turn.refresh_from_db()
    first = turn.current_run
    assert first is not None
    execute_run_streamed(first.id, agent_id=first.agent_id, conversation_id=first.conversation_id)
    first.refresh_from_db()
    assert first.status == "completed"
    return turn


def in_threads(*targets: Callable[[], Any]) -> list[Any]:
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []

    def run(index: int, target: Callable[[], Any]) -> None:
        try:
            results[index] = target()
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return results


@pytest.mark.django_db(transaction=True)
def test_two_advances_after_the_same_finished_speaker_start_one_next_speaker(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM, no_task: None, monkeypatch: pytest.MonkeyPatch
):
    turn = first_speaker_finished(actor, make_agent, llm, "Alice", "Bob", "Carol")
    together = threading.Barrier(2, timeout=10)
    move_on = group_turns._move_on

    def at_once(*args: Any) -> Progress:  # both reach the turn's lock after seeing Alice's run over
        together.wait()
        return move_on(*args)

    monkeypatch.setattr(group_turns, "_move_on", at_once)

    results = in_threads(lambda: advance(turn.id), lambda: advance(turn.id))

    assert sorted(r.value for r in results) == ["continue", "done"]
    runs = group_turn_runs(actor=actor, turn=turn)
    names = dict(Agent.objects.unscoped().values_list("id", "name"))
    assert [(names[r.agent_id], r.status) for r in runs] == [("Alice", "completed"), ("Bob", "created")]
    turn.refresh_from_db()
    assert turn.current_run_id == runs[1].id
    assert [e["text"] for e in turn.transcript] == ["Alice here"]  # taken in once


@pytest.mark.django_db(transaction=True)
def test_a_cancel_racing_an_advance_leaves_no_speaker_to_run(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM, no_task: None, monkeypatch: pytest.MonkeyPatch
):
    turn = first_speaker_finished(actor, make_agent, llm, "Alice", "Bob")
    planning = threading.Event()
    plan = group_turns._plan

    def slow_plan(*args: Any) -> Any:  # the advance holds the turn's lock while the cancel comes in
        planning.set()
        time.sleep(0.5)
        return plan(*args)

    monkeypatch.setattr(group_turns, "_plan", slow_plan)

    def cancel() -> GroupTurn:
        assert planning.wait(10)
        return group_turn_cancel(actor=actor, turn_id=turn.id)

    progress, cancelled = in_threads(lambda: advance(turn.id), cancel)

    assert progress is Progress.CONTINUE  # Bob's run was started before the cancel took the lock...
    assert (cancelled.status, cancelled.stop_reason) == ("cancelled", "cancelled")
    runs = group_turn_runs(actor=actor, turn=turn)
    assert [r.status for r in runs] == ["completed", "cancelled"]  # ...and the cancel stopped it
    assert advance(turn.id) is Progress.DONE  # the task the advance sent for Bob starts nothing
    assert len(group_turn_runs(actor=actor, turn=turn)) == 2
    assert llm.pending() == []


def test_an_advance_after_a_cancel_starts_nothing(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM, no_task: None
):
    turn = first_speaker_finished(actor, make_agent, llm, "Alice", "Bob")

    group_turn_cancel(actor=actor, turn_id=turn.id)

    assert advance(turn.id) is Progress.DONE
    assert [r.status for r in group_turn_runs(actor=actor, turn=turn)] == ["completed"]


def test_only_a_turn_standing_still_past_the_bound_is_recovered(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM, no_task: None, monkeypatch: pytest.MonkeyPatch
):
    sent: list[tuple[str, list[str]]] = []
    monkeypatch.setattr("celery.current_app.send_task", lambda name, args: sent.append((name, args)))
    turn = first_speaker_finished(actor, make_agent, llm, "Alice", "Bob")
    get_redis().delete(f"group-turn-resent:{turn.id}")

    assert recover_stalled_turns() == []  # Alice's run just ended: its advance may still come
    Run.objects.unscoped().filter(id=turn.current_run_id).update(
        completed_at=timezone.now() - group_turns.STALLED_TURN_GRACE - timedelta(seconds=1)
    )
    assert recover_stalled_turns() == [turn.id]
    assert recover_stalled_turns() == []  # sent again once, not on every pass
    assert sent == [("agents.group_turn_advance", [turn.id])]


@pytest.mark.django_db(transaction=True)
def test_a_turn_whose_advance_task_was_lost_is_moved_on_by_recovery_through_a_worker(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM, no_task: None, celery_worker: Any
):
    turn = first_speaker_finished(actor, make_agent, llm, "Alice", "Bob")
    get_redis().delete(f"group-turn-resent:{turn.id}")
    Run.objects.unscoped().filter(id=turn.current_run_id).update(
        completed_at=timezone.now() - group_turns.STALLED_TURN_GRACE - timedelta(seconds=1)
    )
    llm.push(text("Bob here"))

    recover_runs_task()  # the periodic recovery (beat), here called once
    for _ in range(300):
        turn.refresh_from_db()
        if turn.status not in ("created", "running"):
            break
        time.sleep(0.1)

    assert (turn.status, turn.stop_reason) == ("completed", "end_turn")
    names = dict(Agent.objects.unscoped().values_list("id", "name"))
    runs = group_turn_runs(actor=actor, turn=turn)
    assert [(names[r.agent_id], r.status) for r in runs] == [("Alice", "completed"), ("Bob", "completed")]
    assert [(e["name"], e["text"]) for e in turn.transcript] == [("Alice", "Alice here"), ("Bob", "Bob here")]
    assert recover_stalled_turns() == []


def test_every_speakers_run_says_a_group_started_it_in_the_runs_api(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM, no_task: None, api_client_for: Any
):
    alice, bob = make_agent(name="Alice"), make_agent(name="Bob")
    group = group_create(actor=actor, agent_ids=[alice.id, bob.id], description="")
    llm.push(text("Alice here"), text("Bob here"))
    turn = group_turn_create(actor=actor, group_id=group.id, messages=user("go"))
    drive(turn.id)
    client = api_client_for(actor)

    bodies = [client.get(f"/v1/runs/{r.id}").json() for r in group_turn_runs(actor=actor, turn=turn)]
    listed = client.get(f"/v1/runs/?agent_id={bob.id}").json()

    assert [b["metadata"] for b in bodies] == [
        {
            "run_type": "group_send_message",
            "group_id": group.id,
            "group_turn_id": turn.id,
            "group_role": "speaker",
        }
    ] * 2
    assert [r["metadata"]["run_type"] for r in listed] == ["group_send_message"]
