"""Recovery and deferral behind a stuck conversation: a bounded number of tasks, and order kept.

Before: every run queued behind a long one retried every 250 ms, and recovery enqueued every such run
again on each pass (every RUN_RECOVERY_INTERVAL) once it was a minute old, each new task retrying every
250 ms too: a conversation stuck for ten minutes with N queued runs ran about 144 N tasks a second.
"""

from __future__ import annotations

import itertools
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.agents import recovery
from apps.agents.models import Message, Run
from apps.agents.recovery import (
    REQUEUE_MAX_DELAY,
    TASK_MARKER_TTL,
    requeue_count_key,
    requeue_delay,
    task_marker_key,
)
from apps.agents.services import MessageIn, run_cancel, run_create, run_submit
from apps.agents.tasks import DEFER_MAX_SECONDS, defer_countdown, recover_runs_task
from apps.streams.redis_client import get_redis
from tests.support.scripted_llm import text

QUEUED = 3


def test_a_deferred_task_backs_off_exponentially_to_a_cap() -> None:
    assert [defer_countdown(n) for n in range(8)] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert defer_countdown(10_000) == DEFER_MAX_SECONDS == 10.0


def test_a_run_enqueued_again_waits_twice_as_long_each_time_to_a_cap() -> None:
    assert [requeue_delay(n) for n in range(1, 7)] == [120, 240, 480, 960, 1800, 1800]
    assert requeue_delay(0) == TASK_MARKER_TTL
    assert requeue_delay(10_000) == REQUEUE_MAX_DELAY


def _broker_messages() -> int:
    """Task messages in the broker: queued, plus those workers hold (deferred ones wait out their countdown
    there, unacknowledged)."""
    redis = get_redis()
    return int(redis.llen("celery")) + int(redis.hlen("unacked"))


def _task_messages(run: Run) -> int:
    """Task messages the run has had so far (its marker counts sends and deferrals)."""
    return int(get_redis().get(task_marker_key(run.id)) or 0)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.django_db(transaction=True)
def test_runs_queued_behind_a_stuck_run_cost_a_bounded_number_of_tasks_and_still_run_in_order(
    make_agent, actor, llm, celery_worker, monkeypatch
):
    agent = make_agent(embedding="")
    llm.push(text("never said", latency=30, when_last_user_contains="block"))
    llm.push(*[text(f"reply {i}", when_last_user_contains=f"queued {i}") for i in range(QUEUED)])
    blocker = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="block the line")])
    run_submit(blocker)
    _wait_for(lambda: llm.chat_requests(), 30, "the blocker never called the model")
    queued = []
    for i in range(QUEUED):
        run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content=f"queued {i}")])
        run_submit(run)
        queued.append(run)
    monkeypatch.setattr(recovery, "LOST_TASK_GRACE", timedelta(0))  # every queued run counts as stale
    requeued: list[str] = []
    real_enqueue = recovery.enqueue_run

    def counting_enqueue(run_id: str, *args, **kwargs) -> None:
        requeued.append(run_id)
        real_enqueue(run_id, *args, **kwargs)

    monkeypatch.setattr(recovery, "enqueue_run", counting_enqueue)

    in_broker = []
    for _ in range(8):  # eight recovery passes, a second apart, while the conversation is stuck
        recover_runs_task()
        in_broker.append(_broker_messages())
        time.sleep(1.0)

    assert requeued == []  # each queued run still has its task
    assert max(in_broker) <= 1 + QUEUED + 1  # one message per run (two while a deferral is resent)
    # Deferrals 0.25, 0.75, 1.75, 3.75 and 7.75 s after the send: 5 in these 8 s, where 250 ms made 32.
    assert all(2 <= _task_messages(run) <= 8 for run in queued), [_task_messages(r) for r in queued]

    # A task lost meanwhile (its marker expired): enqueued again once, then left alone for a while.
    lost = queued[-1]
    get_redis().delete(task_marker_key(lost.id), requeue_count_key(lost.id))
    for _ in range(3):
        recover_runs_task()
    assert requeued == [lost.id]
    assert get_redis().ttl(task_marker_key(lost.id)) > TASK_MARKER_TTL - 10

    cancelled_at = timezone.now()
    run_cancel(actor=actor, run_id=blocker.id)  # the stuck call ends within about a second

    for run in queued:
        _wait_for(
            lambda run=run: Run.all_objects.get(id=run.id).status == Run.Status.COMPLETED,
            20,
            f"{run.id} did not complete",
        )
    assert Run.all_objects.get(id=blocker.id).status == Run.Status.CANCELLED
    finished = [Run.all_objects.get(id=r.id) for r in queued]
    # The first queued run started as the blocker ended (its worker enqueued it), not at its own task's
    # next try, 15.75 s after its send.
    assert (finished[0].started_at - cancelled_at).total_seconds() < 3.0
    for before, after in itertools.pairwise(finished):
        assert before.completed_at <= after.started_at  # one at a time, in submission order
    agent.refresh_from_db()
    texts = dict(Message.all_objects.filter(id__in=agent.message_ids).values_list("id", "text"))
    in_context = [texts[i] for i in agent.message_ids]
    assert in_context[-2 * QUEUED :] == [t for i in range(QUEUED) for t in (f"queued {i}", f"reply {i}")]
