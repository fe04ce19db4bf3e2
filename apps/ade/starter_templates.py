"""The ADE's starter templates for new agents: plain data, created through agents.services.

Each template names the memory blocks a new agent starts with and whether it gets a sleeptime memory
agent; the person creating it picks the name, model, embedding and (optionally) the system prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.agents.services import BlockSpec

BLOCK_LIMIT = 5000


@dataclass(frozen=True)
class StarterTemplate:
    key: str
    title: str
    summary: str
    blocks: tuple[BlockSpec, ...] = ()
    enable_sleeptime: bool = False


HUMAN = BlockSpec(
    label="human",
    value="The user has not shared anything about themselves yet.",
    limit=BLOCK_LIMIT,
)
PERSONA = BlockSpec(
    label="persona",
    value=(
        "I am a helpful personal assistant. I am warm, concise and honest, I remember what matters to "
        "the person I talk with, and I keep my memory up to date as I learn more."
    ),
    limit=BLOCK_LIMIT,
)

STARTER_TEMPLATES: tuple[StarterTemplate, ...] = (
    StarterTemplate(
        key="personal-assistant",
        title="Personal assistant",
        summary="Remembers who you are and who it is: starts with 'human' and 'persona' memory blocks.",
        blocks=(HUMAN, PERSONA),
    ),
    StarterTemplate(
        key="sleeptime",
        title="Assistant with sleeptime memory agent",
        summary=(
            "A personal assistant plus a background agent that reorganises its memory every few turns, "
            "so replies never wait for memory edits."
        ),
        blocks=(HUMAN, PERSONA),
        enable_sleeptime=True,
    ),
    StarterTemplate(
        key="blank",
        title="Blank agent",
        summary="No memory blocks: start from scratch and add what you need in the workspace.",
    ),
)
DEFAULT_TEMPLATE = STARTER_TEMPLATES[0].key


def starter_template(key: str) -> StarterTemplate | None:
    return next((t for t in STARTER_TEMPLATES if t.key == key), None)
