"""Sleeptime: Letta's background memory agent reorganises the primary agent's memory every N turns.

The primary's reply never waits for it: the runner only counts turns and, when one is due, hands the
work to a Celery task (agents.sleeptime). The sleeptime agent shares the primary's blocks, so its edits
appear in their history attributed to it.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F

from apps.agents.models import Agent, AgentType, Message, Run
from apps.agents.prompts import SLEEPTIME_TASK

TRANSCRIPT_ROLES = (Message.Role.USER, Message.Role.ASSISTANT)


def count_primary_turn(agent: Agent) -> bool:
    """Count a finished turn of a primary with a sleeptime agent; True when the sleeptime agent is due."""
    if agent.sleeptime_agent_id is None or agent.agent_type == AgentType.SLEEPTIME:
        return False
    Agent.all_objects.filter(id=agent.id).update(sleeptime_turns_counter=F("sleeptime_turns_counter") + 1)
    counter, frequency = (
        Agent.all_objects.filter(id=agent.id)
        .values_list("sleeptime_turns_counter", "sleeptime_agent_frequency")
        .get()
    )
    return frequency > 0 and counter % frequency == 0


def create_sleeptime_run(primary_agent_id: str) -> Run | None:
    """A run of the sleeptime agent over the primary's messages since the last one it processed."""
    primary = Agent.all_objects.select_related("sleeptime_agent").get(id=primary_agent_id)
    sleeptime = primary.sleeptime_agent
    if sleeptime is None:
        return None
    messages = Message.all_objects.filter(agent=primary, conversation=None, role__in=TRANSCRIPT_ROLES)
    last = (
        Message.all_objects.filter(id=primary.sleeptime_last_processed_message)
        .values_list("sequence_id", flat=True)
        .first()
    )
    if last is not None:
        messages = messages.filter(sequence_id__gt=last)
    new = [m for m in messages.order_by("sequence_id") if m.text.strip()]
    if not new:
        return None
    transcript = "\n".join(f"{m.role}: {m.text.strip()}" for m in new)
    with transaction.atomic():
        run = Run.all_objects.create(
            organization_id=primary.organization_id,
            agent=sleeptime,
            request_config={"max_steps": 10, "sleeptime_of": primary.id},
        )
        text = SLEEPTIME_TASK.format(transcript=transcript)
        Message.all_objects.create(
            organization_id=primary.organization_id,
            agent=sleeptime,
            run=run,
            role=Message.Role.USER,
            content=[{"type": "text", "text": text}],
            text=text,
        )
        Agent.all_objects.filter(id=primary.id).update(sleeptime_last_processed_message=new[-1].id)
    return run
