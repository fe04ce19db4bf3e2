"""Sleeptime agents reorganise the primary's memory every N turns, in the background, through real workers."""

import time

import pytest

from apps.agents.models import Agent, AgentType, Run
from apps.agents.services import BlockSpec, MessageIn, run_collect, run_create, run_submit
from apps.memory.models import Block, BlockHistory
from tests.support.scripted_llm import text, tool_call, tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_agent_with_sleeptime_gets_a_sleeptime_agent_sharing_its_blocks(make_agent):
    primary = make_agent(enable_sleeptime=True)

    sleeptime = Agent.all_objects.get(id=primary.sleeptime_agent_id)

    assert sleeptime.agent_type == AgentType.SLEEPTIME
    assert sleeptime.name == "Assistant-sleeptime"
    assert set(sleeptime.blocks.values_list("id", flat=True)) == set(
        primary.blocks.values_list("id", flat=True)
    )
    assert sorted(sleeptime.tools.values_list("name", flat=True)) == [
        "memory_finish_edits",
        "memory_insert",
        "memory_replace",
        "memory_rethink",
    ]
    assert sorted(primary.tools.values_list("name", flat=True)) == [
        "archival_memory_search",
        "conversation_search",
        "send_message",
    ]


def test_every_second_turn_the_sleeptime_agent_rewrites_memory_after_the_reply(
    make_agent, actor, llm, celery_worker
):
    primary = make_agent(
        enable_sleeptime=True,
        memory_blocks=[BlockSpec(label="human", value="Name: Sam\nName: Sam", limit=500)],
    )
    Agent.all_objects.filter(id=primary.id).update(sleeptime_agent_frequency=2)
    llm.push(
        text("Nice to meet you."),
        text("Hiking sounds great."),
        tool_calls(tool_call("memory_rethink", {"label": "human", "new_memory": "Name: Sam\nLoves hiking"})),
        tool_calls(tool_call("memory_finish_edits", {})),
    )

    for content in ("I'm Sam", "I love hiking"):
        run = run_create(actor=actor, agent_id=primary.id, messages=[MessageIn(content=content)])
        run_submit(run)
        last_primary = run_collect(actor=actor, run_id=run.id, timeout_s=30).run
    deadline = time.monotonic() + 30
    while not Run.all_objects.filter(agent_id=primary.sleeptime_agent_id, status="completed").exists():
        assert time.monotonic() < deadline
        time.sleep(0.2)

    sleeptime_run = Run.all_objects.get(agent_id=primary.sleeptime_agent_id)
    human = Block.all_objects.get(agent_attachments__agent=primary, label="human")
    assert human.value == "Name: Sam\nLoves hiking"
    assert BlockHistory.all_objects.filter(
        block=human, actor_type="agent", actor_id=primary.sleeptime_agent_id
    ).exists()
    assert sleeptime_run.stop_reason == "tool_rule"
    assert last_primary.completed_at <= sleeptime_run.started_at  # the reply never waited for it
    transcript = llm.chat_requests()[2]["messages"][-1]["content"]
    assert "user: I'm Sam" in transcript
    assert "assistant: Hiking sounds great." in transcript
