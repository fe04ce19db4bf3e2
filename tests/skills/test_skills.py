"""Skills: blocks labelled `skills/<name>`. The prompt lists them (name and one-line description) instead of
showing them; the agent loads one in full with `load_skill`, and only then is its text in the LLM request.
They travel in agent files, show apart in the ADE's memory column, and a git-memory agent's prompt shows
only its `system/` blocks (Letta's MemFS layout)."""

from __future__ import annotations

import json
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from apps.agents.services import BlockSpec
from apps.memory.models import AgentBlock
from tests.support.scripted_llm import text, tool_call, tool_calls

SKILL_TEXT = (
    "# Writing release notes\n"
    "1. Group changes by Added / Changed / Fixed.\n"
    "2. Lead with what the user notices; SECRET-STEP-42: link every issue."
)
SKILL = BlockSpec(
    label="skills/release-notes",
    value=SKILL_TEXT,
    limit=5000,
    description="Write release notes from a list of merged changes.\nMore detail on a second line.",
)
BLOCKS = [BlockSpec(label="human", value="Name: Sam", limit=2000), SKILL]


def system_of(request: dict[str, Any]) -> str:
    return request["messages"][0]["content"]


def full_request_text(request: dict[str, Any]) -> str:
    return json.dumps(request["messages"], ensure_ascii=False)


def test_a_skill_is_listed_and_its_full_text_reaches_the_llm_only_after_loading(make_agent, send, llm):
    agent = make_agent(memory_blocks=BLOCKS, tools=["load_skill"])
    llm.push(
        tool_calls(tool_call("load_skill", {"name": "release-notes"})),
        text("Here are your release notes."),
    )

    result = send(agent, "Write release notes for 1.2.")

    before, after = llm.chat_requests()[-2:]
    system = system_of(before)
    assert "<available_skills>" in system
    assert (
        "<available_skills>\n${MEMORY_DIR}/skills\n└── release-notes/\n"
        "    └── SKILL.md (Write release notes from a list of merged changes.)\n</available_skills>"
    ) in system
    assert "More detail on a second line" not in system  # one line of description only
    assert "SECRET-STEP-42" not in full_request_text(before)
    assert "<skills/release-notes>" not in system  # not rendered as a core block
    tool_message = next(m for m in result.messages if m.role == "tool")
    assert tool_message.is_err is False
    assert tool_message.tool_returns[0]["tool_return"] == SKILL_TEXT
    assert "SECRET-STEP-42" in full_request_text(after)
    assert "SECRET-STEP-42" not in system_of(after)  # in the tool message, not the system message


def test_load_skill_takes_the_name_as_listed_and_an_unknown_name_lists_the_skills(make_agent, send, llm):
    agent = make_agent(memory_blocks=BLOCKS, tools=["load_skill"])
    llm.push(
        tool_calls(
            tool_call("load_skill", {"name": "${MEMORY_DIR}/skills/release-notes/SKILL.md"}),
            tool_call("load_skill", {"name": "haiku"}),
        ),
        text("ok"),
    )

    result = send(agent, "go")

    listed, unknown = [m for m in result.messages if m.role == "tool"]
    assert listed.tool_returns[0]["tool_return"] == SKILL_TEXT
    assert unknown.is_err is True
    assert unknown.tool_returns[0]["tool_return"] == "No skill named 'haiku'. Your skills are: release-notes."


def test_a_skill_added_by_memory_apply_patch_is_listed_at_the_next_step(make_agent, send, llm):
    agent = make_agent(tools=["memory_apply_patch", "load_skill"])
    patch = "*** Add Block: skills/haiku\nDescription: Write a haiku\n+Five, seven, five syllables."
    llm.push(
        tool_calls(tool_call("memory_apply_patch", {"label": "", "patch": patch})),
        tool_calls(tool_call("load_skill", {"name": "haiku"})),
        text("Written."),
    )

    send(agent, "Learn to write haiku, then use it.")

    second, third = llm.chat_requests()[-2:]
    assert "└── haiku/\n    └── SKILL.md (Write a haiku)" in system_of(second)
    assert "Five, seven, five" not in system_of(second)
    assert "Five, seven, five" in full_request_text(third)


# --- agent files ------------------------------------------------------------------------------------------


def _export(client, agent_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/agents/{agent_id}/export")
    assert response.status_code == 200, response.content
    return json.loads(response.content)


def _import(client, document: dict[str, Any]) -> str:
    upload = SimpleUploadedFile("agent.af", json.dumps(document).encode(), content_type="application/json")
    response = client.post("/v1/agents/import", {"file": upload}, format="multipart")
    assert response.status_code == 200, response.content
    [agent_id] = response.json()["agent_ids"]
    return agent_id


def _skill_blocks(agent_id: str) -> dict[str, tuple[str, str]]:
    links = AgentBlock.objects.filter(agent_id=agent_id, block_label__startswith="skills/").select_related(
        "block"
    )
    return {link.block_label: (link.block.value, link.block.description) for link in links}


def test_export_and_import_keep_the_skills(make_agent, actor, api_client_for):
    agent = make_agent(memory_blocks=BLOCKS)
    client = api_client_for(actor)

    document = _export(client, agent.id)
    new_id = _import(client, document)

    assert [skill["name"] for skill in document["skills"]] == ["release-notes"]
    assert document["skills"][0]["files"]["SKILL.md"].endswith(SKILL_TEXT)
    assert _skill_blocks(new_id) == {"skills/release-notes": (SKILL_TEXT, SKILL.description)}  # one copy
    assert _export(client, new_id)["skills"] == document["skills"]


def test_a_letta_file_s_inline_skill_becomes_a_skill_block(make_agent, actor, api_client_for):
    agent = make_agent()
    client = api_client_for(actor)
    document = _export(client, agent.id)
    document["skills"] = [
        {
            "name": "pdf",
            "files": {
                "SKILL.md": "---\nname: pdf\ndescription: Read and fill PDF forms\n---\n# PDF\nUse forms.\n"
            },
        },
        {"name": "slack", "source_url": "letta:slack"},  # never fetched
    ]

    response_id = _import(client, document)

    assert _skill_blocks(response_id) == {"skills/pdf": ("# PDF\nUse forms.\n", "Read and fill PDF forms")}


# --- git-memory agents --------------------------------------------------------------------------------------


def test_a_git_memory_agent_s_prompt_renders_only_system_blocks_and_lists_the_other_files(
    make_agent, send, llm
):
    agent = make_agent(
        tags=["git-memory-enabled"],
        memory_blocks=[
            BlockSpec(label="system/persona", value="I am Ada.", limit=2000),
            BlockSpec(label="system/human", value="Name: Sam", limit=2000, description="About the user"),
            BlockSpec(label="system/projects/current", value="Flask app", limit=2000),
            BlockSpec(label="notes/2025/trip", value="FULL-TRIP-NOTES", limit=2000, description="Trip plan"),
            BlockSpec(label="reference", value="FULL-REFERENCE", limit=2000),
            SKILL,
        ],
    )
    llm.push(text("Hi Sam."))

    send(agent, "hello")

    system = system_of(llm.last_chat_request())
    assert "<self>\n<projection>$MEMORY_DIR/system/persona.md</projection>\nI am Ada.\n</self>" in system
    assert (
        "<memory>\n"
        "<human>\n"
        "  <projection>$MEMORY_DIR/system/human.md</projection>\n"
        "  <description>About the user</description>\n"
        "  Name: Sam\n"
        "</human>\n"
        "<projects>\n"
        "  <current>\n"
        "    <projection>$MEMORY_DIR/system/projects/current.md</projection>\n"
        "    Flask app\n"
        "  </current>\n"
        "</projects>\n"
        "<external_projection>\n"
        "${MEMORY_DIR}/\n"
        "├── notes/\n"
        "│   └── 2025/\n"
        "│       └── trip.md\n"
        "└── reference.md\n"
        "</external_projection>\n"
        "</memory>"
    ) in system
    assert "<system/human>" not in system
    assert "FULL-TRIP-NOTES" not in system
    assert "FULL-REFERENCE" not in system
    assert "SECRET-STEP-42" not in system
    assert "└── release-notes/\n    └── SKILL.md" in system  # skills are still listed
    assert "chars_limit" not in system


def test_without_the_tag_the_same_labels_render_as_ordinary_blocks(make_agent, send, llm):
    agent = make_agent(memory_blocks=[BlockSpec(label="system/human", value="Name: Sam", limit=2000)])
    llm.push(text("Hi."))

    send(agent, "hello")

    system = system_of(llm.last_chat_request())
    assert "<system/human>" in system
    assert "<memory_blocks>" in system


# --- the ADE ---------------------------------------------------------------------------------------------


def test_the_memory_column_shows_skills_apart_with_name_and_description(make_agent, client: Client, user):
    agent = make_agent(memory_blocks=BLOCKS)
    client.force_login(user)

    html = client.get(f"/agents/{agent.id}/").content.decode()

    skills = html[html.index('data-testid="memory-skills"') :]
    core = html[: html.index('data-testid="memory-skills"')]
    assert 'data-testid="block-human"' in core
    assert 'data-testid="block-skills/release-notes"' not in core
    assert 'data-testid="skill-release-notes"' in skills
    assert "Write release notes from a list of merged changes." in skills
    assert "1 block</span>" in html  # the core count leaves the skill out
