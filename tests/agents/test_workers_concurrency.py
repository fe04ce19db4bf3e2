"""One run at a time per agent conversation, in order, across real workers; a killed worker loses nothing."""

import itertools
import time

import pytest

from apps.agents.models import Message, Run
from apps.agents.recovery import WORKER_LOST, fail_orphaned_runs
from apps.agents.services import MessageIn, run_collect, run_create, run_submit
from apps.agents.tasks import execute_run_task
from tests.support import workers
from tests.support.scripted_llm import text, tool_call, tool_calls
from tests.support.workers import WorkerProcess, worker_env

pytestmark = pytest.mark.django_db(transaction=True)


POOLS = ["threads", "prefork"]
"""Threads share a process but not a database session: each holds its own advisory locks."""


@pytest.fixture(params=POOLS)
def second_worker(request, scripted_server, tmp_path):
    worker = WorkerProcess(
        "worker-b", worker_env(scripted_server.url), tmp_path, concurrency=2, pool=request.param
    ).wait_ready()
    yield worker
    worker.stop()


def test_messages_to_one_agent_run_one_at_a_time_in_order_across_two_workers(
    make_agent, actor, llm, celery_worker, second_worker
):
    agent = make_agent()
    llm.push(*[text(f"reply {i}", latency=0.4) for i in range(4)])

    runs = []
    for i in range(4):
        run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content=f"message {i}")])
        run_submit(run)
        runs.append(run)
    for run in runs:
        run_collect(actor=actor, run_id=run.id, timeout_s=60)

    finished = [Run.all_objects.get(id=r.id) for r in runs]
    assert [(r.status, r.error) for r in finished] == [("completed", None)] * 4
    for before, after in itertools.pairwise(finished):
        assert before.completed_at <= after.started_at  # never overlapping, in submission order
    agent.refresh_from_db()
    by_id = dict(Message.all_objects.filter(id__in=agent.message_ids).values_list("id", "text"))
    texts = [by_id[i] for i in agent.message_ids]  # the order the model saw them in
    assert texts == [t for i in range(4) for t in (f"message {i}", f"reply {i}")], " | ".join(texts)


@pytest.fixture(params=POOLS)
def doomed(request, scripted_server, tmp_path):
    """A worker on its own queue, for the test to kill; stopped afterwards if the test did not."""
    worker = WorkerProcess(
        "doomed", worker_env(scripted_server.url), tmp_path, queues="crash", pool=request.param
    ).wait_ready()
    yield worker
    worker.stop()


def test_a_worker_killed_mid_run_leaves_a_failed_run_and_the_agent_usable(
    make_agent, actor, llm, doomed, celery_worker
):
    agent = make_agent()
    llm.push(text("never arrives", latency=30))
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="remember this")])
    execute_run_task.apply_async(args=[run.id], queue="crash")
    deadline = time.monotonic() + 30
    while Run.all_objects.get(id=run.id).status != Run.Status.RUNNING:
        assert time.monotonic() < deadline, doomed.log.read_text()[-3000:]
        time.sleep(0.1)

    doomed.kill()
    time.sleep(0.5)  # PostgreSQL notices the dead session and frees its lock
    orphaned = fail_orphaned_runs()
    llm.reset()
    llm.push(text("I am here"))
    follow_up = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="still there?")])
    run_submit(follow_up)
    collected = run_collect(actor=actor, run_id=follow_up.id, timeout_s=30)

    crashed = Run.all_objects.get(id=run.id)
    assert orphaned == [run.id]
    assert (crashed.status, crashed.error) == (Run.Status.FAILED, {"message": WORKER_LOST})
    agent.refresh_from_db()
    remembered = Message.all_objects.get(run=run, role="user")
    assert remembered.text == "remember this"
    assert remembered.id in agent.message_ids  # the user's message is still in the conversation
    assert collected.run.status == Run.Status.COMPLETED
    assert collected.messages[-1]["content"] == "I am here"


def test_a_pending_approval_survives_a_worker_restart_and_approving_resumes_the_run(
    make_agent, actor, llm, scripted_server, tmp_path, celery_worker
):
    from tests.agents.test_loop import custom_tool

    first = WorkerProcess("first", worker_env(scripted_server.url), tmp_path, queues="restart").wait_ready()
    tool = custom_tool(actor_org(actor), name="cleanup", default_requires_approval=True)
    agent = make_agent(tool_ids=[tool.id])
    llm.push(tool_calls(tool_call("cleanup", {"word": "disk"}, id="call_rm")))
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="clean up")])
    execute_run_task.apply_async(args=[run.id], queue="restart")
    paused = run_collect(actor=actor, run_id=run.id, timeout_s=30)
    first.stop()  # the whole worker tier restarts; the default-queue worker takes the approval

    llm.push(text("Cleaned."))
    resumed = run_create(
        actor=actor,
        agent_id=agent.id,
        approvals=[{"type": "approval", "tool_call_id": "call_rm", "approve": True}],
    )
    run_submit(resumed)
    collected = run_collect(actor=actor, run_id=resumed.id, timeout_s=30)

    assert paused.stop_reason == {"message_type": "stop_reason", "stop_reason": "requires_approval"}
    assert [m["message_type"] for m in collected.messages] == ["tool_return_message", "assistant_message"]
    assert collected.messages[0]["tool_return"] == "DISK"


def actor_org(actor):
    from apps.accounts.models import Organization

    return Organization.objects.get(id=actor.organization_id)


LONELY = "lonely-worker"
"""The application_name of the `lonely` worker's database sessions, the ones the test cuts."""


@pytest.fixture
def lonely(scripted_server, tmp_path):
    """A worker on its own queue whose database sessions carry their own name, for the test to cut."""
    url = workers.test_database_url()
    url += f"{'&' if '?' in url else '?'}application_name={LONELY}"
    worker = WorkerProcess(
        "lonely", worker_env(scripted_server.url, DATABASE_URL=url), tmp_path, queues="lonely"
    ).wait_ready()
    yield worker
    worker.stop()


def test_a_run_whose_claim_a_database_crash_lost_runs_again_once_the_database_is_back(
    make_agent, actor, llm, lonely
):
    from django.db import connection

    agent = make_agent()
    llm.push(text("lost with the crash", latency=3), text("Here after the restart."))
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="are you there?")])
    execute_run_task.apply_async(args=[run.id, agent.id, None], queue="lonely")
    deadline = time.monotonic() + 30
    while Run.all_objects.get(id=run.id).status != Run.Status.RUNNING:
        assert time.monotonic() < deadline, lonely.log.read_text()[-3000:]
        time.sleep(0.05)

    # What a PostgreSQL crash leaves when it loses the claim's commit (it does not wait for the disk):
    # the run `created` again, and the worker's sessions gone while its LLM call is out.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE agents_run SET status = 'created', started_at = NULL, lease = '' WHERE id = %s", [run.id]
        )
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            [LONELY],
        )
        assert cursor.fetchone()[0] >= 1  # the worker's sessions, and no one else's
    collected = run_collect(actor=actor, run_id=run.id, timeout_s=30)

    assert collected.run.status == Run.Status.COMPLETED, lonely.log.read_text()[-3000:]
    assert collected.messages[-1]["content"] == "Here after the restart."
    agent.refresh_from_db()
    asked = Message.all_objects.filter(run=run, role="user").values_list("id", flat=True)
    assert [i for i in agent.message_ids if i in set(asked)] == list(asked)  # the input once in context
