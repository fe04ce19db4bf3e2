"""Group turns with the scripted LLM: each pattern, cancellation, tenancy.

The turn is driven in this process (`drive`, what RUN_EXECUTOR=in_process does; the Celery task calls the
same `advance`), so the scripted replies are taken in speaking order. The end-to-end tests in
tests/api/test_groups_api.py drive turns through the API and a real worker.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from apps.agents.errors import AgentNotFound
from apps.agents.group_turns import Progress, advance, drive
from apps.agents.groups import (
    group_create,
    group_list_for_agent,
    group_message_list,
    group_reset_messages,
    group_turn_cancel,
    group_turn_create,
    group_turn_runs,
    sleeptime_group_sync,
)
from apps.agents.models import Agent, Group, GroupMember, GroupTurn, Message, Run
from apps.core.actor import Actor
from apps.core.errors import Conflict
from apps.core.pagination import PageParams
from tests.support.scripted_llm import ScriptedLLM, text

MakeAgent = Callable[..., Agent]


def user(content: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def inputs(run: Run) -> list[Message]:
    return list(Message.all_objects.filter(run=run, step__isnull=True).order_by("sequence_id"))


def send(actor: Actor, group: Group, content: str) -> GroupTurn:
    turn = group_turn_create(actor=actor, group_id=group.id, messages=user(content))
    drive(turn.id)
    turn.refresh_from_db()
    return turn


def test_round_robin_each_speaker_sees_what_the_others_said(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM
):
    alice, bob = make_agent(name="Alice"), make_agent(name="Bob")
    group = group_create(actor=actor, agent_ids=[alice.id, bob.id], description="pair")
    llm.push(text("Alice here"), text("Bob here"))

    turn = send(actor, group, "introduce yourselves")

    assert (turn.status, turn.stop_reason) == ("completed", "end_turn")
    first, second = group_turn_runs(actor=actor, turn=turn)
    assert (first.agent_id, second.agent_id) == (alice.id, bob.id)
    assert [(m.role, m.text) for m in inputs(first)] == [("user", "introduce yourselves")]
    assert [(m.role, m.text, m.sender_id, m.name) for m in inputs(second)] == [
        ("user", "introduce yourselves", "", ""),
        ("system", "Alice: Alice here", alice.id, "Alice"),
    ]
    assert "Alice: Alice here" in json.dumps(llm.last_chat_request())
    timeline = list(group_message_list(actor=actor, group_id=group.id).order_by("sequence_id"))
    assert [(m.agent_id, m.role, m.text) for m in timeline] == [
        (alice.id, "user", "introduce yourselves"),
        (alice.id, "assistant", "Alice here"),
        (bob.id, "assistant", "Bob here"),
    ]


def test_round_robin_max_turns_and_what_an_agent_missed(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM
):
    alice, bob = make_agent(name="Alice"), make_agent(name="Bob")
    group = group_create(
        actor=actor, agent_ids=[alice.id, bob.id], description="", manager_config={"max_turns": 3}
    )
    llm.push(text("a1"), text("b1"), text("a2"), text("b2"), text("a3"))

    turn = send(actor, group, "go")
    second_turn = send(actor, group, "again")

    runs = group_turn_runs(actor=actor, turn=turn)
    assert [r.agent_id for r in runs] == [alice.id, bob.id, alice.id]
    assert [m.text for m in inputs(runs[2])] == ["Bob: b1"]
    later = group_turn_runs(actor=actor, turn=second_turn)
    assert [r.agent_id for r in later] == [alice.id, bob.id, alice.id]
    # Bob missed Alice's last word of the first turn: he gets it before the new message.
    assert [m.text for m in inputs(later[1])] == ["Alice: a2", "again", "Alice: b2"]


def test_supervisor_sends_to_every_worker_and_gets_their_replies(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM
):
    boss, w1, w2 = make_agent(name="Boss"), make_agent(name="W1"), make_agent(name="W2")
    group = group_create(
        actor=actor,
        agent_ids=[w1.id, w2.id],
        description="team",
        manager_type="supervisor",
        manager_config={"manager_agent_id": boss.id},
    )
    llm.push(text("Everyone: count to three"), text("1 2 3"), text("one two three"), text("All counted."))

    turn = send(actor, group, "have them count")

    assert turn.status == "completed"
    runs = group_turn_runs(actor=actor, turn=turn)
    assert [r.agent_id for r in runs] == [boss.id, w1.id, w2.id, boss.id]
    assert [(m.role, m.text, m.sender_id) for m in inputs(runs[1])] == [
        ("system", "Boss: Everyone: count to three", boss.id)
    ]
    (aggregate,) = inputs(runs[3])
    replies = json.loads(aggregate.text.split(": ", 1)[1])
    assert replies == [
        {"agent_id": w1.id, "response": ["1 2 3"]},
        {"agent_id": w2.id, "response": ["one two three"]},
    ]


def test_dynamic_manager_picks_speakers_until_the_termination_token(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM
):
    manager, alice, bob = make_agent(name="Chair"), make_agent(name="Alice"), make_agent(name="Bob")
    group = group_create(
        actor=actor,
        agent_ids=[alice.id, bob.id],
        description="panel",
        manager_type="dynamic",
        manager_config={"manager_agent_id": manager.id, "max_turns": 5},
    )
    llm.push(text("Bob should answer"), text("Let me think"), text("Alice now"), text("Agreed. DONE!"))

    turn = send(actor, group, "discuss")

    assert turn.status == "completed"
    runs = group_turn_runs(actor=actor, turn=turn)
    assert [r.agent_id for r in runs] == [manager.id, bob.id, manager.id, alice.id]
    prompt = inputs(runs[2])[0].text
    assert prompt.startswith("Choose the most suitable agent")
    assert f"['{alice.id}']" in prompt
    assert "Bob: Let me think" in prompt
    assert group.termination_token == "DONE!"


def test_dynamic_stops_at_max_turns(actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM):
    manager, alice, bob = make_agent(name="Chair"), make_agent(name="Alice"), make_agent(name="Bob")
    group = group_create(
        actor=actor,
        agent_ids=[alice.id, bob.id],
        description="",
        manager_type="dynamic",
        manager_config={"manager_agent_id": manager.id, "max_turns": 1, "termination_token": "STOP"},
    )
    llm.push(text("Alice"), text("hello"))

    turn = send(actor, group, "hi")

    assert turn.status == "completed"
    assert [r.agent_id for r in group_turn_runs(actor=actor, turn=turn)] == [manager.id, alice.id]


def test_dynamic_manager_naming_nobody_fails_the_turn(actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM):
    manager, alice = make_agent(name="Chair"), make_agent(name="Alice")
    group = group_create(
        actor=actor,
        agent_ids=[alice.id],
        description="",
        manager_type="dynamic",
        manager_config={"manager_agent_id": manager.id},
    )
    llm.push(text("no idea"))

    turn = send(actor, group, "hi")

    assert turn.status == "failed"
    assert "named none of the agents" in (turn.error or {})["message"]


def test_another_organisations_agent_is_not_found(
    actor: Actor, other_org_actor: Actor, make_agent: MakeAgent, db
):
    mine = make_agent(name="Mine")
    from apps.agents.services import agent_create

    theirs = agent_create(actor=other_org_actor, name="Theirs", model="openai/gpt-4o-mini")

    with pytest.raises(AgentNotFound) as refused:
        group_create(actor=actor, agent_ids=[mine.id, theirs.id], description="")

    assert refused.value.message == f"Agent with id '{theirs.id}' not found"
    assert not Group.objects.unscoped().exists()
    with pytest.raises(AgentNotFound):
        group_create(
            actor=actor,
            agent_ids=[mine.id],
            description="",
            manager_type="supervisor",
            manager_config={"manager_agent_id": theirs.id},
        )


def test_cancelling_a_turn_midway_starts_no_more_speakers(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM
):
    alice, bob, carol = make_agent(name="Alice"), make_agent(name="Bob"), make_agent(name="Carol")
    group = group_create(actor=actor, agent_ids=[alice.id, bob.id, carol.id], description="")
    llm.push(text("Alice speaks"))
    turn = group_turn_create(actor=actor, group_id=group.id, messages=user("go"))
    assert advance(turn.id) is Progress.CONTINUE  # Alice's run created
    assert advance(turn.id) is Progress.CONTINUE  # Alice spoke; Bob's run created

    cancelled = group_turn_cancel(actor=actor, turn_id=turn.id)

    assert (cancelled.status, cancelled.stop_reason) == ("cancelled", "cancelled")
    assert advance(turn.id) is Progress.DONE
    runs = group_turn_runs(actor=actor, turn=turn)
    assert [(r.agent_id, r.status, r.started_at is None) for r in runs] == [
        (alice.id, "completed", False),
        (bob.id, "cancelled", True),
    ]
    assert llm.pending() == []


@pytest.mark.django_db(transaction=True)
def test_cancelling_stops_the_speaker_in_its_llm_call(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
):
    import threading
    import time

    from apps.agents import groups

    monkeypatch.setattr(groups, "_submit", lambda turn_id: None)  # this test drives the turn itself

    alice, bob = make_agent(name="Alice"), make_agent(name="Bob")
    group = group_create(actor=actor, agent_ids=[alice.id, bob.id], description="")
    llm.push(text("slow", latency=4.0), text("never"))
    turn = group_turn_create(actor=actor, group_id=group.id, messages=user("go"))
    advance(turn.id)
    run_id = GroupTurn.all_objects.get(id=turn.id).current_run_id

    def cancel_soon() -> None:
        from django.db import connection

        time.sleep(0.8)
        group_turn_cancel(actor=actor, turn_id=turn.id)
        connection.close()

    threading.Thread(target=cancel_soon).start()
    started = time.monotonic()
    advance(turn.id)

    assert time.monotonic() - started < 3.5
    assert Run.all_objects.get(id=run_id).status == "cancelled"
    assert GroupTurn.all_objects.get(id=turn.id).status == "cancelled"
    assert len(group_turn_runs(actor=actor, turn=turn)) == 1


def test_reset_empties_the_timeline_and_refuses_while_a_turn_runs(
    actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM
):
    alice = make_agent(name="Alice")
    group = group_create(actor=actor, agent_ids=[alice.id], description="")
    llm.push(text("hi"))
    send(actor, group, "hello")
    pending = group_turn_create(actor=actor, group_id=group.id, messages=user("more"))

    with pytest.raises(Conflict):
        group_reset_messages(actor=actor, group_id=group.id)
    group_turn_cancel(actor=actor, turn_id=pending.id)
    group_reset_messages(actor=actor, group_id=group.id)

    assert group_message_list(actor=actor, group_id=group.id).count() == 0
    assert Message.all_objects.filter(agent=alice, role="assistant", text="hi").exists()  # its own history


def test_groups_of_an_agent(actor: Actor, make_agent: MakeAgent):
    alice, bob, boss = make_agent(name="Alice"), make_agent(name="Bob"), make_agent(name="Boss")
    pair = group_create(actor=actor, agent_ids=[alice.id, bob.id], description="")
    team = group_create(
        actor=actor,
        agent_ids=[bob.id],
        description="",
        manager_type="supervisor",
        manager_config={"manager_agent_id": boss.id},
    )
    page = PageParams(order="asc")

    assert [g.id for g in group_list_for_agent(actor=actor, agent_id=bob.id, page=page)] == [pair.id, team.id]
    assert [g.id for g in group_list_for_agent(actor=actor, agent_id=boss.id, page=page)] == [team.id]
    assert [
        g.id for g in group_list_for_agent(actor=actor, agent_id=bob.id, page=page, manager_type="supervisor")
    ] == [team.id]


def test_a_sleeptime_pairing_is_a_sleeptime_group(actor: Actor, make_agent: MakeAgent, llm: ScriptedLLM):
    primary = make_agent(name="Primary", enable_sleeptime=True)
    primary.refresh_from_db()

    group = Group.objects.unscoped().get(manager_type="sleeptime", manager_agent_id=primary.id)

    assert list(GroupMember.objects.filter(group=group).values_list("agent_id", flat=True)) == [
        primary.sleeptime_agent_id
    ]
    assert group.sleeptime_agent_frequency == primary.sleeptime_agent_frequency
    llm.push(text("noted"))
    turn = send(actor, group, "remember tea")
    assert [r.agent_id for r in group_turn_runs(actor=actor, turn=turn)] == [primary.id]
    Agent.all_objects.filter(id=primary.id).update(enable_sleeptime=False)
    primary.refresh_from_db()
    assert sleeptime_group_sync(primary=primary) is None
    assert not Group.objects.unscoped().filter(id=group.id).exists()
