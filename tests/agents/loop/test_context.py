from datetime import UTC, datetime

import pytest

from apps.agents.loop.context import (
    BlockSnapshot,
    MemoryStats,
    SystemSections,
    build_llm_messages,
    compile_system_message,
    compile_system_sections,
)

NOW = datetime(2025, 3, 5, 23, 30, tzinfo=UTC)
EDITED = datetime(2025, 3, 5, 8, 15, tzinfo=UTC)

PERSONA = BlockSnapshot(
    label="persona",
    description="Who you are and how you speak.",
    value="I am Sam.\nI like tea.",
    limit=2000,
)
HUMAN = BlockSnapshot(
    label="human",
    description="What you know about the user.",
    value="Name: Ada",
    limit=5000,
    read_only=True,
)
SCRATCH = BlockSnapshot(label="scratch", description=None, value="", limit=100)
EMPTY_STATS = MemoryStats(last_memory_edit=None, recall_message_count=0, archival_passage_count=0)

EXPECTED_SYSTEM_MESSAGE = """\
You are Sam, a helpful companion.

<memory_blocks>
These memory blocks make up your core memory; they are always in your context:

<persona>
<description>
Who you are and how you speak.
</description>
<metadata>
- chars_current=21
- chars_limit=2000
</metadata>
<value>
I am Sam.
I like tea.
</value>
</persona>

<human>
<description>
What you know about the user.
</description>
<metadata>
- read_only=true
- chars_current=9
- chars_limit=5000
</metadata>
<value>
Name: Ada
</value>
</human>

<scratch>
<metadata>
- chars_current=0
- chars_limit=100
</metadata>
<value>
</value>
</scratch>
</memory_blocks>

<tool_usage_rules>
These rules constrain which tools you may call and in what order. \
Follow them on every call; one response may contain several tool calls.

You must call conversation_search first, before any other tool.
Calling send_message ends your response.
</tool_usage_rules>

<memory_metadata>
- Current date: March 06, 2025
- Memory blocks last modified: 2025-03-05 09:15:00 AM CET+0100
- 42 earlier messages between you and the user are no longer in context \
but are kept in recall memory (search them with your tools)
- 3 memories you saved are in archival memory (search them with your tools)
- Archival memory tags: alpha, project_x, zeta
</memory_metadata>"""


def _compile(**overrides: object) -> str:
    arguments: dict[str, object] = {
        "system_prompt": "You are Sam.",
        "blocks": [],
        "stats": EMPTY_STATS,
        "tool_rules_text": "",
        "agent_type": "letta_v1_agent",
        "show_line_numbers": False,
        "now": NOW,
        "timezone": "UTC",
    }
    arguments.update(overrides)
    return compile_system_message(**arguments)  # type: ignore[arg-type]


def test_system_message_renders_prompt_blocks_rules_and_metadata_in_order():
    stats = MemoryStats(
        last_memory_edit=EDITED,
        recall_message_count=42,
        archival_passage_count=3,
        archival_tags=["zeta", "alpha", "project_x", "alpha"],
    )
    rules = "You must call conversation_search first, before any other tool.\nCalling send_message ends your response."

    message = compile_system_message(
        system_prompt="You are Sam, a helpful companion.\n",
        blocks=[PERSONA, HUMAN, SCRATCH],
        stats=stats,
        tool_rules_text=rules,
        agent_type="letta_v1_agent",
        show_line_numbers=False,
        now=NOW,
        timezone="Europe/Berlin",
    )

    assert message == EXPECTED_SYSTEM_MESSAGE


def test_line_numbered_blocks_carry_the_warning_and_numbered_lines():
    block = BlockSnapshot(label="persona", description="Me.", value="a\nb", limit=10)

    message = _compile(blocks=[block], show_line_numbers=True)

    assert message.split("\n\n")[2] == (
        "<persona>\n"
        "<description>\nMe.\n</description>\n"
        "<metadata>\n- chars_current=3\n- chars_limit=10\n</metadata>\n"
        "<warning>\n# NOTE: Line numbers such as '1→ ' are shown only to help you edit. "
        "Never include line-number prefixes or this note in memory tool arguments.\n</warning>\n"
        "<value>\n1→ a\n2→ b\n</value>\n"
        "</persona>\n"
        "</memory_blocks>"
    )


def test_minimal_agent_gets_prompt_and_metadata_only():
    message = _compile()

    assert message == (
        "You are Sam.\n\n"
        "<memory_metadata>\n"
        "- Current date: March 05, 2025\n"
        "- 0 earlier messages between you and the user are no longer in context "
        "but are kept in recall memory (search them with your tools)\n"
        "</memory_metadata>"
    )


def test_react_agents_get_no_memory_blocks():
    message = _compile(blocks=[PERSONA], agent_type="react_agent")

    assert "<memory_blocks>" not in message
    assert message.startswith("You are Sam.\n\n<memory_metadata>\n")


def test_blank_tool_rules_are_omitted():
    message = _compile(tool_rules_text="  \n")

    assert "<tool_usage_rules>" not in message


def test_core_memory_placeholder_is_replaced_in_place():
    message = _compile(system_prompt="Before.\n{CORE_MEMORY}\nAfter.")

    assert message.startswith("Before.\n<memory_metadata>\n")
    assert message.endswith("</memory_metadata>\nAfter.")


def test_unknown_timezone_falls_back_to_utc():
    stats = MemoryStats(last_memory_edit=EDITED, recall_message_count=0, archival_passage_count=0)

    message = _compile(stats=stats, timezone="Mars/Olympus_Mons")

    assert "- Memory blocks last modified: 2025-03-05 08:15:00 AM UTC+0000\n" in message


def test_afternoon_times_use_pm():
    stats = MemoryStats(
        last_memory_edit=datetime(2025, 7, 1, 21, 5, 9, tzinfo=UTC),
        recall_message_count=0,
        archival_passage_count=0,
    )

    message = _compile(stats=stats, timezone="America/New_York")

    assert "- Memory blocks last modified: 2025-07-01 05:05:09 PM EDT-0400\n" in message


def test_naive_datetimes_are_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        _compile(now=datetime(2025, 1, 1))


def test_sections_render_to_the_compiled_message():
    arguments = {
        "system_prompt": "You are Sam.",
        "blocks": [PERSONA],
        "stats": EMPTY_STATS,
        "tool_rules_text": "Calling send_message ends your response.",
        "agent_type": "letta_v1_agent",
        "show_line_numbers": False,
        "now": NOW,
        "timezone": "UTC",
    }

    sections = compile_system_sections(**arguments)

    assert sections.render() == compile_system_message(**arguments)
    assert sections.system_prompt == "You are Sam."
    assert sections.memory_blocks.startswith("<memory_blocks>\n")
    assert sections.tool_rules.startswith("<tool_usage_rules>\n")
    assert sections.metadata.startswith("<memory_metadata>\n")


def test_sections_without_a_prompt_render_memory_only():
    sections = SystemSections(system_prompt="", memory_blocks="<memory_blocks/>", tool_rules="", metadata="M")

    assert sections.render() == "<memory_blocks/>\n\nM"


def test_llm_messages_put_the_fresh_system_message_first_and_drop_the_stored_one():
    in_context: list[dict[str, object]] = [
        {"role": "system", "content": "stale"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]

    messages = build_llm_messages("fresh", in_context)

    assert messages == [
        {"role": "system", "content": "fresh"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    assert messages[1] is not in_context[1]
    assert in_context[0] == {"role": "system", "content": "stale"}


def test_llm_messages_without_a_stored_system_message_keep_everything():
    messages = build_llm_messages("fresh", [{"role": "user", "content": "hi"}])

    assert messages == [{"role": "system", "content": "fresh"}, {"role": "user", "content": "hi"}]


# --- available skills ---------------------------------------------------------------------------------


def test_no_skills_render_nothing_and_leave_the_system_message_alone():
    from apps.agents.loop.context import render_available_skills, with_available_skills

    assert render_available_skills([], [("human", "about the user"), ("skills/x/notes", "nested")]) == ""
    assert with_available_skills("You are helpful.\n", "") == "You are helpful.\n"


def test_skill_blocks_come_first_and_a_client_skill_of_the_same_name_is_left_out():
    from apps.agents.loop.context import render_available_skills

    section = render_available_skills(
        [("search", "The client's search", "tools/search/SKILL.md"), ("lint", "", "/opt/lint.md")],
        [("skills/search", "Search the web\nwith care"), ("skills/search/SKILL", "duplicate"), ("human", "")],
    )

    assert section == (
        "<available_skills>\n"
        "${MEMORY_DIR}/skills\n"
        "└── search/\n"
        "    └── SKILL.md (Search the web)\n"
        "\n"
        "/opt\n"
        "└── lint.md\n"
        "</available_skills>"
    )
