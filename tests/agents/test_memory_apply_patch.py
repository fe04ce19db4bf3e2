"""Letta's memory_apply_patch through the real loop (scripted LLM): one block, several blocks at once, and
every refusal (a hunk that does not match, a read-only block, over the limit, a malformed patch) leaves
all blocks as they were and tells the model why."""

import json
import unittest.mock

import pytest

from apps.agents.services import BlockSpec
from apps.memory.models import AgentBlock, Block, BlockHistory
from tests.support.scripted_llm import text, tool_call, tool_calls

BLOCKS = [
    BlockSpec(label="human", value="Name: Sam\nCity: Lisbon\nJob: nurse", limit=2000),
    BlockSpec(label="persona", value="I am a helpful assistant.", limit=2000),
]


def values(agent) -> dict[str, str]:
    links = AgentBlock.objects.filter(agent=agent).select_related("block")
    return {link.block_label: link.block.value for link in links}


def patch_turn(make_agent, send, llm, patch, *, label="", blocks=None):
    agent = make_agent(memory_blocks=blocks or BLOCKS, tools=["memory_apply_patch"])
    llm.push(tool_calls(tool_call("memory_apply_patch", {"label": label, "patch": patch})), text("Done."))
    result = send(agent, "Please update your memory.")
    tool_message = next(m for m in result.messages if m.role == "tool")
    return agent, tool_message


def model_saw(llm) -> str:
    """The tool return as the model read it in the next request."""
    tool = [m for m in llm.last_chat_request()["messages"] if m["role"] == "tool"][-1]
    return json.loads(tool["content"])["message"]


def test_a_single_block_patch_edits_the_block_and_the_next_prompt_shows_it(make_agent, send, llm):
    agent, tool_message = patch_turn(
        make_agent, send, llm, " Name: Sam\n-City: Lisbon\n+City: Porto\n Job: nurse", label="human"
    )

    assert tool_message.is_err is False
    assert values(agent)["human"] == "Name: Sam\nCity: Porto\nJob: nurse"
    assert tool_message.tool_returns[0]["tool_return"] == "Name: Sam\nCity: Porto\nJob: nurse"  # as Letta
    assert "City: Porto" in llm.last_chat_request()["messages"][0]["content"]
    history = BlockHistory.all_objects.filter(block__label="human", actor_type="agent", actor_id=agent.id)
    assert history.count() == 1


def test_a_multi_block_patch_edits_both_blocks_with_several_hunks(make_agent, send, llm):
    patch = (
        "*** Update Block: human\n"
        "@@\n"
        "-City: Lisbon\n"
        "+City: Porto\n"
        "@@\n"
        " Job: nurse\n"
        "+Pet: a dog called Rex\n"
        "*** Update Block: persona\n"
        "-I am a helpful assistant.\n"
        "+I am a concise, helpful assistant."
    )

    agent, tool_message = patch_turn(make_agent, send, llm, patch)

    assert tool_message.is_err is False
    assert values(agent) == {
        "human": "Name: Sam\nCity: Porto\nJob: nurse\nPet: a dog called Rex",
        "persona": "I am a concise, helpful assistant.",
    }
    said = model_saw(llm)
    assert "Updated memory block 'human'" in said
    assert "Updated memory block 'persona'" in said
    system = llm.last_chat_request()["messages"][0]["content"]
    assert "Pet: a dog called Rex" in system
    assert "concise, helpful" in system


def test_add_rename_and_delete_blocks_in_one_patch(make_agent, send, llm):
    patch = (
        "*** Add Block: project\n"
        "Description: What we are building\n"
        "+Framework: Flask\n"
        "+Deploy: fly.io\n"
        "*** Update Block: persona\n"
        "*** Move to: self\n"
        "*** Delete Block: human"
    )

    agent, tool_message = patch_turn(make_agent, send, llm, patch)

    assert tool_message.is_err is False, tool_message.tool_returns
    assert values(agent) == {
        "project": "Framework: Flask\nDeploy: fly.io",
        "self": "I am a helpful assistant.",
    }
    project = Block.all_objects.get(agent_attachments__agent=agent, label="project")
    assert project.description == "What we are building"
    assert BlockHistory.all_objects.filter(block=project, actor_type="agent", actor_id=agent.id).exists()
    assert Block.all_objects.filter(organization=agent.organization, label="human").exists()  # detached only
    system = llm.last_chat_request()["messages"][0]["content"]
    assert "<project>" in system
    assert "<self>" in system
    assert "<human>" not in system


def test_a_hunk_that_does_not_match_changes_no_block_and_the_model_reads_why(make_agent, send, llm):
    patch = (
        "*** Update Block: persona\n"
        "-I am a helpful assistant.\n"
        "+I am terse.\n"
        "*** Update Block: human\n"
        "-City: Madrid\n"
        "+City: Porto"
    )

    agent, tool_message = patch_turn(make_agent, send, llm, patch)

    assert tool_message.is_err is True
    assert values(agent) == {b.label: b.value for b in BLOCKS}  # the persona hunk did not apply either
    said = model_saw(llm)
    assert "hunk 1 does not match memory block 'human'" in said
    assert "City: Madrid" in said
    assert not BlockHistory.all_objects.filter(actor_type="agent", actor_id=agent.id).exists()


def test_an_ambiguous_hunk_is_refused(make_agent, send, llm):
    blocks = [BlockSpec(label="todo", value="- [ ] a\n- [ ] a", limit=2000)]

    agent, tool_message = patch_turn(make_agent, send, llm, "-- [ ] a\n+- [x] a", label="todo", blocks=blocks)

    assert tool_message.is_err is True
    assert "matches 2 places" in model_saw(llm)
    assert values(agent) == {"todo": "- [ ] a\n- [ ] a"}


def test_a_read_only_block_is_refused_and_nothing_changes(make_agent, send, llm):
    blocks = [
        BlockSpec(label="human", value="Name: Sam", limit=2000),
        BlockSpec(label="policy", value="Be kind.", limit=2000, read_only=True),
    ]
    patch = (
        "*** Update Block: human\n-Name: Sam\n+Name: Samantha\n*** Update Block: policy\n-Be kind.\n+Be rude."
    )

    agent, tool_message = patch_turn(make_agent, send, llm, patch, blocks=blocks)

    assert tool_message.is_err is True
    assert "read-only" in model_saw(llm)
    assert values(agent) == {"human": "Name: Sam", "policy": "Be kind."}


@pytest.mark.parametrize(
    "patch", ["*** Delete Block: policy", "*** Update Block: policy\n*** Move to: rules"]
)
def test_a_read_only_block_cannot_be_deleted_or_renamed(make_agent, send, llm, patch):
    blocks = [BlockSpec(label="policy", value="Be kind.", limit=2000, read_only=True)]

    agent, tool_message = patch_turn(make_agent, send, llm, patch, blocks=blocks)

    assert tool_message.is_err is True
    assert values(agent) == {"policy": "Be kind."}


def test_a_patch_over_the_limit_is_refused_and_nothing_changes(make_agent, send, llm):
    blocks = [
        BlockSpec(label="human", value="Name: Sam", limit=2000),
        BlockSpec(label="notes", value="short", limit=20),
    ]
    patch = (
        "*** Update Block: human\n-Name: Sam\n+Name: Samantha\n*** Update Block: notes\n-short\n+" + "x" * 50
    )

    agent, tool_message = patch_turn(make_agent, send, llm, patch, blocks=blocks)

    assert tool_message.is_err is True
    assert "over its limit of 20" in model_saw(llm)
    assert values(agent) == {"human": "Name: Sam", "notes": "short"}


@pytest.mark.parametrize(
    ("label", "patch", "says"),
    [
        ("human", "just some words", "has no hunk"),
        ("", " Name: Sam\n+x", "label is empty"),
        ("human", "*** Move to: other", "must follow"),
        ("human", "*** Update Block:\n+x", "must be followed by a block label"),
        ("human", " 1→ Name: Sam\n+2→ City: Porto", "line-number"),
        ("nope", "+x", "No memory block labelled 'nope'"),
    ],
)
def test_a_malformed_patch_is_an_error_the_model_reads(make_agent, send, llm, label, patch, says):
    agent, tool_message = patch_turn(make_agent, send, llm, patch, label=label)

    assert tool_message.is_err is True
    assert says in model_saw(llm)
    assert values(agent) == {b.label: b.value for b in BLOCKS}


def test_adding_a_block_that_exists_is_refused(make_agent, send, llm):
    agent, tool_message = patch_turn(make_agent, send, llm, "*** Add Block: human\n+hello")

    assert tool_message.is_err is True
    assert "'human' already exists" in model_saw(llm)
    assert values(agent) == {b.label: b.value for b in BLOCKS}


def test_a_concurrent_write_is_not_lost_the_patch_reapplies_on_the_new_value(make_agent, send, llm, actor):
    """Someone edits the block after the run read it: the compare-and-set write fails, the patch is
    re-read and re-applied on the newer value, and both edits survive."""
    from apps.agents import builtin_tools
    from apps.memory import services as memory_services

    agent = make_agent(memory_blocks=BLOCKS, tools=["memory_apply_patch"])
    human = Block.all_objects.get(agent_attachments__agent=agent, label="human")
    plan = builtin_tools._plan_patch
    planned = []

    def someone_writes_after_the_plan(*args, **kwargs):
        outcome = plan(*args, **kwargs)
        if not planned:
            memory_services.block_update(actor=actor, block_id=human.id, value=human.value + "\nAge: 40")
        planned.append(outcome)
        return outcome

    llm.push(
        tool_calls(
            tool_call("memory_apply_patch", {"label": "human", "patch": "-City: Lisbon\n+City: Porto"})
        ),
        text("Done."),
    )
    with unittest.mock.patch.object(builtin_tools, "_plan_patch", someone_writes_after_the_plan):
        result = send(agent, "I moved to Porto.")

    assert next(m for m in result.messages if m.role == "tool").is_err is False
    assert len(planned) == 2  # planned again on the value the other writer left
    assert values(agent)["human"] == "Name: Sam\nCity: Porto\nJob: nurse\nAge: 40"


# --- the patch format, rule by rule (apps.memory.edits, no database) --------------------------------------


def view(value: str, limit: int = 2000):
    from apps.memory.edits import BlockView

    return BlockView(label="notes", value=value, limit=limit)


@pytest.mark.parametrize(
    ("value", "diff", "expected"),
    [
        (
            "a\nb\nc",
            "--- a/notes\n+++ b/notes\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c",
            "a\nB\nc",
        ),  # headers ignored
        ("a\nb", "+c\n+d", "a\nb\nc\nd"),  # only "+" lines: appended
        ("a\n\nb", " a\n\n-b\n+c", "a\n\nc"),  # a blank patch line is an empty context line
        ("x\ty", "-x\ty\n+z", "z"),  # tabs expanded on both sides before matching
        ("a\nb\nc", "@@\n-a\n+A\n@@\n-c\n+C", "A\nb\nC"),  # hunks apply in order
    ],
)
def test_hunks_apply_as_letta_does(value, diff, expected):
    from apps.memory.edits import memory_apply_hunks

    assert memory_apply_hunks(view(value), diff) == expected


def test_a_move_after_an_update_without_hunks_is_a_pure_rename():
    from apps.memory.edits import PatchOperation, parse_memory_patch

    operations = parse_memory_patch("", "*** Update Block: a\n*** Move to: b")

    assert operations == [PatchOperation("move", "a", new_label="b")]
