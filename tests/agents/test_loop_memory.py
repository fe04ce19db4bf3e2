"""Self-editing memory through the real loop: core memory, archival page out/in, recall after eviction."""

import json

from apps.agents.services import BlockSpec, conversation_create
from apps.memory.models import Block, BlockHistory
from tests.agents.test_loop_memory_pressure import LONG
from tests.support.scripted_llm import text, tool_call, tool_calls


def block_value(agent, label):
    return Block.all_objects.get(agent_attachments__agent=agent, label=label).value


def test_the_weekend_scenario_memory_carries_into_a_new_conversation(make_agent, send, llm, actor):
    agent = make_agent(
        memory_blocks=[
            BlockSpec(label="human", value="Name: Sam", limit=2000),
            BlockSpec(label="project", value="", limit=2000),
        ]
    )
    llm.push(
        tool_calls(
            tool_call("memory_insert", {"label": "human", "new_string": "prefers simple deployment"}),
            tool_call("memory_insert", {"label": "project", "new_string": "framework: FastAPI"}),
        ),
        text("Got it: FastAPI, simple deployment."),
    )
    send(agent, "I'm building with FastAPI and I like simple deployments.")
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "project", "old_string": "FastAPI", "new_string": "Flask"})
        ),
        text("Switched to Flask."),
    )
    send(agent, "Actually we moved to Flask.")
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    llm.push(text("You use Flask."))

    result = send(agent, "What framework do I use?", conversation_id=conversation.id)

    system = llm.last_chat_request()["messages"][0]["content"]
    assert "framework: Flask" in system
    assert "FastAPI" not in system
    assert "prefers simple deployment" in block_value(agent, "human")
    assert result.stop_reason == "end_turn"
    assert [m["role"] for m in llm.last_chat_request()["messages"]] == ["system", "user"]  # fresh thread
    edits = BlockHistory.all_objects.filter(block__label="project", actor_type="agent", actor_id=agent.id)
    assert edits.count() == 2


def test_a_memory_edit_shows_up_in_the_next_steps_system_message(make_agent, send, llm):
    agent = make_agent()
    llm.push(
        tool_calls(
            tool_call("memory_replace", {"label": "human", "old_string": "unknown", "new_string": "Sam"})
        ),
        text("Hi Sam"),
    )

    send(agent, "I'm Sam")

    assert "Name: Sam" in llm.chat_requests()[1]["messages"][0]["content"]


def test_a_block_write_over_the_limit_fails_readably_and_changes_nothing(make_agent, send, llm):
    agent = make_agent(memory_blocks=[BlockSpec(label="human", value="Name: Sam", limit=20)])
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "x" * 50})),
        text("That did not fit."),
    )

    result = send(agent, "remember a lot")

    tool_message = next(m for m in result.messages if m.role == "tool")
    assert tool_message.is_err is True
    assert "over its limit of 20" in tool_message.tool_returns[0]["tool_return"]
    assert block_value(agent, "human") == "Name: Sam"


def test_archival_page_out_and_page_in_by_meaning_and_by_tag(make_agent, send, llm):
    agent = make_agent(tools=["archival_memory_insert", "archival_memory_search"])
    llm.push(
        tool_calls(
            tool_call(
                "archival_memory_insert", {"content": "Sam's dog is called Rex", "tags": ["pets", "family"]}
            )
        ),
        tool_calls(
            tool_call("archival_memory_insert", {"content": "Sam works as a nurse", "tags": ["work"]})
        ),
        text("Saved."),
    )
    send(agent, "My dog is Rex and I am a nurse.")
    llm.push(
        tool_calls(tool_call("archival_memory_search", {"query": "what is the dog called"})),
        tool_calls(
            tool_call(
                "archival_memory_search", {"query": "Sam", "tags": ["pets", "work"], "tag_match_mode": "any"}
            )
        ),
        tool_calls(
            tool_call(
                "archival_memory_search",
                {"query": "Sam", "tags": ["pets", "family"], "tag_match_mode": "all"},
            )
        ),
        text("Your dog is Rex."),
    )

    result = send(agent, "What's my dog's name?")

    searches = [json.loads(m.tool_returns[0]["tool_return"]) for m in result.messages if m.role == "tool"]
    by_meaning, any_tag, all_tags = searches
    assert by_meaning[0]["content"] == "Sam's dog is called Rex"
    assert sorted(r["content"] for r in any_tag) == ["Sam works as a nurse", "Sam's dog is called Rex"]
    assert [r["content"] for r in all_tags] == ["Sam's dog is called Rex"]
    system = llm.last_chat_request()["messages"][0]["content"]
    assert "2 memories you saved are in archival memory" in system
    assert "Archival memory tags: family, pets, work" in system


def test_conversation_search_finds_a_message_evicted_by_compaction(make_agent, send, llm):
    agent = make_agent(context_window_limit=1600)
    llm.configure(strict=False, default_turn={"content": "Noted."})
    send(agent, "My secret code word is PAPAYA.")
    for i in range(8):
        send(agent, f"Message {i}: {LONG}")
    agent.refresh_from_db()
    llm.push(
        tool_calls(tool_call("conversation_search", {"query": "secret code word", "limit": 1})),
        text("PAPAYA"),
    )

    result = send(agent, "What was my code word?")

    found = json.loads(next(m for m in result.messages if m.role == "tool").tool_returns[0]["tool_return"])
    assert any("PAPAYA" in r["content"] for r in found["results"])
    assert not any("PAPAYA" in (m.get("content") or "") for m in llm.chat_requests()[-2]["messages"][1:])
